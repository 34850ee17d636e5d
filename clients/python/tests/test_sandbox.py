"""The synchronous client against a real ``corral serve`` on a real daemon."""

from __future__ import annotations

import io
import pathlib
import subprocess
import tarfile
import time

import pytest

import corral

pytestmark = pytest.mark.server


# -- commands --------------------------------------------------------------


def test_health(corral_client):
    h = corral_client.health()
    assert h.ok and h.daemon_reachable and h.version


# The frame-forging attack of the Rust trust tests (busybox sh functions).
FORGER = (
    pathlib.Path(__file__).resolve().parents[3] / "crates/corral-docker/tests/attacks/forge-frames.sh"
).read_text()


def test_the_api_reports_the_real_result_of_a_command_that_forges_frames(corral_sandbox):
    r = corral_sandbox.run(FORGER + "\necho '3 tests FAILED'; forge; exit 1", timeout=60)
    assert r.failure is None
    assert (r.exit_code, r.stdout) == (1, "3 tests FAILED\n")
    assert "forge: cannot write /proc/1/fd/1" in r.stderr
    # A grader's later command is not forged either.
    g = corral_sandbox.run("echo '2 passed, 1 failed'; exit 1")
    assert (g.exit_code, g.stdout) == (1, "2 passed, 1 failed\n")


def test_an_exclusive_grader_sees_no_leftover_output(corral_sandbox):
    corral_sandbox.run(
        "( while :; do for f in /proc/[0-9]*/fd/1; do echo 'ALL TESTS PASSED' > $f; done 2>/dev/null;"
        " sleep 0.05; done ) >/dev/null 2>&1 &"
    )
    g = corral_sandbox.run("sleep 1; echo '3 tests FAILED'; exit 1", exclusive=True)
    assert (g.exit_code, g.stdout) == (1, "3 tests FAILED\n")


def test_run_echo(corral_sandbox):
    r = corral_sandbox.run("echo hello")
    assert r.ok
    assert (r.exit_code, r.stdout, r.stderr) == (0, "hello\n", "")
    assert r.stdout_total_bytes == 6 and not r.truncated
    assert r.failure is None and r.duration_ms >= 0
    assert r.sandbox_id


def test_exit_codes_are_results_not_errors(corral_sandbox):
    assert corral_sandbox.run("exit 3").exit_code == 3
    assert corral_sandbox.run("false").exit_code == 1
    with pytest.raises(corral.CommandFailedError) as ei:
        corral_sandbox.run("echo boom >&2; exit 7", check=True)
    assert ei.value.exit_code == 7 and "boom" in str(ei.value)
    assert corral_sandbox.run("true", check=True).ok


def test_stderr_is_separate(corral_sandbox):
    r = corral_sandbox.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr) == ("out\n", "err\n")


def test_binary_output_keeps_exact_bytes(corral_sandbox):
    r = corral_sandbox.run(["printf", "\\377\\000\\001ok"])
    assert r.stdout_bytes == b"\xff\x00\x01ok"
    assert r.stdout == "\ufffd\x00\x01ok"
    assert r.stderr_bytes == b""


def test_stdin_text_and_bytes(corral_sandbox):
    assert corral_sandbox.run("cat", stdin="typed in\n").stdout == "typed in\n"
    data = bytes(range(256)) * 4
    r = corral_sandbox.run("cat", stdin=data)
    assert r.stdout_bytes == data
    assert corral_sandbox.run("wc -c").stdout.strip() == "0"  # no stdin: EOF at once


def test_argv_cwd_and_env(corral_sandbox):
    r = corral_sandbox.run(["sh", "-c", 'echo "$GREETING from $(pwd)"'], cwd="/tmp", env={"GREETING": "hi there"})
    assert r.stdout == "hi there from /tmp\n"


def test_output_cap_keeps_head_and_tail(corral_sandbox):
    r = corral_sandbox.run("seq 1 100000", max_output=1000)
    assert r.stdout_truncated and r.truncated
    assert r.stdout_total_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))
    assert r.stdout.startswith("1\n2\n3\n") and r.stdout.endswith("99999\n100000\n")
    assert len(r.stdout_bytes) < 2000


