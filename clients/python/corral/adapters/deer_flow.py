"""A deer-flow sandbox provider (``deerflow/sandbox/sandbox_provider.py``)
running on corral.

The one-line switch
-------------------

deer-flow picks its provider from ``config.yaml``
(``get_sandbox_provider()`` resolves ``sandbox.use`` with
``resolve_class(..., SandboxProvider)`` and builds it with no arguments);
the other keys of the ``sandbox:`` block reach the provider as they are::

    sandbox:
      use: corral.adapters.deer_flow:CorralSandboxProvider
      image: python:3.12-slim          # optional: else the service's default image
      environment:                     # optional, as for AioSandboxProvider ($NAME: from the gateway's env)
        API_KEY: $MY_API_KEY
      # corral's own keys, all optional:
      # corral_url: http://127.0.0.1:7070   (else $CORRAL_URL)
      # corral_token: ...                   (else $CORRAL_TOKEN or a local service's token file)
      # profile: deerflow                   (a profile / warm pool of the service's config)
      # spec: {limits: {memory: 2147483648}} (a corral sandbox spec, merged over the service's defaults)
      # shell: bash                         (runs each command: bash -c)

The provider
------------

One sandbox per (user, thread), from corral's provider, under the session
key ``deerflow-<sha256(user_id:thread_id)[:16]>`` (deer-flow's deterministic
id, prefixed): every process of a gateway gets the same sandbox for a
thread, and its id is that key. What deer-flow's ``AioSandboxProvider``
does in the gateway, corral does in the service:

* **warm pool**: sandboxes of a ``profile`` whose pool keeps ``warm``
  started ones (``provider.pools`` in corral's config) are handed over, not
  started;
* **replica limit with LRU eviction**: ``provider.max_live``; at the limit
  a warm spare goes first, then the least recently used idle session
  (AIO's ``replicas``);
* **idle timeout**: ``provider.idle_timeout_ms`` (AIO's ``idle_timeout``);
* **auto-restart** (``auto_restart``, default true): the sandbox's recovery
  policy is ``recreate``, so a container killed or removed out of band is
  recreated from the same spec (start-up commands included) and the command
  that found it gone runs again; acquiring the thread again replaces a dead
  one as well. ``auto_restart: false`` asks for ``fail``: the loss is
  reported (``Error: ...``), as AIO returns a stale sandbox then.

``acquire``/``acquire_async`` create or get the thread's sandbox (IO, off
the event loop as deer-flow requires). ``get`` is a dictionary lookup,
never IO: deer-flow calls it on the event loop. ``release`` ends the
thread's turn: the sandbox stays in the service, where the thread's next
``acquire`` finds it (AIO parks it in its warm pool), until corral's idle
timeout or LRU eviction removes it. ``destroy`` removes it now.
``shutdown`` (and ``reset``, which deer-flow's ``reset_sandbox_provider``
calls) removes every sandbox this provider acquired, released ones too;
they also go at interpreter exit and on SIGTERM/SIGHUP
(:mod:`corral.adapters._reaper`), and the service's idle timeout removes
what a SIGKILL leaves.

The sandbox
-----------

:class:`CorralSandbox` is a deer-flow ``Sandbox``:

* ``/mnt/user-data/{workspace,uploads,outputs}`` exist in every sandbox
  (made world-writable by a start-up command, so again after a restart) and
  paths are used as given, as inside AIO's container;
  ``uses_thread_data_mounts`` is false (the gateway's thread directories are
  not mounted: uploads and artifact edits reach the sandbox through
  ``update_file``, which writes them mode 0666, readable and writable by any
  user the sandbox runs commands as, as deer-flow's upload router makes the
  files it syncs), unless ``thread_data_mounts: true`` says a profile mounts
  them; ``needs_upload_permission_adjustment`` is true;
* ``execute_command(command, env=None, timeout=None)`` runs ``bash -c``
  with ``env`` for that command only (names checked as deer-flow checks
  them: ``ValueError``) and ``timeout`` (default ``bash_command_timeout``,
  600 s; the command's whole process tree is killed then), and answers as
  ``LocalSandbox`` does: stdout, then ``Std Error:`` and stderr, then
  ``Exit Code: N`` when non-zero, the timeout notice, ``(no output)``; a
  failure of the sandbox or the service is an ``Error: ...`` string, as
  AIO's. The command returns when its main process exits (a server started
  with ``&`` does not hold the turn, as with ``LocalSandbox``);
* ``read_file`` (1-indexed inclusive ``start_line``/``end_line``),
  ``write_file`` (``append``; parents created), ``update_file`` (bytes),
  ``download_file`` (``/mnt/user-data`` only, ``..`` refused: both
  ``PermissionError``; 100 MB cap: ``OSError`` EFBIG) raise what
  ``LocalSandbox`` raises: ``FileNotFoundError``, ``IsADirectoryError``,
  ``NotADirectoryError``, ``PermissionError``, ``OSError``, naming the path
  as given; a file that is not UTF-8 raises ``UnicodeDecodeError`` from
  ``read_file`` (the tool then points the model at ``bash``);
* ``list_dir(path, max_depth=2)``: absolute paths, directories with a
  trailing ``/``, sorted, deer-flow's ignored names left out, ``[]`` for a
  missing directory; ``glob``/``grep`` return ``(matches, truncated)``
  with deer-flow's ignore list, glob matching and line cuts, and raise
  ``FileNotFoundError``/``NotADirectoryError`` for a bad root, as
  ``LocalSandbox`` does. ``grep`` skips files over 1 MB and binary lines,
  and checks every line with Python's ``re`` (the pattern deer-flow
  validated), after ``grep`` in the sandbox narrowed them.

They need ``sh``, ``find``, ``grep`` and ``xargs`` in the image for
``list_dir``/``glob``/``grep`` (busybox has them); files move through
corral's agent, so reads and writes work in any image.

Differences from deer-flow's ``AioSandboxProvider``
---------------------------------------------------

* corral's limits are the service's: ``replicas`` and ``idle_timeout`` in
  ``config.yaml`` are not applied by the gateway (a warning names
  ``provider.max_live`` and ``provider.idle_timeout_ms`` instead), and an
  LRU eviction may pick a thread's sandbox between two of its tool calls
  (corral counts a sandbox idle when no request is running on it, AIO only
  evicts released ones): the thread's next call then gets a new sandbox,
  without the files of the old one, and a warning is logged;
* ``mounts`` (host directories) are refused with ``ValueError``: a client
  cannot mount host paths; an operator grants them in a corral profile;
* nothing is published on ports: commands and files go through corral's
  agent. ``port``, ``container_prefix``, ``ownership`` and the provisioner
  keys mean nothing here (sessions are shared by key in the service);
* ``read_file``/``write_file`` errors are raised (``LocalSandbox``'s
  contract), where AIO returns an ``Error: ...`` string from ``read_file``;
* commands run with a per-command environment and a fresh ``bash`` each,
  like ``LocalSandbox`` and AIO's env path, not in AIO's one persistent
  shell: a ``cd`` or ``export`` does not carry over to the next command
  (deer-flow's bash tool prefixes each command with
  ``cd /mnt/user-data/workspace``);
* a background job that keeps writing to the command's own stdout or
  stderr after the command returns gets SIGPIPE; redirect it (deer-flow's
  bash tool tells the model to);
* ``grep`` runs ``grep -E`` in the sandbox with a translation of the
  pattern: a Python construct with no translation (lookarounds,
  back-references, inline flags) makes every line of the files under the
  root travel to the gateway to be matched there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from typing import Any, Dict, Mapping, Optional

from ..client import Client, Sandbox
from ..errors import CapacityError, CorralError
from . import _reaper
from ._deer_flow_sandbox import VIRTUAL_PATH_PREFIX, CorralSandbox

__all__ = [
    "CorralSandboxProvider",
    "CorralSandbox",
    "VIRTUAL_PATH_PREFIX",
    "session_key",
]

log = logging.getLogger("corral.adapters")

#: The thread directories every sandbox has.
THREAD_DIRS = tuple(f"{VIRTUAL_PATH_PREFIX}/{d}" for d in ("workspace", "uploads", "outputs"))
#: deer-flow's default command timeout (``DEFAULT_COMMAND_TIMEOUT_SECONDS``).
DEFAULT_COMMAND_TIMEOUT = 600
#: Bytes of each stream corral keeps per command (head and tail beyond it);
#: deer-flow's bash tool keeps 20,000 characters anyway.
DEFAULT_MAX_OUTPUT = 1 << 20

_DIRS_SCRIPT = "mkdir -p {d} && chmod a+rwx {d}".format(d=" ".join(THREAD_DIRS))

# deer-flow's SandboxConfig fields and other providers' keys: accepted, and
# either meaningless here or the tool layer's.
_DEERFLOW_KEYS = frozenset(
    """use allow_host_bash image port replicas overflow_policy acquire_timeout burst_limit container_prefix
    idle_timeout health_check_skip_seconds ownership mounts thread_data_mounts environment bash_output_max_chars
    read_file_output_max_chars ls_output_max_chars bash_command_timeout provisioner_api_key provisioner_url
    auto_restart""".split()
)
_CORRAL_KEYS = frozenset("corral_url corral_token profile spec shell max_output".split())
#: AIO's settings that are corral's service's here.
_SERVICE_SETTINGS = {"replicas": "provider.max_live", "idle_timeout": "provider.idle_timeout_ms"}

try:  # deer-flow's base classes and errors, when it is installed
    from deerflow.sandbox.exceptions import SandboxCapacityExceededError as _CapacityExceeded
    from deerflow.sandbox.sandbox_provider import SandboxProvider as _ProviderBase

    DEERFLOW = True
except Exception:  # noqa: BLE001 - standalone
    _ProviderBase = object  # type: ignore[assignment,misc]
    _CapacityExceeded = None  # type: ignore[assignment,misc]
    DEERFLOW = False

def session_key(thread_id: str, user_id: str) -> str:
    """The corral session key (and deer-flow sandbox id) of a user's thread:
    deer-flow's deterministic id, ``sha256("user:thread")[:16]``, prefixed."""
    return "deerflow-" + hashlib.sha256(f"{user_id}:{thread_id}".encode()).hexdigest()[:16]


