"""corral as a terminal backend of hermes-agent (``tools/terminal_tool.py``),
in place of its Docker backend (``tools/environments/docker.py``).

The one-line switch
-------------------

hermes builds the environment its ``terminal`` and file tools run in with
``tools.terminal_tool._create_environment(env_type, image, cwd, timeout,
...)``, ``env_type`` being ``$TERMINAL_ENV`` (``terminal.backend`` in
``~/.hermes/config.yaml``, bridged to that variable at start). hermes-agent
0.19.0 (the PyPI release) knows a fixed list of backends there; newer
sources look any other name up in a plugin registry
(``TerminalEnvironmentProvider``). corral is the backend ``corral``:

* ``TERMINAL_ENV=corral hermes``: the client's startup hook
  (``corral_autoload.pth``, see :mod:`corral_autoload`) sees
  ``$TERMINAL_ENV`` at interpreter start and calls :func:`install` right
  after ``tools.terminal_tool`` is imported;
* ``terminal.backend: corral`` in ``config.yaml`` with the plugin enabled
  (``hermes plugins enable corral``): the client's wheel declares the
  ``hermes_agent.plugins`` entry point ``corral``, whose :func:`register`
  registers :class:`CorralTerminalProvider` where hermes has the plugin API
  and calls :func:`install` where it has not;
* in code: ``corral.adapters.hermes.install()``, then ``TERMINAL_ENV=corral``.

:func:`install` registers the provider through the plugin API when the
installed hermes has ``agent.terminal_env_registry``; otherwise it wraps
``_create_environment`` (``"corral"`` gives a :class:`CorralEnvironment`,
every other name hermes' own), adds ``"corral"`` to ``_CONTAINER_BACKENDS``
(host paths given as the working directory are dropped, as for Docker),
answers the terminal tool's requirement check for ``corral`` (else hermes
hides the terminal and file tools), and skips the dangerous-command approval
prompt for it as for an isolated Docker container (not when host paths are
mounted). The service is ``$CORRAL_URL``/``$CORRAL_TOKEN`` as the client
finds it, or :func:`install`'s ``base_url``/``token``.

The backend
-----------

:class:`CorralEnvironment` subclasses hermes' ``BaseEnvironment``, so the
command wrapping, session snapshot, working-directory tracking, output
capture, interrupt and timeout handling are hermes' own code; it supplies
``_run_bash`` (a command as a process handle: corral's output stream feeds a
pipe that hermes drains) and ``cleanup``. The settings of the Docker backend
map onto a corral spec:

* image: a task's ``docker_image`` override (``register_task_env_overrides``),
  else ``$TERMINAL_CORRAL_IMAGE``, else ``terminal.docker_image``
  (``$TERMINAL_DOCKER_IMAGE``), else the service's default image. hermes'
  built-in default (``nikolaik/python-nodejs:...``, which its config bridge
  sets when the user chose none) gives way, with a warning, to the service's
  default image when the service refuses it (by default a service pulls
  nothing for clients); any other image the service refuses is an error
  naming it. ``$TERMINAL_CORRAL_PROFILE`` takes a profile of the service
  instead (the operator's image, limits and mounts; no spec is sent);
* ``container_cpu``, ``container_memory`` (MB), ``container_disk`` (MB) are
  ``limits.cpus``, ``limits.memory``, ``limits.disk``; the process limit is
  hermes' 256. Where the daemon cannot limit disk the sandbox starts
  without, with a warning, as hermes does;
* ``docker_network: false`` is ``network: none``; ``docker_env`` is the spec's
  ``env``; ``docker_forward_env`` (and hermes' own pass-through list) goes,
  as with Docker, only to the login shell that takes the session snapshot;
  ``docker_volumes`` and ``docker_mount_cwd_to_workspace`` are spec
  ``mounts`` and ``docker_run_as_host_user`` the spec's user, which the
  service's policy refuses to clients (403 naming the field): an operator
  grants them through a profile; ``docker_extra_args`` has no corral
  equivalent and is refused (``ValueError`` naming it);
* hermes' labels (``hermes-agent``, ``hermes-task-id``, ``hermes-profile``)
  are the sandbox's labels;
* ``container_persistent`` (default true) is a persistent sandbox:
  ``/workspace`` and the home directory are kept by the service per session
  key, across lost containers and service restarts. The service must allow
  it (``server.policy.allow_persistent``), else the environment is not
  created and the error names the setting. corral keeps
  ``/workspace`` and the sandbox's home (``$HOME``, ``/home/corral``), not
  ``/root`` (hermes' Docker backend keeps ``/root``, its default working
  directory): work in ``/workspace`` (``terminal.cwd: /workspace``);
* ``docker_persist_across_processes`` (default true), hermes' one long-lived
  container per task shared across processes, is the session key
  ``hermes-<profile>-<task id>`` (``hermes-tmp-...`` when not persistent),
  under which the next hermes process of the task gets the same sandbox,
  processes included, as hermes finds its container by its labels; and the
  recovery policy ``recreate`` (else ``fail``): hermes' recovery from
  out-of-band removal. Without it each environment has a sandbox of its
  own (no session key: two hermes processes of one task never share one,
  as hermes' Docker backend starts a container per process), not
  persistent (hermes keeps such a workspace in a host directory per task;
  corral keeps a workspace per session key, which no next process would
  find). As with hermes, the sandbox of a key is reused
  whatever the settings now say; release it (``cleanup(force_remove=True)``)
  after changing them.

A command runs as ``bash -c`` (``bash -l -c`` for the snapshot), stderr
merged into stdout inside the sandbox, as hermes' ``stderr=STDOUT``;
``stdin_data`` is the command's stdin. ``execute`` returns
``{"output", "returncode"}``: the command's exit code; 124 and
``[Command timed out after Ns]`` past the timeout, 130 and
``[Command interrupted]`` on hermes' interrupt (both hermes' own code; the
command's whole process tree is killed); 137 on an OOM kill; -1 with
corral's message for a failure of the service (its type is
:attr:`CorralEnvironment.last_failure`).

Recovery (hermes' "No such container" recovery, PR #39415): the container
removed out-of-band (``docker rm -f``, a prune, a daemon restart) is brought
back by the service under the same spec, a persistent sandbox with its
workspace; the command runs there, and the environment takes hermes'
session snapshot again when the command finds it missing (a new container
has a new ``/tmp``). A sandbox the service no longer has (deleted,
evicted) is asked for again with the same spec and session key, and the
command run there. Only the service's typed failure counts as a
loss: a command that exits non-zero, whatever it prints, is a result.

``cleanup()`` (hermes calls it when a task's environment idles, at
``cleanup_vm`` and at exit) does what hermes' Docker backend does: with
``docker_persist_across_processes`` it leaves the sandbox running for the
next process (the service's idle timeout, ``provider.idle_timeout_ms``,
removes one nobody uses; a persistent one's workspace stays); without it, or
with ``force_remove=True``, it releases the sandbox: removed, a persistent
one's workspace and home kept. ``cleanup_vm(task_id, force_remove=True)``
tears down the environment the task's commands ran in, also for a task id
hermes runs in its shared ``"default"`` environment (one without an image
override), which hermes' own ``cleanup_vm`` does not find (it would leave
the sandbox). Such a sandbox is also released at
interpreter exit (a crash included), on SIGTERM and SIGHUP, and on SIGINT
without a terminal (:mod:`corral.adapters._reaper`).

Deliberate differences from hermes' Docker backend:

* a lost container is recognised by the service's typed failure, never by
  the words "No such container" or "is not running" in the output of a
  failed command, on which hermes' Docker backend "recovers" a healthy
  container: it takes a new session snapshot (variables exported earlier
  are lost) and runs the command a second time;
* the sandbox has corral's hardening (all capabilities dropped but CHOWN,
  DAC_OVERRIDE and FOWNER, as hermes; SETUID/SETGID only where the
  operator's spec adds them, where hermes adds them for images that drop
  privileges; no-new-privileges; a seccomp filter; tmpfs limits) and
  corral's network (no traffic between sandboxes), rather than hermes' run
  arguments (``--init``, ``/tmp`` 512 MB tmpfs, ``/workspace`` and ``/root``
  tmpfs when not persistent);
* hermes' ``/root`` is not kept by a persistent sandbox (``/workspace``
  and ``$HOME`` are), and a released persistent sandbox keeps its files in
  the service's ``persistence_root`` (hermes: ``~/.hermes/sandboxes``);
* ``cleanup_vm(task_id, force_remove=True)`` for a task id without an
  image override removes the shared environment's sandbox that task's
  commands ran in, where hermes' own ``cleanup_vm`` finds no environment
  under that id and removes nothing;
* a sandbox left for the next process is removed by the service's idle
  timeout (30 minutes by default, its workspace kept), where hermes' Docker
  backend leaves the container until its orphan reaper at a later start;
* stdout and stderr keep the order in which they were written (both go to
  one pipe in the sandbox), where ``docker exec``'s demultiplexing may
  reorder them;
* a command's output is kept up to 16 MiB (``max_output``) per stream; beyond
  it the head and the tail are kept and the text says where it was cut;
* a command the service runs again after recovering the container runs
  before hermes' session snapshot is re-taken (variables exported earlier
  were in the lost container's ``/tmp`` either way).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import select
import shlex
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional

try:
    from tools.environments.base import BaseEnvironment
except ImportError as _err:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"corral.adapters.hermes needs hermes-agent (pip install hermes-agent): "
        f"tools.environments.base is not importable ({_err})"
    ) from _err

from ..client import Client, Sandbox
from ..errors import CorralError, NotFoundError, UnsupportedError
from ..models import CommandResult
from . import _output, _reaper

__all__ = [
    "BACKEND",
    "CorralEnvironment",
    "CorralTerminalProvider",
    "create_environment",
    "install",
    "register",
    "session_key",
]

log = logging.getLogger("corral.adapters")

#: The ``terminal.backend`` / ``$TERMINAL_ENV`` value.
BACKEND = "corral"

#: hermes' process limit for its Docker containers (``--pids-limit``).
PIDS_LIMIT = 256
#: What a command's wrapper writes to its own stderr (before stderr goes to
#: stdout) when hermes' session snapshot is not in the sandbox: a new
#: container, whose /tmp is new.
SNAPSHOT_GONE = b"corral-hermes-snapshot-gone\n"
#: Bytes of output kept per stream and command by default (head and tail
#: beyond it).
DEFAULT_MAX_OUTPUT = 16 << 20
_MB = 1 << 20

# Settings read from the environment besides hermes' own TERMINAL_* ones.
IMAGE_ENV = "TERMINAL_CORRAL_IMAGE"
PROFILE_ENV = "TERMINAL_CORRAL_PROFILE"
MAX_OUTPUT_ENV = "TERMINAL_CORRAL_MAX_OUTPUT"

# What install() was given: CorralEnvironment keyword arguments (base_url,
# token, client, profile, spec, max_output) for every environment.
_defaults: Dict[str, Any] = {}


# -- a command as hermes' process handle ------------------------------------


class _StreamedCommand:
    """One command in the sandbox as the ``ProcessHandle`` hermes'
    ``_wait_for_process`` polls: its output (stdout, stderr merged into it
    inside the sandbox) is written to a pipe hermes drains, ``poll``/``wait``
    report the exit code, and ``kill`` closes corral's output stream, which
    kills the command's process tree in the sandbox."""

    def __init__(
        self,
        env: "CorralEnvironment",
        argv: List[str],
        *,
        timeout: Optional[float],
        stdin: Optional[str],
        extra_env: Optional[Mapping[str, str]],
        check_snapshot: bool = False,
    ) -> None:
        self._env = env
        self._check_snapshot = check_snapshot
        self._argv = argv
        self._timeout = timeout
        self._stdin = stdin
        self._extra_env = dict(extra_env or {})
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._stdout = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._write_fd: Optional[int] = write_fd
        self._returncode: Optional[int] = None
        self._done = threading.Event()
        self._killed = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self.pid: Optional[int] = None
        #: The command's result from the service (``None`` when there was none).
        self.result: Optional[CommandResult] = None
        #: The service's refusal, when the command could not run at all.
        self.error: Optional[CorralError] = None
        self._thread = threading.Thread(target=self._run, name="corral-hermes-command", daemon=True)
        self._thread.start()

    # ProcessHandle
    @property
    def stdout(self) -> Any:
        return self._stdout

    @property
    def returncode(self) -> Optional[int]:
        return self._returncode if self._done.is_set() else None

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._done.wait(timeout)
        return self.returncode

    def kill(self) -> None:
        self._killed.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - the connection may be mid-read
                pass

    terminate = kill

    # The worker
    def _write(self, data: bytes) -> None:
        """Write to the pipe hermes drains; give up once the command was
        killed (hermes stops draining then, and a full pipe would block)."""
        fd = self._write_fd
        view = memoryview(data)
        while view and fd is not None:
            try:
                n = os.write(fd, view)
                view = view[n:]
            except BlockingIOError:
                if self._killed.is_set():
                    return
                select.select([], [fd], [], 0.1)
            except OSError as err:
                if err.errno == errno.EPIPE:
                    return
                raise

    def _finish(self, code: int) -> None:
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            os.close(fd)
        self._returncode = code
        self._done.set()

    def _run(self) -> None:
        code = -1
        try:
            code = self._execute()
        except Exception as err:  # noqa: BLE001 - reported in the output, never lost
            if not self._killed.is_set():
                self._write(f"corral: {type(err).__name__}: {err}\n".encode())
        finally:
            if self._killed.is_set() and self._returncode is None and code == -1:
                code = -9
            self._finish(code)

    def _execute(self) -> int:
        sb = self._env.sandbox
        max_output = self._env.max_output
        try:
            stream = sb.stream(
                self._argv,
                timeout=self._timeout,
                env=self._extra_env or None,
                stdin=self._stdin,
                max_output=max_output,
                wait_for_output=True,
                raise_on_failure=False,
            )
        except CorralError as err:
            return self._refused(err)
        with self._lock:
            self._stream = stream
        if self._killed.is_set():
            stream.close()
            return -9
        head_len = max_output - max_output // 2
        seen = {"stdout": 0, "stderr": 0}
        held: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        sentinel = b""
        try:
            for ev in stream:
                if not ev.is_output:
                    continue
                kind = ev.kind
                data = ev.data
                if kind == "stderr" and self._check_snapshot and len(sentinel) < len(SNAPSHOT_GONE):
                    # The wrapper's own stderr, before the command's goes to
                    # stdout: at most the marker.
                    take = len(SNAPSHOT_GONE) - len(sentinel)
                    sentinel += data[:take]
                    data = data[take:]
                    if sentinel == SNAPSHOT_GONE:
                        self._env._snapshot_gone = True
                    elif not SNAPSHOT_GONE.startswith(sentinel):
                        data, sentinel = sentinel + data, SNAPSHOT_GONE
                    if not data:
                        continue
                # The service sends each stream's head live and its kept tail
                # at the end; whether bytes were dropped between them shows in
                # the result, so what comes past the head waits for it.
                live = max(0, min(len(data), head_len - seen[kind]))
                seen[kind] += len(data)
                if live:
                    self._write(data[:live])
                if live < len(data):
                    held[kind].append(data[live:])
        except CorralError as err:
            if self._killed.is_set():
                return -9
            return self._refused(err)
        result = stream.result
        if result is None:  # pragma: no cover - the stream raises instead
            return -1
        self.result = result
        for kind in ("stdout", "stderr"):
            rest = b"".join(held[kind])
            truncated = result.stdout_truncated if kind == "stdout" else result.stderr_truncated
            total = result.stdout_total_bytes if kind == "stdout" else result.stderr_total_bytes
            if truncated and rest:
                self._write(_output.elided_marker(total - head_len - len(rest)).encode())
            if rest:
                self._write(rest)
        self._env.last_failure = result.failure
        return self._code(result)

    def _refused(self, err: CorralError) -> int:
        """The service did not run the command (the sandbox is gone, the
        service unreachable, ...): corral's message as the output."""
        self.error = err
        self._env._refused(err)
        self._write(f"corral: {err.message}\n".encode())
        return -1

    def _code(self, result: CommandResult) -> int:
        failure = result.failure
        if failure is None:
            if result.exit_code is not None:
                return result.exit_code
            return 128 + result.signal if result.signal else -1
        if failure.kind == "timeout":
            # hermes' own deadline normally ends the command first; the
            # service's, at the same instant, reads the same.
            self._write(f"\n[Command timed out after {_seconds(self._timeout)}s]".encode())
            return 124
        message = failure.message if failure.message.endswith("\n") else failure.message + "\n"
        self._write(("\n" + message).encode())
        if failure.kind == "oom_killed":
            return 137
        if failure.kind == "spawn_failed":
            return 127
        return -1


