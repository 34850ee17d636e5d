"""Code contexts: what ``Sandbox.run_code`` returns (results with their MIME
bundles, logs, the error), built from the events of
``POST /v1/sandboxes/{id}/code``."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from .errors import CorralError, _class_for, ServiceUnavailableError

#: A callback for one streamed item.
Handler = Optional[Callable[[Any], Any]]


@dataclass
class Result:
    """A rich result: the value of the code's last expression
    (``is_main_result``) or something it displayed (a plot). ``data`` maps
    MIME types to values; the properties name the common ones."""

    data: Dict[str, Any]
    is_main_result: bool = False

    @property
    def text(self) -> Optional[str]:
        return self.data.get("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self.data.get("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def png(self) -> Optional[str]:
        """The PNG, base64 (``png_bytes()`` decodes it)."""
        return self.data.get("image/png")

    @property
    def jpeg(self) -> Optional[str]:
        return self.data.get("image/jpeg")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    def png_bytes(self) -> Optional[bytes]:
        return base64.b64decode(self.png) if self.png else None

    def formats(self) -> List[str]:
        return sorted(self.data)


@dataclass
class Logs:
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """The exception the code raised (not a corral failure: those raise)."""

    name: str
    value: str
    traceback: List[str]


@dataclass
class Execution:
    """What one ``run_code`` produced."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    #: Output or results beyond ``max_output`` were dropped.
    truncated: bool = False
    duration_ms: int = 0

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the last expression's value)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class CodeContext:
    """A code context: a kernel of its own in the sandbox."""

    id: str
    language: str
    cwd: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CodeContext":
        return cls(id=d["id"], language=d["language"], cwd=d.get("cwd"))


def run_body(
    code: str,
    context: Any,
    env: Optional[Mapping[str, str]],
    timeout: Optional[float],
    max_output: Optional[int],
    exclusive: bool = False,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    if exclusive:
        body["exclusive"] = True
    if context is not None:
        body["context"] = context.id if isinstance(context, CodeContext) else str(context)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if timeout is not None:
        body["timeout_ms"] = int(timeout * 1000)
    if max_output is not None:
        body["max_output"] = int(max_output)
    return body


def failure_error(failure: Mapping[str, Any]) -> CorralError:
    """The typed exception of a run that did not finish (``timeout``,
    ``oom_killed``, a kernel that could not start)."""
    kind = failure.get("kind", "error")
    cls = _class_for(kind, None)
    if cls is ServiceUnavailableError:
        cls = CorralError
    return cls(
        failure.get("message") or kind,
        kind=kind,
        retryable=failure.get("retryable"),
        container=failure.get("container"),
    )


def apply(
    ex: Execution,
    event: str,
    data: Mapping[str, Any],
    on_stdout: Handler,
    on_stderr: Handler,
    on_result: Handler,
    on_error: Handler,
) -> Optional[Any]:
    """Adds one event to ``ex``; the callback's return value (maybe
    awaitable). Raises the typed exception of an ``end`` with a failure."""
    if event == "stdout":
        ex.logs.stdout.append(data["text"])
        return on_stdout(data["text"]) if on_stdout else None
    if event == "stderr":
        ex.logs.stderr.append(data["text"])
        return on_stderr(data["text"]) if on_stderr else None
    if event == "result":
        r = Result(dict(data.get("data") or {}), bool(data.get("is_main_result")))
        ex.results.append(r)
        return on_result(r) if on_result else None
    if event == "error":
        ex.error = ExecutionError(data["name"], data["value"], list(data.get("traceback") or []))
        return on_error(ex.error) if on_error else None
    if event == "end":
        ex.execution_count = data.get("execution_count")
        ex.truncated = bool(data.get("truncated"))
        ex.duration_ms = int(data.get("duration_ms") or 0)
        if data.get("failure"):
            raise failure_error(data["failure"])
    return None
