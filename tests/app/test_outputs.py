"""`sysid fit`'s outputs (issue 20, point 1): every output location — the parameter file, the results
JSON and the report, the defaults included — is checked before any computation, and the three files
are committed together (all written to temporaries, then renamed; a failure or Ctrl-C between the
renames puts back what was renamed), so a run leaves the whole set or none of it, and says which.

Each row: exit status, the one line printed, and the files left (none of the set, or the earlier set
byte for byte).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import yaml

import sysid.app.evaluate as evaluate
import sysid.app.outputs as outputs
import sysid.app.pipeline as pipeline
import sysid.app.sweep as sweep
from sysid.cli import main
from tests.helpers.fit_doubles import write_noisy_runs

ROOT = Path(__file__).resolve().parents[2]
ROBOT = ROOT / "models" / "helhest" / "robot.yaml"
UNWRITABLE = "/proc/sysid-test/out"  # nothing can be created there, even by root


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_noisy_runs(tmp_path_factory.mktemp("outputs-data"), 4.0)


@pytest.fixture
def ws(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(ws: Path, data: Path, output: dict | None = None) -> Path:
    cfg = {
        "robot": str(ROBOT),
        "simulator": "kinematic",
        "data": {"train": [str(data / "train-*.npz")], "held_out": [str(data / "held-0-slalom.npz")]},
        "fit": {"dt": 0.05, "max_iter": 6},
        "sweep": {"enabled": False},
    }
    if output is not None:
        cfg["output"] = output
    path = ws / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fit(cfg: Path, *extra: str) -> int:
    return main(["fit", "-q", "-c", str(cfg), *extra])


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {"fit.yaml"}


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any loading of runs counts as work: the checks must stop before it."""
    def refuse(*_a, **_k):
        raise AssertionError("runs were loaded before the output paths were checked")

    for command in (pipeline, evaluate, sweep):  # every command that loads runs
        monkeypatch.setattr(command, "load_runs", refuse)


# ---------------------------------------------------------------------------------------------
# checked before any computation


def test_report_whose_parent_is_a_file(ws, data, capsys, monkeypatch):
    (ws / "afile").write_text("x")
    cfg = _config(ws, data, {"params": str(ws / "out" / "p.yaml"), "report": str(ws / "afile" / "r.html")})
    _no_work(monkeypatch)
    assert _fit(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the report "), err
    assert "is a file, not a folder" in err[0] and "nothing was computed or written" in err[0]
    assert _files(ws) == {"afile"} and not (ws / "out").exists()


def test_default_report_folder_is_a_file(ws, data, capsys, monkeypatch):
    """No output on the command line or in the config: the default reports/fit-<robot>-<date>.html
    and the default parameter file are checked too."""
    (ws / "reports").write_text("a file where the default report folder would be")
    cfg = _config(ws, data)
    _no_work(monkeypatch)
    assert _fit(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the report (default) "), err
    assert "'reports' is a file, not a folder" in err[0]
    assert _files(ws) == {"reports"} and not (ws / "models").exists()


def test_unwritable_report_in_config(ws, data, capsys, monkeypatch):
    cfg = _config(ws, data, {"params": str(ws / "out" / "p.yaml"), "report": UNWRITABLE + "/r.html",
                             "results": str(ws / "out" / "r.json")})
    _no_work(monkeypatch)
    assert _fit(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: the report '{UNWRITABLE}/r.html': cannot write"), err
    assert _files(ws) == set() and not (ws / "out").exists()


def test_unwritable_report_on_the_command_line(ws, data, capsys, monkeypatch):
    cfg = _config(ws, data)
    _no_work(monkeypatch)
    assert _fit(cfg, "--params-out", str(ws / "p.yaml"), "--report", UNWRITABLE + "/r.html") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write in" in err[0] and UNWRITABLE in err[0], err
    assert _files(ws) == set()


def test_report_and_results_the_same_file(ws, data, capsys, monkeypatch):
    cfg = _config(ws, data)
    _no_work(monkeypatch)
    assert _fit(cfg, "--params-out", str(ws / "p.yaml"), "--report", str(ws / "fit.json")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are the same file" in err[0] and "the results file" in err[0], err
    assert _files(ws) == set()


# ---------------------------------------------------------------------------------------------
# committed together


def _outputs(ws: Path) -> dict:
    return {"params": str(ws / "out" / "sub" / "p.yaml"), "report": str(ws / "out" / "sub" / "r.html"),
            "results": str(ws / "out" / "r.json")}


def _fail_at(monkeypatch: pytest.MonkeyPatch, k: int, exc: BaseException) -> list[Path]:
    """Make the k-th rename into place (1-based) raise ``exc``; returns the targets renamed."""
    calls: list[Path] = []
    real = outputs._rename_into_place

    def rename(tmp: Path, target: Path) -> None:
        if len(calls) + 1 == k:
            raise exc
        real(tmp, target)
        calls.append(target)

    monkeypatch.setattr(outputs, "_rename_into_place", rename)
    return calls


@pytest.mark.parametrize("k", [2, 3])
def test_failure_between_renames_leaves_no_output(ws, data, capsys, monkeypatch, k):
    cfg = _config(ws, data, _outputs(ws))
    renamed = _fail_at(monkeypatch, k, OSError(errno.ENOSPC, "No space left on device"))
    assert _fit(cfg) == 2
    assert len(renamed) == k - 1  # the failure came after k - 1 files were in place
    err = capsys.readouterr().err.strip().splitlines()
    what = {2: "results", 3: "report"}[k]
    assert err[-1].startswith(f"error: could not write the {what} (No space left on device); nothing was written"), err
    assert not any(ln.startswith("wrote") for ln in capsys.readouterr().out.splitlines())
    assert _files(ws) == set()  # no output, no temporary, no backup
    assert not (ws / "out").exists()  # and no folder made for them


def test_interrupt_between_renames_leaves_no_output(ws, data, capsys, monkeypatch):
    cfg = _config(ws, data, _outputs(ws))
    _fail_at(monkeypatch, 2, KeyboardInterrupt())
    assert _fit(cfg) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interrupted: no output was written"), err
    assert _files(ws) == set() and not (ws / "out").exists()


def test_failure_between_renames_keeps_the_earlier_set(ws, data, capsys, monkeypatch):
    """A second fit onto the same paths fails half-way: the first fit's three files stay, byte for byte."""
    cfg = _config(ws, data, _outputs(ws))
    assert _fit(cfg) == 0
    out = capsys.readouterr().out
    before = {name: (ws / name).read_bytes() for name in _files(ws)}
    assert set(before) == {"out/sub/p.yaml", "out/sub/r.html", "out/r.json"}, before
    assert "wrote" in out
    _fail_at(monkeypatch, 3, OSError(errno.EIO, "Input/output error"))
    assert _fit(cfg, "--max-iter", "3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "could not write the report (Input/output error); nothing was written" in err[-1], err
    after = {name: (ws / name).read_bytes() for name in _files(ws)}
    assert after == before


def test_success_writes_the_whole_set_with_the_usual_permissions(ws, data, capsys):
    cfg = _config(ws, data, _outputs(ws))
    assert _fit(cfg) == 0
    assert _files(ws) == {"out/sub/p.yaml", "out/sub/r.html", "out/r.json"}
    for name in _files(ws):
        assert (ws / name).stat().st_mode & 0o044 == 0o044  # readable like any file the user writes
    assert yaml.safe_load((ws / "out/sub/p.yaml").read_text())["metadata"]["results"] == str(ws / "out" / "r.json")