def _seconds(value: Optional[float]) -> Any:
    if value is None:
        return value
    return int(value) if float(value).is_integer() else value


# -- the environment --------------------------------------------------------


_KEY_OK = re.compile(r"[^A-Za-z0-9_.-]")


def session_key(task_id: str, profile: Optional[str] = None, *, persistent: bool = True) -> str:
    """The session key of a hermes task's sandbox, as hermes' Docker backend
    finds its container by the labels of the task and the profile:
    ``hermes-<profile>-<task id>`` (``hermes-tmp-...`` for a sandbox that
    is not persistent), characters the service does not take replaced (with
    a hash of the original then, so two task ids never share a key)."""
    prefix = "hermes" if persistent else "hermes-tmp"
    raw = f"{prefix}-{profile or _hermes_profile()}-{task_id or 'default'}"
    key = _KEY_OK.sub("_", raw)
    if key != raw or len(key) > 128:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
        key = f"{key[:100]}-{digest}"
    return key


def _hermes_profile() -> str:
    try:
        from tools.environments.docker import _get_active_profile_name

        return str(_get_active_profile_name() or "default")
    except Exception:  # noqa: BLE001 - hermes' own fallback
        return "default"


def _hermes_default_image() -> Optional[str]:
    """hermes' built-in ``terminal.docker_image``, which its config bridge
    sets whenever the user did not choose one."""
    try:
        from hermes_cli.config import DEFAULT_CONFIG

        return str(DEFAULT_CONFIG["terminal"]["docker_image"])
    except Exception:  # noqa: BLE001 - a hermes without it
        return None