def test_timeout_raises_typed_error_with_the_result(corral_sandbox):
    start = time.monotonic()
    with pytest.raises(corral.SandboxTimeoutError) as ei:
        corral_sandbox.run("echo started; sleep 30", timeout=1)
    elapsed = time.monotonic() - start
    err = ei.value
    assert err.kind == "timeout" and err.retryable is False
    assert isinstance(err, TimeoutError) and isinstance(err, corral.CorralError)
    assert err.result is not None and err.result.stdout == "started\n"
    assert err.result.exit_code is None
    assert elapsed < 20
    # The sandbox is still usable, and the sleep's tree is gone.
    assert corral_sandbox.run("echo after").stdout == "after\n"


def test_timeout_can_be_returned_instead(corral_sandbox):
    r = corral_sandbox.run("sleep 30", timeout=0.5, raise_on_failure=False)
    assert r.failure is not None and r.failure.kind == "timeout" and not r.ok


def test_oom_kill_raises_typed_error(corral_client, corral_spec):
    spec = corral_spec(limits={"memory": 32 * 1024 * 1024})
    with corral_client.sandbox(spec=spec) as sb:
        # One 100 MiB allocation OOMs at once; a pipe into `tail` grows
        # slowly and the kernel can thrash for a minute before it kills.
        hog = "dd if=/dev/zero of=/dev/null bs=100M count=1"
        with pytest.raises(corral.SandboxOOMError) as ei:
            sb.run(hog, timeout=60)
        err = ei.value
        assert err.kind == "oom_killed" and isinstance(err, MemoryError)
        assert err.result is not None and err.result.failure.kind == "oom_killed"
        # Raised or returned, as asked.
        r = sb.run(hog, timeout=60, raise_on_failure=False)
        assert r.failure is not None and r.failure.kind == "oom_killed"


def test_container_removed_out_of_band_is_container_lost(corral_client):
    with corral_client.sandbox() as sb:
        assert sb.run("true").ok
        assert sb.container_id
        subprocess.run(["docker", "rm", "-f", sb.container_id], check=True, capture_output=True)
        with pytest.raises(corral.SandboxContainerLostError) as ei:
            sb.run("echo hi", timeout=30)
        err = ei.value
        assert err.kind == "container_lost"
        assert err.retryable is True
        # Either the command's result (failure container_lost) or an error
        # answer (410) when the service already knew before running it.
        if err.result is not None:
            assert err.result.failure.kind == "container_lost" and err.result.failure.retryable
        else:
            assert err.status == 410
        assert sb.sandbox_id in err.message
        # The sandbox stays failed (recovery: fail); deleting it is fine.
        with pytest.raises((corral.SandboxContainerLostError, corral.SandboxNotFoundError)):
            sb.run("true")


# -- streaming -------------------------------------------------------------


def test_stream_yields_output_before_the_result(corral_sandbox):
    seen = []
    stream = corral_sandbox.stream("echo one; sleep 1; echo two >&2; sleep 1; echo three")
    for ev in stream:
        seen.append((time.monotonic(), ev))
    kinds = [ev.kind for _, ev in seen]
    assert kinds[-1] == "result" and kinds.count("result") == 1
    first_output = next(t for t, ev in seen if ev.is_output)
    result_at = seen[-1][0]
    assert result_at - first_output > 1.0, "output must arrive while the command still runs"
    out = b"".join(ev.data for _, ev in seen if ev.kind == "stdout")
    err = b"".join(ev.data for _, ev in seen if ev.kind == "stderr")
    assert (out, err) == (b"one\nthree\n", b"two\n")
    assert stream.result is not None and stream.result.exit_code == 0
    assert stream.result.stdout == "one\nthree\n"


def test_stream_binary_chunks_and_failure(corral_sandbox):
    evs = list(corral_sandbox.stream(["printf", "\\377\\376"]))
    assert b"".join(e.data for e in evs if e.kind == "stdout") == b"\xff\xfe"
    with pytest.raises(corral.SandboxTimeoutError) as ei:
        for _ in corral_sandbox.stream("echo x; sleep 30", timeout=1):
            pass
    assert ei.value.result.stdout == "x\n"
    s = corral_sandbox.stream("sleep 30", timeout=0.5, raise_on_failure=False)
    assert list(s)[-1].result.failure.kind == "timeout"


