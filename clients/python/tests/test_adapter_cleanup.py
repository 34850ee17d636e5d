"""Sandboxes made by the adapters are removed when the Python process that
made them ends: at a normal exit without cleanup, after an uncaught
exception, on SIGTERM and SIGHUP mid-episode (the handler chains to the one
it replaced), and on SIGINT when no terminal is on stdin. Each case runs a real child process and checks, with the docker
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


def _child(corral_url: str, corral_spec, body: str, stdin=None):
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
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # The launcher a person runs in a terminal: SIGHUP and SIGINT at
        # their defaults even when the tests themselves run under nohup
        # (which a child would otherwise inherit, and rightly keep).
        preexec_fn=_default_signals,
    )
    return case, proc


def _default_signals() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


OPEN_INSTRUCT_EPISODE = """\
from corral.adapters.open_instruct import CorralBackend
b = CorralBackend(base_url=URL, spec=SPEC)
b.start()
print("ready", flush=True)
try:
    b.run_command("echo mid-episode; sleep 120", timeout=300)
except KeyboardInterrupt:
    # What a framework's loop does with Ctrl-C: carry on (here: wait).
    print("interrupted", flush=True)
    time.sleep(600)
"""


def test_sighup_mid_episode_removes_the_sandbox(corral_url, corral_spec):
    """A closed terminal or SSH session: the launcher gets SIGHUP while a
    command runs. The sandbox goes, and the process still dies of SIGHUP."""
    case, proc = _child(corral_url, corral_spec, OPEN_INSTRUCT_EPISODE, stdin=subprocess.DEVNULL)
    _wait_line(proc, "ready")
    assert docker_ids("corral.sandbox", f"corraltest.case={case}")
    time.sleep(1.0)  # the command is running
    proc.send_signal(signal.SIGHUP)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGHUP, proc.stderr.read()[-3000:]
    assert _left(case) == []


def test_sigint_without_a_terminal_removes_the_sandbox(corral_url, corral_spec):
    """Without a terminal on stdin a SIGINT is a stop (a launcher's, a Ray
    worker's), even when the framework catches the KeyboardInterrupt and
    carries on: the sandbox goes, then the KeyboardInterrupt is raised as
    before."""
    case, proc = _child(corral_url, corral_spec, OPEN_INSTRUCT_EPISODE, stdin=subprocess.DEVNULL)
    try:
        _wait_line(proc, "ready")
        assert docker_ids("corral.sandbox", f"corraltest.case={case}")
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _wait_line(proc, "interrupted")
        assert _left(case) == []
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_sigint_at_a_terminal_keeps_the_sandbox(corral_url, corral_spec):
    """At a terminal Ctrl-C interrupts a step and the person decides what
    next (mini-swe-agent asks): the sandbox must still answer."""
    body = OPEN_INSTRUCT_EPISODE.replace("    time.sleep(600)\n", '    print(b.run_command("echo alive").stdout.strip(), flush=True)\n')
    leader, follower = os.openpty()
    try:
        case, proc = _child(corral_url, corral_spec, body, stdin=follower)
        _wait_line(proc, "ready")
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _wait_line(proc, "interrupted")
        _wait_line(proc, "alive")
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()[-3000:]
        assert _left(case, wait=0) == []
    finally:
        os.close(follower)
        os.close(leader)


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