def _label_value(value: str) -> str:
    try:
        from tools.environments.docker import _sanitize_label_value

        return str(_sanitize_label_value(value))
    except Exception:  # noqa: BLE001
        return (_KEY_OK.sub("_", value)[:63]) or "unknown"


def _parse_volume(entry: Any, index: int) -> Dict[str, Any]:
    """``HOST:CONTAINER[:ro|rw]`` (``docker_volumes``) as a corral mount."""
    if not isinstance(entry, str) or entry.count(":") not in (1, 2):
        raise ValueError(f"docker_volumes[{index}]: expected 'HOST:CONTAINER[:ro]', got {entry!r}")
    parts = entry.strip().split(":")
    host, container = os.path.abspath(os.path.expanduser(parts[0])), parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw") or not container.startswith("/"):
        raise ValueError(f"docker_volumes[{index}]: expected 'HOST:CONTAINER[:ro]', got {entry!r}")
    return {"host": host, "container": container, "read_only": mode == "ro"}


class CorralEnvironment(BaseEnvironment):
    """hermes' terminal environment on a corral sandbox (see the module
    docs). The constructor takes the Docker backend's arguments
    (``tools.environments.docker.DockerEnvironment``) plus corral's."""

    def __init__(
        self,
        image: Optional[str] = None,
        cwd: str = "/root",
        timeout: int = 60,
        cpu: float = 0,
        memory: int = 0,
        disk: int = 0,
        persistent_filesystem: bool = False,
        task_id: str = "default",
        volumes: Optional[List[Any]] = None,
        forward_env: Optional[List[str]] = None,
        env: Optional[Dict[str, Any]] = None,
        network: bool = True,
        host_cwd: Optional[str] = None,
        auto_mount_cwd: bool = False,
        run_as_host_user: bool = False,
        extra_args: Optional[List[Any]] = None,
        persist_across_processes: bool = True,
        *,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        client: Optional[Client] = None,
        profile: Optional[str] = None,
        spec: Optional[Mapping[str, Any]] = None,
        max_output: Optional[int] = None,
    ) -> None:
        """
        Args:
            image .. persist_across_processes: as hermes' ``DockerEnvironment``
                (``cpu`` in CPUs, ``memory`` and ``disk`` in MB, 0: the
                service's default).
            base_url, token: the corral service (default ``$CORRAL_URL``,
                ``$CORRAL_TOKEN``, else a local service's generated token).
            client: a :class:`corral.Client` to share (not closed here).
            profile: a profile of the service's config instead of a spec.
            spec: a corral spec the mapped settings are applied on top of.
            max_output: bytes of output kept per stream and command
                (default 16 MiB).
        """
        self._sandbox: Optional[Sandbox] = None
        self._reaper_key: Optional[int] = None
        self._client: Optional[Client] = None
        self._owns_client = client is None
        if extra_args:
            raise ValueError(
                f"docker_extra_args: {list(extra_args)!r} are docker run flags, which corral has no equivalent "
                "of; ask the service's operator for a profile ($TERMINAL_CORRAL_PROFILE) or leave them out"
            )
        # Without docker_persist_across_processes a sandbox is this process's
        # alone (hermes: a container per process) and fails rather than being
        # recreated on a loss: a kept workspace would serve no next process.
        persistent = bool(persistent_filesystem) and bool(persist_across_processes)
        if cwd == "~":
            cwd = "/root"
        super().__init__(cwd=cwd, timeout=timeout)
        self._task_id = task_id or "default"
        self._persistent = persistent
        self._persist_across_processes = bool(persist_across_processes)
        self._image = image or None
        self._default_image = self._image is not None and self._image == _hermes_default_image()
        self._profile = profile
        self._base_url = base_url
        self._token = token
        self.max_output = int(max_output or DEFAULT_MAX_OUTPUT)
        if self.max_output < 2:
            raise ValueError(f"max_output: expected at least 2 bytes, got {max_output!r}")
        self._forward_env = _forward_names(forward_env)
        self._docker_env = _env_dict(env)
        hermes_profile = _hermes_profile()
        self._labels = {
            "hermes-agent": "1",
            "hermes-task-id": _label_value(self._task_id),
            "hermes-profile": _label_value(hermes_profile),
        }
        # hermes' Docker backend finds a task's container again from the next
        # process (docker_persist_across_processes); here the session key
        # does, and cleanup leaves the sandbox to the service.
        self._keep = self._persist_across_processes
        self._session = session_key(self._task_id, hermes_profile, persistent=persistent) if self._keep else None
        self._spec = self._build_spec(
            dict(spec) if spec is not None else None,
            cpu=cpu,
            memory=memory,
            disk=disk,
            volumes=volumes,
            network=network,
            host_cwd=host_cwd,
            auto_mount_cwd=auto_mount_cwd,
            run_as_host_user=run_as_host_user,
        )
        self._snapshot_gone = False
        #: The last failure of the service that ended a command, typed
        #: (``kind``, ``retryable``); ``None`` after a command that ran.
        self.last_failure: Optional[Any] = None
        self._gone: Optional[CorralError] = None
        self._client = client or Client(base_url, token=token)
        try:
            self._acquire()
            self._init_env = self._init_env_vars()
            self.init_session()
        except BaseException:
            self.cleanup()
            raise

    # -- the spec ----------------------------------------------------------

    def _build_spec(
        self,
        base: Optional[Dict[str, Any]],
        *,
        cpu: float,
        memory: int,
        disk: int,
        volumes: Optional[List[Any]],
        network: bool,
        host_cwd: Optional[str],
        auto_mount_cwd: bool,
        run_as_host_user: bool,
    ) -> Optional[Dict[str, Any]]:
        if self._profile is not None:
            if base is not None:
                raise ValueError("spec: not with a profile (the profile is the spec)")
            return None
        spec: Dict[str, Any] = dict(base or {})
        if self._image:
            spec["image"] = self._image
        limits = dict(spec.get("limits") or {})
        limits.setdefault("pids", PIDS_LIMIT)
        if cpu and float(cpu) > 0:
            limits["cpus"] = float(cpu)
        if memory and int(memory) > 0:
            limits["memory"] = int(memory) * _MB
        if disk and int(disk) > 0:
            limits["disk"] = int(disk) * _MB
        spec["limits"] = limits
        if not network:
            spec["network"] = "none"
        if self._docker_env:
            env = [e for e in spec.get("env") or [] if not (isinstance(e, Mapping) and e.get("name") in self._docker_env)]
            env.extend({"name": k, "value": v} for k, v in sorted(self._docker_env.items()))
            spec["env"] = env
        mounts = list(spec.get("mounts") or [])
        if volumes is not None and not isinstance(volumes, list):
            raise ValueError(f"docker_volumes: expected a list of 'HOST:CONTAINER[:ro]', got {volumes!r}")
        parsed = [_parse_volume(v, i) for i, v in enumerate(volumes or []) if not (isinstance(v, str) and not v.strip())]
        workspace_mounted = any(m["container"] == "/workspace" for m in parsed)
        if auto_mount_cwd and host_cwd and not workspace_mounted:
            host = os.path.abspath(os.path.expanduser(host_cwd))
            if os.path.isdir(host):
                mounts.append({"host": host, "container": "/workspace", "read_only": False})
        mounts.extend(parsed)
        if mounts:
            spec["mounts"] = mounts
        if run_as_host_user and hasattr(os, "getuid"):
            security = dict(spec.get("security") or {})
            security["user"] = f"{os.getuid()}:{os.getgid()}"
            spec["security"] = security
        spec["recovery"] = "recreate" if self._persist_across_processes else "fail"
        spec["labels"] = {**self._labels, **dict(spec.get("labels") or {})}
        return spec

    @property
    def has_host_mounts(self) -> bool:
        """Whether host paths are mounted (then hermes' approval prompt stays)."""
        return bool(self._spec and self._spec.get("mounts"))

    def _acquire(self) -> None:
        """Create the sandbox (or, for a session key, get it)."""
        client = self._client
        assert client is not None
        while True:
            try:
                sb = self._create(self._spec)
                break
            except CorralError as err:
                if not self._settle(err):
                    raise
        self._sandbox = sb
        _reaper.release(self._reaper_key)
        self._reaper_key = None
        if not self._keep:
            self._reaper_key = _reaper.track(
                sb.id, _reaper.client_factory(self._base_url, self._token, None if self._owns_client else client)
            )
        log.info(
            "corral: sandbox %s for hermes task %s (container %s, persistent=%s)",
            sb.id,
            self._task_id,
            sb.container_id,
            self._persistent,
        )

    def _settle(self, err: CorralError) -> bool:
        """Drop what the service cannot honour where hermes' Docker backend
        would go on without it; ``False``: the error stands."""
        spec = self._spec or {}
        limits = spec.get("limits") or {}
        if isinstance(err, UnsupportedError) and "disk" in limits and (
            (err.field or "").endswith("disk") or "limits.disk" in err.message
        ):
            # hermes: "Container will run without disk quota."
            log.warning(
                "corral: the daemon cannot limit a sandbox's disk (%s): the sandbox runs without a disk quota",
                err.message,
            )
            self._spec = {**spec, "limits": {k: v for k, v in limits.items() if k != "disk"}}
            return True
        if self._default_image and "image" in spec and (err.field in ("spec.image", "image") or err.kind == "image_not_found"):
            # hermes' built-in default image, which the user did not choose
            # (hermes sets it whenever terminal.docker_image is unset).
            log.warning(
                "corral: the service refuses hermes' default image %s (%s): using the service's default image; "
                "set terminal.docker_image or $%s to choose one",
                spec["image"],
                err.message,
                IMAGE_ENV,
            )
            self._spec = {k: v for k, v in spec.items() if k != "image"}
            self._image = None
            self._default_image = False
            return True
        return False

    def _create(self, spec: Optional[Dict[str, Any]]) -> Sandbox:
        client = self._client
        assert client is not None
        try:
            return client.sandbox(
                spec=spec,
                profile=self._profile,
                session=self._session,
                persistent=self._persistent,
            )
        except CorralError as err:
            if err.field == "persistent":
                raise type(err)(
                    f"{err.message} (hermes' container_persistent is on: allow persistent sandboxes on the service, "
                    "server.policy.allow_persistent: true, or set terminal.container_persistent: false, "
                    "TERMINAL_CONTAINER_PERSISTENT=false)",
                    kind=err.kind,
                    status=err.status,
                    field=err.field,
                    retryable=err.retryable,
                ) from None
            raise

    def _init_env_vars(self) -> Dict[str, str]:
        """What hermes' Docker backend passes to the login shell that takes
        the session snapshot: ``docker_env``, ``docker_forward_env`` and
        hermes' pass-through variables (its own code decides which)."""
        try:
            from tools.environments.docker import DockerEnvironment

            class _Names:
                _env = self._docker_env
                _forward_env = self._forward_env

            args = DockerEnvironment._build_init_env_args(_Names())  # type: ignore[arg-type]
            out: Dict[str, str] = {}
            for flag, pair in zip(args[::2], args[1::2]):
                if flag == "-e" and "=" in pair:
                    k, v = pair.split("=", 1)
                    out[k] = v
            return out
        except Exception:  # noqa: BLE001 - a hermes without that helper
            out = dict(self._docker_env)
            for key in self._forward_env:
                value = os.getenv(key)
                if value:
                    out[key] = value
            return out

    # -- BaseEnvironment ---------------------------------------------------

    @property
    def sandbox(self) -> Sandbox:
        """The corral sandbox."""
        if self._sandbox is None:
            raise RuntimeError("the environment was cleaned up")
        return self._sandbox

    @property
    def container_id(self) -> Optional[str]:
        """The container's id as the service gave it when the sandbox was
        made (``sandbox.refresh()`` has the current one after a recovery)."""
        return self._sandbox.container_id if self._sandbox is not None else None

    def _run_bash(
        self,
        cmd_string: str,
        *,
        login: bool = False,
        timeout: int = 120,
        stdin_data: Optional[str] = None,
    ) -> _StreamedCommand:
        shell = ["bash", "-l", "-c", cmd_string] if login else ["bash", "-c", cmd_string]
        # stderr into stdout inside the sandbox: one pipe, written in order,
        # as hermes' `docker exec` with stderr=STDOUT reads it. Before that,
        # a command that sources hermes' session snapshot says on its own
        # stderr when the snapshot is missing (a new container).
        check = not login and self._snapshot_ready
        script = 'exec 2>&1; exec "$@"'
        if check:
            marker = SNAPSHOT_GONE.decode().strip()
            script = f"[ -e {shlex.quote(self._snapshot_path)} ] || echo {marker} >&2; " + script
        argv = ["/bin/sh", "-c", script, "sh", *shell]
        return _StreamedCommand(
            self,
            argv,
            timeout=timeout,
            stdin=stdin_data,
            extra_env=self._init_env if login else None,
            check_snapshot=check,
        )

    def execute(self, command: str, cwd: str = "", **kwargs: Any) -> dict:
        """hermes' ``execute``, with its recovery: a sandbox the service no
        longer has is asked for again (same spec and key) and the command run
        once more; a container the service replaced gets a new session
        snapshot."""
        self._gone = None
        self._snapshot_gone = False
        result = BaseEnvironment.execute(self, command, cwd, **kwargs)
        if self._gone is not None and self._persist_across_processes:
            log.warning("corral: sandbox %s is gone (%s): asking the service for it again", self.sandbox.id, self._gone)
            if self._reacquire():
                result = BaseEnvironment.execute(self, command, cwd, **kwargs)
        elif self._snapshot_gone and self._sandbox is not None:
            log.warning(
                "corral: sandbox %s has a new container (%s): taking hermes' session snapshot again",
                self.sandbox.id,
                self.sandbox.refresh().container_id,
            )
            self._snapshot_ready = False
            self.init_session()
        return result

    def _reacquire(self) -> bool:
        try:
            self._acquire()
            self._snapshot_ready = False
            self.init_session()
            return True
        except CorralError as err:
            log.error("corral: could not get a sandbox again: %s", err)
            return False

    def _refused(self, err: CorralError) -> None:
        self.last_failure = err
        if isinstance(err, NotFoundError):
            self._gone = err

    def cleanup(self, *, force_remove: bool = False) -> None:
        """As hermes' Docker backend: with ``persist_across_processes`` (its
        default) the sandbox is left to the service for the next process of
        the task (the service's idle timeout removes what nobody asks for);
        without it, or with ``force_remove``, the sandbox is released:
        removed, a persistent one's workspace and home kept."""
        sb, self._sandbox = getattr(self, "_sandbox", None), None
        key, self._reaper_key = getattr(self, "_reaper_key", None), None
        release = force_remove or not getattr(self, "_keep", False)
        try:
            if sb is not None and release:
                sb.delete()
            _reaper.release(key)
        except CorralError as err:
            log.warning("corral: could not release sandbox %s: %s", sb.id if sb else "?", err)
            # Left registered: the exit hook tries again.
        finally:
            if getattr(self, "_owns_client", False) and getattr(self, "_client", None) is not None:
                self._client.close()  # type: ignore[union-attr]
                self._client = None

    def wait_for_cleanup(self, timeout: float = 30.0) -> bool:
        """hermes' exit hook waits on this; ``cleanup`` is synchronous."""
        return True

    def __del__(self) -> None:
        # hermes' BaseEnvironment cleans up in __del__; during interpreter
        # shutdown the reaper's exit hook has done it.
        if sys.is_finalizing():
            return
        try:
            self.cleanup()
        except Exception:  # noqa: BLE001
            pass


