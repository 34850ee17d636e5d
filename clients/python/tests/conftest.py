"""Fixtures for the Python client's tests: a real ``corral serve`` on the real
container daemon, no mocks.

* ``corral_server`` (session): the server (binary ``$CORRAL_BIN`` else
  ``<repo>/target/debug/corral``) on a free loopback port with the default
  trust settings (a generated token the clients find by themselves), its config's
  ``defaults`` using ``corral-test/busybox`` and labelling every container
  ``corraltest=pyclient`` (plus this run's ``corraltest.run`` id). Stopped
  with SIGTERM at the end, after which no container of this run may remain.
* ``corral_url`` (session): its base URL.
* ``corral_client``: a :class:`corral.Client` for it.
* ``corral_sandbox``: a fresh sandbox, deleted after the test.
* ``internet`` (module): the test internet (``corral-internet up``:
  pypi.test, evil.test), removed at the end.
* ``corral_spec``: builds a sandbox spec that names the test image and
  labels (a spec is merged over the server's ``defaults`` anyway).

``remove_snapshot_images(name)`` removes every principal's snapshot of a
name (found by label: an MCP session's or a tenant's lives under an image
of its own namespace, ``corral-snapshot/NAMESPACE:NAME``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

import corral
from corral.testing import LocalServer, docker_ids

REPO = Path(__file__).resolve().parents[3]
IMAGE = os.environ.get("CORRAL_TEST_IMAGE", "corral-test/busybox")
LABEL = "corraltest=pyclient"
RUN_ID = uuid.uuid4().hex[:12]
LABELS = {"corraltest": "pyclient", "corraltest.run": RUN_ID}


def corral_binary() -> str:
    return os.environ.get("CORRAL_BIN") or str(REPO / "target" / "debug" / "corral")


def server_config(**sections: Any) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {"defaults": {"image": IMAGE, "labels": dict(LABELS)}}
    cfg.update(sections)
    return cfg


@contextlib.contextmanager
def running_server(**kwargs: Any) -> Iterator[LocalServer]:
    """A `corral serve` of its own (`kwargs` as `LocalServer`'s), started;
    at the end stopped (it removes its sandboxes), checked to have exited 0
    and to have left no container behind."""
    srv = LocalServer(corral_binary(), **kwargs)
    srv.start()
    try:
        yield srv
    finally:
        code = srv.stop()
        srv.close()
        assert_no_leaks()
        assert code == 0


def leaked_containers() -> list:
    return docker_ids(LABEL, f"corraltest.run={RUN_ID}")


def assert_no_leaks(wait: float = 15.0) -> None:
    """No container of this run may remain (removal after SIGTERM may take a
    moment). Leftovers are removed, then reported."""
    deadline = time.monotonic() + wait
    left = leaked_containers()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = leaked_containers()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        pytest.fail(f"containers labelled {LABEL} left behind (now removed): {left}")


def snapshot_images(name: str) -> List[str]:
    """Ids of the snapshot images of ``name``, whoever's namespace they are
    in (label ``corral.snapshot``)."""
    out = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", "--filter", f"label=corral.snapshot={name}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return sorted(set(out.stdout.split()))


def remove_snapshot_images(name: str) -> None:
    """Removes every principal's snapshot of ``name`` (a test's cleanup:
    names are unique to the test)."""
    ids = snapshot_images(name)
    if ids:
        subprocess.run(["docker", "rmi", "-f", *ids], capture_output=True, timeout=120)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server: needs a real corral serve on a real container daemon")


@pytest.fixture(scope="session")
def corral_server() -> Iterator[LocalServer]:
    binary = corral_binary()
    if not Path(binary).is_file():
        pytest.fail(f"no corral binary at {binary}: run `cargo build --bin corral` or set CORRAL_BIN", pytrace=False)
    server = LocalServer(binary, config=server_config())
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    try:
        yield server
    finally:
        code = server.stop()
        tail = server.log_tail()
        server.close()
        assert_no_leaks()
        assert code == 0, f"corral serve exited with {code} on SIGTERM:\n{tail}"


@pytest.fixture(scope="session")
def corral_url(corral_server: LocalServer) -> str:
    return corral_server.url


@pytest.fixture
def corral_client(corral_url: str) -> Iterator[corral.Client]:
    with corral.Client(corral_url) as client:
        yield client


@pytest.fixture
def corral_sandbox(corral_client: corral.Client) -> Iterator[corral.Sandbox]:
    with corral_client.sandbox() as sb:
        yield sb


@pytest.fixture(scope="session")
def corral_spec() -> Callable[..., Dict[str, Any]]:
    def make(**keys: Any) -> Dict[str, Any]:
        spec: Dict[str, Any] = {"image": IMAGE, "labels": dict(LABELS)}
        spec.update(keys)
        return spec

    return make


def internet_binary() -> str:
    return os.environ.get("CORRAL_INTERNET_BIN") or str(REPO / "target" / "debug" / "corral-internet")


@pytest.fixture(scope="module")
def internet() -> Iterator[Dict[str, Any]]:
    """The test internet (pypi.test, evil.test), removed at the end."""
    binary = internet_binary()
    if not Path(binary).is_file():
        pytest.fail(f"no corral-internet binary at {binary}: run `cargo build --bin corral-internet`", pytrace=False)
    tag = f"corral-egtest-py-{uuid.uuid4().hex[:8]}"
    try:
        out = subprocess.run([binary, "up", tag], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"corral-internet up failed: {out.stderr}"
        yield json.loads(out.stdout)
    finally:
        subprocess.run([binary, "down", tag], capture_output=True, timeout=300)
