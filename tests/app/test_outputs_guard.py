"""Outputs never overwrite inputs, are probed with real bytes, are locked against a second command
and put right what a killed run left (`sysid.app.outputs`, ``ingest.clikit.input_clash``).

Each refusal: exit status 2, one ``error:`` line naming the output and the input, stopped before
any work (loading runs, planning) and every input byte for byte as before.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

import ingest.clikit as clikit
import sysid.app.evaluate as evaluate
import sysid.app.pipeline as pipeline
import sysid.app.sweep as sweep
from sysid.cli import main
from sysid.cli.ingest_program import main as ingest_main
from sysid.fit.params import Parameter, ParameterSet, save_params
from tests.helpers.fit_doubles import write_noisy_runs

ROOT = Path(__file__).resolve().parents[2]
ROBOT = ROOT / "models" / "helhest" / "robot.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_noisy_runs(tmp_path_factory.mktemp("guard-data"), 4.0)


@pytest.fixture
def ws(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder (the cwd) with a copy of the runs in runs/ and a kinematic fit config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for p in data.iterdir():
        (tmp_path / "runs" / p.name).write_bytes(p.read_bytes())
    cfg = {"robot": str(ROBOT), "simulator": "kinematic",
           "data": {"train": ["runs/train-*.npz"], "held_out": ["runs/held-0-slalom.npz"]},
           "fit": {"dt": 0.05, "max_iter": 6}, "sweep": {"enabled": False}}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(cfg))
    save_params(tmp_path / "P.yaml", ParameterSet([Parameter("kp", 250.0, 10.0, 1000.0)]), robot="helhest")
    return tmp_path


def _inputs(ws: Path) -> dict[str, bytes]:
    return {str(p.relative_to(ws)): p.read_bytes() for p in sorted(ws.rglob("*")) if p.is_file() and not p.is_symlink()}


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("work began before the outputs were checked")

    for command in (pipeline, evaluate, sweep):  # every command that loads runs
        monkeypatch.setattr(command, "load_runs", refuse)
    monkeypatch.setattr("sysid.app.plan.plan", refuse)


def _refused(capsys: pytest.CaptureFixture[str], status: int, *names: str) -> str:
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for name in names:
        assert name in err[0], (name, err[0])
    assert "would overwrite" in err[0] and "nothing was" in err[0], err[0]
    return err[0]


# ---------------------------------------------------------------------------------------------
# an output that names an input


def test_fit_results_out_is_a_training_run(ws, capsys, monkeypatch):
    before = _inputs(ws)
    _no_work(monkeypatch)
    status = main(["fit", "-q", "-c", "fit.yaml", "--train", "runs/train-0-turn.npz", "--results-out",
                   "runs/train-0-turn.npz", "-o", "out"])
    line = _refused(capsys, status, "the results file 'runs/train-0-turn.npz'", "the training run", "--results-out")
    assert "train-0-turn.npz" in line.split("training run", 1)[1]
    assert _inputs(ws) == before and not (ws / "out").exists()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        pytest.param(["fit", "-q", "-c", "fit.yaml", "--params-out", "runs/../fit.yaml", "-o", "out"],
                     ["the parameter file 'runs/../fit.yaml' is the same file as the config 'fit.yaml'"],
                     id="fit-params-out-is-the-config"),
        pytest.param(["evaluate", "-q", "-c", "fit.yaml", "-p", "P.yaml", "-o", "P.yaml"],
                     ["-o/--output 'P.yaml' is also the parameter file 'P.yaml'"],
                     id="evaluate-output-is-the-parameter-file"),
        pytest.param(["sweep-dt", "-q", "-c", "fit.yaml", "--dts", "0.05", "-o", "./runs/held-0-slalom.npz"],
                     ["-o/--output './runs/held-0-slalom.npz'", "the held-out run"],
                     id="sweep-dt-output-is-a-held-out-run"),
    ],
)
def test_an_output_that_is_an_input(ws, capsys, monkeypatch, args: list[str], names: list[str]):
    before = _inputs(ws)
    _no_work(monkeypatch)
    status = main(args)
    _refused(capsys, status, *names)
    assert _inputs(ws) == before and not (ws / "out").exists()


def test_an_output_that_is_a_symlink_to_an_input(ws, capsys, monkeypatch):
    (ws / "link.json").symlink_to(ws / "runs" / "held-0-slalom.npz")
    before = _inputs(ws)
    _no_work(monkeypatch)
    status = main(["fit", "-q", "-c", "fit.yaml", "--results-out", "link.json", "-o", "out"])
    _refused(capsys, status, "the results file 'link.json' is the same file as the held-out run")
    assert _inputs(ws) == before and (ws / "link.json").is_symlink()


def test_an_input_given_through_a_symlinked_folder(ws, capsys, monkeypatch):
    """The run is read as alias/train-1-accel.npz; the report would be written to its real path."""
    (ws / "alias").symlink_to(ws / "runs")
    before = _inputs(ws)
    _no_work(monkeypatch)
    status = main(["fit", "-q", "-c", "fit.yaml", "--train", "alias/train-1-accel.npz", "--report-out",
                   str(ws / "runs" / "train-1-accel.npz"), "-o", "out"])
    _refused(capsys, status, "the report", "the training run", "--report-out")
    assert _inputs(ws) == before


def test_plan_output_folder_holding_the_parameter_file(ws, capsys, monkeypatch):
    (ws / "plans").mkdir()
    save_params(ws / "plans" / "plan.yaml", ParameterSet([Parameter("kp", 250.0, 10.0, 1000.0)]), robot="helhest")
    before = _inputs(ws)
    _no_work(monkeypatch)
    status = main(["plan", "--params", "plans/plan.yaml", "--goal", "1,0,0", "-o", "plans", "-q"])
    _refused(capsys, status, "the plan output 'plans/plan.yaml' is also the parameter file 'plans/plan.yaml'")
    assert _inputs(ws) == before


def test_report_output_is_its_results_file(ws, capsys):
    """-o naming the results file, and the default output (the results with .html) when the results
    file already ends in .html."""
    for name in ("R.json", "R.html"):
        (ws / name).write_text('{"results": "kept"}\n')
    before = _inputs(ws)
    status = main(["report", "R.json", "-o", "./R.json"])
    _refused(capsys, status, "-o/--output 'R.json' is also the results file 'R.json'", "give the report another path")
    status = main(["report", "R.html"])
    _refused(capsys, status, "the report 'R.html' is also the results file 'R.html'")
    assert _inputs(ws) == before


def test_cv_output_folder_holding_a_link_to_a_training_run(ws, capsys, monkeypatch):
    """cv.json in the -o folder is a symlink to a training run: writing it would replace the run."""
    (ws / "cv").mkdir()
    (ws / "cv" / "cv.json").symlink_to(ws / "runs" / "train-0-turn.npz")
    before = _inputs(ws)
    monkeypatch.setattr("sysid.app.cv.cross_validate", lambda *_a, **_k: pytest.fail("cv began its work"))
    status = main(["cv", "-q", "-c", "fit.yaml", "--folds", "2", "-o", "cv"])
    _refused(capsys, status, "-o/--output", "cv.json", "is the same file as the training run", "train-0-turn.npz")
    assert _inputs(ws) == before and (ws / "cv" / "cv.json").is_symlink()


def test_ingest_load_output_is_its_input(ws, capsys):
    before = _inputs(ws)
    status = ingest_main(["load", "runs/held-0-slalom.npz", "-q", "-o", "runs/./held-0-slalom.npz"])
    _refused(capsys, status, "-o/--output 'runs/./held-0-slalom.npz' is the same file as the input")
    assert _inputs(ws) == before


def test_hard_links_and_paths_name_one_file(tmp_path):
    a = tmp_path / "a.json"
    a.write_text("{}")
    os.link(a, tmp_path / "b.json")
    assert clikit.same_file(tmp_path / "b.json", a)
    assert clikit.same_file(tmp_path / "sub" / ".." / "a.json", a)  # a missing folder on the way: paths compared
    assert not clikit.same_file(tmp_path / "c.json", a)
    assert "is the same file as the run" in clikit.input_clash([("out", tmp_path / "b.json")], [("the run", a)])


def test_a_nul_character_in_an_output_is_a_one_line_error(ws, capsys):
    """An output name holding a NUL byte (the OS refuses it) is refused before any work, and comparing it with
    the inputs does not raise (pathlib's resolve raises ValueError on it)."""
    assert "contains a NUL character" in clikit.output_problem("out\x00.json", "-o/--output")
    assert not clikit.same_file("out\x00.json", ws / "fit.yaml")
    assert clikit.input_clash([("-o", "out\x00.json")], [("the config", ws / "fit.yaml")]) is None
    code = main(["evaluate", "-c", str(ws / "fit.yaml"), "-p", str(ws / "missing.yaml"), "--runs", str(ws / "x.npz"),
                 "-o", "out\x00.json"])
    err = capsys.readouterr().err
    assert code == 2 and "contains a NUL character" in err and "internal error" not in err, err


# ---------------------------------------------------------------------------------------------
# a full disk, found before any work


def test_a_full_disk_is_found_before_any_work(ws, capsys, monkeypatch):
    """Creating an empty file succeeds on a full disk; writing to it does not (as on a full tmpfs)."""
    real = tempfile.NamedTemporaryFile

    class Full:
        def __init__(self, *a: object, **k: object) -> None:
            self.fh = real(*a, **k)  # type: ignore[call-overload]

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            if data:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return 0

        def flush(self) -> None:
            pass

    monkeypatch.setattr(clikit.tempfile, "NamedTemporaryFile", Full)
    _no_work(monkeypatch)
    status = main(["fit", "-q", "-c", "fit.yaml", "-o", "out"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write in" in err[0] and "No space left on device" in err[0], err
    assert not (ws / "out").exists()


# ---------------------------------------------------------------------------------------------
# two fits into one folder; the leftovers of a killed one


def test_a_second_fit_into_a_locked_folder_stops_before_any_work(ws, capsys, monkeypatch):
    """Another process holds out/.sysid-lock (as a fit writing into out/ does, from its start to its end)."""
    lock = ws / "out" / ".sysid-lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, os, time\nos.makedirs({str(lock.parent)!r})\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, str(os.getpid()).encode())\nprint('held', flush=True)\ntime.sleep(60)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        _no_work(monkeypatch)
        assert main(["fit", "-q", "-c", "fit.yaml", "-o", "out"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: another sysid command (process {holder.pid}) is "
                                                   f"writing into {str(ws / 'out')!r}"), err
    finally:
        holder.kill()
        holder.wait()


def test_a_fit_puts_right_what_a_killed_commit_left(ws, capsys):
    """A commit into out/ killed (SIGKILL) between its renames leaves a mixed set, the journal,
    backups and temporaries; the next fit into out/ restores the earlier set before its work (a
    warning says so), then writes its own: out/ holds exactly its three files."""
    from tests.app.test_commit_signals import HARNESS  # a commit that kills itself at a given step
    out = ws / "out"
    out.mkdir()
    earlier = {"params.yaml": b"earlier params\n", "report.json": b"{}\n", "report.html": b"<p>earlier</p>\n"}
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    targets = [("parameter file", str(out / "params.yaml")), ("results", str(out / "report.json")),
               ("report", str(out / "report.html"))]
    new = {what: f"killed {what}\n" for what, _t in targets}
    log = ws / "step.log"
    arg = json.dumps([targets, new, "SIGKILL", 9, str(log)])  # step 9: rename the results into place
    proc = subprocess.run([sys.executable, "-c", HARNESS, arg], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -9 and log.read_text() == "rename the results into place", proc.stderr
    (out / ".report.html.sysid-0badcafe.tmp").write_text("half")  # an abandoned single-file write
    left = sorted(p.name for p in out.iterdir())
    assert (out / "params.yaml").read_bytes() == b"killed parameter file\n"  # the mix a killed commit leaves
    assert any(n.endswith(".bak") for n in left) and any(n.endswith(".json") and n.startswith(".") for n in left)
    assert main(["fit", "-q", "-c", "fit.yaml", "-o", "out"]) == 0
    err = capsys.readouterr().err
    assert "warning: an earlier run was stopped while it wrote" in err and "the earlier set is back in place" in err
    assert sorted(p.name for p in out.iterdir()) == ["params.yaml", "report.html", "report.json"]
    assert json.loads((out / "report.json").read_text())["outputs"]["params"] == "out/params.yaml"


def test_a_fit_removes_the_leftovers_of_a_run_killed_without_a_journal(ws, capsys):
    """The temporaries a run killed by SIGTERM left before journals existed (``.part``, ``.bak``, named
    by ``tempfile.mkstemp``) and an abandoned ``.tmp`` are removed by the next fit into the folder."""
    out = ws / "out"
    out.mkdir()
    stale = [".params.yaml.k2j4h5g6.part", ".report.json.x8_4ab2c.bak", ".report.html.sysid-1a2b3c4d.tmp"]
    for name in stale:
        (out / name).write_text("left by a killed run")
    assert main(["fit", "-q", "-c", "fit.yaml", "-o", "out"]) == 0
    assert "removed 3 temporary file(s) that a stopped earlier run left" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["params.yaml", "report.html", "report.json"]