def _forward_names(names: Optional[List[Any]]) -> List[str]:
    try:
        from tools.environments.docker import _normalize_forward_env_names

        return list(_normalize_forward_env_names(names))
    except ImportError:  # pragma: no cover - a hermes without the helper
        return [n.strip() for n in names or [] if isinstance(n, str) and n.strip()]


def _env_dict(env: Optional[Dict[str, Any]]) -> Dict[str, str]:
    try:
        from tools.environments.docker import _normalize_env_dict

        return dict(_normalize_env_dict(env))
    except ImportError:  # pragma: no cover - a hermes without the helper
        return {str(k): str(v) for k, v in (env or {}).items()}


# -- hermes' settings --------------------------------------------------------


def _terminal_settings(task_id: str, image: Optional[str], container_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The Docker backend's settings for a corral environment: the caller's
    ``container_config`` where hermes gives one (its plugin API), else the
    ``TERMINAL_*`` variables parsed by hermes' own parser (hermes 0.19.0
    reads the container ones only for its own container backends)."""
    import tools.terminal_tool as tt

    parse = tt._parse_env_var
    flag = lambda name, default: os.getenv(name, default).strip().lower() in ("true", "1", "yes")  # noqa: E731
    cc: Dict[str, Any] = {
        "container_cpu": parse("TERMINAL_CONTAINER_CPU", "1", float, "number"),
        "container_memory": parse("TERMINAL_CONTAINER_MEMORY", "5120"),
        "container_disk": parse("TERMINAL_CONTAINER_DISK", "51200"),
        "container_persistent": flag("TERMINAL_CONTAINER_PERSISTENT", "true"),
        "docker_forward_env": parse("TERMINAL_DOCKER_FORWARD_ENV", "[]", json.loads, "valid JSON"),
        "docker_volumes": parse("TERMINAL_DOCKER_VOLUMES", "[]", json.loads, "valid JSON"),
        "docker_env": parse("TERMINAL_DOCKER_ENV", "{}", json.loads, "valid JSON"),
        "docker_extra_args": parse("TERMINAL_DOCKER_EXTRA_ARGS", "[]", json.loads, "valid JSON"),
        "docker_mount_cwd_to_workspace": flag("TERMINAL_DOCKER_MOUNT_CWD_TO_WORKSPACE", "false"),
        "docker_run_as_host_user": flag("TERMINAL_DOCKER_RUN_AS_HOST_USER", "false"),
        "docker_network": flag("TERMINAL_DOCKER_NETWORK", "true"),
        "docker_persist_across_processes": flag("TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES", "true"),
    }
    if container_config:
        cc.update({k: v for k, v in container_config.items() if v is not None})
    overrides: Mapping[str, Any] = {}
    try:
        overrides = tt.resolve_task_overrides(task_id) or {}
    except Exception:  # noqa: BLE001 - a hermes without overrides
        overrides = {}
    chosen = (
        overrides.get("corral_image")
        or overrides.get("docker_image")
        or os.getenv(IMAGE_ENV)
        or image
        or os.getenv("TERMINAL_DOCKER_IMAGE")
        or None
    )
    cc["image"] = chosen
    return cc


def _max_output_setting() -> Optional[int]:
    raw = os.getenv(MAX_OUTPUT_ENV)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${MAX_OUTPUT_ENV}: expected a number of bytes, got {raw!r}") from None
    if value < 2:
        raise ValueError(f"${MAX_OUTPUT_ENV}: expected at least 2 bytes, got {raw!r}")
    return value


def create_environment(
    *,
    cwd: str,
    timeout: int,
    task_id: str = "default",
    image: Optional[str] = None,
    container_config: Optional[Mapping[str, Any]] = None,
    host_cwd: Optional[str] = None,
    **kwargs: Any,
) -> CorralEnvironment:
    """A :class:`CorralEnvironment` from hermes' terminal settings (what
    ``_create_environment`` and the plugin API's ``create_environment``
    receive); :func:`install`'s keyword arguments are its defaults."""
    cc = _terminal_settings(task_id, image, container_config)
    options = dict(_defaults)
    profile = os.getenv(PROFILE_ENV) or options.pop("profile", None)
    options.pop("profile", None)
    max_output = _max_output_setting() or options.pop("max_output", None)
    options.pop("max_output", None)
    return CorralEnvironment(
        image=cc["image"],
        cwd=cwd,
        timeout=timeout,
        cpu=cc["container_cpu"],
        memory=cc["container_memory"],
        disk=cc["container_disk"],
        persistent_filesystem=cc["container_persistent"],
        task_id=task_id,
        volumes=cc["docker_volumes"],
        forward_env=cc["docker_forward_env"],
        env=cc["docker_env"],
        network=cc["docker_network"],
        host_cwd=host_cwd,
        auto_mount_cwd=cc["docker_mount_cwd_to_workspace"],
        run_as_host_user=cc["docker_run_as_host_user"],
        extra_args=cc["docker_extra_args"],
        persist_across_processes=cc["docker_persist_across_processes"],
        profile=profile,
        max_output=max_output,
        **options,
    )


