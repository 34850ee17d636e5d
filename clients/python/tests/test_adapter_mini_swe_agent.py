"""mini-swe-agent's own code (2.4.6, installed from PyPI by
scripts/python-env.sh) running on corral through ``CorralEnvironment``: its
real ``DefaultAgent`` and ``DeterministicModel`` with every stock config the
package ships, the ``mini`` CLI's ``environment_class:`` route, and each
behaviour of ``DockerEnvironment`` the adapter reproduces."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from corral.adapters import _output, mini_swe_agent
from corral.adapters.mini_swe_agent import CorralEnvironment

minisweagent = pytest.importorskip("minisweagent", reason="mini-swe-agent is installed by scripts/python-env.sh")
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir, get_config_from_spec  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

pytestmark = pytest.mark.server

STOCK_CONFIGS = ["mini.yaml", "default.yaml", "benchmarks/swebench.yaml"]


def _episode_outputs() -> list:
    return [
        make_output("look around", [{"command": "pwd && echo hello > greeting.txt && ls"}]),
        make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat greeting.txt"}]),
    ]


def test_version_is_the_pinned_one():
    from minisweagent import __version__

    assert __version__ == "2.4.6"


def test_the_adapter_raises_mini_swe_agents_own_submitted():
    assert mini_swe_agent.Submitted is Submitted


@pytest.mark.parametrize("config_name", STOCK_CONFIGS)
def test_default_agent_runs_each_stock_config_to_submitted(corral_url, config_name):
    config = get_config_from_spec(builtin_config_dir / config_name)
    env_config = dict(config.get("environment", {}))
    env_config.pop("environment_class", None)
    if config_name.endswith("swebench.yaml"):
        # The configured cwd, /testbed, is not in the image: Docker's `-w`
        # creates it, so must the adapter.
        assert env_config["cwd"] == "/testbed"
    env = CorralEnvironment(base_url=corral_url, **env_config)
    try:
        model = DeterministicModel(outputs=_episode_outputs(), **config.get("model", {}))
        agent = DefaultAgent(model, env, **config["agent"])
        info = agent.run("say hello")
        assert info["exit_status"] == "Submitted", agent.messages[-1]
        assert info["submission"] == "hello\n"
        first_observation = agent.messages[3]["content"]
        assert (env_config.get("cwd") or "/") in first_observation
        assert "greeting.txt" in first_observation
        # The system template names the host's uname, as DockerEnvironment's does.
        if "{{system}}" in config["agent"]["system_template"]:
            assert platform.uname().system in agent.messages[0]["content"]
    finally:
        env.cleanup()


def test_mini_cli_environment_class_route(corral_url, tmp_path):
    """`mini -c mini.yaml -c ours.yaml` with `environment_class:` naming the
    adapter: the CLI builds the environment from YAML alone."""
    ours = {
        "environment": {
            "environment_class": "corral.adapters.mini_swe_agent.CorralEnvironment",
            "base_url": corral_url,
            "cwd": "/work/project",
        },
        "model": {"model_class": "deterministic", "model_name": "deterministic", "outputs": _episode_outputs()},
    }
    cfg = tmp_path / "corral.yaml"
    cfg.write_text(yaml.safe_dump(ours))
    traj = tmp_path / "traj.json"
    env = dict(os.environ)
    env.update(MSWEA_CONFIGURED="1", MSWEA_SILENT_STARTUP="1", MSWEA_GLOBAL_CONFIG_DIR=str(tmp_path / "global"))
    proc = subprocess.run(
        [
            sys.executable, "-m", "minisweagent.run.mini",
            "-c", "mini.yaml", "-c", str(cfg),
            "-t", "say hello", "--yolo", "--exit-immediately", "-o", str(traj),
        ],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(traj.read_text())
    assert data["info"]["exit_status"] == "Submitted"
    assert data["info"]["submission"] == "hello\n"
    assert data["info"]["config"]["environment_type"] == "corral.adapters.mini_swe_agent.CorralEnvironment"
    assert "/work/project" in json.dumps(data["messages"])


def test_template_vars_carry_platform_uname(corral_url):
    """DockerEnvironment.get_template_vars merges platform.uname()._asdict();
    mini.yaml's system template renders {{system}} {{release}} {{version}} {{machine}}."""
    with CorralEnvironment(base_url=corral_url) as env:
        tv = env.get_template_vars(extra=1)
        for key, value in platform.uname()._asdict().items():
            assert tv[key] == value
        assert tv["extra"] == 1 and tv["cwd"] == "/"
        assert "token" not in tv


