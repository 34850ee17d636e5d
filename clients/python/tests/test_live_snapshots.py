"""Live snapshots through a real ``corral serve``: ``sb.snapshot(name,
kind="live")`` of a running gVisor sandbox without network (the operator's
tier) keeps its processes, and ``client.fork(name, n)`` restores sandboxes
that go on from there. The attack: another tenant tries to fork, list,
read and delete the live snapshot, plainly and by its qualified name, and
must find nothing. Needs runsc registered as ``runsc-live`` and the daemon's
``experimental`` setting (``scripts/ensure-gvisor.sh``)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from typing import Iterator

import httpx
import pytest

import corral
from corral.testing import LocalServer
from conftest import LABELS, corral_binary, running_server

pytestmark = pytest.mark.server

TOKENS = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}

# A counter in a shell variable, written out each tenth of a second (renamed
# into place, so a reader never finds the file empty).
COUNTER = "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &"


def _live_ready() -> str:
    """Why live snapshots cannot run here, or ''."""
    info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    if info.returncode != 0 or "runsc-live" not in json.loads(info.stdout or "{}"):
        return "runtime runsc-live is not registered: scripts/ensure-gvisor.sh"
    v = subprocess.run(["docker", "version", "--format", "{{.Server.Experimental}}"], capture_output=True, text=True)
    if v.stdout.strip() != "true":
        return "the daemon's experimental setting is off: scripts/ensure-gvisor.sh"
    return ""


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    why = _live_ready()
    if why:
        pytest.skip(why)
    with running_server(
        config={
            "defaults": {
                "image": "corral-test/busybox",
                "isolation": "gvisor",
                "network": "none",
                "labels": dict(LABELS),
            },
            "server": {
                "token": secrets.token_hex(16),
                "tenants": {name: {"token": token} for name, token in TOKENS.items()},
            },
        },
    ) as srv:
        yield srv


def _client(server: LocalServer, who: str) -> corral.Client:
    return corral.Client(server.url, token=TOKENS[who])


def _count(sb: corral.Sandbox) -> int:
    """The background counter, which must be moving."""
    out = sb.run("cat /tmp/count; sleep 0.5; cat /tmp/count").stdout.split()
    a, b = int(out[0]), int(out[1])
    assert b > a, f"the counter stands still at {a}"
    return a


def test_a_live_snapshot_forks_running_processes_and_no_other_tenant_reaches_it(server: LocalServer) -> None:
    alice, bob = _client(server, "alice"), _client(server, "bob")
    name = f"live-{secrets.token_hex(4)}"
    forks: list = []
    with corral.Sandbox.create(client=alice) as sb:
        sb.run(COUNTER)
        time.sleep(0.5)
        before = _count(sb)
        snap = sb.snapshot(name, kind="live")
        assert snap.kind == "live", snap
        try:
            assert _count(sb) >= before
            listed = {s.name: s.kind for s in alice.snapshots()}
            assert listed.get(name) == "live", listed
            # Another tenant: nothing to fork, list, read or delete, by
            # either name.
            for target in (name, f"alice/{name}"):
                with pytest.raises((corral.SnapshotNotFoundError, corral.ForbiddenError)):
                    bob.fork(target, 1)
                with pytest.raises((corral.SnapshotNotFoundError, corral.ForbiddenError)):
                    bob.snapshot_info(target)
                with pytest.raises((corral.SnapshotNotFoundError, corral.ForbiddenError)):
                    bob.delete_snapshot(target)
            assert name not in {s.name for s in bob.snapshots()}
            forks = alice.fork(name, 2)
            assert len({f.id for f in forks} | {sb.id}) == 3
            for f in forks:
                assert _count(f) >= before, "a fork started over"
            forks[0].run("echo mine > /tmp/mine")
            assert forks[1].run("cat /tmp/mine 2>/dev/null || echo absent").stdout == "absent\n"
        finally:
            for f in forks:
                f.delete()
            alice.delete_snapshot(name)
    assert name not in {s.name for s in alice.snapshots()}


def test_pause_to_disk_through_the_service_and_no_other_tenant_pauses_it(server: LocalServer) -> None:
    alice = _client(server, "alice")
    with corral.Sandbox.create(client=alice) as sb:
        sb.run(COUNTER)
        time.sleep(0.5)
        before = _count(sb)
        # Another tenant can neither pause nor resume it.
        def as_bob(action: str) -> int:
            url = f"{server.url}/v1/sandboxes/{sb.id}/{action}"
            return httpx.post(url, headers={"Authorization": f"Bearer {TOKENS['bob']}"}, timeout=30).status_code

        assert as_bob("pause") == 404
        assert sb.pause() == "disk"
        with pytest.raises(corral.ConflictError):
            sb.pause()
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}}", sb.container_id], capture_output=True, text=True
        ).stdout.strip()
        assert state == "false", state
        r = sb.run("echo no", raise_on_failure=False)
        assert r.failure is not None and "paused" in r.failure.message, r
        assert as_bob("resume") == 404
        sb.resume()
        with pytest.raises(corral.ConflictError):
            sb.resume()
        assert _count(sb) >= before


def test_e2b_fork_full_snapshot_and_pause_keep_running_processes() -> None:
    """Through E2B's own SDK, on the operator's gVisor tier without
    network: `fork(count)` and `create_snapshot(mode="full")` carry the
    running processes, and `pause()` goes to disk (the container stops)
    while `connect()` brings the same process back."""
    why = _live_ready()
    if why:
        pytest.skip(why)
    from e2b import Sandbox as E2bSandbox
    from test_e2b import _docker_state, e2b_service

    def e2b_count(sbx: E2bSandbox) -> int:
        out = sbx.commands.run("cat /tmp/count; sleep 0.5; cat /tmp/count").stdout.split()
        a, b = int(out[0]), int(out[1])
        assert b > a, f"the counter stands still at {a}"
        return a

    with e2b_service(defaults={"isolation": "gvisor", "network": "none"}) as server:
        sbx = E2bSandbox.create(timeout=120)
        children: list = []
        snap = None
        try:
            sbx.commands.run(COUNTER + " sleep 0.5")
            before = e2b_count(sbx)
            children += sbx.fork(count=2, timeout=120)
            assert len({f.sandbox_id for f in children} | {sbx.sandbox_id}) == 3
            for f in children:
                assert e2b_count(f) >= before, "a fork started over"
            # Each fork has its own envd token; the source's opens none of
            # them (nor a sibling's the other).

            def read_as(target: E2bSandbox, token: str) -> int:
                headers = {"E2b-Sandbox-Id": target.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
                return httpx.get(f"{server['url']}/files", params={"path": "/tmp/count"}, headers=headers, timeout=30).status_code

            tokens = {sbx._envd_access_token} | {f._envd_access_token for f in children}
            assert len(tokens) == 3
            for f, other in ((children[0], children[1]), (children[1], children[0])):
                assert read_as(f, f._envd_access_token) == 200
                assert read_as(f, sbx._envd_access_token) == 401
                assert read_as(f, other._envd_access_token) == 401
            snap = sbx.create_snapshot(mode="full")
            child = E2bSandbox.create(snap.snapshot_id, timeout=120)
            children.append(child)
            assert e2b_count(child) >= before
            # The counter's loop: the oldest sh (a newer one can be the
            # loop's own child between its fork and its exec of sleep).
            holder = sbx.commands.run("pidof sh | tr ' ' '\\n' | sort -n | head -1").stdout.strip()
            sbx.pause()
            assert _docker_state(server, sbx.sandbox_id) == "exited"
            # A paused sandbox forks (E2B's own service answers 409).
            from_paused = E2bSandbox.fork(sbx.sandbox_id, count=1, timeout=120)
            assert all(isinstance(f, E2bSandbox) for f in from_paused), from_paused
            children += from_paused
            assert e2b_count(from_paused[0]) >= before
            resumed = E2bSandbox.connect(sbx.sandbox_id)
            assert resumed.commands.run(f"kill -0 {holder} && echo alive").stdout == "alive\n"
            assert e2b_count(resumed) >= before
        finally:
            for f in children:
                f.kill()
            sbx.kill()
            if snap is not None:
                E2bSandbox.delete_snapshot(snap.snapshot_id)


def test_mcp_snapshot_live_and_restore_bring_the_processes_back() -> None:
    """`corral mcp` on the operator's gVisor tier without network: a
    `snapshot` with live true keeps the running counter, and `restore`
    replaces the session's sandbox with one restored from it, the counter
    going on; without the tier it says why."""
    why = _live_ready()
    if why:
        pytest.skip(why)
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from test_mcp import Labelled, _call, _env, _is_error, _ok, _text

    def _numbers(text: str) -> list:
        """The numbers a command printed (its stdout section of run_command's
        answer, not the exit code or usage lines)."""
        assert "--- stdout ---" in text, text
        out = text.split("--- stdout ---", 1)[1].split("---", 1)[0]
        return [int(w) for w in out.split() if w.isdigit()]

    lab = Labelled("mcp-live", defaults="  isolation: gvisor\n  network: none\n")
    params = StdioServerParameters(command=corral_binary(), args=["--config", lab.config, "mcp"], env=_env())
    name = f"mcp-live-{secrets.token_hex(4)}"

    async def main() -> None:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(60):
                    await session.initialize()
                await _ok(session, "run_command", {"command": COUNTER + " sleep 0.5"})
                first = _numbers(await _ok(session, "run_command", {"command": "cat /tmp/count"}))[0]
                text = await _ok(session, "snapshot", {"name": name, "live": True})
                assert name in text, text
                before = lab.ids()
                text = await _ok(session, "restore", {"name": name})
                assert "restored with the processes" in text, text
                assert lab.wait_at_most(1, 30) != before
                out = await _ok(session, "run_command", {"command": "cat /tmp/count; sleep 0.5; cat /tmp/count"})
                a, b = _numbers(out)[:2]
                assert b > a >= first, out
                # Another MCP session (the model of another run) can neither
                # restore it nor replace it with a snapshot of its own.
                async with stdio_client(params) as (read2, write2):
                    async with ClientSession(read2, write2) as other:
                        with anyio.fail_after(60):
                            await other.initialize()
                        result = await _call(other, "restore", {"name": name})
                        assert _is_error(result) and "no such snapshot" in _text(result), _text(result)
                        await _ok(other, "run_command", {"command": "echo theirs > /tmp/count"})
                        await _ok(other, "snapshot", {"name": name, "live": True})
                out = await _ok(session, "run_command", {"command": "sleep 0.3; cat /tmp/count"})
                assert _numbers(out)[0] > a, out
                text = await _ok(session, "restore", {"name": name})
                out = await _ok(session, "run_command", {"command": "cat /tmp/count"})
                assert "theirs" not in out and _numbers(out)[0] >= first, out

    try:
        anyio.run(main)
    finally:
        lab.close()


def test_a_sandbox_paused_to_disk_outlives_a_restart_of_the_service(tmp_path) -> None:
    """`corral serve` stops and starts again (same configuration and
    snapshot directory): a sandbox paused to disk through the REST API and
    one paused through E2B's SDK are served again, paused, by the new
    service, owned as before: another tenant finds neither, and a resume
    (`connect` for E2B, with the sandbox's own envd token) brings back the
    shell counting in memory."""
    why = _live_ready()
    if why:
        pytest.skip(why)
    from e2b import Sandbox as E2bSandbox
    from corral.testing import free_port

    snapshots = tmp_path / "snapshots"
    snapshots.mkdir(mode=0o700)
    e2b_port = free_port()
    config = {
        "defaults": {"image": "corral-test/busybox", "isolation": "gvisor", "network": "none", "labels": dict(LABELS)},
        "server": {
            "token": secrets.token_hex(16),
            "tenants": {name: {"token": token} for name, token in TOKENS.items()},
            "e2b_listen": f"127.0.0.1:{e2b_port}",
        },
        "snapshots": {"dir": str(snapshots)},
    }
    e2b_url = f"http://127.0.0.1:{e2b_port}"
    e2b_env = {"api_key": TOKENS["alice"], "api_url": e2b_url, "sandbox_url": e2b_url}
    srv = LocalServer(corral_binary(), config=config)
    srv.start()
    ids: list = []
    e2b_id = None
    try:
        alice = _client(srv, "alice")
        sb = corral.Sandbox.create(client=alice)
        ids.append(sb.id)
        sb.run(COUNTER)
        time.sleep(0.5)
        before = _count(sb)
        assert sb.pause() == "disk"
        sbx = E2bSandbox.create(timeout=300, metadata={"run": "restart"}, **e2b_env)
        e2b_id = sbx.sandbox_id
        envd_token = sbx._envd_access_token
        sbx.commands.run(COUNTER + " sleep 0.5")
        e2b_before = int(sbx.commands.run("cat /tmp/count").stdout)
        sbx.pause()

        e2b_container = httpx.get(
            f"{srv.url}/v1/sandboxes/{e2b_id}", headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=30
        ).json()["container_id"]
        assert srv.stop() == 0, srv.log_tail()
        # Both stay, stopped, with their checkpoints, marked for every corral
        # on the host (the other tests' services and their orphan reapers).
        for container in (sb.container_id, e2b_container):
            state = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Status}} {{.Name}}", container], capture_output=True, text=True
            ).stdout.split()
            assert state and state[0] == "exited" and state[1].startswith("/corral-paused-"), (container, state)
        srv.start()

        alice, bob = _client(srv, "alice"), _client(srv, "bob")
        assert sb.id in {i.id for i in alice.list_sandboxes()}
        assert sb.id not in {i.id for i in bob.list_sandboxes()}
        for action in ("resume", "pause"):
            url = f"{srv.url}/v1/sandboxes/{sb.id}/{action}"
            r = httpx.post(url, headers={"Authorization": f"Bearer {TOKENS['bob']}"}, timeout=30)
            assert r.status_code == 404, (action, r.status_code, r.text)
        from e2b.exceptions import NotFoundException

        with pytest.raises(NotFoundException):
            E2bSandbox.connect(e2b_id, api_key=TOKENS["bob"], api_url=e2b_url, sandbox_url=e2b_url)

        again = alice.get_sandbox(sb.id)
        r = again.run("echo no", raise_on_failure=False)
        assert r.failure is not None and "paused" in r.failure.message, r
        again.resume()
        # Its container's owner labels name the first service: it stays
        # marked, or another corral's reaper would take it for an orphan.
        name = subprocess.run(
            ["docker", "inspect", "-f", "{{.Name}}", sb.container_id], capture_output=True, text=True
        ).stdout.strip()
        assert name.startswith("/corral-paused-"), name
        assert _count(again) >= before, "the counter started over"
        # The store of checkpoints and records is nowhere inside.
        seen = again.run(f"test -e {snapshots} && echo present; find / -xdev -name '*.live' 2>/dev/null").stdout
        assert seen == "", seen

        resumed = E2bSandbox.connect(e2b_id, **e2b_env)
        assert resumed._envd_access_token == envd_token
        assert resumed.get_info().metadata.get("run") == "restart"
        out = resumed.commands.run("cat /tmp/count; sleep 0.5; cat /tmp/count").stdout.split()
        assert int(out[1]) > int(out[0]) >= e2b_before, out
    finally:
        if srv.proc is not None:
            for sid in ids:
                try:
                    _client(srv, "alice").delete_sandbox(sid)
                except Exception:
                    pass
            if e2b_id is not None:
                try:
                    E2bSandbox.kill(e2b_id, **e2b_env)
                except Exception:
                    pass
        code = srv.stop()
        srv.close()
        from conftest import assert_no_leaks

        assert_no_leaks()
        assert code == 0
    # Deleting them removed their checkpoints and records.
    assert not list((snapshots / "paused").glob("*")), list((snapshots / "paused").iterdir())