# -- the switch --------------------------------------------------------------


def _provider_base() -> Optional[type]:
    try:
        from agent.terminal_env_provider import TerminalEnvironmentProvider

        return TerminalEnvironmentProvider
    except ImportError:
        return None


def _make_provider_class() -> type:
    base = _provider_base() or object

    class CorralTerminalProvider(base):  # type: ignore[valid-type, misc]
        """corral for hermes' terminal-backend plugin API
        (``agent.terminal_env_provider.TerminalEnvironmentProvider``)."""

        name = BACKEND
        display_name = "corral"
        is_remote = True
        is_container = True

        @property
        def description(self) -> str:
            return "Run commands in a corral sandbox (a hardened container of a corral service)."

        @property
        def env_description(self) -> str:
            return "a corral sandbox (a Linux container)"

        def is_available(self) -> bool:
            return True

        def create_environment(
            self,
            *,
            cwd: str,
            timeout: int,
            task_id: str = "default",
            image: Optional[str] = None,
            container_config: Optional[Dict[str, Any]] = None,
            **kwargs: Any,
        ) -> CorralEnvironment:
            return create_environment(
                cwd=cwd,
                timeout=timeout,
                task_id=task_id,
                image=image,
                container_config=container_config,
                **kwargs,
            )

    return CorralTerminalProvider


