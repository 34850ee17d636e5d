"""Writes the synchronous client (corral/client.py) from the asyncio one
(corral/aio.py), the one source of both, as httpcore does with unasync.

    python tools/unasync.py          # write corral/client.py
    python tools/unasync.py --check  # exit 1 when corral/client.py is not current

Add or change a method in aio.py only. The sync text is aio.py with
``async``/``await`` taken off and the async names exchanged for their sync
ones (``AsyncSandbox`` -> ``Sandbox``, ``aclose`` -> ``close``,
``aiter_bytes`` -> ``iter_bytes``, ...; see ``RENAMES``). Where the two
differ, aio.py marks lines:

    # unasync: async only       the lines up to ``# unasync: end`` are
                                left out of the sync client;
    # unasync: sync only        the lines up to ``# unasync: end`` are
                                commented out in aio.py (``# `` after the
                                indentation) and uncommented in client.py.

corral/client.py is not in git: packaging (hatch_build.py) and
scripts/python-env.sh write it, and tests/test_unit.py checks it is current.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "corral"
SOURCE = PACKAGE / "aio.py"
TARGET = PACKAGE / "client.py"

HEADER = (
    "# Generated from aio.py by tools/unasync.py; do not edit: change aio.py\n"
    "# and run `python tools/unasync.py` (packaging and scripts/python-env.sh do).\n"
)

# Whole words (or the exact phrases) of the async text and their sync form,
# applied in this order.
RENAMES = [
    (r"\basync def\b", "def"),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\bimport asyncio\b", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncSandbox\b", "Sandbox"),
    (r"\bAsyncShell\b", "Shell"),
    (r"\bAsyncCommandStream\b", "CommandStream"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncHTTPTransport\b", "HTTPTransport"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncJsonPool\b", "JsonPool"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_bytes\b", "iter_bytes"),
]

MARK = re.compile(r"^\s*# unasync: (async only|sync only|end)\s*$")


def unasync(text: str) -> str:
    """The sync client's source for the async client's ``text``."""
    out = []
    block = None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        mark = MARK.match(line)
        if mark:
            word = mark.group(1)
            if (word == "end") == (block is None):
                raise ValueError(f"aio.py:{n}: '# unasync: {word}' {'without a block' if block is None else 'inside a block'}")
            block = None if word == "end" else word
            continue
        if block == "async only":
            continue
        if block == "sync only":
            stripped = line.lstrip(" ")
            indent = line[: len(line) - len(stripped)]
            if stripped.startswith("# "):
                line = indent + stripped[2:]
            elif stripped.rstrip("\n") == "#":
                line = "\n"
            else:
                raise ValueError(f"aio.py:{n}: a line of a '# unasync: sync only' block must be commented out")
        for pattern, sync in RENAMES:
            line = re.sub(pattern, sync, line)
        out.append(line)
    if block is not None:
        raise ValueError(f"aio.py: '# unasync: {block}' block not ended")
    return HEADER + "".join(out)


def is_current() -> bool:
    return TARGET.exists() and TARGET.read_text() == unasync(SOURCE.read_text())


def write() -> bool:
    """Write client.py when it is not current; True when it was written."""
    if is_current():
        return False
    TARGET.write_text(unasync(SOURCE.read_text()))
    return True


def main(argv: list) -> int:
    if argv == ["--check"]:
        if is_current():
            return 0
        print(f"{TARGET} is not current: run `python {Path(__file__)}`", file=sys.stderr)
        return 1
    if argv:
        print(f"usage: {Path(__file__).name} [--check]", file=sys.stderr)
        return 2
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
