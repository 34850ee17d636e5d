"""Pristine reset through the client, against a real ``corral serve`` on a
real daemon: a sandbox created with ``pristine=True`` is reset in place
(files outside /tmp and background processes gone); any other is reset by
replacing its container, and the result says why."""

from __future__ import annotations

import pytest

import corral

pytestmark = pytest.mark.server

MARKERS = "/etc/corral-reset-marker /root/corral-reset-marker /tmp/corral-reset-marker"

# Leaves files outside /tmp (root file system) and in /tmp (tmpfs), and a
# background process that would outlive the command.
MESS = (
    f"for f in {MARKERS}; do echo dirty > $f; done; "
    "sleep 1000 >/dev/null 2>&1 &"
)

# What is left of the mess: the markers that exist, then the number of
# sleep processes.
LOOK = (
    f"for f in {MARKERS}; do test -e $f && echo $f; done; "
    "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c '^sleep$' || true"
)


def leftovers(r: corral.CommandResult) -> tuple[list[str], int]:
    lines = r.check().stdout.split()
    return lines[:-1], int(lines[-1])


def make_mess(sb) -> None:
    sb.run(MESS, timeout=30).check()
    files, sleeping = leftovers(sb.run(LOOK, timeout=30))
    assert files == MARKERS.split() and sleeping == 1, (files, sleeping)


def test_a_pristine_sandbox_is_reset_in_place(corral_client: corral.Client) -> None:
    with corral_client.sandbox(pristine=True) as sb:
        assert sb.info.resets_in_place, sb.info
        assert sb.info.reset_unavailable_reason is None
        before = sb.container_id
        make_mess(sb)
        sb.run("cd /tmp && export X=1", timeout=30)
        with sb.shell("main") as sh:
            sh.run("export KEPT=1")
            result = sb.reset()
            assert isinstance(result, corral.ResetResult)
            assert result.mode == "in_place" and result.in_place, result
            assert result.fallback_reason is None, result
            # The background sleep at least; the shell too.
            assert result.killed >= 1, result
            assert result.elapsed_ms >= 0
            assert leftovers(sb.run(LOOK, timeout=30)) == ([], 0)
            # Shell sessions are gone with their processes; the next
            # command starts a fresh one.
            assert sb.shells() == []
            assert sh.run('echo "[$KEPT]"', timeout=30).stdout == "[]\n"
        # Same container, same handle.
        assert sb.refresh().container_id == before
        assert sb.run("echo again", timeout=30).check().stdout == "again\n"
        # And again: every reset returns to the same start.
        make_mess(sb)
        assert sb.reset().in_place
        assert leftovers(sb.run(LOOK, timeout=30)) == ([], 0)


def test_a_plain_sandbox_is_replaced_and_says_why(corral_client: corral.Client) -> None:
    with corral_client.sandbox() as sb:
        assert not sb.info.resets_in_place, sb.info
        assert (sb.info.reset_unavailable_reason or "").startswith("pristine is false"), sb.info
        before = sb.container_id
        make_mess(sb)
        result = sb.reset()
        assert result.mode == "replaced" and not result.in_place, result
        assert (result.fallback_reason or "").startswith("pristine is false"), result
        assert result.killed == 0
        assert leftovers(sb.run(LOOK, timeout=30)) == ([], 0)
        # A new container under the same handle; the info followed it.
        assert sb.container_id != before
        assert sb.refresh().container_id == sb.container_id


def test_reset_of_a_deleted_sandbox_is_not_found(corral_client: corral.Client) -> None:
    sb = corral_client.sandbox()
    sb.delete()
    with pytest.raises(corral.SandboxNotFoundError):
        sb.reset()


@pytest.mark.asyncio
async def test_async_reset(corral_url: str) -> None:
    async with corral.AsyncClient(corral_url) as client:
        async with client.sandbox(pristine=True) as sb:
            assert sb.info.resets_in_place, sb.info
            await sb.run("echo dirty > /etc/corral-reset-marker; sleep 1000 >/dev/null 2>&1 &", timeout=30)
            result = await sb.reset()
            assert result.in_place and result.killed >= 1, result
            r = await sb.run("test -e /etc/corral-reset-marker && echo kept || echo gone", timeout=30)
            assert r.stdout == "gone\n"
        async with client.sandbox(pristine=False) as sb:
            result = await sb.reset()
            assert result.mode == "replaced" and result.fallback_reason, result