#: The provider class for hermes' plugin API (a subclass of its
#: ``TerminalEnvironmentProvider`` where the installed hermes has one).
CorralTerminalProvider = _make_provider_class()


def _register_provider() -> bool:
    """Register with ``agent.terminal_env_registry`` where hermes has it."""
    try:
        from agent import terminal_env_registry as reg  # type: ignore[import-not-found]
    except ImportError:
        return False
    register_fn = getattr(reg, "register_provider", None)
    get = getattr(reg, "get_provider", None)
    if not callable(register_fn):
        return False
    if callable(get) and get(BACKEND) is not None:
        return True
    register_fn(CorralTerminalProvider())
    return True


def register(ctx: Any) -> None:
    """hermes' plugin entry point (``hermes_agent.plugins``: ``corral``):
    registers the provider through the plugin API where hermes has it, else
    :func:`install`."""
    register_fn = getattr(ctx, "register_terminal_environment_provider", None)
    if callable(register_fn):
        register_fn(CorralTerminalProvider())
        return
    install()


def install(**defaults: Any) -> None:
    """Make ``corral`` a terminal backend of the hermes in this process
    (then ``TERMINAL_ENV=corral``, or ``terminal.backend: corral``). Safe to
    call more than once. ``defaults`` are :class:`CorralEnvironment` keyword
    arguments for every environment (``base_url``, ``token``, ``client``,
    ``profile``, ``spec``, ``max_output``). Raises ``ImportError`` when
    hermes' ``tools.terminal_tool`` is not importable."""
    global _defaults
    if defaults:
        _defaults = dict(defaults)
    if _register_provider():
        _patch_cleanup_vm()
        return
    import tools.terminal_tool as tt

    original = tt._create_environment
    if not getattr(original, "_corral", False):

        def _create_environment(env_type: str, image: str, cwd: str, timeout: int, *args: Any, **kwargs: Any) -> Any:
            if str(env_type).strip().lower() != BACKEND:
                return original(env_type, image, cwd, timeout, *args, **kwargs)
            names = ("ssh_config", "container_config", "local_config", "task_id", "host_cwd")
            bound = dict(zip(names, args))
            bound.update(kwargs)
            return create_environment(
                cwd=cwd,
                timeout=timeout,
                task_id=bound.get("task_id") or "default",
                image=image or None,
                container_config=bound.get("container_config"),
                host_cwd=bound.get("host_cwd"),
            )

        _create_environment._corral = True  # type: ignore[attr-defined]
        _create_environment.__wrapped__ = original  # type: ignore[attr-defined]
        tt._create_environment = _create_environment
    if BACKEND not in tt._CONTAINER_BACKENDS:
        tt._CONTAINER_BACKENDS = frozenset(tt._CONTAINER_BACKENDS) | {BACKEND}
    _patch_requirements(tt)
    _patch_guards()
    _patch_cleanup_vm()