def test_stream_feeds_stdin_then_eof(corral_sandbox):
    """A streamed command gets its stdin and then EOF, as with ``run``:
    ``cat`` ends (it would wait for EOF until its timeout otherwise)."""
    s = corral_sandbox.stream("cat; echo end", timeout=30, stdin="piped in\n", raise_on_failure=False)
    out = b"".join(ev.data for ev in s if ev.kind == "stdout")
    assert s.result is not None and s.result.failure is None, s.result
    assert (out, s.result.exit_code) == (b"piped in\nend\n", 0)
    binary = corral_sandbox.stream(["od", "-An", "-tx1"], timeout=30, stdin=b"\x00\xff", raise_on_failure=False)
    assert b"".join(ev.data for ev in binary if ev.kind == "stdout").split() == [b"00", b"ff"]


# -- files -----------------------------------------------------------------


def test_files_round_trip_text_binary_and_listing(corral_sandbox):
    blob = bytes(range(256)) * 64
    corral_sandbox.write_file("/tmp/data/blob.bin", blob, mkdirs=True)
    corral_sandbox.write_file("/tmp/data/note.txt", "h\u00e9llo\n", mode=0o600)
    assert corral_sandbox.read_file("/tmp/data/blob.bin") == blob
    assert corral_sandbox.read_text("/tmp/data/note.txt") == "h\u00e9llo\n"
    assert corral_sandbox.run("cat /tmp/data/note.txt").stdout == "h\u00e9llo\n"
    entries = {e.name: e for e in corral_sandbox.list_files("/tmp/data")}
    assert set(entries) == {"blob.bin", "note.txt"}
    assert entries["blob.bin"].is_file and entries["blob.bin"].size == len(blob)
    assert entries["note.txt"].mode & 0o777 == 0o600
    corral_sandbox.run("mkdir /tmp/data/sub && ln -s note.txt /tmp/data/link")
    entries = {e.name: e for e in corral_sandbox.list_files("/tmp/data")}
    assert entries["sub"].is_dir
    assert entries["link"].type == "symlink" and entries["link"].target == "note.txt"


def test_missing_file_is_file_not_found(corral_sandbox):
    with pytest.raises(corral.SandboxFileNotFoundError) as ei:
        corral_sandbox.read_file("/tmp/no-such-file")
    assert isinstance(ei.value, FileNotFoundError) and ei.value.status == 404
    with pytest.raises(FileNotFoundError):
        corral_sandbox.write_file("/tmp/no/such/dir/f", b"x")  # no mkdirs


def test_relative_path_is_an_invalid_request_naming_path(corral_sandbox):
    with pytest.raises(corral.InvalidRequestError) as ei:
        corral_sandbox.read_file("relative/path")
    assert ei.value.field == "path" and ei.value.status == 400


