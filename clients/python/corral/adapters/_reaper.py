"""Removes the sandboxes the adapters made when the process ends: at
interpreter exit (a crash included: an uncaught exception still runs
``atexit``), on SIGTERM, on SIGHUP (a closed terminal or SSH session), and
on SIGINT when the process is not interactive, whatever the caller forgot to
clean up.

Frameworks clean up in ``__del__``, which runs during interpreter shutdown
when imports already fail (``ImportError: sys.meta_path is None``), and not
at all on a signal. Here every live sandbox is registered; the ``atexit``
hook and a signal handler delete what is still registered. The handler then
chains to the handler it replaced (or, if that was the default, re-raises
the signal with the default action so the process still dies of it).

SIGINT counts only without a terminal on stdin: at a terminal, Ctrl-C is a
person interrupting a step (mini-swe-agent catches ``KeyboardInterrupt`` to
ask what to do next), and the sandbox must survive it; without one (a
launcher, ``nohup``, a Ray worker) a SIGINT is a stop, and a framework that
catches the ``KeyboardInterrupt`` must not keep the sandboxes alive. A signal
the process ignores (``nohup`` ignores SIGHUP) is left ignored: the process
means to outlive it, with its sandboxes. SIGKILL cannot be caught, and a
Ray worker whose driver was signalled is ended without running handlers: for
those, a guardian process (:mod:`corral.adapters._guardian`), started at the
first sandbox tracked, outside the process's tree, deletes what is still
registered when the process's pipe to it closes, however the process ended
(``CORRAL_ADAPTER_GUARDIAN=0``: none).

Deletion at exit or on a signal uses a fresh connection to the service: the
signal may have interrupted a request on the adapter's own client mid-way.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from ..client import Client

log = logging.getLogger("corral.adapters")

_lock = threading.RLock()
_entries: Dict[int, "_Entry"] = {}
_next_key = 0
_atexit_registered = False
_previous_handlers: Dict[int, Any] = {}

#: The signals on which registered sandboxes are deleted (SIGINT too when
#: the process is not interactive: :func:`signals`).
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def interactive() -> bool:
    """Whether a person may be at the keyboard: stdin is a terminal."""
    try:
        return os.isatty(0)
    except OSError:  # pragma: no cover - no fd 0 at all
        return False


def signals() -> tuple:
    """The signals this process deletes its sandboxes on."""
    if interactive():
        return SIGNALS
    return SIGNALS + (signal.SIGINT,)


@dataclass
class _Entry:
    sandbox_id: str
    new_client: Callable[[], Client]


class _Service:
    """How to reach the service again from scratch (a new client each call);
    ``url``/``token`` ``None``: as a client finds them."""

    def __init__(self, url: Optional[str], token: Optional[str]) -> None:
        self.url = url
        self.token = token

    def __call__(self) -> Client:
        return Client(self.url, token=self.token)


def client_factory(base_url: Optional[str], token: Optional[str], client: Optional[Client]) -> Callable[[], Client]:
    """How to reach the service again from scratch: the adapter's own
    ``base_url``/``token`` or, for a caller's client, its URL and token."""
    if client is None:
        return _Service(base_url, token)
    return _Service(client.base_url, getattr(getattr(client, "_tokens", None), "token", None))


#: This process's guardian: (the pid that started it, its stdin).
_guardian: Optional[Tuple[int, Any]] = None


def _tell_guardian(op: str, sandbox_id: str, service: Any = None) -> None:
    """Register (``+``) or release (``-``) a sandbox with this process's
    guardian, starting it at the first registration."""
    global _guardian
    with _lock:
        if _guardian is None or _guardian[0] != os.getpid():
            # None yet, or inherited through a fork: this process's own.
            if op != "+" or os.environ.get("CORRAL_ADAPTER_GUARDIAN", "1") == "0":
                return
            _guardian = (os.getpid(), _start_guardian())
        pipe = _guardian[1]
        if pipe is None:
            return
        entry: Dict[str, Any] = {"id": sandbox_id}
        if op == "+":
            entry["url"] = getattr(service, "url", None)
            entry["token"] = getattr(service, "token", None)
        try:
            pipe.write(op + json.dumps(entry) + "\n")
            pipe.flush()
        except (OSError, ValueError) as err:
            log.debug("corral: the sandbox guardian is gone: %s", err)


def _start_guardian() -> Any:
    from . import _guardian as guardian

    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(guardian.__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_OPEN_INSTRUCT", "TERMINAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", guardian.BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            start_new_session=True,
        )
        # The intermediate process exits as soon as it has forked the guardian.
        proc.wait(timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("corral: no guardian for this process's sandboxes (a SIGKILL leaves them to the idle timeout): %s", err)
        return None
    return proc.stdin


def track(sandbox_id: str, new_client: Callable[[], Client]) -> int:
    """Register a live sandbox; returns the key to :func:`release` it with."""
    global _next_key
    with _lock:
        _next_key += 1
        key = _next_key
        _entries[key] = _Entry(sandbox_id, new_client)
        _tell_guardian("+", sandbox_id, new_client)
    _install()
    return key


def release(key: Optional[int]) -> None:
    """Forget a sandbox (it was deleted, or is about to be, by its owner)."""
    if key is None:
        return
    with _lock:
        entry = _entries.pop(key, None)
        if entry is not None:
            _tell_guardian("-", entry.sandbox_id)


def delete_now(key: Optional[int]) -> None:
    """Delete one registered sandbox over a fresh connection (for timers and
    other threads that must not share the owner's client)."""
    if key is None:
        return
    with _lock:
        entry = _entries.pop(key, None)
    if entry is not None:
        _delete(entry)


def reap_all() -> int:
    """Delete every registered sandbox; returns how many were registered."""
    with _lock:
        entries = list(_entries.values())
        _entries.clear()
    for entry in entries:
        _delete(entry)
    return len(entries)


def live_count() -> int:
    with _lock:
        return len(_entries)


def _delete(entry: _Entry) -> None:
    try:
        client = entry.new_client()
    except Exception as err:  # noqa: BLE001 - best effort at exit
        log.warning("corral: could not reach the service to delete sandbox %s: %s", entry.sandbox_id, err)
        return
    try:
        client.delete_sandbox(entry.sandbox_id)
        with _lock:
            _tell_guardian("-", entry.sandbox_id)
    except Exception as err:  # noqa: BLE001 - best effort at exit
        log.warning("corral: could not delete sandbox %s: %s", entry.sandbox_id, err)
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass


def _on_signal(signum: int, frame: Any) -> None:
    reap_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # The default action (or a handler not set from Python): die of the
    # signal, as the process would have without us.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_handlers() -> None:
    """Set the exit hook, and the signal handlers when called on the main
    thread, before any sandbox is tracked (for adapters that make their
    sandboxes on other threads)."""
    _install()


def _install() -> None:
    global _atexit_registered
    with _lock:
        if not _atexit_registered:
            atexit.register(reap_all)
            _atexit_registered = True
        # Signal handlers can only be set from the main thread; a sandbox made
        # on another thread gets them when one is made on the main thread, and
        # the atexit hook in any case.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals():
            current = signal.getsignal(sig)
            if current is _on_signal or current == signal.SIG_IGN:
                continue
            _previous_handlers[sig] = current
            try:
                signal.signal(sig, _on_signal)
            except (ValueError, OSError) as err:  # pragma: no cover - embedded interpreters
                log.debug("corral: could not set a handler for signal %s: %s", sig, err)