def _effective_user_id() -> str:
    try:
        from deerflow.runtime.user_context import get_effective_user_id

        return str(get_effective_user_id())
    except Exception:  # noqa: BLE001 - standalone, or no user context
        return "default"


def _app_sandbox_config() -> Dict[str, Any]:
    """The ``sandbox:`` block of deer-flow's ``config.yaml`` (empty without
    deer-flow)."""
    try:
        from deerflow.config import get_app_config
    except Exception:  # noqa: BLE001
        return {}
    cfg = get_app_config().sandbox
    if cfg is None:
        return {}
    # Fields deer-flow declares are its own (a newer deer-flow may add some);
    # the extra keys are this provider's, checked strictly.
    extra = dict(getattr(cfg, "model_extra", None) or {})
    data = {k: v for k, v in cfg.model_dump().items() if k in _DEERFLOW_KEYS and k not in extra}
    data.update(extra)
    return data


def _resolve_env(env: Mapping[str, Any]) -> Dict[str, str]:
    """AIO's ``environment``: a value ``$NAME`` is the gateway's ``$NAME``."""
    out = {}
    for key, value in env.items():
        if isinstance(value, str) and value.startswith("$"):
            out[str(key)] = os.environ.get(value[1:], "")
        else:
            out[str(key)] = str(value)
    return out


