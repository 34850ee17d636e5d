"""deer-flow's ``Sandbox`` on one corral sandbox, for
:mod:`corral.adapters.deer_flow` (whose docstring describes its contract and
its differences from deer-flow's own sandboxes).

Commands and files go through corral's HTTP API; listings and searches run
``find``/``grep`` in the sandbox (``sh -c`` with the paths and patterns as
arguments, never spliced into the script) and apply deer-flow's rules
(:mod:`corral.adapters._deer_flow_search`) on the host. Each operation that
finds the sandbox gone from the service (evicted, idle-timed out) asks the
provider for the thread's sandbox again and runs once more, when
``auto_restart`` allows.
"""

from __future__ import annotations

import errno
import io
import logging
import posixpath
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from ..client import Sandbox
from ..errors import CorralError, SandboxFileNotFoundError, SandboxNotFoundError, TooLargeError
from . import _deer_flow_search as search
from . import _output

__all__ = ["CorralSandbox", "VIRTUAL_PATH_PREFIX"]

log = logging.getLogger("corral.adapters")

#: deer-flow's virtual prefix (``deerflow.config.paths.VIRTUAL_PATH_PREFIX``).
VIRTUAL_PATH_PREFIX = "/mnt/user-data"
#: Largest file ``download_file`` returns (deer-flow's ``_MAX_DOWNLOAD_SIZE``).
MAX_DOWNLOAD_BYTES = 100 * 1024 * 1024
#: Bytes of a listing or search corral returns at most.
SEARCH_MAX_OUTPUT = 16 << 20

try:  # deer-flow's base class, when it is installed
    from deerflow.sandbox.sandbox import Sandbox as _SandboxBase
except Exception:  # noqa: BLE001 - standalone
    _SandboxBase = object  # type: ignore[assignment,misc]

T = TypeVar("T")


