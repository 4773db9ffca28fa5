"""Every example printed by every ``--help`` runs as written.

The examples are read from the help texts as printed (``sysid --help``, every ``sysid <command>
--help`` and their subcommands', ``ingest --help`` and its subcommands'), a line starting with
``sysid`` or ``ingest`` under an ``example`` heading, joined over a trailing backslash. Each runs
through ``bash`` in a scratch copy of the project's folder (``examples/``, ``datasets/`` and
``models/`` copied, 12 MB; ``../shared`` a link to the shared data, which no example writes), with
``HOME`` in the scratch folder, and must exit 0 with no traceback, no ``error:`` line and no Warp
CUDA warning on stderr.

The quick examples run by default; the others (fits, cross-validation, sweeps, planning, dataset
generation) are marked slow. An example that reads what another example writes gets it first: by
running that example (``PRODUCERS``), or, for the quick ``sysid report`` examples when the fit has
not run, from a small kinematic fit on synthetic runs (`tests.helpers.report_fixtures`) written
where the fit would write its results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
BIN = Path(sys.executable).parent

# The examples of the default run (a few seconds of CPU each: no fit, no engine rollout; `sysid ingest X`
# is the program `ingest X`, run here once); every other example is marked slow.
QUICK = {
    "sysid robot check husky",
    "sysid synth --list",
    "sysid report reports/pallet-sample/report.json -o report.html",
    "sysid ingest inspect datasets/pallet-sample/run_10",
    "ingest inspect datasets/pallet-sample/run_10/run_10.mcap --json",
    "ingest inspect ../shared/data/bags/robot_localization_test1_husky.bag -q",
    "ingest inspect datasets/pallet-sample/run_10 -c examples/fit.yaml",
    "ingest load datasets/pallet-sample/run_10 --topics datasets/pallet-sample/topics.yaml --dt 0.02",
    "ingest load ../shared/data/helhest-real/left_circle.json --cache ~/.cache/ingest",
}
# file an example reads -> the example (without its comment) that writes it
PRODUCERS = {
    "reports/helhest-real/params.yaml": "sysid fit --config examples/helhest-real.yaml",
    "reports/pallet-sample/report.json": "sysid fit --config examples/fit.yaml",
}


def _parsers() -> list[argparse.ArgumentParser]:
    from sysid.cli import build_parser as sysid_parser
    from sysid.cli.ingest_program import build_parser as ingest_parser

    out: list[argparse.ArgumentParser] = []

    def walk(p: argparse.ArgumentParser) -> None:
        out.append(p)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)

    walk(sysid_parser(with_synth=True))
    walk(ingest_parser())
    return out


def examples_of(help_text: str) -> list[str]:
    """The example command lines of a help text (continuation lines joined)."""
    out: list[str] = []
    in_examples = False
    pending = ""
    for line in help_text.splitlines():
        text = line.strip()
        if text.lower().startswith("example"):
            in_examples = True
            continue
        if not text:
            in_examples = False
            continue
        if pending:
            pending += " " + text
        elif in_examples and text.split(" ", 1)[0] in ("sysid", "ingest"):
            pending = text
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        else:
            out.append(pending)
            pending = ""
    return out


def command_of(example: str) -> str:
    """The example without its trailing ``# comment``, spaces collapsed."""
    return " ".join(example.split(" # ", 1)[0].split())


def all_examples() -> list[str]:
    """Every example once (the same command with another comment is the same example)."""
    seen: dict[str, str] = {}
    for p in _parsers():
        for ex in examples_of(p.format_help()):
            seen.setdefault(command_of(ex), " ".join(ex.split()))
    return list(seen.values())


EXAMPLES = all_examples()


def _is_quick(example: str) -> bool:
    return command_of(example) in QUICK


def test_examples_are_found() -> None:
    """Every command and subcommand shows examples, and the extraction finds them."""
    assert len(EXAMPLES) >= 30, EXAMPLES
    for start in ("sysid fit ", "sysid evaluate ", "sysid sweep-dt ", "sysid report ", "sysid cv ", "sysid plan ",
                  "sysid synth ", "sysid robot check ", "sysid ingest inspect ", "sysid ingest load ",
                  "ingest inspect ", "ingest load "):
        assert any(e.startswith(start) for e in EXAMPLES), start
    assert {command_of(e) for e in EXAMPLES} >= QUICK


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's folder for the examples (what they read, copied: an example that
    regenerates the sample must not write through a link into the checkout)."""
    top = tmp_path_factory.mktemp("examples")
    work = top / "work" / "main"
    for name in ("examples", "datasets", "models"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "params-20*.yaml"))
    if SHARED.is_dir():
        (top / "work" / "shared").symlink_to(SHARED)
    (top / "home").mkdir()
    return work


def _env(scratch: Path) -> dict[str, str]:
    home = Path.home()
    env = dict(os.environ)
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(scratch.parents[1] / "home"))
    # Warp's kernel cache and matplotlib's font cache stay where they are (no recompiling)
    env.setdefault("XDG_CACHE_HOME", str(home / ".cache"))
    env.setdefault("XDG_CONFIG_HOME", str(home / ".config"))
    env.pop("SYSID_WARP_VERBOSE", None)
    return env


def run_example(example: str, scratch: Path, timeout: float) -> None:
    res = subprocess.run(["bash", "-c", example], cwd=scratch, env=_env(scratch), capture_output=True, text=True,
                         timeout=timeout)
    err = res.stderr
    assert res.returncode == 0, f"`{example}` exited {res.returncode}:\n{err[-3000:]}"
    assert "Traceback" not in err, f"`{example}`:\n{err[-3000:]}"
    assert "\nerror:" not in "\n" + err, f"`{example}`:\n{err[-3000:]}"
    assert "Warp CUDA warning" not in err + res.stdout, f"`{example}` printed Warp's CUDA warning"


def _needs(example: str, scratch: Path) -> None:
    """Write what ``example`` reads from another example first."""
    for path, producer in PRODUCERS.items():
        if path not in example or (scratch / path).exists():
            continue
        if _is_quick(example) and path == "reports/pallet-sample/report.json":
            from tests.helpers.report_fixtures import fit_with_pieces

            work = scratch.parents[1] / "report-fixture"
            work.mkdir(exist_ok=True)
            fit_with_pieces(work)
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "out" / "report.json", scratch / path)
            continue
        producer_line = next(e for e in EXAMPLES if command_of(e) == producer)
        run_example(producer_line, scratch, timeout=3600)


@pytest.mark.parametrize("example", [pytest.param(e, marks=() if _is_quick(e) else pytest.mark.slow,
                                                  id=command_of(e)) for e in EXAMPLES])
def test_help_example_runs_as_written(example: str, scratch: Path) -> None:
    if "../shared/" in example and not SHARED.is_dir():
        pytest.skip("../shared (the shared data) is absent")
    _needs(example, scratch)
    run_example(example, scratch, timeout=300 if _is_quick(example) else 3600)