class _Settings:
    """The provider's settings, checked: a bad value raises ``ValueError``
    naming ``sandbox.<key>`` and the value."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        for key in raw:
            if key not in _DEERFLOW_KEYS and key not in _CORRAL_KEYS:
                raise ValueError(
                    f"sandbox.{key}: {raw[key]!r}: not a setting of corral.adapters.deer_flow:CorralSandboxProvider (known: "
                    f"{', '.join(sorted(_CORRAL_KEYS))} and deer-flow's sandbox keys)"
                )
        self.image = self._opt(raw, "image", str)
        self.profile = self._opt(raw, "profile", str)
        self.url = self._opt(raw, "corral_url", str)
        self.token = self._opt(raw, "corral_token", str)
        self.shell = self._opt(raw, "shell", str) or "bash"
        env = raw.get("environment") or {}
        if not isinstance(env, Mapping):
            raise ValueError(f"sandbox.environment: expected a mapping of names to values, got {env!r}")
        self.environment = _resolve_env(env)
        spec = raw.get("spec")
        if spec is not None and not isinstance(spec, Mapping):
            raise ValueError(f"sandbox.spec: expected a corral sandbox spec (a mapping), got {spec!r}")
        self.spec = dict(spec or {})
        auto = raw.get("auto_restart", True)
        if not isinstance(auto, bool):
            raise ValueError(f"sandbox.auto_restart: expected true or false, got {auto!r}")
        self.auto_restart = auto
        timeout = raw.get("bash_command_timeout")
        if timeout is None:
            timeout = DEFAULT_COMMAND_TIMEOUT
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"sandbox.bash_command_timeout: expected seconds above 0, got {timeout!r}")
        self.command_timeout = float(timeout)
        max_output = raw.get("max_output")
        if max_output is None:
            max_output = DEFAULT_MAX_OUTPUT
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output <= 0:
            raise ValueError(f"sandbox.max_output: expected bytes above 0, got {max_output!r}")
        self.max_output = max_output
        mounts = raw.get("mounts") or []
        if mounts:
            raise ValueError(
                f"sandbox.mounts: {mounts!r}: host mounts are the corral operator's to grant (a profile with "
                "`mounts` in corral's config, chosen with `profile:`); a client's spec cannot mount host paths"
            )
        thread_mounts = raw.get("thread_data_mounts")
        if thread_mounts is not None and not isinstance(thread_mounts, bool):
            raise ValueError(f"sandbox.thread_data_mounts: expected true, false or null, got {thread_mounts!r}")
        self.thread_data_mounts = bool(thread_mounts)
        self.service_settings = {k: raw[k] for k in _SERVICE_SETTINGS if raw.get(k) is not None}

    @staticmethod
    def _opt(raw: Mapping[str, Any], key: str, typ: type) -> Any:
        value = raw.get(key)
        if value is not None and not isinstance(value, typ):
            raise ValueError(f"sandbox.{key}: expected a {typ.__name__}, got {value!r}")
        return value

    def create_args(self) -> Dict[str, Any]:
        """How the service is asked for a thread's sandbox."""
        if self.profile is not None:
            return {"profile": self.profile}
        spec = dict(self.spec)
        if self.image is not None:
            spec["image"] = self.image
        if self.environment:
            ours = set(self.environment)
            kept = [e for e in spec.get("env") or [] if not (isinstance(e, Mapping) and e.get("name") in ours)]
            spec["env"] = kept + [{"name": k, "value": v} for k, v in self.environment.items()]
        spec.setdefault("recovery", "recreate" if self.auto_restart else "fail")
        spec["startup"] = [*list(spec.get("startup") or []), _DIRS_SCRIPT]
        return {"spec": spec}


