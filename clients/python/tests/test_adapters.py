"""The drop-in adapters (open-instruct's SandboxBackend, mini-swe-agent's
environment) against a real ``corral serve``."""

from __future__ import annotations

import subprocess

import pytest

import corral
from corral.adapters import mini_swe_agent, open_instruct

pytestmark = pytest.mark.server


# -- open-instruct ---------------------------------------------------------


def test_open_instruct_backend_shape(corral_url):
    backend = open_instruct.create_backend("docker", timeout=60, base_url=corral_url)
    with pytest.raises(RuntimeError, match="start"):
        backend.run_command("true")
    backend.start()
    try:
        r = backend.run_command("echo out; echo err >&2; exit 3")
        assert isinstance(r, open_instruct.ExecutionResult)
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
        # bash, as the original runs commands with `bash -c`.
        assert backend.run_command("echo $BASH_VERSION").stdout.strip()

        backend.write_file("/testbed/input/prog.py", "print('hi')\n")
        backend.write_file("/testbed/input/raw.bin", b"\x00\xff")
        assert backend.read_file("/testbed/input/prog.py") == "print('hi')\n"
        assert backend.read_file("/testbed/input/raw.bin", binary=True) == b"\x00\xff"
        assert backend.run_command("cat /testbed/input/prog.py").stdout == "print('hi')\n"
        with pytest.raises(FileNotFoundError):
            backend.read_file("/testbed/none.txt")
        with pytest.raises(IsADirectoryError):
            backend.read_file("/testbed/input")

        t = backend.run_command("echo before; sleep 30", timeout=1)
        assert t.exit_code == 124
        assert t.stderr.startswith("Command timed out after 1s.")
        assert t.stdout == "before\n"
    finally:
        backend.close()
    backend.close()  # twice is fine


def test_open_instruct_mem_limit_oom_and_lost_container(corral_url, corral_spec):
    spec = corral_spec()
    with open_instruct.CorralBackend(mem_limit="32m", spec=spec, base_url=corral_url) as backend:
        r = backend.run_command("dd if=/dev/zero of=/dev/null bs=100M count=1")
        assert r.exit_code == 137
        assert backend.run_command("echo alive").stdout == "alive\n"
        subprocess.run(["docker", "rm", "-f", backend.sandbox.container_id], check=True, capture_output=True)
        with pytest.raises(corral.SandboxContainerLostError) as ei:
            backend.run_command("true")
        assert ei.value.retryable


def test_parse_mem_limit():
    assert open_instruct.parse_mem_limit("4g") == 4 << 30
    assert open_instruct.parse_mem_limit("512m") == 512 << 20
    assert open_instruct.parse_mem_limit("1.5G") == int(1.5 * (1 << 30))
    assert open_instruct.parse_mem_limit(1000) == 1000
    with pytest.raises(ValueError):
        open_instruct.parse_mem_limit("lots")


# -- mini-swe-agent --------------------------------------------------------


def test_mini_swe_agent_execute_shape(corral_url, monkeypatch):
    monkeypatch.setenv("FORWARD_ME", "fwd")
    # The service's real token, passed explicitly: it must never be dumped.
    token = corral.find_token(corral_url)
    assert token
    env = mini_swe_agent.CorralEnvironment(
        base_url=corral_url,
        token=token,
        cwd="/tmp",
        env={"PAGER": "cat"},
        forward_env=["FORWARD_ME", "NOT_SET_ANYWHERE"],
        timeout=30,
    )
    try:
        out = env.execute({"command": "echo one; echo two >&2; echo three; exit 4"})
        assert out == {"output": "one\ntwo\nthree\n", "returncode": 4, "exception_info": ""}
        assert env.execute({"command": "pwd"})["output"] == "/tmp\n"
        assert env.execute({"command": "pwd"}, cwd="/etc")["output"] == "/etc\n"
        assert env.execute({"command": "echo $PAGER $FORWARD_ME ${NOT_SET_ANYWHERE:-unset}"})["output"] == (
            "cat fwd unset\n"
        )
        # 1.x passed the command string.
        assert env.execute("echo legacy")["output"] == "legacy\n"

        t = env.execute({"command": "echo partial; sleep 30"}, timeout=1)
        assert t["returncode"] == -1
        assert "timed out" in t["exception_info"]
        assert t["extra"]["exception_type"] == "TimeoutExpired"
        assert t["output"] == "partial\n"
        with pytest.raises(subprocess.TimeoutExpired) as ei:
            env.execute("echo legacy-partial; sleep 30", timeout=1)
        assert b"legacy-partial" in ei.value.output

        with pytest.raises(mini_swe_agent.Submitted) as ei:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
        msg = ei.value.messages[0]
        assert msg["role"] == "exit" and msg["extra"]["submission"] == "the patch\n"
        # Not submitted when the command failed.
        failed = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})
        assert failed["returncode"] == 1

        tv = env.get_template_vars(extra_key=1)
        assert tv["cwd"] == "/tmp" and tv["timeout"] == 30 and tv["extra_key"] == 1
        assert "token" not in tv and token not in repr(env.serialize())
        ser = env.serialize()["info"]["config"]
        assert ser["environment_type"] == "corral.adapters.mini_swe_agent.CorralEnvironment"
        assert ser["environment"]["interpreter"] == ["bash", "-lc"]
        cid = env.container_id
        assert cid
    finally:
        env.cleanup()
    assert env._sandbox is None
    env.cleanup()  # twice is fine


def test_mini_swe_agent_lost_container_and_environment_class_loading(corral_url):
    import importlib

    module_name, class_name = "corral.adapters.mini_swe_agent.CorralEnvironment".rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    env = cls(base_url=corral_url, image="corral-test/busybox", interpreter=["sh", "-c"])
    try:
        subprocess.run(["docker", "rm", "-f", env.container_id], check=True, capture_output=True)
        out = env.execute({"command": "echo hi"})
        assert out["returncode"] == -1
        assert out["extra"]["failure_kind"] == "container_lost" and out["extra"]["retryable"] is True
        assert "lost its container" in out["exception_info"]
    finally:
        env.cleanup()
