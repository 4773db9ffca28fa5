"""The documentation is reference for users, not a lab notebook: the front pages stay short, and no
document but docs/results.md and CHANGELOG.md (dated by design), no code comment and no docstring
carries dated history (dates of work, issue numbers, "until <date>", "formerly", work sessions) or, in
code, timing figures. History belongs to git; measurements to docs/results.md.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

README_MAX_BYTES = 12_000
README_MAX_LINES = 220
BENCHMARKS_README_MAX_BYTES = 25_000

# a calendar date (not an ISO timestamp constant such as a fixed epoch "2026-01-01T00:00:00Z")
DATE = r"\b20\d\d-[01]\d-[0-3]\d\b(?!T\d)"
HISTORY = re.compile(
    "|".join([
        DATE,
        r"\b[Ii]ssues? #?\d+",                    # issue 21, issue #16
        r"(?<![\w&#/\"'])(?<!: )#\d{1,4}\b(?![;0-9a-fA-F])",   # #16 (not a colour, an anchor or a URL)
        r"\b[Uu]ntil 20\d\d\b", r"\b[Ss]ince 20\d\d\b",
        r"\b[Ff]ormerly\b", r"\b[Tt]he former (default|defaults|mode|norm|tolerances|spellings?)\b",
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
        r"|\d+(st|nd|rd|th)) session\b",
        r"\bwork period",
    ])
)
# timing figures: a speed-up, a per-world-step cost, a before -> after time
TIMING = re.compile(
    r"\b\d+(\.\d+)?x (faster|slower|less time)\b"
    r"|\b\d+(\.\d+)? ?(us|µs) per\b"
    r"|\b\d+(\.\d+)? ?(ms|us|µs|s) ?(->|→) ?\d"
    r"|\b\d+(\.\d+)? ?(->|→) ?\d+(\.\d+)? ?(ms|us|µs|s)\b"
)


def _docs() -> list[Path]:
    undated = {"results.md"}
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in undated)]


def _code_texts(path: Path) -> list[tuple[int, str]]:
    """Every comment and docstring line of a Python file, with its line number."""
    src = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(src).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out += [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]
    return out


def _code_files() -> list[Path]:
    return sorted(p for pkg in ("sysid", "ingest") for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def test_readme_is_a_front_page() -> None:
    readme = ROOT / "README.md"
    size = len(readme.read_bytes())
    lines = readme.read_text(encoding="utf-8").count("\n")
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): reference goes to docs/"
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_benchmarks_readme_is_short() -> None:
    size = len((ROOT / "benchmarks" / "README.md").read_bytes())
    assert size <= BENCHMARKS_README_MAX_BYTES, (
        f"benchmarks/README.md is {size} bytes (at most {BENCHMARKS_README_MAX_BYTES}): per script its latest "
        "table; dated results go to docs/results.md")


@pytest.mark.parametrize("path", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_carry_no_dated_history(path: Path) -> None:
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "dated history in the documentation (dated results belong in docs/results.md, history " \
        "in git):\n" + "\n".join(hits)


def test_code_comments_carry_no_history_or_timings() -> None:
    hits = []
    for path in _code_files():
        for n, text in _code_texts(path):
            if HISTORY.search(text) or TIMING.search(text):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {text.strip()[:120]}")
    assert not hits, "history or timing figures in code comments / docstrings (measurements belong in " \
        "docs/results.md):\n" + "\n".join(hits)


def test_benchmark_scripts_carry_no_dated_history() -> None:
    """The benchmarks describe what they measure; their dated figures live in docs/results.md."""
    hits = [f"{path.relative_to(ROOT)}:{n}: {text.strip()[:120]}"
            for path in sorted((ROOT / "benchmarks").glob("*.py")) for n, text in _code_texts(path)
            if HISTORY.search(text)]
    assert not hits, "dated history in the benchmarks' comments / docstrings:\n" + "\n".join(hits)


def test_results_entries_say_how_to_reproduce_them() -> None:
    """Every result in docs/results.md names its command and when, where and at which commit it was measured."""
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    entries = re.split(r"^### ", text, flags=re.M)[1:]
    assert entries, "docs/results.md has no ### entries"
    missing = [e.splitlines()[0] for e in entries
               if not (re.search(r"^Command", e, re.M) and re.search(r"^Measured: .*" + DATE + r".*commit [0-9a-f]{7}",
                                                                      e, re.M))]
    assert not missing, "results without a 'Command' line or a 'Measured: <date>, <machine>, commit <hash>' " \
        "line:\n" + "\n".join(missing)


def test_patterns_catch_history() -> None:
    """The checks above can fail: each pattern catches the kind of line it is for, and passes reference prose."""
    for line in ("Until 2026-12-06 the inputs were not reproducible", "the default since issue 21's change",
                 "(issue #16)", "see #16", "formerly the FitOptions docstring", "the former default",
                 "(2026-12-05, fourth session)", "measured 2026-12-04"):
        assert HISTORY.search(line), line
    for line in ("forward 1.9x faster", "114 -> 68 us per world-step", "0.36 s -> 0.074 s", "1.44 -> 0.78 s"):
        assert TIMING.search(line), line
    for line in ("EPOCH_NS = 1  # 2026-01-01T00:00:00Z, fixed", "color: #222;", "a 0.1 s step, 16 iterations",
                 "see [Install](#install)", "the former is exact, the latter fast", "a Ray session"):
        assert not HISTORY.search(line) and not TIMING.search(line), line
