"""Templates through a real ``corral serve``: a tenant builds one from a
Dockerfile and its context directory, starts sandboxes from it, rebuilds
it from the cache, and gets a failing step typed with its line. The
attacks: another tenant tries to find, use, delete, build on and start
from the template (by name and by its image) and must get nothing."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Dict, Iterator

import pytest

import corral
from corral.testing import LocalServer
from conftest import LABELS, running_server

pytestmark = pytest.mark.server

RUN = secrets.token_hex(3)
TENANTS: Dict[str, str] = {f"tpla{RUN}": secrets.token_hex(16), f"tplb{RUN}": secrets.token_hex(16)}
ALICE, BOB = list(TENANTS)

DOCKERFILE = f"""FROM corral-test/busybox
ENV RUN_ID={RUN} GREETING=hello
WORKDIR /srv/app
COPY . ./
RUN chmod 755 hello.sh && echo built > stamp
"""


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with running_server(
        config={
            "defaults": {"image": "corral-test/busybox", "network": "none", "labels": dict(LABELS)},
            "server": {
                "token": secrets.token_hex(16),
                "tenants": {name: {"token": token} for name, token in TENANTS.items()},
            },
        },
    ) as srv:
        yield srv
    # The tenants' templates and cached steps are this run's alone.
    images = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()
    mine = [i for i in images if any(f"/{t}:" in i for t in TENANTS) and i.startswith("corral-template")]
    if mine:
        subprocess.run(["docker", "rmi", *mine], capture_output=True, timeout=120)


def _client(server: LocalServer, who: str) -> corral.Client:
    return corral.Client(server.url, token=TENANTS[who])


def _context(tmp_path: Path, greeting: str = "hi from the context") -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "hello.sh").write_text(f"echo {greeting} $GREETING\n")
    return ctx


def test_a_template_builds_from_a_dockerfile_and_starts_sandboxes(server: LocalServer, tmp_path: Path) -> None:
    alice = _client(server, ALICE)
    name = f"web-{RUN}"
    t = alice.build_template(name, dockerfile=DOCKERFILE, context=_context(tmp_path))
    assert t["build"]["cached"] == 0 and t["build"]["steps"] == 5, t
    assert t["workdir"] == "/srv/app" and ["GREETING", "hello"] in t["env"], t
    assert any("[4/5] COPY" in line for line in t["log"]), t["log"]
    with alice.sandbox(template=name) as sb:
        r = sb.run("pwd; ./hello.sh; cat stamp")
        assert r.stdout == "/srv/app\nhi from the context hello\nbuilt\n", r
    # Again: every file-changing step from the cache.
    again = alice.build_template(name, dockerfile=DOCKERFILE, context=_context(tmp_path))
    assert again["build"]["cached"] == 3, again
    assert name in {x["name"] for x in alice.templates()}
    # A changed file reruns the copy and what follows, nothing before.
    changed = alice.build_template(name, dockerfile=DOCKERFILE, context=_context(tmp_path, "changed"))
    assert changed["build"]["cached"] == 1, changed
    with alice.sandbox(template=name) as sb:
        assert sb.run("./hello.sh").stdout == "changed hello\n"
    alice.delete_template(name)
    with pytest.raises(corral.NotFoundError):
        alice.template_info(name)


def test_a_failing_step_names_its_line_and_output(server: LocalServer) -> None:
    alice = _client(server, ALICE)
    with pytest.raises(corral.CorralError) as err:
        alice.build_template(
            f"broken-{RUN}",
            dockerfile=f"FROM corral-test/busybox\nENV RUN_ID={RUN}\nRUN echo the-step-said-this >&2; exit 3\n",
        )
    e = err.value
    assert e.kind == "build_failed" and e.status == 422, e
    assert e.field == "dockerfile:3", e.field
    assert "the-step-said-this" in e.message and "exit code 3" in e.message, e.message
    with pytest.raises(corral.CorralError) as bad:
        alice.build_template(f"multi-{RUN}", dockerfile="FROM a\nFROM b\n")
    assert bad.value.field == "dockerfile" and "line 2" in bad.value.message, bad.value


def test_another_tenant_finds_uses_and_builds_on_nothing_of_a_template(server: LocalServer, tmp_path: Path) -> None:
    alice, bob = _client(server, ALICE), _client(server, BOB)
    name = f"private-{RUN}"
    t = alice.build_template(name, dockerfile=DOCKERFILE, context=_context(tmp_path))
    try:
        assert name not in {x["name"] for x in bob.templates()}
        with pytest.raises(corral.NotFoundError):
            bob.template_info(name)
        with pytest.raises(corral.NotFoundError):
            bob.delete_template(name)
        with pytest.raises(corral.NotFoundError):
            bob.sandbox(template=name)
        # Its image, by reference or by id: refused as if absent.
        image_id = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", t["image"]], capture_output=True, text=True
        ).stdout.strip()
        for ref in (t["image"], image_id):
            with pytest.raises(corral.CorralError) as err:
                bob.sandbox(image=ref)
            assert err.value.status in (403, 404) and err.value.field == "image", err.value
            with pytest.raises(corral.CorralError) as err:
                bob.build_template(f"onto-{RUN}", dockerfile=f"FROM {ref}\nRUN true\n")
            assert err.value.status in (400, 403, 404), err.value
        with pytest.raises(corral.CorralError) as err:
            bob.build_template(f"onto-{RUN}", from_=f"template:{name}", steps=[{"run": {"argv": ["true"]}}])
        assert "no such template" in err.value.message, err.value
        # Bob's template of the same name is his own.
        mine = bob.build_template(name, from_="corral-test/busybox", steps=[{"env": {"name": "WHO", "value": "bob"}}])
        assert mine["image"] != t["image"] and mine["owner"] == f"tenant:{BOB}"
        with bob.sandbox(template=name) as sb:
            assert sb.run("echo $WHO; test -e /srv/app/stamp && echo leaked || echo clean").stdout == "bob\nclean\n"
        bob.delete_template(name)
        # Alice's is untouched.
        assert alice.template_info(name)["image"] == t["image"]
    finally:
        alice.delete_template(name, missing_ok=True)