def _os_error(err: CorralError, path: str, op: str) -> OSError:
    """corral's file error as the ``OSError`` ``LocalSandbox`` raises."""
    if isinstance(err, SandboxFileNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if isinstance(err, TooLargeError):
        return OSError(errno.EFBIG, f"File exceeds maximum size: {err.message}", path)
    low = err.message.lower()
    if "is a directory" in low:
        return IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if "not a directory" in low:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
    if "permission denied" in low:
        return PermissionError(errno.EACCES, "Permission denied", path)
    if "read-only file system" in low:
        return OSError(errno.EROFS, "Read-only file system", path)
    return OSError(errno.EIO, f"cannot {op}: {err.message}", path)


class _PrefilterRefused(Exception):
    """The sandbox's ``grep`` refused the translated pattern."""


def _timeout_notice(timeout: float) -> str:
    seconds = float(timeout)
    amount = str(int(seconds)) if seconds.is_integer() else f"{seconds:g}"
    unit = "second" if seconds == 1 else "seconds"
    return (
        f"Command timed out after {amount} {unit} and was terminated. To run a long-lived process such as a web "
        "server, start it in the background and redirect its output, e.g. "
        "`your-command > /mnt/user-data/workspace/server.log 2>&1 &`."
    )


class CorralSandbox(_SandboxBase):  # type: ignore[misc,valid-type]
    """deer-flow's ``Sandbox`` on one corral sandbox (see the module doc)."""

    def __init__(self, id: str, provider: Any, sandbox: Sandbox) -> None:
        self._id = id
        self._provider = provider
        self._sb = sandbox
        self._sb_lock = threading.Lock()

    @property
    def id(self) -> str:
        return self._id

    @property
    def sandbox(self) -> Sandbox:
        """The corral sandbox, for everything deer-flow's interface lacks."""
        with self._sb_lock:
            return self._sb

    def _replace(self, sb: Sandbox) -> None:
        with self._sb_lock:
            self._sb = sb

    def _call(self, op: Callable[[Sandbox], T]) -> T:
        """``op`` on the sandbox; once more on a new one when the service
        removed it (and ``auto_restart`` allows)."""
        sb = self.sandbox
        try:
            return op(sb)
        except SandboxNotFoundError:
            if not self._provider.auto_restart:
                raise
        return op(self._provider._reopen(self._id))

    # -- commands ----------------------------------------------------------

    def execute_command(self, command: str, env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> str:
        search.validate_extra_env(env)
        limit = self._provider.settings.command_timeout if timeout is None else float(timeout)
        shell = self._provider.settings.shell
        cap = self._provider.settings.max_output
        try:
            r = self._call(
                lambda sb: sb.run([shell, "-c", command], timeout=limit, env=env, max_output=cap, raise_on_failure=False)
            )
        except CorralError as err:
            log.error("corral: command in sandbox %s failed: %s", self._id, err)
            return f"Error: {err}"
        output = _output.joined(r.stdout_bytes, r.stdout_truncated, r.stdout_total_bytes)
        stderr = _output.joined(r.stderr_bytes, r.stderr_truncated, r.stderr_total_bytes)
        if stderr:
            output += f"\nStd Error:\n{stderr}" if output else stderr
        failure = r.failure
        if failure is None:
            code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
            if code != 0:
                output += f"\nExit Code: {code}"
        elif failure.kind == "timeout":
            notice = _timeout_notice(limit)
            output += f"\n{notice}" if output else notice
        else:
            message = f"Error: {failure.kind}: {failure.message}"
            output += f"\n{message}" if output else message
        return output if output else "(no output)"

    # -- files -------------------------------------------------------------

    def _read_bytes(self, path: str, max_bytes: Optional[int] = None) -> bytes:
        try:
            return self._call(lambda sb: sb.read_file(path, max_bytes=max_bytes))
        except SandboxNotFoundError:
            raise
        except CorralError as err:
            if err.field == "path" or isinstance(err, (SandboxFileNotFoundError, TooLargeError)) or err.kind == "file_error":
                raise _os_error(err, path, "read") from None
            raise

    def _write_bytes(self, path: str, data: bytes, mode: Optional[int] = None) -> None:
        try:
            self._call(lambda sb: sb.write_file(path, data, mode=mode, mkdirs=True))
        except SandboxNotFoundError:
            raise
        except CorralError as err:
            if err.field == "path" or isinstance(err, TooLargeError) or err.kind == "file_error":
                raise _os_error(err, path, "write") from None
            raise

    def read_file(self, path: str, start_line: Optional[int] = None, end_line: Optional[int] = None) -> str:
        text = self._read_bytes(path).decode("utf-8")
        if start_line is None and end_line is None:
            return text
        start = max(start_line or 1, 1)
        selected: List[str] = []
        for number, line in enumerate(io.StringIO(text, newline="\n"), start=1):
            if number < start:
                continue
            if end_line is not None and number > end_line:
                break
            selected.append(line.rstrip("\r\n"))
        return "\n".join(selected)

    def download_file(self, path: str) -> bytes:
        normalised = path.replace("\\", "/")
        if ".." in normalised.split("/"):
            raise PermissionError(f"Access denied: path traversal detected in '{path}'")
        stripped = normalised.lstrip("/")
        prefix = VIRTUAL_PATH_PREFIX.lstrip("/")
        if stripped != prefix and not stripped.startswith(prefix + "/"):
            raise PermissionError(errno.EACCES, f"Access denied: path must be under '{VIRTUAL_PATH_PREFIX}'", path)
        try:
            return self._read_bytes(normalised, max_bytes=MAX_DOWNLOAD_BYTES)
        except OSError as err:
            if err.errno == errno.EFBIG:
                raise OSError(errno.EFBIG, f"File exceeds maximum download size of {MAX_DOWNLOAD_BYTES} bytes", path) from None
            raise
        except CorralError as err:
            raise OSError(f"Failed to download file '{path}' from sandbox: {err}") from err

    def write_file(self, path: str, content: str, append: bool = False) -> None:
        data = content.encode("utf-8")
        if append:
            try:
                data = self._read_bytes(path) + data
            except FileNotFoundError:
                pass
        self._write_bytes(path, data)

    def update_file(self, path: str, content: bytes) -> None:
        self._write_bytes(path, bytes(content), mode=0o666)

    # -- listings and searches ---------------------------------------------

    def _script(self, script: str, *args: str) -> bytes:
        """``sh -c script`` with ``args`` as ``$1...``; exit 3: the root is
        missing, 4: it is not a directory (or file, where one is allowed)."""
        r = self._call(
            lambda sb: sb.run(["sh", "-c", script, "sh", *args], timeout=300, max_output=SEARCH_MAX_OUTPUT)
        )
        if r.exit_code == 3:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", args[0])
        if r.exit_code == 4:
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", args[0])
        if r.exit_code == 5:
            raise _PrefilterRefused()
        data = r.stdout_bytes
        if r.stdout_truncated:
            data = data[: len(data) - len(data) // 2]  # the head; its last record may be cut
            data = data[: data.rfind(b"\0") + 1] if b"\0" in data else data[: data.rfind(b"\n") + 1]
        return data

    def list_dir(self, path: str, max_depth: int = 2) -> List[str]:
        depth = int(max_depth)
        if depth < 1:
            return []
        script = (
            '[ -d "$1" ] || exit 0; find "$1" -mindepth 1 -maxdepth "$2" -type d -print0; printf "/\\0"; '
            'find "$1" -mindepth 1 -maxdepth "$2" ! -type d -print0'
        )
        records = self._script(script, path, str(depth)).split(b"\0")
        root = _norm_root(path)
        out: List[str] = []
        is_dir = True
        for raw in records:
            if raw == b"/":
                is_dir = False
                continue
            if not raw:
                continue
            entry = raw.decode("utf-8", errors="replace")
            if search.should_ignore_path(_relative(entry, root)):
                continue
            out.append(entry.rstrip("/") + "/" if is_dir else entry)
        return sorted(out)

    def glob(self, path: str, pattern: str, *, include_dirs: bool = False, max_results: int = 200) -> Tuple[List[str], bool]:
        types = '\\( -type f -o -type d \\)' if include_dirs else "-type f"
        script = f'[ -e "$1" ] || exit 3; [ -d "$1" ] || exit 4; find "$1" -mindepth 1 {types} -print0'
        data = self._script(script, path)
        root = _norm_root(path)
        matches: List[str] = []
        for raw in sorted(data.split(b"\0")):
            if not raw:
                continue
            entry = raw.decode("utf-8", errors="replace")
            rel = _relative(entry, root)
            if not rel or search.should_ignore_path(rel):
                continue
            if search.path_matches(pattern, rel):
                matches.append(entry)
                if len(matches) >= max_results:
                    return matches, True
        return matches, False

    def grep(
        self,
        path: str,
        pattern: str,
        *,
        glob: Optional[str] = None,
        literal: bool = False,
        case_sensitive: bool = False,
        max_results: int = 100,
    ) -> Tuple[List[Any], bool]:
        import re

        regex = re.compile(re.escape(pattern) if literal else pattern, 0 if case_sensitive else re.IGNORECASE)
        if literal:
            flags, needle = "-F", pattern
        else:
            prefilter = search.ere_prefilter(pattern)
            flags, needle = ("-E", prefilter) if prefilter is not None else ("-F", "")
        try:
            return self._grep(path, flags, needle, regex, glob, case_sensitive, max_results)
        except _PrefilterRefused:
            # The image's grep does not read the translation: every line is
            # a candidate, Python decides.
            return self._grep(path, "-F", "", regex, glob, case_sensitive, max_results)

    def _grep(
        self,
        path: str,
        flags: str,
        needle: str,
        regex: Any,
        glob: Optional[str],
        case_sensitive: bool,
        max_results: int,
    ) -> Tuple[List[Any], bool]:
        if not case_sensitive:
            flags += " -i"
        # "D" or "F" (the root's type), the candidate files (NUL-separated,
        # ended by "/"), then grep's lines "path:number:text", whose path is
        # one of the files.
        find = f'find -H "$1" -type f -size -{search.MAX_GREP_FILE_BYTES + 1}c -print0'
        script = (
            f'[ -e "$1" ] || exit 3; echo x | grep {flags} -e "$2" >/dev/null 2>&1; [ $? -le 1 ] || exit 5; '
            'if [ -d "$1" ]; then printf "D\\0"; elif [ -f "$1" ]; then printf "F\\0"; '
            f'else exit 4; fi; {find}; printf "/\\0"; {find} | xargs -0 -r grep -n -H {flags} -e "$2" --; exit 0'
        )
        data = self._script(script, path, needle)
        kind, _, rest = data.partition(b"\0")
        head, _, body = rest.partition(b"/\0")
        files = {f.decode("utf-8", errors="replace") for f in head.split(b"\0") if f}
        root = _norm_root(path)
        root_is_file = kind == b"F"
        matches: List[Any] = []
        for raw in body.split(b"\n"):
            if not raw or b"\0" in raw:
                continue
            parsed = _grep_line(raw.decode("utf-8", errors="replace"), files)
            if parsed is None:
                continue
            file_path, number, text = parsed
            text = text[:-1] if text.endswith("\r") else text
            rel = file_path.rsplit("/", 1)[-1] if root_is_file else _relative(file_path, root)
            if not root_is_file and search.should_ignore_path(rel):
                continue
            if glob is not None and not search.path_matches(glob, rel):
                continue
            if len(text) > search.LINE_SUMMARY_LENGTH * 10 or not regex.search(text):
                continue
            matches.append(search.GrepMatch(path=file_path, line_number=number, line=search.truncate_line(text)))
            if len(matches) >= max_results:
                return matches, True
        return matches, False


def _norm_root(path: str) -> str:
    return posixpath.normpath(path) if path not in ("", "/") else "/"


def _relative(entry: str, root: str) -> str:
    if root == "/":
        return entry.lstrip("/")
    if entry == root:
        return ""
    return entry[len(root) + 1 :] if entry.startswith(root + "/") else entry


def _grep_line(line: str, files: set) -> Optional[Tuple[str, int, str]]:
    """``path:number:text`` split where ``path`` is one of ``files``."""
    start = 0
    while True:
        idx = line.find(":", start)
        if idx < 0:
            return None
        if line[:idx] in files:
            number, sep, text = line[idx + 1 :].partition(":")
            if sep and number.isdigit():
                return line[:idx], int(number), text
        start = idx + 1
