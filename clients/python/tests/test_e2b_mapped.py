"""E2B features mapped onto corral's own, through the real ``e2b`` SDK
(sync and async) against a real ``corral serve`` (the fixtures of
test_e2b.py): file metadata from the agent's listing (owner and group
names from the sandbox's own /etc/passwd and /etc/group, mode,
modification time, symlink targets), ``get_host(port)`` relayed to a
server inside the sandbox (streamed, and closed to callers without the
traffic access token when ``allowPublicTraffic`` is false), and
``allow_internet_access`` / ``network`` as corral's ``network: none`` and
egress allow-lists, attacked from inside a sandbox against a real test
internet (``corral-internet``) and checked by ``server.policy``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, Dict, Iterator

import httpx
import pytest

import corral

from test_e2b import (  # noqa: F401  (fixtures)
    TOKEN,
    _docker_state,
    _garbage_collected_inside_the_pool_lock,
    e2b,
    e2b_server,
    e2b_service,
    sbx,
)
from e2b import AsyncSandbox, Sandbox  # noqa: E402
from e2b.exceptions import SandboxException  # noqa: E402


pytestmark = [
    pytest.mark.server,
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the file's async tests: the SDK keeps its
    transport across calls, and 2.7.0's is bound to the loop it started
    on."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()

# -- file metadata -----------------------------------------------------------

# A user and a group of the sandbox's own, a file of theirs with a known
# time and mode, a link to it, and a file of ids nobody names.
OWNED = (
    "echo 'alice:x:1234:4321::/:/bin/sh' >> /etc/passwd && "
    "echo 'staff2:x:4321:' >> /etc/group && "
    "mkdir -p /m && echo hello > /m/f && chown 1234:4321 /m/f && chmod 640 /m/f && "
    "touch -d '2020-01-02 03:04:05' /m/f && ln -s /m/f /m/l && "
    "touch /m/n && chown 777:888 /m/n"
)
WHEN = datetime(2020, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _utc(t: datetime) -> datetime:
    """The SDK's time in UTC (2.7.0 gives it naive, in UTC)."""
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _check_entries(info_f: Any, info_l: Any, listing: Dict[str, Any]) -> None:
    assert (info_f.owner, info_f.group) == ("alice", "staff2"), info_f
    assert info_f.mode & 0o7777 == 0o640 and info_f.permissions == "-rw-r-----", info_f
    assert _utc(info_f.modified_time) == WHEN, info_f
    assert info_f.symlink_target is None
    # Stat follows the link: the target's metadata, and where it leads.
    assert info_l.symlink_target == "/m/f" and info_l.owner == "alice", info_l
    f, n = listing["f"], listing["n"]
    assert (f.owner, f.group, _utc(f.modified_time)) == ("alice", "staff2", WHEN), f
    # SDKs without FileType.SYMLINK (2.7.0) leave links out of listings.
    if hasattr(e2b.FileType, "SYMLINK"):
        assert listing["l"].symlink_target == "/m/f", listing
    # Ids no file names are answered as numbers, as envd does.
    assert (n.owner, n.group) == ("777", "888"), n
    assert abs((_utc(n.modified_time) - datetime.now(timezone.utc)).total_seconds()) < 600, n