def _patch_cleanup_vm() -> None:
    """hermes runs a task id without an image override in the shared
    ``"default"`` environment (``_resolve_container_task_id``; its
    ``get_active_env`` looks it up so), but ``cleanup_vm`` pops the raw id:
    ``cleanup_vm("t1", force_remove=True)`` after ``terminal_tool(...,
    task_id="t1")`` finds nothing and leaves the sandbox. With
    ``force_remove`` (explicit teardown: a fresh sandbox on the task's next
    command) and a corral environment, the environment the task's commands
    ran in is torn down: the sandbox is released before the call returns.
    Without ``force_remove`` (a session closing, possibly a subagent's of
    the shared environment) hermes' lookup stands."""
    try:
        import tools.terminal_tool as tt
    except ImportError:  # pragma: no cover - install() needs it anyway
        return
    original = getattr(tt, "cleanup_vm", None)
    resolve = getattr(tt, "_resolve_container_task_id", None)
    envs = getattr(tt, "_active_environments", None)
    lock = getattr(tt, "_env_lock", None)
    if original is None or getattr(original, "_corral", False) or resolve is None or envs is None or lock is None:
        return

    def cleanup_vm(task_id: str, *, force_remove: bool = False) -> Any:
        if force_remove:
            with lock:
                key = None if task_id in envs else resolve(task_id)
                env = envs.get(key) if key is not None else None
            if key is not None and key != task_id and isinstance(env, CorralEnvironment):
                return original(key, force_remove=True)
        return original(task_id, force_remove=force_remove)

    cleanup_vm._corral = True  # type: ignore[attr-defined]
    cleanup_vm.__wrapped__ = original  # type: ignore[attr-defined]
    cleanup_vm.__doc__ = original.__doc__
    tt.cleanup_vm = cleanup_vm


