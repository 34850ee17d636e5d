"""E2B's own SDK builds templates on corral (`Template().from_image(...)`,
`Template.build`, tags, `Template.exists`), with files copied from a
context directory, and starts sandboxes from `name`, `name:tag` and
`name:BUILD`. A failing step is the SDK's `BuildException` naming it. The
attack: another tenant's key finds the template nowhere (exists, tags,
create) and builds nothing on it."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

pytest.importorskip("e2b")

from e2b import Sandbox, Template  # noqa: E402
from e2b.exceptions import BuildException  # noqa: E402

from test_e2b import OTHER_TOKEN, TOKEN, e2b_service  # noqa: E402

pytestmark = pytest.mark.server

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def server() -> Iterator[dict]:
    with e2b_service() as srv:
        yield srv
    # The default tenant's templates and cached steps made here.
    images = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()
    mine = [i for i in images if i.startswith(("corral-template/default:e2b-", "corral-template-cache/default:"))]
    if mine:
        subprocess.run(["docker", "rmi", *mine], capture_output=True, timeout=120)


def _delete(server: dict, name: str) -> None:
    httpx.delete(f"{server['url']}/templates/{name}", headers={"X-API-KEY": TOKEN}, timeout=60)


def test_the_sdk_builds_a_template_and_starts_sandboxes_from_it(server: dict, tmp_path: Path) -> None:
    (tmp_path / "hello.sh").write_text("echo hello $GREETING\n")
    name = f"sdk-{RUN}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image("corral-test/busybox")
        .set_envs({"GREETING": "from-the-template", "RUN_ID": RUN})
        .copy("hello.sh", "/opt/tools/", mode=0o755)
        .run_cmd("echo built > /opt/tools/stamp", user="root")
        .set_workdir("/opt/tools")
    )
    logs: List[str] = []
    try:
        info = Template.build(template, name, tags=["default", "v1"], on_build_logs=lambda e: logs.append(e.message))
        assert any("COPY" in line for line in logs), logs
        sbx = Sandbox.create(template=name)
        try:
            r = sbx.commands.run("pwd; ./hello.sh; cat stamp; id -un; stat -c %U hello.sh")
            # Steps without a user ran as E2B's `user`; the copy is its.
            assert r.stdout == "/opt/tools\nhello from-the-template\nbuilt\nuser\nuser\n", r
        finally:
            sbx.kill()
        for ref in (f"{name}:v1", f"{name}:{info.build_id}"):
            other = Sandbox.create(template=ref)
            other.kill()
        assert {t.tag for t in Template.get_tags(name)} >= {"v1", "default"}
        assert Template.exists(name)
        assert not Template.exists(f"nothing-{RUN}")
        # The same build again: every step from the cache.
        again: List[str] = []
        Template.build(template, name, on_build_logs=lambda e: again.append(e.message))
        assert any("CACHED" in line for line in again), again
        assert not any("COPY" in line and "CACHED" not in line for line in again), again
    finally:
        _delete(server, name)
    with pytest.raises(Exception):
        Sandbox.create(template=name)


def test_a_failing_step_is_a_build_exception_naming_it(server: dict) -> None:
    bad = Template().from_image("corral-test/busybox").run_cmd(f"echo {RUN}-step-output >&2; exit 4")
    name = f"bad-{RUN}"
    try:
        with pytest.raises(BuildException) as err:
            Template.build(bad, name)
        assert "exit code 4" in str(err.value) and f"{RUN}-step-output" in str(err.value), err.value
    finally:
        _delete(server, name)


def test_another_tenant_finds_and_builds_on_nothing_of_a_template(server: dict) -> None:
    name = f"mine-{RUN}"
    Template.build(Template().from_image("corral-test/busybox").set_envs({"OWNER": "default"}), name)
    try:
        assert not Template.exists(name, api_key=OTHER_TOKEN)
        with pytest.raises(Exception) as err:
            Template.get_tags(name, api_key=OTHER_TOKEN)
        assert "404" in str(err.value) or getattr(err.value, "status_code", None) == 404, err.value
        with pytest.raises(Exception):
            Sandbox.create(template=name, api_key=OTHER_TOKEN)
        theirs = Template().from_template(name).run_cmd("true")
        with pytest.raises(BuildException):
            Template.build(theirs, f"onto-{RUN}", api_key=OTHER_TOKEN)
        # The image of the template, named as an image: refused.
        image = f"corral-template/default:e2b-{name}"
        listed = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()
        built = [i for i in listed if i.startswith(image)]
        assert built, listed
        with pytest.raises(Exception):
            Sandbox.create(template=built[0], api_key=OTHER_TOKEN)
    finally:
        _delete(server, name)


def test_the_sdks_dockerfile_builds_with_its_context(server: dict, tmp_path: Path) -> None:
    """`from_dockerfile` (what Harbor's e2b environment builds with): the
    SDK turns it into steps (USER root and WORKDIR / first, USER user last
    when it has none), and the copy reads the context directory."""
    (tmp_path / "app.txt").write_text("from the context\n")
    name = f"df-{RUN}"
    template = Template(file_context_path=str(tmp_path)).from_dockerfile(
        f"FROM corral-test/busybox\nENV RUN_ID={RUN}\nWORKDIR /app\nCOPY app.txt ./\nRUN cat app.txt > copied\n"
    )
    try:
        Template.build(template, name)
        sbx = Sandbox.create(template=name)
        try:
            r = sbx.commands.run("pwd; cat copied; id -un")
            assert r.stdout == "/app\nfrom the context\nuser\n", r
        finally:
            sbx.kill()
    finally:
        _delete(server, name)
