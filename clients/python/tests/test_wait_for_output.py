"""``wait_for_output``: what ends a command whose background job writes to
its output, through a real ``corral serve`` on a real daemon."""

from __future__ import annotations

import time

import pytest

import corral

pytestmark = pytest.mark.server

# A foreground line, then a job that prints two seconds later and then
# leaves a mark in the file system.
JOB = "echo fg; (sleep 2; echo bg; touch /tmp/late) &"


def test_by_default_the_command_ends_with_its_main_process(corral_sandbox):
    start = time.monotonic()
    r = corral_sandbox.run(JOB)
    assert time.monotonic() - start < 2
    assert (r.exit_code, r.stdout) == (0, "fg\n")
    # The job died writing to the closed pipe: its file never appears.
    time.sleep(3)
    assert corral_sandbox.run("test -e /tmp/late").exit_code == 1


def test_wait_for_output_returns_the_jobs_output(corral_sandbox):
    start = time.monotonic()
    r = corral_sandbox.run(JOB + " exit 4", wait_for_output=True)
    assert time.monotonic() - start >= 2
    assert (r.exit_code, r.stdout, r.failure) == (4, "fg\nbg\n", None)
    assert corral_sandbox.run("test -e /tmp/late").exit_code == 0

    events = list(corral_sandbox.stream("echo a; (sleep 1; echo b) &", wait_for_output=True))
    assert "".join(ev.text for ev in events if ev.is_output) == "a\nb\n"
    assert events[-1].result.exit_code == 0


def test_wait_for_output_is_bounded_by_the_timeout(corral_sandbox):
    start = time.monotonic()
    with pytest.raises(corral.SandboxTimeoutError) as ei:
        corral_sandbox.run("echo fg; (sleep 30; echo bg) &", timeout=1, wait_for_output=True)
    assert time.monotonic() - start < 15
    assert ei.value.result is not None and ei.value.result.stdout == "fg\n"
    # The job was killed with the command.
    assert "sleep 30" not in corral_sandbox.run("ps -o args").stdout


@pytest.mark.asyncio
async def test_async_client_sends_wait_for_output(corral_url):
    async with corral.AsyncClient(corral_url) as client:
        async with client.sandbox() as sb:
            r = await sb.run("echo fg; (sleep 1; echo bg) &", wait_for_output=True)
            assert (r.exit_code, r.stdout) == (0, "fg\nbg\n")
            r = await sb.run("echo fg; (sleep 1; echo bg) &")
            assert (r.exit_code, r.stdout) == (0, "fg\n")