def test_entry_info_has_owner_group_mode_time_and_link_target(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    sbx.commands.run(OWNED)
    listing = {e.name: e for e in sbx.files.list("/m")}
    _check_entries(sbx.files.get_info("/m/f"), sbx.files.get_info("/m/l"), listing)
    # The same data through corral's own file API (REST), not an E2B path.
    r = httpx.get(
        f"{e2b_server['corral']}/v1/sandboxes/{sbx.sandbox_id}/files/list",
        params={"path": "/m"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    rest = {e["name"]: e for e in r.json()["entries"]}
    assert (rest["f"]["owner"], rest["f"]["group"], rest["f"]["uid"], rest["f"]["gid"]) == ("alice", "staff2", 1234, 4321)
    assert rest["f"]["mtime"] == WHEN.timestamp()
    assert (rest["n"]["owner"], rest["n"]["group"], rest["n"]["uid"]) == (None, None, 777)
    # And corral's Python client reads them.
    with corral.Client(e2b_server["corral"], token=TOKEN) as client:
        mine = {e.name: e for e in client.sandbox(session=sbx.sandbox_id).list_files("/m")}
    assert (mine["f"].owner, mine["f"].gid, mine["f"].mtime) == ("alice", 4321, WHEN.timestamp()), mine["f"]
    assert (mine["n"].owner, mine["n"].uid) == (None, 777), mine["n"]


def test_entry_info_async(e2b_server: Dict[str, str], loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=120)
        try:
            await sandbox.commands.run(OWNED)
            listing = {e.name: e for e in await sandbox.files.list("/m")}
            _check_entries(await sandbox.files.get_info("/m/f"), await sandbox.files.get_info("/m/l"), listing)
        finally:
            await sandbox.kill()

    loop.run_until_complete(main())


# -- autoPause ---------------------------------------------------------------


def _auto_paused(timeout: int) -> Sandbox:
    import inspect

    if "lifecycle" in inspect.signature(Sandbox.create).parameters:
        return Sandbox.create(timeout=timeout, lifecycle={"on_timeout": "pause"})
    return Sandbox.beta_create(timeout=timeout, auto_pause=True)  # 2.7.0


def test_auto_pause_pauses_at_the_timeout_and_connect_resumes(e2b_server: Dict[str, str]) -> None:
    sandbox = _auto_paused(3)
    try:
        keeper = sandbox.commands.run("sleep 600", background=True)
        for _ in range(100):
            if Sandbox.get_info(sandbox.sandbox_id).state == e2b.SandboxState.PAUSED:
                break
            time.sleep(0.2)
        # Paused, not released: the container is frozen, with its processes.
        assert Sandbox.get_info(sandbox.sandbox_id).state == e2b.SandboxState.PAUSED
        assert _docker_state(e2b_server, sandbox.sandbox_id) == "paused"
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
        assert _docker_state(e2b_server, sandbox.sandbox_id) == "running"
        assert resumed.commands.run(f"kill -0 {keeper.pid} && echo alive").stdout == "alive\n"
        keeper.disconnect()
    finally:
        sandbox.kill()
    # What corral cannot do is refused by name.
    for body, named in (
        ({"autoPause": True, "autoResume": {"enabled": True}}, "autoResume"),
        ({"autoPause": True, "autoPauseMemory": False}, "autoPauseMemory"),
    ):
        r = httpx.post(
            f"{e2b_server['url']}/sandboxes",
            json={"templateID": "base", **body},
            headers={"X-API-KEY": TOKEN},
            timeout=30,
        )
        assert r.status_code == 400 and named in r.json()["message"], r.text


# -- get_metrics -------------------------------------------------------------


def test_get_metrics_reads_the_sandboxs_usage(e2b_server: Dict[str, str], sbx: Sandbox, loop: asyncio.AbstractEventLoop) -> None:
    # A tmpfs file counts as the sandbox's memory.
    sbx.commands.run("mkdir -p /dev/shm && dd if=/dev/zero of=/dev/shm/m bs=1M count=16 2>/dev/null; true")
    (m,) = sbx.get_metrics()
    assert m.cpu_count >= 1 and 0 <= m.cpu_used_pct <= 100, m
    assert m.mem_used > 0, m
    assert abs((_utc(m.timestamp) - datetime.now(timezone.utc)).total_seconds()) < 120, m
    # A window that is over: nothing in it.
    assert sbx.get_metrics(end=datetime(2020, 1, 1, tzinfo=timezone.utc)) == []

    async def main() -> None:
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        (m,) = await again.get_metrics()
        assert m.mem_used > 0, m

    loop.run_until_complete(main())


# -- get_host(port) ----------------------------------------------------------

# A CGI script of the sandbox's httpd that sends a first line, then waits
# for /tmp/go before the rest: a proxy that buffered would hold the first
# line back.
TRICKLE = (
    "mkdir -p /www/cgi-bin && printf '%s\\n' '#!/bin/sh' "
    "\"printf 'Content-Type: text/plain\\r\\n\\r\\nfirst\\n'\" "
    "'while [ ! -f /tmp/go ]; do sleep 0.1; done' 'echo second' > /www/cgi-bin/trickle "
    "&& chmod 755 /www/cgi-bin/trickle"
)


def _via_host(url: str, host: str, path: str, **headers: str) -> httpx.Response:
    """GET `path` on `host` (a get_host answer, PORT-ID.DOMAIN whose DOMAIN
    is the listener): sent to the listener with that Host, as a resolver
    of *.DOMAIN would."""
    return httpx.get(f"{url}{path}", headers={"Host": host, **headers}, timeout=30)


def _listening(sandbox: Sandbox, port: int) -> None:
    """Waits until something listens on `port` in the sandbox (without
    connecting to it)."""
    check = f"for i in $(seq 100); do netstat -ltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; exit 1"
    sandbox.commands.run(check)


def _serve(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p /www && echo 'hello from inside' > /www/hello.txt")
    sandbox.commands.run("httpd -f -p 8000 -h /www", background=True)
    _listening(sandbox, 8000)


def test_get_host_reaches_a_server_in_the_sandbox_streamed(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    _serve(sbx)
    host = sbx.get_host(8000)
    assert host.startswith(f"8000-{sbx.sandbox_id}."), host
    r = _via_host(e2b_server["url"], host, "/hello.txt")
    assert r.status_code == 200 and r.text == "hello from inside\n", (r.status_code, r.text)
    # The path is the server's own: /files is not envd's here.
    assert _via_host(e2b_server["url"], host, "/files").status_code == 404
    # Nothing listening: a bad gateway, not a hang.
    assert _via_host(e2b_server["url"], sbx.get_host(8009), "/").status_code == 502

    sbx.commands.run(TRICKLE)
    with httpx.stream(
        "GET", f"{e2b_server['url']}/cgi-bin/trickle", headers={"Host": host}, timeout=20
    ) as r:
        assert r.status_code == 200, (r.status_code, r.read())
        chunks = r.iter_raw()
        first = next(chunks)
        assert first.startswith(b"first"), first
        sbx.commands.run("touch /tmp/go")
        rest = first + b"".join(chunks)
    assert rest == b"first\nsecond\n", rest


def test_private_ports_need_the_traffic_token(e2b_server: Dict[str, str]) -> None:
    private = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    public = Sandbox.create(timeout=120)
    try:
        _serve(private)
        host = private.get_host(8000)
        url = e2b_server["url"]
        refused = _via_host(url, host, "/hello.txt")
        assert refused.status_code == 403 and "E2b-Traffic-Access-Token" in refused.text, refused.text
        # Another sandbox's token opens nothing here.
        other = _via_host(url, host, "/hello.txt", **{"E2b-Traffic-Access-Token": public._envd_access_token or "x"})
        assert other.status_code == 403
        token = getattr(private, "traffic_access_token", None) or private._envd_access_token
        ok = _via_host(url, host, "/hello.txt", **{"E2b-Traffic-Access-Token": token})
        assert ok.status_code == 200 and ok.text == "hello from inside\n", ok.text
    finally:
        private.kill()
        public.kill()


def test_get_host_async(e2b_server: Dict[str, str], loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=120)
        try:
            await sandbox.commands.run("mkdir -p /www && echo async-inside > /www/a.txt")
            await sandbox.commands.run("httpd -f -p 8000 -h /www", background=True)
            async with httpx.AsyncClient(timeout=30) as http:
                for _ in range(100):
                    r = await http.get(f"{e2b_server['url']}/a.txt", headers={"Host": sandbox.get_host(8000)})
                    if r.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
            assert r.status_code == 200 and r.text == "async-inside\n", (r.status_code, r.text)
        finally:
            await sandbox.kill()

    loop.run_until_complete(main())


# -- network -----------------------------------------------------------------


def _reaches(sandbox: Sandbox, target: str) -> bool:
    r = sandbox.commands.run(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' {target} || true")
    return r.stdout.strip() not in ("", "000")


def test_network_options_are_corrals_egress_and_policy(internet: Dict[str, Any]) -> None:
    with e2b_service(
        defaults={"image": internet["image"]},
        daemon={"egress_network": internet["network"]},
        server={"policy": {"egress_allow": ["pypi.test", "evil.test"]}},
    ) as server:
        allowed = Sandbox.create(timeout=120, network={"allow_out": ["pypi.test"], "deny_out": ["0.0.0.0/0"]})
        closed = Sandbox.create(timeout=120, allow_internet_access=False)
        try:
            # The allow-list: its name reaches out, another does not.
            assert _reaches(allowed, "http://pypi.test/")
            assert not _reaches(allowed, "http://evil.test/")
            # Internet access off: nothing, by name or by address.
            for target in ("http://pypi.test/", f"http://{internet['pypi_ip']}/", f"http://{internet['evil_ip']}/"):
                assert not _reaches(closed, target), target
            ifaces = closed.commands.run("ls /sys/class/net").stdout.split()
            assert ifaces == ["lo"], ifaces
        finally:
            allowed.kill()
            closed.kill()
        # server.policy checks it as a REST create's spec.network.
        with pytest.raises(SandboxException) as e:
            Sandbox.create(timeout=60, network={"allow_out": ["other.test"], "deny_out": ["0.0.0.0/0"]})
        assert "network.egress.allow" in str(e.value) and "other.test" in str(e.value), e.value
        # What corral cannot map is refused by name.
        for network, named in (
            ({"deny_out": ["1.2.3.4"]}, "network.denyOut"),
            ({"allow_out": ["0.0.0.0/0"], "deny_out": ["0.0.0.0/0"]}, "network.allowOut[0]"),
            ({"mask_request_host": "x"}, "network.maskRequestHost"),
        ):
            with pytest.raises(SandboxException) as e:
                Sandbox.create(timeout=60, network=network)
            assert named in str(e.value), (network, e.value)
        assert server["url"]


def test_network_options_async(internet: Dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        closed = await AsyncSandbox.create(timeout=120, allow_internet_access=False)
        try:
            r = await closed.commands.run("curl -s -m 5 -o /dev/null -w '%{http_code}' http://pypi.test/ || true")
            assert r.stdout.strip() in ("", "000"), r.stdout
            assert (await closed.commands.run("ls /sys/class/net")).stdout.split() == ["lo"]
        finally:
            await closed.kill()

    with e2b_service(defaults={"image": internet["image"]}, daemon={"egress_network": internet["network"]}):
        loop.run_until_complete(main())


# -- snapshots and forks -------------------------------------------------------


def _fork_bases(server: Dict[str, str]) -> list:
    """The snapshots under E2B forks that corral still keeps (REST, as the
    operator)."""
    r = httpx.get(f"{server['corral']}/v1/snapshots", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == 200, r.text
    return [s["name"] for s in r.json()["snapshots"] if "e2b-fork-" in s["name"]]


def test_snapshots_and_forks_are_corrals(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    if not hasattr(Sandbox, "fork"):
        pytest.skip(f"e2b {e2b.__version__ if hasattr(e2b, '__version__') else ''} has no fork or snapshot API")
    from test_e2b import OTHER_TOKEN
    from e2b.exceptions import NotFoundException

    sbx.files.write("/state.txt", "prepared")
    info = sbx.create_snapshot()
    sid = info.snapshot_id
    try:
        assert info.names == [sid]
        mine = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
        assert sid in mine, mine
        # Another tenant neither sees, forks nor deletes it.
        theirs = [s.snapshot_id for s in Sandbox.list_snapshots(api_key=OTHER_TOKEN).next_items()]
        assert sid not in theirs, theirs
        assert Sandbox.delete_snapshot(sid, api_key=OTHER_TOKEN) is False
        with pytest.raises(NotFoundException):
            Sandbox._cls_fork_sandbox(sbx.sandbox_id, count=1, api_key=OTHER_TOKEN)  # type: ignore[attr-defined]
        # To another tenant the name is no snapshot, only an image it may not run.
        with pytest.raises(Exception, match="is not allowed: it is not on the daemon"):
            Sandbox.create(sid, api_key=OTHER_TOKEN, timeout=60)

        # A sandbox started from the snapshot has its file system.
        child = Sandbox.create(sid, timeout=120)
        try:
            assert child.files.read("/state.txt") == "prepared"
        finally:
            child.kill()

        # A fork: count sandboxes of the state now, each its own.
        sbx.files.write("/state.txt", "forked")
        forks = sbx.fork(count=2, timeout=120)
        try:
            assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
            assert len({f.sandbox_id for f in forks} | {sbx.sandbox_id}) == 3
            for i, f in enumerate(forks):
                assert f.files.read("/state.txt") == "forked"
                f.files.write("/state.txt", f"fork {i}")
            assert [f.files.read("/state.txt") for f in forks] == ["fork 0", "fork 1"]
            assert sbx.files.read("/state.txt") == "forked"
            assert sbx.is_running()
        finally:
            for f in forks:
                if isinstance(f, Sandbox):
                    f.kill()
        # The snapshot under the forks is gone with them, and never listed.
        assert _fork_bases(e2b_server) == []
        assert all("e2b-fork-" not in s.snapshot_id for s in Sandbox.list_snapshots().next_items())

        # What corral cannot do is refused by name.
        with pytest.raises(SandboxException, match="memory"):
            sbx.create_snapshot(mode="full")
        with pytest.raises(SandboxException, match="count"):
            Sandbox._cls_fork_sandbox(sbx.sandbox_id, count=0)  # type: ignore[attr-defined]
    finally:
        assert Sandbox.delete_snapshot(sid) is True
    assert Sandbox.delete_snapshot(sid) is False
    assert sid not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
