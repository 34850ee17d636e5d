"""Archive extraction (``download_dir``) against a chain of relative links
that escapes the destination only once earlier members are on disk:

    a -> .            (inside)
    b -> a/a/a/../..  (lexically inside: a/a/a/../.. is a, before a exists)
    b/escaped.txt     (lands two directories above the destination)

A check of the archive made before extracting passes it. Pythons with
tarfile's extraction filters check each member as it is extracted; on
Pythons without them (3.9.0 to 3.9.16, within ``requires-python``) the
client refuses archives holding links. The fallback is forced here the way
such a Python behaves: no ``tarfile.data_filter`` and an ``extractall`` that
knows no ``filter`` argument.
"""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

import corral
from corral import _core


def chained_escape() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, target in (("a", "."), ("b", "a/a/a/../..")):
            link = tarfile.TarInfo(name)
            link.type = tarfile.SYMTYPE
            link.linkname = target
            tar.addfile(link)
        payload = b"written outside the destination\n"
        f = tarfile.TarInfo("b/escaped.txt")
        f.size = len(payload)
        tar.addfile(f, io.BytesIO(payload))
    return buf.getvalue()


@pytest.fixture
def no_filters(monkeypatch):
    """This Python, made to behave like one without extraction filters."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    real = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if "filter" in kwargs:
            raise TypeError("extractall() got an unexpected keyword argument 'filter'")
        return real(self, path, members, numeric_owner=numeric_owner, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    assert not _core.tar_filters_available()


def outside(tmp_path: Path) -> list:
    """Files under tmp_path but outside the destination tmp_path/x/y/dest."""
    dest = tmp_path / "x" / "y" / "dest"
    return [p for p in tmp_path.rglob("*") if dest not in p.parents and p != dest and p.is_file()]


def test_chained_link_escape_is_refused_without_filters(tmp_path, no_filters):
    dest = tmp_path / "x" / "y" / "dest"
    with pytest.raises(corral.CorralError) as err:
        _core.unpack_tar(chained_escape(), dest)
    assert err.value.kind == "unsafe_archive"
    assert "link" in str(err.value) and "3.9.17" in str(err.value), str(err.value)
    assert not (tmp_path / "x" / "escaped.txt").exists()
    assert outside(tmp_path) == []


def test_chained_link_escape_is_refused_with_filters(tmp_path):
    if not _core.tar_filters_available():
        pytest.skip("this Python has no tarfile extraction filters")
    dest = tmp_path / "x" / "y" / "dest"
    with pytest.raises(corral.CorralError) as err:
        _core.unpack_tar(chained_escape(), dest)
    assert err.value.kind == "unsafe_archive"
    assert not (tmp_path / "x" / "escaped.txt").exists()
    assert outside(tmp_path) == []


def test_plain_archives_still_extract_without_filters(tmp_path, no_filters):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        d.mode = 0o777
        tar.addfile(d)
        data = b"#!/bin/sh\n"
        f = tarfile.TarInfo("dir/tool")
        f.size = len(data)
        f.mode = 0o4777  # set-uid, world-writable
        f.uid = 4242
        tar.addfile(f, io.BytesIO(data))
    names = _core.unpack_tar(buf.getvalue(), tmp_path / "out")
    assert names == ["dir", "dir/tool"]
    tool = tmp_path / "out" / "dir" / "tool"
    assert tool.read_bytes() == data
    mode = stat.S_IMODE(tool.stat().st_mode)
    assert mode == 0o755, oct(mode)


@pytest.mark.server
def test_download_dir_with_links_from_a_real_sandbox_without_filters(corral_sandbox, tmp_path, no_filters):
    """What a sandbox's directory with a link chain in it becomes on a Python
    without filters: refused, nothing written outside."""
    corral_sandbox.run(
        "mkdir -p /tmp/d && cd /tmp/d && ln -s . a && ln -s a/a/a/../.. b && echo hi > f", check=True
    )
    dest = tmp_path / "x" / "y" / "dest"
    with pytest.raises(corral.CorralError) as err:
        corral_sandbox.download_dir("/tmp/d", dest)
    assert err.value.kind == "unsafe_archive", err.value
    assert outside(tmp_path) == []
