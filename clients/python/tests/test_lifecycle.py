"""What counts as a sandbox's activity for the service's idle timeout
(``provider.idle_timeout_ms``): what its owner does to it (a command, a
file), not what an observer reads (the list, a description, its usage), so
a dashboard or monitor that polls keeps no abandoned sandbox alive. A real
``corral serve`` with a short idle timeout; a second client polls."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

import corral
from corral.testing import LocalServer

from conftest import assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server

IDLE_MS = 3000


@pytest.fixture(scope="module")
def idle_server() -> Iterator[LocalServer]:
    cfg = server_config(provider={"idle_timeout_ms": IDLE_MS, "reap_interval_ms": 200})
    server = LocalServer(corral_binary(), config=cfg)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.close()
        assert_no_leaks()


def _poll(url: str, sandbox_id: str, stop: threading.Event, reads: list) -> None:
    """A dashboard: the list, the description and the usage, as fast as the
    service answers."""
    with corral.Client(url) as observer:
        while not stop.is_set():
            observer.list_sandboxes()
            observer.usage()
            try:
                observer.get_sandbox(sandbox_id).usage()
            except corral.SandboxNotFoundError:
                pass
            reads.append(time.monotonic())
            time.sleep(0.05)


def test_a_polled_list_keeps_no_sandbox_alive(idle_server):
    """An abandoned sandbox goes at its idle timeout while a second client
    polls the list, its description and its usage all along."""
    with corral.Client(idle_server.url) as owner:
        sb = owner.create_sandbox()
        assert sb.run("echo used").stdout == "used\n"
        used = time.monotonic()
        stop, reads = threading.Event(), []
        poller = threading.Thread(target=_poll, args=(idle_server.url, sb.id, stop, reads), daemon=True)
        poller.start()
        try:
            deadline = used + IDLE_MS / 1000 + 20
            while any(s.id == sb.id for s in owner.list_sandboxes()):
                assert time.monotonic() < deadline, "a polled sandbox outlived its idle timeout by 20 s"
                time.sleep(0.1)
            gone = time.monotonic() - used
        finally:
            stop.set()
            poller.join(timeout=30)
        assert len(reads) >= 2, "the observer did not poll"
        assert IDLE_MS / 1000 <= gone, gone
        with pytest.raises(corral.SandboxNotFoundError):
            owner.get_sandbox(sb.id)


def test_what_the_owner_does_is_activity(idle_server):
    """Commands keep a sandbox: one used every second outlives its idle
    timeout several times over."""
    with corral.Client(idle_server.url) as owner:
        sb = owner.create_sandbox()
        try:
            until = time.monotonic() + 3 * IDLE_MS / 1000
            while time.monotonic() < until:
                assert sb.run("true").exit_code == 0
                time.sleep(1)
            assert owner.get_sandbox(sb.id).id == sb.id
        finally:
            owner.delete_sandbox(sb.id)