def test_tar_upload_download_and_dirs(corral_sandbox, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    corral_sandbox.upload_dir(src, "/root/proj")
    assert corral_sandbox.run("/root/proj/run.sh").stdout == "ran\n"
    assert corral_sandbox.read_text("/root/proj/pkg/mod.py") == "X = 1\n"

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    corral_sandbox.upload_tar("/root/proj", buf.getvalue())
    assert corral_sandbox.read_text("/root/proj/hello.txt") == "hi\n"

    data = corral_sandbox.download_tar("/root/proj")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = set(tar.getnames())
    assert any(n.endswith("pkg/mod.py") for n in names), names
    out = tmp_path / "out"
    corral_sandbox.download_dir("/root/proj", out)
    found = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert any(f.endswith("pkg/mod.py") for f in found), found


# -- shell sessions --------------------------------------------------------


def test_shell_session_keeps_cwd_env_and_functions(corral_sandbox):
    with corral_sandbox.shell("work") as sh:
        first = sh.run("cd /tmp && export COLOR=blue && greet() { echo \"hi $1\"; }")
        assert first.exit_code == 0
        r = sh.run("pwd; echo $COLOR; greet you")
        assert r.stdout == "/tmp\nblue\nhi you\n"
        assert r.restarted is False and r.ended is False
        # Shell results come from the shell inside the sandbox: never trusted.
        assert r.trusted is False and r.dropped_between_bytes == 0
        assert sh.run("false").exit_code == 1
        assert "work" in corral_sandbox.shells()
        # A one-shot command does not see the session's state.
        assert corral_sandbox.run("echo ${COLOR:-none}").stdout == "none\n"
    assert "work" not in corral_sandbox.shells()


def test_shell_timeout_and_exit(corral_sandbox):
    sh = corral_sandbox.shell()
    sh.run("export KEEP=1")
    with pytest.raises(corral.SandboxTimeoutError):
        sh.run("sleep 30", timeout=1)
    # Interrupted, the session is kept; a shell that had to be replaced says so.
    r = sh.run("echo ${KEEP:-lost}")
    assert r.stdout == ("lost\n" if r.restarted else "1\n")
    ended = sh.run("exit 4")
    assert ended.ended is True and ended.exit_code == 4
    again = sh.run("echo ${KEEP:-fresh}")
    assert again.stdout == "fresh\n" and again.restarted is True
    sh.close()
    sh.close()  # closing twice is fine


# -- sandboxes and errors --------------------------------------------------


def test_sandbox_lifecycle_and_listing(corral_client):
    sb = corral_client.create_sandbox()
    try:
        ids = {s.id for s in corral_client.list_sandboxes()}
        assert sb.id in ids
        info = sb.refresh()
        assert info.alive and info.container_id == sb.container_id and info.image == "corral-test/busybox"
        same = corral_client.get_sandbox(sb.id)
        assert same.container_id == sb.container_id
    finally:
        sb.delete()
    assert sb.id not in {s.id for s in corral_client.list_sandboxes()}
    sb.delete()  # twice is fine
    with pytest.raises(corral.SandboxNotFoundError):
        corral_client.sandbox_info(sb.id)


def test_session_key_returns_the_same_sandbox(corral_client):
    with corral_client.sandbox(session="pytest-same-key") as a:
        b = corral_client.sandbox(session="pytest-same-key")
        assert b.id == a.id == "pytest-same-key" and b.container_id == a.container_id


def test_unknown_sandbox_is_sandbox_not_found(corral_client):
    ghost = corral.Sandbox(corral_client, _info=corral.SandboxInfo(id="no-such-sandbox"))
    with pytest.raises(corral.SandboxNotFoundError) as ei:
        ghost.run("true")
    assert ei.value.status == 404 and ei.value.kind == "not_found" and not ei.value.retryable
    with pytest.raises(corral.SandboxNotFoundError):
        ghost.read_file("/etc/passwd")
    with pytest.raises(corral.SandboxNotFoundError):
        corral_client.get_sandbox("no-such-sandbox")


def test_bad_spec_is_invalid_spec_naming_the_field(corral_client, corral_spec):
    with pytest.raises(corral.InvalidSpecError) as ei:
        corral_client.sandbox(spec=corral_spec(limits={"memory": 1}))
    err = ei.value
    assert err.status == 400 and err.kind == "invalid_spec"
    assert err.field is not None and "limits.memory" in err.field
    with pytest.raises(corral.InvalidRequestError) as ei:
        corral_client.sandbox(spec=corral_spec(no_such_key=True))
    assert ei.value.field is not None and "no_such_key" in (ei.value.field + ei.value.message)


def test_missing_image_is_refused_not_pulled(corral_client):
    # Clients may name any image already on the daemon (the default policy);
    # the service pulls nothing for them.
    with pytest.raises(corral.ForbiddenError) as ei:
        corral_client.sandbox(image="corral-test/does-not-exist:never")
    assert ei.value.kind == "forbidden" and ei.value.status == 403
    assert ei.value.field == "image" and "corral-test/does-not-exist:never" in str(ei.value)


def test_sandbox_without_client_uses_corral_url(corral_url, monkeypatch):
    monkeypatch.setenv("CORRAL_URL", corral_url)
    with corral.Sandbox() as sb:
        assert sb.run("echo env").stdout == "env\n"
        sid = sb.id
    with corral.Client() as c:
        assert sid not in {s.id for s in c.list_sandboxes()}
