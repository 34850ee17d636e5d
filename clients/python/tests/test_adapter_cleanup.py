"""Sandboxes made by the adapters are removed when the Python process that
made them ends: at a normal exit without cleanup, after an uncaught
exception, and on SIGTERM mid-episode (the handler chains to the one it
replaced). Each case runs a real child process and checks, with the docker
CLI, that no container labelled ``corral.sandbox`` and the case's own label
is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import corral
from corral.testing import docker_ids

pytestmark = pytest.mark.server


def _left(case: str, wait: float = 15.0) -> list:
    deadline = time.monotonic() + wait
    left = docker_ids("corral.sandbox", f"corraltest.case={case}")
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = docker_ids("corral.sandbox", f"corraltest.case={case}")
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    return left


def _child(corral_url: str, corral_spec, body: str):
    case = uuid.uuid4().hex[:12]
    spec = corral_spec()
    spec["labels"] = {**spec["labels"], "corraltest.case": case}
    prelude = textwrap.dedent(
        f"""\
        import sys, time
        SPEC = {spec!r}
        URL = {corral_url!r}
        """
    )
    env = dict(os.environ)
    env["CORRAL_TOKEN"] = corral.find_token(corral_url) or ""
    proc = subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return case, proc


def _wait_line(proc, want: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.strip() == want:
            return
    proc.kill()
    pytest.fail(f"child never printed {want!r}: {proc.stderr.read()[-3000:]}")


MINI_EPISODE = """\
from corral.adapters.mini_swe_agent import CorralEnvironment
env = CorralEnvironment(base_url=URL, spec=SPEC, cwd="/testbed")
print("ready", flush=True)
env.execute({"command": "echo mid-episode; sleep 120"}, timeout=300)
"""


def test_sigterm_mid_episode_removes_the_sandbox(corral_url, corral_spec):
    """The `mini` CLI or a Ray worker killed with SIGTERM while a command runs."""
    case, proc = _child(corral_url, corral_spec, MINI_EPISODE)
    _wait_line(proc, "ready")
    assert docker_ids("corral.sandbox", f"corraltest.case={case}")
    time.sleep(1.0)  # the command is running
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    # It still dies of SIGTERM (the default action is chained to).
    assert proc.returncode == -signal.SIGTERM, proc.stderr.read()[-3000:]
    assert _left(case) == []


def test_sigterm_chains_to_the_previous_handler(corral_url, corral_spec):
    body = (
        "import signal\n"
        'signal.signal(signal.SIGTERM, lambda s, f: (print("previous handler ran", flush=True), sys.exit(7)))\n'
        + MINI_EPISODE
    )
    case, proc = _child(corral_url, corral_spec, body)
    _wait_line(proc, "ready")
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out = proc.stdout.read()
    assert proc.returncode == 7 and "previous handler ran" in out, proc.stderr.read()[-3000:]
    assert _left(case) == []


def test_exit_without_cleanup_removes_the_sandbox(corral_url, corral_spec):
    body = """\
    from corral.adapters.open_instruct import CorralBackend
    b = CorralBackend(base_url=URL, spec=SPEC)
    b.start()
    assert b.run_command("echo hi").stdout == "hi\\n"
    from corral.adapters.mini_swe_agent import CorralEnvironment
    env = CorralEnvironment(base_url=URL, spec=SPEC)
    keep = [b, env]  # alive until interpreter shutdown, never cleaned up
    print("ready", flush=True)
    """
    case, proc = _child(corral_url, corral_spec, body)
    _wait_line(proc, "ready")
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "sys.meta_path is None" not in err and "Exception ignored" not in err, err
    assert _left(case) == []


def test_crash_removes_the_sandbox(corral_url, corral_spec):
    body = """\
    from corral.adapters.mini_swe_agent import CorralEnvironment
    env = CorralEnvironment(base_url=URL, spec=SPEC)
    print("ready", flush=True)
    raise RuntimeError("the agent crashed")
    """
    case, proc = _child(corral_url, corral_spec, body)
    _wait_line(proc, "ready")
    proc.wait(timeout=60)
    assert proc.returncode == 1 and "the agent crashed" in proc.stderr.read()
    assert _left(case) == []