class CorralSandboxProvider(_ProviderBase):  # type: ignore[misc,valid-type]
    """deer-flow's ``SandboxProvider`` on corral: one sandbox per thread.

    Args:
        config: the ``sandbox:`` settings; default: deer-flow's ``config.yaml``
            (``get_app_config().sandbox``, extra keys included), or none when
            deer-flow is not installed.
        client: a :class:`corral.Client` to use (else one of its own).
        **overrides: settings over ``config``'s.
    """

    needs_upload_permission_adjustment = True

    def __init__(self, config: Optional[Mapping[str, Any]] = None, *, client: Optional[Client] = None, **overrides: Any):
        raw = dict(_app_sandbox_config() if config is None else config)
        raw.update(overrides)
        self.settings = _Settings(raw)
        for key, value in self.settings.service_settings.items():
            log.warning(
                "corral: sandbox.%s=%r is not applied by the gateway: corral's %s (the service's config) governs it",
                key,
                value,
                _SERVICE_SETTINGS[key],
            )
        self._owns_client = client is None
        self._client = client if client is not None else Client(self.settings.url, token=self.settings.token)
        self._lock = threading.Lock()
        self._active: Dict[str, CorralSandbox] = {}
        self._reaper_keys: Dict[str, int] = {}
        self._shut = False
        # Sandboxes are made in worker threads (deer-flow's acquire_async),
        # where no signal handler can be set: set them now when this is the
        # main thread (the atexit hook covers the rest).
        _reaper.install_handlers()

    # -- deer-flow's provider interface -----------------------------------

    @property
    def uses_thread_data_mounts(self) -> bool:
        """Whether the gateway's thread directories are mounted into the
        sandboxes (then uploads need no sync): only when ``thread_data_mounts``
        says a profile mounts them."""
        return self.settings.thread_data_mounts

    @property
    def auto_restart(self) -> bool:
        return self.settings.auto_restart

    @property
    def client(self) -> Client:
        return self._client

    def acquire(self, thread_id: Optional[str] = None, *, user_id: Optional[str] = None) -> str:
        """The thread's sandbox id (created, handed over from a warm pool, or
        the thread's existing one; a dead one is replaced). Without a thread,
        a new sandbox of its own."""
        user = user_id or _effective_user_id()
        key = session_key(thread_id, user) if thread_id else session_key(uuid.uuid4().hex, user)
        self._open(key)
        return key

    async def acquire_async(self, thread_id: Optional[str] = None, *, user_id: Optional[str] = None) -> str:
        """:meth:`acquire` in a worker thread, off the event loop."""
        import asyncio

        return await asyncio.to_thread(self.acquire, thread_id, user_id=user_id)

    def get(self, sandbox_id: str) -> Optional["CorralSandbox"]:
        """The acquired (and not released) sandbox of this id, else ``None``.
        No IO: deer-flow calls it on its event loop."""
        with self._lock:
            return self._active.get(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        """End the thread's turn. The sandbox stays in the service for the
        thread's next acquire until corral's idle timeout or LRU eviction."""
        with self._lock:
            self._active.pop(sandbox_id, None)

    def destroy(self, sandbox_id: str) -> None:
        """Remove the sandbox now."""
        with self._lock:
            self._active.pop(sandbox_id, None)
            key = self._reaper_keys.pop(sandbox_id, None)
        try:
            self._client.delete_sandbox(sandbox_id)
        finally:
            _reaper.release(key)

    def shutdown(self) -> None:
        """Remove every sandbox this provider acquired (released ones too).
        Idempotent."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
            self._active.clear()
            ids = list(self._reaper_keys)
        for sandbox_id in ids:
            try:
                self.destroy(sandbox_id)
            except CorralError as err:
                log.warning("corral: could not remove sandbox %s at shutdown: %s", sandbox_id, err)
        if self._owns_client:
            self._client.close()

    def reset(self) -> None:
        """deer-flow's ``reset_sandbox_provider`` detaches this instance:
        its sandboxes go, as at :meth:`shutdown`."""
        self.shutdown()

    # -- corral ------------------------------------------------------------

    def _open(self, key: str) -> "CorralSandbox":
        with self._lock:
            if self._shut:
                raise RuntimeError("corral: this CorralSandboxProvider was shut down; deer-flow builds a new one")
        try:
            sb = Sandbox(self._client, session=key, **self.settings.create_args())
        except CapacityError as err:
            if _CapacityExceeded is not None:
                raise _CapacityExceeded(f"corral has no room for another sandbox: {err.message}") from err
            raise
        if self.settings.profile is not None:
            # A profile's start-up commands are the operator's: make sure the
            # thread directories are there.
            sb.run(["sh", "-c", _DIRS_SCRIPT], timeout=60, check=True)
        with self._lock:
            current = self._active.get(key)
            if current is None:
                current = CorralSandbox(key, self, sb)
                self._active[key] = current
            else:
                current._replace(sb)
            if key not in self._reaper_keys:
                self._reaper_keys[key] = _reaper.track(
                    key, _reaper.client_factory(self.settings.url, self.settings.token, self._client)
                )
        return current

    def _reopen(self, key: str) -> Sandbox:
        """After the service said the sandbox is gone (evicted, idle-timed
        out): a new one under the same key."""
        log.warning(
            "corral: sandbox %s was removed by the service (LRU eviction or idle timeout); starting a new one, "
            "without the files of the old one",
            key,
        )
        return self._open(key).sandbox
