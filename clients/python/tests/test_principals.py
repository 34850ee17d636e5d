"""Principals, attacked through the real front ends: a real `corral serve`
(its REST API through this client, its `/mcp` through the official MCP
client), a real `corral mcp` on stdio and the real CLI, on the real daemon.

The threat: a trainer keeps a durable snapshot with the CLI (`corral run
--env API_KEY=... --snapshot NAME`) and starts its rollouts from it. A model
driving an MCP session (or a tenant's client) must not restore that
snapshot (it would read the trainer's files), must not see the secret the
trainer's sandbox had, and must not replace it by a snapshot of its own
sandbox with a poisoned `/bin/sh` that makes every command "pass". Its
`snapshot` lands in its own namespace; the trainer's runs still exit with
their real exit code. Snapshots keep variable names, never values.

Then two tenants of one service through this client: neither sees, runs
in, deletes or forks the other's sandboxes and snapshots (404 as if
absent), the same session key gives each its own sandbox, a spent quota is
a typed `CapacityError`, and `whoami()` names each.

Two services per module, each started once: `plain` (only `server.token`,
the setup of the hijack) and `tenants` (tenants with quotas, an admin
token, `server.mcp_snapshots`). The CLI and `corral mcp` read the same
config files, so every sandbox carries this run's labels.

Needs: a Docker daemon, the image `corral-test/busybox`, the corral binary
($CORRAL_BIN, default `target/debug/corral`), the pip packages `mcp`,
`pytest`, `pytest-asyncio`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List

import anyio
import pytest

import corral
from conftest import (
    assert_no_leaks,
    corral_binary,
    remove_snapshot_images,
    server_config,
    snapshot_images,
)
from corral.testing import LocalServer
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_mcp import STEP_TIMEOUT, _call, _env, _http_streams, _is_error, _ok, _text

pytestmark = pytest.mark.server

# What the trainer's sandbox had and the model must never see.
SECRET = "sk-trainer-" + secrets.token_hex(12)
TRAINER_FILE = "trainer-data"
# Replaces the sandbox's /bin/sh with a script that exits 0 whatever it is
# asked to run: a snapshot of it would make every graded command pass.
POISON = "rm /bin/sh && printf '#!/bin/busybox sh\\nexit 0\\n' > /bin/sh && chmod 755 /bin/sh"
CLI_TIMEOUT = 300


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Service:
    """A `corral serve` of this module, with the config file it shares
    with the CLI and `corral mcp` (so their sandboxes carry this run's
    labels)."""

    config: str
    server: LocalServer
    tokens: Dict[str, str]

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def mcp_url(self) -> str:
        return self.server.url + "/mcp"

    def client(self, who: str, **kwargs: Any) -> corral.Client:
        return corral.Client(self.server.url, token=self.tokens[who], **kwargs)


@dataclass
class World:
    """The module's config files (`plain`, `tenants`) and tokens, the
    trainer's snapshots and every snapshot name a test used (all removed
    at the end)."""

    configs: Dict[str, str]
    tokens: Dict[str, str]
    trainer: str  # the CLI's snapshot nobody else may touch
    shared: str  # the CLI's snapshot listed in `server.mcp_snapshots`
    names: List[str] = field(default_factory=list)

    def name(self, prefix: str) -> str:
        n = unique(prefix)
        self.names.append(n)
        return n

    def cli(self, config: str, *args: str) -> subprocess.CompletedProcess:
        """The corral CLI (the operator on the host) with config `config`."""
        env = dict(os.environ)
        for key in ("CORRAL_TOKEN", "CORRAL_URL", "CORRAL_CONFIG"):
            env.pop(key, None)
        return subprocess.run(
            [corral_binary(), "--config", self.configs[config], *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=CLI_TIMEOUT,
        )

    def trainer_run(self, command: str, *, snapshot: str = "", env: str = "") -> subprocess.CompletedProcess:
        """`corral run --from-snapshot` of one of the trainer's snapshots."""
        args = ["run", "--from-snapshot", snapshot or self.trainer]
        if env:
            args += ["--env", env]
        return self.cli("plain", *args, "--", command)

    def assert_trainer_intact(self, snapshot: str = "") -> None:
        """The trainer's snapshot still grades honestly (a poisoned /bin/sh
        would make `exit 3` exit 0) and still holds its file."""
        r = self.trainer_run("exit 3", snapshot=snapshot)
        assert r.returncode == 3, f"the trainer's run from its snapshot exited {r.returncode}, not 3: {r.stderr}"
        r = self.trainer_run("cat /trainer.txt", snapshot=snapshot)
        assert r.returncode == 0 and r.stdout == TRAINER_FILE + "\n", (r.returncode, r.stdout, r.stderr)


