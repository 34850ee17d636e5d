"""deer-flow's search and validation rules, for :mod:`corral.adapters.deer_flow`.

When deer-flow is importable its own helpers are used
(``deerflow.sandbox.search``: ``GrepMatch``, ``path_matches``,
``should_ignore_path``, ``truncate_line``; ``deerflow.sandbox.sandbox``:
``_validate_extra_env``), so results are the very objects its tools expect.
Without it (the client's own tests, a gateway that vendors the adapter
first) these equivalents apply the same rules: the names its searches skip
(VCS directories, dependency and build trees, caches, editor and temporary
files), glob matching relative to the search root with ``**/`` also
matching at the root, result lines cut to 200 characters with ``...``, and
environment names that are POSIX names.

:func:`ere_prefilter` is corral's own: ``grep`` inside the sandbox narrows
the lines with an extended regular expression that matches *at least* the
lines deer-flow's Python pattern matches, and Python's ``re`` decides on
the host, so no line is reported that deer-flow's local search would not
report.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Dict, Optional

#: Longest line kept in a grep result, as deer-flow's ``truncate_line``.
LINE_SUMMARY_LENGTH = 200
#: Files larger than this are not searched (deer-flow's DEFAULT_MAX_FILE_SIZE_BYTES).
MAX_GREP_FILE_BYTES = 1_000_000

_IGNORED_NAMES = frozenset(
    """
    .git .svn .hg .bzr node_modules __pycache__ .venv venv .env env .tox .nox .eggs
    site-packages dist build .next .nuxt .output .turbo target out .idea .vscode
    .project .classpath .settings .DS_Store Thumbs.db desktop.ini .cache logs
    .coverage coverage .nyc_output htmlcov .pytest_cache .mypy_cache .ruff_cache
    """.split()
)
_IGNORED_GLOBS = re.compile(
    "|".join(
        fnmatch.translate(p)
        for p in "*.egg-info *.swp *.swo *~ *.lnk *.log *.tmp *.temp .upload-*.part *.bak *.cache".split()
    )
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class _GrepMatch:
    """One matching line (deer-flow's ``GrepMatch`` when it is not importable)."""

    path: str
    line_number: int
    line: str


def _should_ignore_name(name: str) -> bool:
    return name in _IGNORED_NAMES or _IGNORED_GLOBS.match(name) is not None


def _should_ignore_path(path: str) -> bool:
    return any(_should_ignore_name(seg) for seg in path.replace("\\", "/").split("/") if seg)


def _path_matches(pattern: str, rel_path: str) -> bool:
    path = PurePosixPath(rel_path)
    if path.match(pattern):
        return True
    return pattern.startswith("**/") and path.match(pattern[3:])


def _truncate_line(line: str, max_chars: int = LINE_SUMMARY_LENGTH) -> str:
    line = line.rstrip("\n\r")
    if len(line) <= max_chars:
        return line
    return line[: max_chars - 3] + "..."


def _validate_extra_env(extra_env: Optional[Dict[str, str]]) -> None:
    if not extra_env:
        return
    for key in extra_env:
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ValueError(
                f"extra_env key {key!r} is not a valid POSIX environment variable name "
                "(must match ^[A-Za-z_][A-Za-z0-9_]*$)"
            )


GrepMatch: Any = _GrepMatch
path_matches: Any = _path_matches
should_ignore_path: Any = _should_ignore_path
truncate_line: Any = _truncate_line
validate_extra_env: Any = _validate_extra_env
DEERFLOW_HELPERS = False
try:  # deer-flow's own rules when it is installed
    from deerflow.sandbox.search import GrepMatch as GrepMatch  # type: ignore[no-redef]  # noqa: F811
    from deerflow.sandbox.search import path_matches as path_matches  # type: ignore[no-redef]  # noqa: F811
    from deerflow.sandbox.search import should_ignore_path as should_ignore_path  # type: ignore[no-redef]  # noqa: F811
    from deerflow.sandbox.search import truncate_line as truncate_line  # type: ignore[no-redef]  # noqa: F811
    from deerflow.sandbox.sandbox import _validate_extra_env as validate_extra_env  # type: ignore[no-redef]  # noqa: F811

    DEERFLOW_HELPERS = True
except Exception:  # noqa: BLE001 - deer-flow absent, or a layout this adapter does not know
    pass


# -- the grep prefilter --------------------------------------------------------

_CLASS_ESCAPES = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "w": "[[:alnum:]_]",
    "W": "[^[:alnum:]_]",
    "s": "[[:space:]]",
    "S": "[^[:space:]]",
}
_IN_BRACKET_ESCAPES = {"d": "0-9", "w": "[:alnum:]_", "s": "[:space:]"}
_ANCHOR_ESCAPES = set("bBAZ")
_QUANTIFIER = re.compile(r"\{\d*(,\d*)?\}")


def ere_prefilter(pattern: str) -> Optional[str]:
    """An extended regular expression (POSIX, as busybox and GNU ``grep -E``
    read it) that matches every line Python's ``re.search(pattern, line)``
    matches, perhaps more; ``None`` when no such translation is known (a
    lookaround, a back-reference, inline flags...): then every line is a
    candidate and Python alone decides.

    Class escapes become POSIX classes, word and string anchors are dropped
    (fewer constraints: more lines), lazy quantifiers become greedy (the same
    lines match), ``(?:``/``(?P<name>`` become plain groups, and a brace that
    is not a quantifier is escaped, as Python reads it literally."""
    out = []
    i, n = 0, len(pattern)
    in_bracket = False
    while i < n:
        c = pattern[i]
        if in_bracket:
            if c == "\\":
                if i + 1 >= n:
                    return None
                e = pattern[i + 1]
                if e in _IN_BRACKET_ESCAPES:
                    out.append(_IN_BRACKET_ESCAPES[e])
                elif e == "\\":
                    out.append("\\")
                else:
                    return None
                i += 2
                continue
            if c == "[" and pattern.startswith("[:", i):
                return None
            out.append(c)
            if c == "]":
                in_bracket = False
            i += 1
            continue
        if c == "\\":
            if i + 1 >= n:
                return None
            e = pattern[i + 1]
            if e in _CLASS_ESCAPES:
                out.append(_CLASS_ESCAPES[e])
            elif e in _ANCHOR_ESCAPES:
                pass
            elif e == "t":
                out.append("\t")
            elif not e.isalnum():
                out.append("\\" + e)
            else:
                return None
            i += 2
            continue
        if c == "[":
            in_bracket = True
            out.append(c)
            i += 1
            # A leading ^ and a leading ] belong to the set.
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if c == "(":
            if pattern.startswith("(?:", i):
                out.append("(")
                i += 3
                continue
            if pattern.startswith("(?P<", i):
                end = pattern.find(">", i)
                if end < 0:
                    return None
                out.append("(")
                i = end + 1
                continue
            if pattern.startswith("(?", i):
                return None
            out.append("(")
            i += 1
            continue
        if c == "{":
            m = _QUANTIFIER.match(pattern, i)
            if m and m.group(0) != "{}" and out:
                out.append(m.group(0))
                i = m.end()
            else:
                out.append("\\{")
                i += 1
            if i < n and pattern[i] == "?":
                i += 1
            continue
        if c in "*+?":
            if not out:
                return None
            out.append(c)
            i += 1
            if i < n and pattern[i] == "?":
                i += 1  # lazy: the same lines match
            elif i < n and pattern[i] == "+":
                return None  # possessive
            continue
        if c == "}":
            out.append("\\}")
            i += 1
            continue
        out.append(c)
        i += 1
    if in_bracket:
        return None
    return "".join(out)
