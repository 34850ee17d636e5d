"""Snapshots and forks through the Python client against a real
``corral serve``: a prepared sandbox's state in every fork, deletion
refused while forks live, errors typed and naming the field."""

from __future__ import annotations

import uuid

import pytest

import corral

pytestmark = pytest.mark.server


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_forks_see_the_prepared_state_and_hold_the_snapshot(corral_client):
    name = unique("py-snap")
    forks = []
    try:
        with corral_client.sandbox() as sb:
            sb.write_file("/srv/app/config.txt", "ready\n", mkdirs=True)
            sb.write_file("/srv/app/scratch.txt", "temporary\n")
            sb.run("rm /srv/app/scratch.txt", check=True)

            with pytest.raises(corral.InvalidRequestError) as ei:
                sb.snapshot("Not A/Name")
            assert ei.value.field == "name"

            snap = sb.snapshot(name)
            assert isinstance(snap, corral.Snapshot)
            assert (snap.name, snap.durable, snap.base_image) == (name, False, sb.image)
            assert snap.source_sandbox == sb.sandbox_id
        assert name in {s.name for s in corral_client.snapshots()}
        assert corral_client.snapshot_info(name).image == snap.image

        forks = corral_client.fork(snap, 3)
        assert len(forks) == 3 and len({f.id for f in forks}) == 3
        for f in forks:
            assert isinstance(f, corral.Sandbox)
            assert f.read_text("/srv/app/config.txt") == "ready\n"
            assert [e.name for e in f.list_files("/srv/app")] == ["config.txt"]
        # Each fork is its own sandbox.
        forks[0].write_file("/srv/app/config.txt", "changed\n")
        assert forks[1].read_text("/srv/app/config.txt") == "ready\n"

        with pytest.raises(corral.ConflictError):
            corral_client.delete_snapshot(name)
        for f in forks:
            f.delete()
        forks = []
        corral_client.delete_snapshot(name)
        assert name not in {s.name for s in corral_client.snapshots()}
        with pytest.raises(corral.SnapshotNotFoundError):
            corral_client.snapshot_info(name)
        with pytest.raises(corral.SnapshotNotFoundError):
            corral_client.fork(name, 1)
        corral_client.delete_snapshot(name, missing_ok=True)
    finally:
        for f in forks:
            f.delete()
        corral_client.delete_snapshot(name, missing_ok=True)


def test_fork_counts_and_prefixes_are_checked(corral_client, corral_sandbox):
    name = unique("py-snap-count")
    try:
        corral_sandbox.snapshot(name)
        for n in (0, 10_000):
            with pytest.raises(corral.InvalidRequestError) as ei:
                corral_client.fork(name, n)
            assert ei.value.field == "count"
        prefix = unique("pyfork")
        forks = corral_client.fork(name, 2, session_prefix=prefix)
        try:
            assert [f.id for f in forks] == [f"{prefix}-0", f"{prefix}-1"]
            with pytest.raises(corral.ConflictError) as ei:
                corral_client.fork(name, 1, session_prefix=prefix)
            assert ei.value.field == "session_prefix"
        finally:
            for f in forks:
                f.delete()
    finally:
        corral_client.delete_snapshot(name, missing_ok=True)


@pytest.mark.asyncio
async def test_async_snapshot_and_fork(corral_url):
    name = unique("py-snap-async")
    async with corral.AsyncClient(corral_url) as client:
        try:
            async with client.sandbox() as sb:
                await sb.write_file("/srv/x", b"kept", mkdirs=True)
                snap = await sb.snapshot(name)
            (fork,) = await client.fork(snap, 1)
            async with fork:
                assert await fork.read_file("/srv/x") == b"kept"
            assert name in {s.name for s in await client.snapshots()}
        finally:
            await client.delete_snapshot(name, missing_ok=True)


def test_a_pristine_sandboxs_snapshot_is_a_delta_its_forks_take_in(corral_client):
    """No image: the changes travel through the agents' streams. Forks
    have them (deletions too), reset back to them, and outlive the
    snapshot's deletion."""
    name = unique("py-delta")
    forks = []
    try:
        with corral_client.sandbox(pristine=True) as sb:
            sb.write_file("/srv/app/config.txt", "ready\n", mkdirs=True)
            sb.run("rm /etc/hostname.bak 2>/dev/null; rm -f /bin/cal", check=True)
            snap = sb.snapshot(name)
            assert (snap.kind, snap.image, snap.base_image) == ("delta", sb.image, sb.image)
            assert snap.size > 0
        assert corral_client.snapshot_info(name).kind == "delta"
        forks = corral_client.fork(name, 2)
        for f in forks:
            assert f.read_text("/srv/app/config.txt") == "ready\n"
            assert f.run("test -e /bin/cal && echo there || echo gone").stdout == "gone\n"
            f.write_file("/srv/app/config.txt", "changed\n")
            f.reset()
            assert f.read_text("/srv/app/config.txt") == "ready\n"
        # A delta's forks do not hold it: it deletes while they live.
        corral_client.delete_snapshot(name)
        assert forks[0].read_text("/srv/app/config.txt") == "ready\n"
        # A sandbox that does not reset in place keeps no delta, and says
        # why.
        with corral_client.sandbox() as plain:
            with pytest.raises(corral.UnsupportedError) as ei:
                plain.snapshot(unique("py-delta-plain"), kind="delta")
        assert "reset in place" in str(ei.value)
    finally:
        for f in forks:
            f.delete()
        corral_client.delete_snapshot(name, missing_ok=True)