def _write_config(path: Path, cfg: Dict[str, Any]) -> str:
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return str(path)


def _image_inspect(ref: str) -> str:
    r = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"docker image inspect {ref}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The configs, and the trainer's snapshots kept with the CLI, its
    secret in the sandbox's environment (the command checks it was
    there). Removed at the end with `corral snapshots rm`; every other
    snapshot of the module's names by label."""
    tmp = tempfile.TemporaryDirectory(prefix="corral-principals-")
    tokens = {name: secrets.token_hex(16) for name in ("default", "alice", "bob", "admin")}
    trainer, shared = unique("trainer"), unique("trainer-shared")
    configs = {
        # The hijack's setup: one token (tenant `default`), nothing shared.
        "plain": _write_config(Path(tmp.name) / "plain.yaml", server_config(server={"token": tokens["default"]})),
        "tenants": _write_config(
            Path(tmp.name) / "tenants.yaml",
            server_config(
                server={
                    "token": tokens["default"],
                    "admin_token": tokens["admin"],
                    "tenants": {
                        "alice": {"token": tokens["alice"]},
                        "bob": {"token": tokens["bob"], "max_sandboxes": 1, "max_snapshots": 4},
                    },
                    "mcp_snapshots": [shared],
                }
            ),
        ),
    }
    w = World(configs=configs, tokens=tokens, trainer=trainer, shared=shared, names=[trainer, shared])
    rm = None
    try:
        for name in (w.trainer, w.shared):
            r = w.cli(
                "plain",
                "run",
                "--env",
                f"API_KEY={SECRET}",
                "--snapshot",
                name,
                "--",
                f'test -n "$API_KEY" && echo {TRAINER_FILE} > /trainer.txt',
            )
            assert r.returncode == 0, f"the trainer's corral run --snapshot {name} failed: {r.stdout}{r.stderr}"
        yield w
        rm = w.cli("plain", "snapshots", "rm", w.trainer, w.shared)
    finally:
        for name in w.names:
            remove_snapshot_images(name)
        tmp.cleanup()
        assert_no_leaks()
    assert rm.returncode == 0, f"corral snapshots rm failed: {rm.stdout}{rm.stderr}"


def _service(world: World, config: str) -> Iterator[Service]:
    server = LocalServer(corral_binary(), config=world.configs[config])
    try:
        server.start()
        yield Service(world.configs[config], server, world.tokens)
    finally:
        code = server.stop()
        tail = server.log_tail()
        server.close()
        assert_no_leaks()
    assert code == 0, f"corral serve exited with {code} on SIGTERM:\n{tail}"


@pytest.fixture(scope="module")
def plain(world: World) -> Iterator[Service]:
    yield from _service(world, "plain")


@pytest.fixture(scope="module")
def tenants(world: World) -> Iterator[Service]:
    yield from _service(world, "tenants")


