"""Every code block of the top-level README runs: shell blocks with the built
corral on the real daemon, Python blocks against a real ``corral serve``. A
block that cannot run here is marked just above it with
``<!-- readme: skip: REASON -->``, and the reason is required. The Python
blocks of the book's guides run the same way."""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from conftest import REPO, corral_binary

README = REPO / "README.md"
SKIP = re.compile(r"<!--\s*readme:\s*skip:\s*(.*?)\s*-->")


def blocks(text: str) -> List[Tuple[int, str, str, Optional[str]]]:
    """(line, language, code, skip reason or None) of each fenced block."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(prev)
        out.append((start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n", skip.group(1) if skip else None))
        i = j + 1
    return out


ALL = blocks(README.read_text())
GUIDES = [REPO / "docs" / "book" / "src" / name for name in ("guide-agents.md", "guide-rl.md")]


def test_every_block_runs_or_says_why_not():
    assert ALL, "no code blocks found in README.md"
    for line, lang, _, skip in ALL:
        assert lang in ("sh", "python"), f"README.md:{line}: block language {lang!r} is neither sh nor python"
        if skip is not None:
            assert len(skip) > 10, f"README.md:{line}: a skipped block must say why"
    assert any(s is None and lang == "sh" for _, lang, _, s in ALL), "no shell block runs"
    assert any(s is None and lang == "python" for _, lang, _, s in ALL), "no Python block runs"


def _run_ids(kind: str) -> List[Tuple[int, str]]:
    return [(line, code) for line, lang, code, skip in ALL if lang == kind and skip is None]


@pytest.mark.parametrize("line,code", _run_ids("sh"), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_shell_block(line: int, code: str, tmp_path: Path):
    # `target/debug/corral` in a block means the binary under test.
    code = code.replace("target/debug/corral", corral_binary())
    out = subprocess.run(
        ["bash", "-eu", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, f"README.md:{line} failed ({out.returncode}):\n{code}\n{out.stdout}\n{out.stderr}"
    assert out.stdout.strip(), f"README.md:{line} printed nothing"


@pytest.mark.server
@pytest.mark.parametrize("line,code", _run_ids("python"), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_python_block(line: int, code: str, corral_url: str):
    env = dict(os.environ, CORRAL_URL=corral_url)
    env.pop("CORRAL_TOKEN", None)  # the client finds the local service's token itself, as the README says
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"README.md:{line} failed ({out.returncode}):\n{code}\n{out.stdout}\n{out.stderr}"
    assert out.stdout.strip(), f"README.md:{line} printed nothing"


GUIDE_BLOCKS = [
    (f"{path.name}:{line}", code)
    for path in GUIDES
    for line, lang, code, skip in blocks(path.read_text())
    if lang == "python" and skip is None
]


def test_the_guides_have_examples():
    assert len(GUIDE_BLOCKS) >= len(GUIDES), GUIDE_BLOCKS


@pytest.mark.server
@pytest.mark.parametrize("where,code", GUIDE_BLOCKS, ids=lambda v: v if ":" in v and "\n" not in v else "")
def test_guide_python_block(where: str, code: str, corral_url: str):
    env = dict(os.environ, CORRAL_URL=corral_url)
    env.pop("CORRAL_TOKEN", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"{where} failed ({out.returncode}):\n{code}\n{out.stdout}\n{out.stderr}"
    assert out.stdout.strip(), f"{where} printed nothing"