def test_missing_cwd_is_created_like_docker_run_w(corral_url):
    with CorralEnvironment(base_url=corral_url, cwd="/testbed/deep/dir") as env:
        out = env.execute({"command": "pwd; touch made-here"})
        assert out == {"output": "/testbed/deep/dir\n", "returncode": 0, "exception_info": ""}
        # A cwd passed per command is not created, as `docker exec -w` does not.
        missing = env.execute({"command": "pwd"}, cwd="/not/there")
        assert missing["returncode"] != 0


def test_container_timeout_ends_the_sandbox(corral_url, corral_client):
    """DockerEnvironment runs `sleep <container_timeout>` as the container's
    command: past it the container is gone and commands fail."""
    with pytest.raises(ValueError, match="container_timeout"):
        CorralEnvironment(base_url=corral_url, container_timeout="soon")
    env = CorralEnvironment(base_url=corral_url, container_timeout="2s")
    try:
        assert env.execute({"command": "echo up"})["output"] == "up\n"
        cid = env.container_id
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and subprocess.run(
            ["docker", "inspect", cid], capture_output=True
        ).returncode == 0:
            time.sleep(0.25)
        assert subprocess.run(["docker", "inspect", cid], capture_output=True).returncode != 0
        after = env.execute({"command": "echo up"})
        assert after["returncode"] == -1 and after["exception_info"]
    finally:
        env.cleanup()
    assert mini_swe_agent.parse_container_timeout("2h") == 7200
    assert mini_swe_agent.parse_container_timeout("1.5m") == 90
    assert mini_swe_agent.parse_container_timeout("infinity") is None


def test_large_output_is_returned_whole(corral_url):
    """DockerEnvironment returns all the output (mini.yaml's template counts
    elided_chars itself): 3 MB come back whole, past corral's 1 MiB default."""
    with CorralEnvironment(base_url=corral_url) as env:
        out = env.execute({"command": "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END"})
        assert out["returncode"] == 0
        assert len(out["output"]) == 3000000 + 1 + 4
        assert out["output"].endswith("a\nEND\n")


def test_output_over_max_output_says_how_much_was_elided(corral_url):
    with CorralEnvironment(base_url=corral_url, max_output=1000) as env:
        out = env.execute({"command": "head -c 5000 /dev/zero | tr '\\0' a; echo END"})
        text = out["output"]
        assert text.startswith("a" * 500)
        assert text.endswith("a" * 496 + "END\n")
        assert _output.elided_marker(4004) in text
        assert "4004 bytes elided" in text


def test_stderr_and_stdout_keep_their_order(corral_url):
    with CorralEnvironment(base_url=corral_url) as env:
        out = env.execute({"command": "for i in 1 2 3; do echo out$i; echo err$i >&2; done"})
        assert out["output"] == "out1\nerr1\nout2\nerr2\nout3\nerr3\n"


@pytest.mark.skipif(
    not _output.supports_wait_for_output(),
    reason="this client's Sandbox.run lacks wait_for_output (issue 12 item 7 lands it)",
)
def test_background_job_output_is_waited_for_like_docker_exec(corral_url):
    """`docker exec` returns when the output streams close: a background job
    holding them is waited for and its output kept (`fg\\nbg\\n` after 2 s)."""
    with CorralEnvironment(base_url=corral_url) as env:
        out = env.execute({"command": "echo fg; (sleep 2; echo bg; touch /tmp/bg-done) &"})
        assert out["output"] == "fg\nbg\n"
        assert env.execute({"command": "test -f /tmp/bg-done"})["returncode"] == 0


def test_stock_config_files_exist():
    for name in STOCK_CONFIGS:
        assert (Path(builtin_config_dir) / name).is_file()