def _assert_config_keeps_no_value(ref: str, secret: str, names: List[str]) -> None:
    """Snapshot image `ref` records the variables' names, never their
    values, in its labels and in the config every fork starts from (see
    test_snapshot_image_metadata_keeps_no_value for the rest of the image)."""
    config = json.loads(_image_inspect(ref))[0]["Config"]
    assert sorted(json.loads(config["Labels"]["corral.snapshot.env"])) == sorted(names), config["Labels"]
    assert secret not in json.dumps(config), f"a variable's value is in the config of snapshot image {ref}"


def _assert_trainer_labels_keep_no_secret(w: World) -> None:
    _assert_config_keeps_no_value(f"corral-snapshot:{w.trainer}", SECRET, ["API_KEY"])


async def _model_attacks(session: ClientSession, w: World) -> None:
    """What a model does over MCP: restore the trainer's snapshot, look for
    its secret and files, poison its own /bin/sh and snapshot it under the
    trainer's name."""
    result = await _call(session, "restore", {"name": w.trainer})
    assert _is_error(result), f"an MCP session restored the trainer's snapshot: {_text(result)}"
    assert "no such snapshot" in _text(result), _text(result)

    text = await _ok(session, "run_command", {"command": 'cat /trainer.txt; echo "key=[$API_KEY]"; env'})
    assert TRAINER_FILE not in text and SECRET not in text, text
    assert "key=[]" in text, text

    await _ok(session, "run_command", {"command": POISON})
    # The poison works in its own sandbox: `exit 3` now "passes".
    text = await _ok(session, "run_command", {"command": "exit 3"})
    assert "exit code: 0" in text, text

    text = await _ok(session, "snapshot", {"name": w.trainer, "durable": True})
    assert w.trainer in text and "durable" in text, text


