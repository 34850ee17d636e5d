"""Run a local ``corral serve`` for tests, examples and benchmarks::

    from corral.testing import LocalServer

    with LocalServer("target/debug/corral", config={"defaults": {"image": "corral-test/busybox"}}) as srv:
        with Sandbox(base_url=srv.url) as sb:
            ...

The server listens on a free loopback port, with the given configuration
(a dict, written as a YAML file; JSON is YAML) and is stopped with SIGTERM, so
it removes its non-persistent sandboxes on the way out.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

import httpx

__all__ = ["LocalServer", "find_binary", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_binary(binary: Union[str, "os.PathLike[str]", None] = None) -> str:
    """``binary``, else ``$CORRAL_BIN``, else ``corral`` on ``PATH``."""
    candidate = binary or os.environ.get("CORRAL_BIN") or shutil.which("corral")
    if not candidate:
        raise FileNotFoundError("no corral binary: pass one, set $CORRAL_BIN or put corral on PATH")
    path = Path(candidate)
    if not path.is_file() or not os.access(str(path), os.X_OK):
        raise FileNotFoundError(f"corral binary not found or not executable: {path}")
    return str(path)


class LocalServer:
    """A ``corral serve`` child process on a free loopback port.

    Args:
        binary: the corral binary (see :func:`find_binary`).
        config: the configuration, as a dict (or the path of a YAML file).
        token: a bearer token the server requires (passed as
            ``$CORRAL_TOKEN``); ``None``: the server generates one.
        env: extra environment for the server.
        log_path: where its stderr/stdout go (default: a temp file, whose
            tail is shown when it fails to start).
        startup_timeout: seconds to wait for ``/v1/health``.
        extra_args: more arguments of ``corral serve``.
        port: the loopback port to listen on; 0: a free one at each start.

    Without ``token`` the server generates one and writes it to its token
    file, where clients (and :attr:`client_token`) find it.
    """

    def __init__(
        self,
        binary: Union[str, "os.PathLike[str]", None] = None,
        *,
        config: Union[Mapping[str, Any], str, "os.PathLike[str]", None] = None,
        token: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        log_path: Union[str, "os.PathLike[str]", None] = None,
        startup_timeout: float = 60.0,
        extra_args: Optional[List[str]] = None,
        port: int = 0,
    ) -> None:
        self.binary = find_binary(binary)
        self.config = config
        self.token = token
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self._fixed_port = port
        self.port = port
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-serve-")
        self.log_path = Path(log_path) if log_path else Path(self._tmp.name) / "serve.log"
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config_file(self) -> Optional[str]:
        if self.config is None:
            return None
        if isinstance(self.config, Mapping):
            path = Path(self._tmp.name) / "corral.yaml"
            path.write_text(json.dumps(self.config, indent=2) + "\n")
            return str(path)
        return str(self.config)

    def start(self) -> "LocalServer":
        if self.proc is not None:
            return self
        self.port = self._fixed_port or free_port()
        args = [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}"]
        cfg = self._config_file()
        if cfg:
            args += ["--config", cfg]
        args += self.extra_args
        env = dict(os.environ)
        # The server's own settings come from the arguments and the file only.
        for key in ("CORRAL_TOKEN", "CORRAL_LISTEN", "CORRAL_CONFIG"):
            env.pop(key, None)
        env.update(self.env)
        if self.token:
            env["CORRAL_TOKEN"] = self.token
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def client_token(self) -> Optional[str]:
        """The token clients send: the one given, else the one the server
        generated (from its token file)."""
        if self.token:
            return self.token
        from ._discovery import find_token

        return find_token(self.url)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last: Optional[BaseException] = None
        assert self.proc is not None
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"corral serve exited with {self.proc.returncode} at start-up:\n{self.log_tail()}"
                    )
                try:
                    r = http.get(self.url + "/v1/health")
                    if r.status_code == 200:
                        return
                except httpx.TransportError as exc:
                    last = exc
                time.sleep(0.1)
        raise TimeoutError(
            f"corral serve did not answer /v1/health within {self.startup_timeout}s ({last}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 90.0) -> Optional[int]:
        """SIGTERM (the server removes its sandboxes), then SIGKILL after
        ``timeout`` seconds. Returns the exit code."""
        proc, self.proc = self.proc, None
        code: Optional[int] = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            code = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def docker_ids(*labels: str) -> List[str]:
    """Ids of containers (any state) carrying every ``key=value`` label,
    through the docker CLI."""
    args = ["docker", "ps", "-aq"]
    for label in labels:
        args += ["--filter", f"label={label}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [line for line in out.split() if line]


def config_with(defaults: Dict[str, Any], **sections: Any) -> Dict[str, Any]:
    """A config dict: ``defaults`` plus other top-level sections."""
    cfg: Dict[str, Any] = {"defaults": defaults}
    cfg.update(sections)
    return cfg
