"""corral's own terminals: ``Sandbox.stream(..., pty=(cols, rows))`` runs a
real interactive program (python3's REPL) on a pseudo-terminal in a real
sandbox behind a real ``corral serve``, and ``interactive=True`` keeps a
plain command's stdin open. Input, resizes and signals go through
``POST /v1/sandboxes/{id}/exec/{handle}/input``, which another principal
cannot reach. Needs ``corral-test/python``
(``scripts/build-test-images.sh --python``)."""

from __future__ import annotations

import secrets
import subprocess
from typing import Iterator

import httpx
import pytest

import corral
from corral.testing import LocalServer
from conftest import LABELS, running_server

pytestmark = pytest.mark.server

PY_IMAGE = "corral-test/python"
TOKENS = {"alice": secrets.token_hex(16), "bob": secrets.token_hex(16)}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    if subprocess.run(["docker", "image", "inspect", PY_IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{PY_IMAGE} is not built: scripts/build-test-images.sh --python")
    with running_server(
        config={
            "defaults": {"image": PY_IMAGE, "labels": dict(LABELS)},
            "server": {
                "token": secrets.token_hex(16),
                "tenants": {name: {"token": token} for name, token in TOKENS.items()},
            },
        },
    ) as srv:
        yield srv


def sandbox(server: LocalServer, who: str = "alice") -> corral.Sandbox:
    return corral.Sandbox.create(base_url=server.url, token=TOKENS[who])


class Terminal:
    """Reads a stream's output up to what a test waits for."""

    def __init__(self, stream: corral.CommandStream) -> None:
        self.stream = stream
        self.events = iter(stream)
        self.seen = ""
        self.read = 0  # how far earlier waits have read

    def until(self, needle: str) -> str:
        """The output from the end of the last wait until ``needle`` shows."""
        start = self.read
        while True:
            at = self.seen.find(needle, start)
            if at >= 0:
                self.read = at + len(needle)
                return self.seen[start : self.read]
            ev = next(self.events, None)
            if ev is None:
                break
            self.seen += ev.text
        raise AssertionError(f"the stream ended before {needle!r}; it showed {self.seen[start:]!r}")


def test_a_python_repl_runs_on_a_terminal_that_resizes_and_interrupts(server: LocalServer) -> None:
    with sandbox(server) as sb:
        with sb.stream(["python3", "-q", "-i"], pty=(80, 24), timeout=120) as stream:
            term = Terminal(stream)
            first = next(term.events)
            assert first.kind == "started" and stream.handle, first
            term.until(">>> ")
            stream.send_stdin("import os, shutil; print('tty', os.isatty(0), os.getsid(0) == os.getpid())\r")
            assert "tty True True" in term.until(">>> ")
            stream.send_stdin("print(shutil.get_terminal_size())\r")
            assert "columns=80, lines=24" in term.until(">>> ")
            stream.resize(132, 43)
            stream.send_stdin("print(shutil.get_terminal_size())\r")
            # readline redraws its prompt on SIGWINCH, so wait for the answer.
            term.until("columns=132, lines=43")
            term.until(">>> ")
            # Ctrl-C reaches the foreground program through the terminal:
            # sent once the loop runs (a Ctrl-C typed before the line is read
            # discards the unread input, as a terminal does).
            stream.send_stdin("print('spin' + 'ning'); exec('while True: pass')\r")
            term.until("spinning\r\n")
            stream.send_stdin("\x03")
            term.until("KeyboardInterrupt")
            term.until(">>> ")
            stream.send_stdin("print(6 * 7)\r")
            term.until("42\r\n")
            term.until(">>> ")
            stream.send_stdin("\x04")  # end of input at a line's start
            for _ in term.events:
                pass
        assert stream.result is not None and stream.result.exit_code == 0, stream.result
        # The handle ended with the command.
        with pytest.raises(corral.NotFoundError, match="no running interactive command"):
            stream.send_stdin("late\r")


def test_an_interactive_command_takes_stdin_until_eof(server: LocalServer) -> None:
    with sandbox(server) as sb:
        with sb.stream("read a; echo got=$a; cat", interactive=True, timeout=60) as stream:
            term = Terminal(stream)
            assert next(term.events).kind == "started"
            stream.send_stdin("one\n")
            term.until("got=one\n")
            stream.send_stdin(b"\x00bytes\n")
            term.until("bytes\n")
            stream.close_stdin()
            for _ in term.events:
                pass
        assert stream.result is not None and stream.result.exit_code == 0, stream.result
        # A command that ignores its stdin is stopped by a signal.
        with sb.stream("trap '' INT; sleep 600", interactive=True, timeout=60, raise_on_failure=False) as stream:
            events = iter(stream)
            assert next(events).kind == "started"
            stream.signal(15)
            for _ in events:
                pass
        assert stream.result is not None and stream.result.signal == 15, stream.result


def test_another_principal_cannot_type_into_a_terminal(server: LocalServer) -> None:
    with sandbox(server, "alice") as mine, sandbox(server, "bob") as theirs:
        with mine.stream(["python3", "-q", "-i"], pty=(80, 24), timeout=120) as stream:
            term = Terminal(stream)
            term.until(">>> ")
            handle = stream.handle
            assert handle
            attack = {"data": "import os; os.system('touch /tmp/bob-was-here')\r", "signal": 9}
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKENS['bob']}"}) as bob:
                # alice's sandbox by its id, and bob's own sandbox with alice's handle.
                for sid in (mine.id, theirs.id):
                    r = bob.post(f"/v1/sandboxes/{sid}/exec/{handle}/input", json=attack)
                    assert r.status_code == 404, (sid, r.status_code, r.text)
                # A guessed handle in bob's own sandbox is no better.
                for guess in range(1, 64):
                    r = bob.post(f"/v1/sandboxes/{theirs.id}/exec/{guess}/input", json=attack)
                    assert r.status_code == 404, (guess, r.status_code, r.text)
            stream.send_stdin("print('alive', __import__('os').path.exists('/tmp/bob-was-here'))\r")
            assert "alive False" in term.until(">>> ")
            stream.send_stdin("exit()\r")
            for _ in term.events:
                pass
        assert stream.result is not None and stream.result.exit_code == 0, stream.result


def test_bad_input_is_named(server: LocalServer) -> None:
    with sandbox(server) as sb:
        with pytest.raises(corral.InvalidRequestError) as info:
            list(sb.stream("true", pty=(0, 24)))
        assert info.value.field == "pty.cols", info.value
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKENS['alice']}"}) as http:
            r = http.post(f"/v1/sandboxes/{sb.id}/exec", json={"command": "true", "interactive": True})
            assert r.status_code == 400 and r.json()["error"]["field"] == "interactive", r.text
        with sb.stream("cat", interactive=True, timeout=60) as plain:
            events = iter(plain)
            assert next(events).kind == "started"
            with pytest.raises(corral.InvalidRequestError) as info:
                plain.resize(80, 24)
            assert info.value.field == "resize", info.value
            with pytest.raises(corral.InvalidRequestError) as info:
                plain._input({"data": "x", "data_base64": "eA=="})  # type: ignore[attr-defined]
            assert info.value.field == "data", info.value
            plain.close_stdin()
            for _ in events:
                pass
        with sb.stream("cat", pty=(80, 24), timeout=60) as term:
            events = iter(term)
            assert next(events).kind == "started"
            with pytest.raises(corral.InvalidRequestError) as info:
                term.resize(80, 5000)
            assert info.value.field == "resize.rows", info.value
            with pytest.raises(corral.InvalidRequestError) as info:
                term.close_stdin()
            assert info.value.field == "eof", info.value
            term.send_stdin("\x04")
            for _ in events:
                pass