def _assert_model_snapshot_in_own_namespace(w: World, namespace_prefix: str) -> None:
    """Two snapshots of the trainer's name now: the CLI's, and the model's
    under an image of its session's namespace."""
    repos = subprocess.run(
        ["docker", "images", "--filter", f"label=corral.snapshot={w.trainer}", "--format", "{{.Repository}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert "corral-snapshot" in repos, repos
    assert any(r.startswith(f"corral-snapshot/{namespace_prefix}") for r in repos), repos


@pytest.mark.asyncio
async def test_mcp_session_over_http_cannot_restore_or_poison_the_trainers_snapshot(
    world: World, plain: Service
) -> None:
    svc = plain
    _assert_trainer_labels_keep_no_secret(world)
    async with _http_streams(svc.mcp_url, svc.tokens["default"]) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            with anyio.fail_after(STEP_TIMEOUT):
                await session.initialize()
            await _model_attacks(session, world)
    _assert_model_snapshot_in_own_namespace(world, "default.mcp-")
    await anyio.to_thread.run_sync(world.assert_trainer_intact)
    r = await anyio.to_thread.run_sync(
        lambda: world.trainer_run("cat /trainer.txt; echo $API_KEY", env="API_KEY=x")
    )
    assert r.returncode == 0 and r.stdout == f"{TRAINER_FILE}\nx\n", (r.stdout, r.stderr)
    _assert_trainer_labels_keep_no_secret(world)


@pytest.mark.asyncio
async def test_stdio_mcp_session_cannot_restore_or_poison_the_trainers_snapshot(world: World) -> None:
    params = StdioServerParameters(
        command=corral_binary(), args=["--config", world.configs["plain"], "mcp"], env=_env()
    )
    with tempfile.TemporaryFile(mode="w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    with anyio.fail_after(STEP_TIMEOUT):
                        await session.initialize()
                    # The operator's own MCP session is a principal of its
                    # own, not the operator.
                    await _model_attacks(session, world)
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"--- corral mcp stderr ---\n{errlog.read()}\n")
            raise
    _assert_model_snapshot_in_own_namespace(world, "operator.mcp-")
    await anyio.to_thread.run_sync(world.assert_trainer_intact)


def test_tenant_over_rest_cannot_fork_or_poison_the_trainers_snapshot(world: World, plain: Service) -> None:
    svc = plain
    with svc.client("default") as client:
        assert world.trainer not in {s.name for s in client.snapshots()}
        with pytest.raises(corral.SnapshotNotFoundError):
            client.fork(world.trainer)
        with pytest.raises(corral.SnapshotNotFoundError):
            client.snapshot_info(world.trainer)
        with pytest.raises(corral.SnapshotNotFoundError):
            client.delete_snapshot(world.trainer)
        with client.sandbox() as sb:
            r = sb.run('cat /trainer.txt; echo "key=[$API_KEY]"')
            assert TRAINER_FILE not in r.stdout and "key=[]" in r.stdout, r.stdout
            sb.run(POISON, check=True)
            assert sb.run("exit 3").exit_code == 0, "the poisoned /bin/sh does not make `exit 3` pass"
            snap = sb.snapshot(world.trainer, durable=True)
        assert (snap.name, snap.owner, snap.read_only) == (world.trainer, "tenant:default", False), snap
        assert snap.image == f"corral-snapshot/default:{world.trainer}", snap
        # Its own is what it sees, forks and deletes; the CLI's stays.
        (fork,) = client.fork(world.trainer)
        with fork:
            assert fork.run("exit 3").exit_code == 0
        world.assert_trainer_intact()
        client.delete_snapshot(world.trainer)
        with pytest.raises(corral.SnapshotNotFoundError):
            client.delete_snapshot(world.trainer)
    world.assert_trainer_intact()


@pytest.mark.asyncio
async def test_snapshots_shared_with_mcp_restore_without_values_and_stay_the_operators(
    world: World, tenants: Service
) -> None:
    svc = tenants
    async with _http_streams(svc.mcp_url, svc.tokens["default"]) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            with anyio.fail_after(STEP_TIMEOUT):
                await session.initialize()
            # Not listed in server.mcp_snapshots: as if absent.
            result = await _call(session, "restore", {"name": world.trainer})
            assert _is_error(result) and "no such snapshot" in _text(result), _text(result)
            text = await _ok(session, "restore", {"name": world.shared})
            assert "restored" in text, text
            text = await _ok(session, "run_command", {"command": 'cat /trainer.txt; echo "key=[$API_KEY]"'})
            assert TRAINER_FILE in text and "key=[]" in text and SECRET not in text, text
            await _ok(session, "run_command", {"command": POISON})
            text = await _ok(session, "snapshot", {"name": world.shared, "durable": True})
            assert world.shared in text, text
            # Restoring the name now finds the session's own.
            await _ok(session, "restore", {"name": world.shared})
            text = await _ok(session, "run_command", {"command": "exit 3"})
            assert "exit code: 0" in text, text
    # The operator's shared snapshot is unchanged.
    await anyio.to_thread.run_sync(world.assert_trainer_intact, world.shared)
    with svc.client("admin") as admin:
        mine = admin.snapshot_info(world.shared)
        assert (mine.owner, mine.read_only, mine.env_names) == ("operator", False, ["API_KEY"]), mine
        theirs = [s for s in admin.snapshots() if s.name.endswith("/" + world.shared)]
        assert len(theirs) == 1 and theirs[0].owner.startswith("mcp:default:mcp-"), theirs

    # stdio `corral mcp` (the operator's session) restores it too, and only it.
    params = StdioServerParameters(command=corral_binary(), args=["--config", svc.config, "mcp"], env=_env())
    with tempfile.TemporaryFile(mode="w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    with anyio.fail_after(STEP_TIMEOUT):
                        await session.initialize()
                    result = await _call(session, "restore", {"name": world.trainer})
                    assert _is_error(result) and "no such snapshot" in _text(result), _text(result)
                    await _ok(session, "restore", {"name": world.shared})
                    result = await _call(session, "run_command", {"command": "cat /trainer.txt; exit 3"})
                    text = _text(result)
                    assert _is_error(result) and TRAINER_FILE in text and "exit code: 3" in text, text
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"--- corral mcp stderr ---\n{errlog.read()}\n")
            raise


def test_snapshot_image_metadata_keeps_no_value(world: World) -> None:
    """Nothing of the image the trainer's snapshot is kept in holds the
    secret (`docker image inspect`, `docker save` show all of it)."""
    inspect = _image_inspect(f"corral-snapshot:{world.trainer}")
    where = [k for k, v in json.loads(inspect)[0].items() if SECRET in json.dumps(v)]
    assert where == [], f"the trainer's secret is in its snapshot image's {where}"


def _same_but_name(a: corral.CorralError, b: corral.CorralError, name_a: str, name_b: str) -> None:
    """Two errors that differ only by the name asked for: another's thing
    is answered exactly as an absent one."""
    assert type(a) is type(b), (a, b)
    assert (a.status, a.kind, a.field, a.retryable) == (b.status, b.kind, b.field, b.retryable), (a, b)
    assert a.message.replace(name_a, "NAME") == b.message.replace(name_b, "NAME"), (a.message, b.message)


def test_two_tenants_see_nothing_of_each_other(world: World, tenants: Service) -> None:
    svc = tenants
    key = unique("ep")
    snap_name = world.name("alice-snap")
    with svc.client("alice") as alice, svc.client("bob", retry=None) as bob, svc.client("admin") as admin:
        me = alice.whoami()
        assert (me.principal, me.tenant, me.max_sandboxes, me.is_operator) == ("tenant:alice", "alice", None, False)
        me = bob.whoami()
        assert (me.principal, me.tenant, me.max_sandboxes, me.max_snapshots) == ("tenant:bob", "bob", 1, 4)
        me = admin.whoami()
        assert (me.principal, me.tenant, me.is_operator) == ("operator", None, True)

        with alice.sandbox(session=key) as a_sb:
            assert a_sb.info.owner == "tenant:alice"
            a_sb.write_file("/alice.txt", "alice-data")
            a_snap = a_sb.snapshot(snap_name)
            assert (a_snap.name, a_snap.owner, a_snap.read_only) == (snap_name, "tenant:alice", False)

            # Sandboxes: not listed, not described, not run in, not deleted.
            assert key not in {s.id for s in bob.list_sandboxes()}
            absent = unique("ep")
            with pytest.raises(corral.SandboxNotFoundError) as theirs:
                bob.get_sandbox(key)
            with pytest.raises(corral.SandboxNotFoundError) as none:
                bob.get_sandbox(absent)
            _same_but_name(theirs.value, none.value, key, absent)
            with pytest.raises(corral.SandboxNotFoundError):
                bob.request(
                    "POST", f"/v1/sandboxes/{key}/exec", json={"command": "cat /alice.txt"}, resource="sandbox"
                )
            with pytest.raises(corral.SandboxNotFoundError):
                bob.request("GET", f"/v1/sandboxes/{key}/files", params={"path": "/alice.txt"}, resource="file")
            with pytest.raises(corral.SandboxNotFoundError):
                bob.delete_sandbox(key, missing_ok=False)
            assert a_sb.run("cat /alice.txt").stdout == "alice-data"

            # Snapshots: not listed, inspected, forked or deleted, by bare
            # or qualified name.
            assert not any(snap_name in s.name for s in bob.snapshots())
            absent_snap = unique("none")
            for name in (snap_name, f"alice/{snap_name}"):
                with pytest.raises(corral.SnapshotNotFoundError) as theirs:
                    bob.snapshot_info(name)
                with pytest.raises(corral.SnapshotNotFoundError) as none:
                    bob.snapshot_info(absent_snap)
                _same_but_name(theirs.value, none.value, name, absent_snap)
                with pytest.raises(corral.SnapshotNotFoundError):
                    bob.fork(name)
                with pytest.raises(corral.SnapshotNotFoundError):
                    bob.delete_snapshot(name)
            assert alice.snapshot_info(snap_name).image == a_snap.image

            # The same session key is bob's own sandbox.
            with bob.sandbox(session=key) as b_sb:
                assert b_sb.id == key and b_sb.info.owner == "tenant:bob"
                assert b_sb.sandbox_id != a_sb.sandbox_id
                assert b_sb.run("test -e /alice.txt && echo seen || echo absent").stdout == "absent\n"
                # The operator sees both, and whose each is.
                owners = {s.sandbox_id: s.owner for s in admin.list_sandboxes()}
                assert owners.get(a_sb.sandbox_id) == "tenant:alice", owners
                assert owners.get(b_sb.sandbox_id) == "tenant:bob", owners
                assert {s.name: s.owner for s in admin.snapshots()}.get(f"alice/{snap_name}") == "tenant:alice"

                # bob's one sandbox is his quota: a second is refused, typed.
                with pytest.raises(corral.CapacityError) as full:
                    bob.sandbox()
                err = full.value
                assert (err.status, err.kind, err.retryable, err.field) == (503, "capacity", True, "max_sandboxes"), err
                assert isinstance(err, corral.DaemonUnavailableError)
            # Room comes back when it goes.
            with bob.sandbox() as again:
                assert again.run("true").ok
        alice.delete_snapshot(snap_name)
        with pytest.raises(corral.SnapshotNotFoundError):
            alice.snapshot_info(snap_name)


def test_fork_env_gives_values_the_snapshot_does_not_keep(world: World, tenants: Service) -> None:
    svc = tenants
    secret = "sk-alice-" + secrets.token_hex(8)
    name = world.name("env-snap")
    with svc.client("alice") as alice:
        try:
            spec = {"env": [{"name": "API_KEY", "value": secret}, {"name": "MODE", "value": "train"}]}
            with alice.sandbox(spec=spec) as sb:
                assert sb.run('echo "$API_KEY"').stdout == secret + "\n"
                snap = sb.snapshot(name)
            assert sorted(snap.env_names) == ["API_KEY", "MODE"], snap
            _assert_config_keeps_no_value(snap.image, secret, ["API_KEY", "MODE"])
            (given,) = alice.fork(name, env={"API_KEY": "x", "EXTRA": "y"})
            with given:
                assert given.run('echo "[$API_KEY][$MODE][$EXTRA]"').stdout == "[x][][y]\n"
            (bare,) = alice.fork(snap)
            with bare:
                assert bare.run('echo "[$API_KEY][$MODE]"').stdout == "[][]\n"
        finally:
            alice.delete_snapshot(name, missing_ok=True)


@pytest.mark.asyncio
async def test_async_whoami_and_fork_env(world: World, tenants: Service) -> None:
    svc = tenants
    name = world.name("async-env")
    async with corral.AsyncClient(svc.url, token=svc.tokens["bob"]) as bob:
        me = await bob.whoami()
        assert (me.principal, me.max_sandboxes) == ("tenant:bob", 1)
        try:
            async with bob.sandbox(spec={"env": [{"name": "API_KEY", "value": "bob-secret"}]}) as sb:
                snap = await sb.snapshot(name)
            assert snap.owner == "tenant:bob" and "API_KEY" in snap.env_names
            # Two forks are more than bob's one sandbox: none starts.
            with pytest.raises(corral.CapacityError) as full:
                await bob.fork(snap, 2)
            assert full.value.field == "max_sandboxes" and full.value.retryable
            (fork,) = await bob.fork(snap, env={"API_KEY": "z"})
            async with fork:
                assert (await fork.run('echo "[$API_KEY]"')).stdout == "[z]\n"
        finally:
            await bob.delete_snapshot(name, missing_ok=True)
    assert snapshot_images(name) == []