def _patch_requirements(tt: Any) -> None:
    """hermes hides the terminal and file tools when
    ``check_terminal_requirements`` says no, which it does for a backend it
    does not know. For ``corral`` it says yes (a cheap check, no network, as
    the plugin API asks)."""
    original = tt.check_terminal_requirements
    if getattr(original, "_corral", False):
        return

    def check_terminal_requirements() -> bool:
        if os.getenv("TERMINAL_ENV", "local").strip().lower() == BACKEND:
            return True
        return original()

    check_terminal_requirements._corral = True  # type: ignore[attr-defined]
    check_terminal_requirements.__wrapped__ = original  # type: ignore[attr-defined]
    tt.check_terminal_requirements = check_terminal_requirements
    try:
        from tools.registry import registry

        with registry._lock:
            for entry in registry._tools.values():
                if entry.check_fn is original:
                    entry.check_fn = check_terminal_requirements
            for name, fn in list(registry._toolset_checks.items()):
                if fn is original:
                    registry._toolset_checks[name] = check_terminal_requirements
    except Exception as err:  # noqa: BLE001 - a registry of another shape
        log.warning("corral: could not update hermes' tool registry (%s): the terminal tool may stay hidden", err)


def _patch_guards() -> None:
    """hermes skips its dangerous-command approval prompt for isolated
    container backends (Docker without host mounts); so for corral."""
    try:
        import tools.approval as approval
    except ImportError:  # pragma: no cover
        return
    original = getattr(approval, "_should_skip_container_guards", None)
    if original is None or getattr(original, "_corral", False):
        return

    def _should_skip_container_guards(env_type: str, has_host_access: bool = False) -> bool:
        if str(env_type).strip().lower() == BACKEND:
            return not has_host_access and not _corral_has_host_mounts()
        return original(env_type, has_host_access=has_host_access)

    _should_skip_container_guards._corral = True  # type: ignore[attr-defined]
    approval._should_skip_container_guards = _should_skip_container_guards


def _corral_has_host_mounts() -> bool:
    raw = os.getenv("TERMINAL_DOCKER_VOLUMES", "").strip()
    if raw and raw != "[]":
        return True
    return os.getenv("TERMINAL_DOCKER_MOUNT_CWD_TO_WORKSPACE", "false").strip().lower() in ("true", "1", "yes")


def installed() -> bool:
    """Whether :func:`install` switched this process's hermes."""
    tt = sys.modules.get("tools.terminal_tool")
    if tt is not None and getattr(getattr(tt, "_create_environment", None), "_corral", False):
        return True
    try:
        from agent import terminal_env_registry as reg  # type: ignore[import-not-found]

        return reg.get_provider(BACKEND) is not None
    except Exception:  # noqa: BLE001
        return False

