"""The command line answers at once and stops cleanly.

- ``--help`` of every command and subcommand, and argument errors, load none of the heavy packages
  (Warp, newton, torch, Ray, open3d, MuJoCo, matplotlib, pandas, scipy): a command imports what
  its work needs inside its ``run``. Checked in a fresh interpreter through the entry points
  (``sysid.cli.main``, ``sysid.cli.ingest_program.main``); which modules are loaded is
  deterministic, so no timing is asserted.
- Ctrl-C at any moment, including while a command's modules are still being imported, prints the
  one ``interrupted`` line and exits 130, with no traceback and nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("warp", "newton", "torch", "ray", "open3d", "mujoco", "matplotlib", "pandas", "scipy")

# argv -> the exit status it must give: every --help (0) and argument errors caught by the parser (2)
SYSID_ARGV: list[tuple[list[str], int]] = [
    ([], 2),
    (["--help"], 0),
    (["--version"], 0),
    *(([cmd, "--help"], 0) for cmd in ("fit", "evaluate", "sweep-dt", "report", "cv", "plan", "robot", "ingest",
                                        "synth")),
    (["robot", "check", "--help"], 0),
    (["ingest", "inspect", "--help"], 0),
    (["ingest", "load", "--help"], 0),
    (["nosuch"], 2),
    (["fit", "--max-iter", "0"], 2),
    (["fit", "--dt", "-1"], 2),
    (["fit", "--no-such-flag"], 2),
    (["evaluate"], 2),  # -p/--params is required
    (["sweep-dt", "--dts", "0,x"], 2),
    (["report"], 2),
    (["cv"], 2),
    (["cv", "-c", "f.yaml", "--folds", "1"], 2),
    (["plan", "-p", "p.yaml"], 2),  # --goal is required
    (["plan", "-p", "p.yaml", "--goal", "1,2"], 2),
    (["plan", "-p", "p.yaml", "--goal", "1,2,0", "--scene", "moon"], 2),
    (["robot"], 2),
    (["robot", "check"], 2),
    (["ingest", "load", "x.bag", "--dt", "0"], 2),
    (["synth", "--format", "zip"], 2),
    (["synth", "--seed", "-1"], 2),
]
INGEST_ARGV: list[tuple[list[str], int]] = [
    ([], 2),
    (["--help"], 0),
    (["inspect", "--help"], 0),
    (["load", "--help"], 0),
    (["inspect"], 2),
    (["load", "x.bag", "--resample", "cubic"], 2),
]

PROBE = """
import contextlib, io, json, sys
import sysid.cli
import sysid.cli.ingest_program

def status(main, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    lines = err.getvalue().strip().splitlines()
    return [code or 0, lines]

cases = json.loads(sys.argv[1])
got = [status(sysid.cli.main if prog == "sysid" else sysid.cli.ingest_program.main, argv) for prog, argv in cases]
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"got": got, "heavy": heavy}))
"""


def test_help_and_argument_errors_load_no_heavy_package() -> None:
    cases = [("sysid", argv) for argv, _ in SYSID_ARGV] + [("ingest", argv) for argv, _ in INGEST_ARGV]
    want = [code for _, code in SYSID_ARGV] + [code for _, code in INGEST_ARGV]
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases), json.dumps(HEAVY)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["heavy"] == [], f"--help / argument errors imported {doc['heavy']}"
    for (prog, argv), code, (got, lines) in zip(cases, want, doc["got"], strict=True):
        assert got == code, f"{prog} {' '.join(argv)}: exit {got}, expected {code}: {lines}"
        if code == 2:  # an argument error is one line
            assert len(lines) == 1 and lines[0].startswith("error: "), (prog, argv, lines)


def test_choices_in_the_parser_agree_with_the_library() -> None:
    """The parser's copies of the library's choices (kept light to build): the same values."""
    from sysid.app import plan as app_plan
    from sysid.app.choices import SCENES
    from sysid.synth import cli as synth_cli
    from sysid.synth.generate import FORMATS

    assert app_plan.SCENES == SCENES
    assert set(synth_cli.FORMATS) == set(FORMATS)


def _sysid_script() -> str:
    found = shutil.which("sysid", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("the sysid console script is not installed beside this interpreter")
    return found


def _assert_interrupted(proc: subprocess.Popen[str], out_dir: Path) -> None:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted"), err
    assert not out_dir.exists() or not any(out_dir.iterdir()), list(out_dir.iterdir())


@pytest.mark.parametrize("delay", [0.2, 1.0, 2.5])
def test_ctrl_c_while_the_command_imports_is_one_line(tmp_path: Path, delay: float) -> None:
    """SIGINT once the entry point's module is imported (``ready``), ``delay`` later: in the
    parser, or while `sysid fit` imports the engine, newton and Warp (seconds of CPU)."""
    out_dir = tmp_path / "out"
    code = ("import sys, sysid.cli; print('ready', flush=True); "
            f"sys.exit(sysid.cli.main(['fit', '--config', {str(ROOT / 'examples' / 'fit.yaml')!r}, "
            f"'-o', {str(out_dir)!r}, '-q']))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _assert_interrupted(proc, out_dir)


# What a console script does (``from <module> import main; sys.exit(main())``), with SIGINT delivered
# as the import system starts on ``at`` (a module the entry point loads before its boundary is in place).
ENTRY = r"""
import json, os, signal, sys

module, at, argv = json.loads(sys.argv[1])


class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == at:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, InterruptAt())
main = __import__(module, fromlist=["main"]).main
sys.exit(main(argv))
"""


@pytest.mark.parametrize(("module", "at"), [("sysid.cli", "ingest.clikit"), ("sysid.cli", "sysid.cli.common"),
                                            ("sysid.cli.ingest_program", "ingest.clikit")])
def test_ctrl_c_while_the_entry_point_loads_is_one_line(tmp_path: Path, module: str, at: str) -> None:
    """Ctrl-C in the first tenths of a second of ``sysid`` or ``ingest``, while the console script
    imports the entry point and the command line's boundary: one line, exit 130, no traceback."""
    out_dir = tmp_path / "out"
    argv = (["fit", "--config", str(ROOT / "examples" / "fit.yaml"), "-o", str(out_dir), "-q"]
            if module == "sysid.cli" else ["load", str(ROOT / "datasets" / "pallet-sample" / "run_10"), "-q",
                                           "-o", str(out_dir / "run.npz")])
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, json.dumps([module, at, argv])], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _assert_interrupted(proc, out_dir)


def test_ctrl_c_shortly_after_start_of_the_sysid_program(tmp_path: Path) -> None:
    """The installed ``sysid`` program, Ctrl-C two seconds after it starts (its imports take longer)."""
    out_dir = tmp_path / "out"
    proc = subprocess.Popen([_sysid_script(), "fit", "--config", str(ROOT / "examples" / "fit.yaml"),
                             "-o", str(out_dir), "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _assert_interrupted(proc, out_dir)


def test_plan_prints_no_warp_cuda_warning(tmp_path: Path) -> None:
    """`sysid plan` initialises Warp as the other commands do: on a machine without a CUDA driver
    no `Warp CUDA warning` line (and no banner) reaches stderr."""
    res = subprocess.run([sys.executable, "-m", "sysid.cli", "plan", "-p",
                          str(ROOT / "models" / "helhest" / "params-pallet-sample.yaml"), "--goal", "1,0,0",
                          "--iterations", "1", "--duration", "1", "-o", str(tmp_path / "plan"), "-q"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
