"""Output as the frameworks expect it, from corral's capped streams.

corral keeps at most ``max_output`` bytes per stream: the first half (rounded
up) and the last half, and counts every byte. The frameworks' Docker backends
keep either everything (mini-swe-agent) or the first 1,000,000 bytes
(open-instruct). These helpers turn a capped stream into either, and never
join a head and a tail silently.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict

from ..client import Sandbox


def elided_marker(elided: int) -> str:
    """The line put where corral dropped the middle of an output."""
    return f"\n[... {elided} bytes elided by corral: output over its max_output, head and tail kept ...]\n"


def joined(data: bytes, truncated: bool, total: int) -> str:
    """The kept bytes as text; when the middle was dropped, head and tail are
    joined by :func:`elided_marker`, which says how many bytes are missing."""
    if not truncated or total <= len(data):
        return data.decode("utf-8", errors="replace")
    head_len = len(data) - len(data) // 2
    head, tail = data[:head_len], data[head_len:]
    return (
        head.decode("utf-8", errors="replace")
        + elided_marker(total - len(data))
        + tail.decode("utf-8", errors="replace")
    )


def head_only(data: bytes, truncated: bool, limit: int) -> bytes:
    """The first ``limit`` bytes of a stream whose ``max_output`` was at least
    ``2 * limit`` (so corral's head holds them all)."""
    if truncated:
        data = data[: len(data) - len(data) // 2]
    return data[:limit]


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return False
    return name in params


def supports_wait_for_output() -> bool:
    """Whether this client's ``Sandbox.run`` takes ``wait_for_output`` (wait
    for the output streams to close, as ``docker exec`` does, rather than
    return when the main process exits)."""
    return _accepts(Sandbox.run, "wait_for_output")


def wait_for_output_kwargs(sandbox: Sandbox) -> Dict[str, Any]:
    """``{"wait_for_output": True}`` when the client has the option, else
    nothing (older clients return at main-process exit)."""
    return {"wait_for_output": True} if _accepts(sandbox.run, "wait_for_output") else {}
