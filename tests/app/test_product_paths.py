"""One rule for relative paths (issue 20, point 4; README "Paths", docs/fit.md "Config"):

- a path given on the command line is taken from the current folder (inputs and outputs alike);
- in a config file, an input path (robot, data.train / held_out / manifest / topics) is taken from
  the config file's folder, so a config and its runs move together;
- an output path in a config (output.params / report / results) and every default output
  (models/<robot>/params-<date>.yaml, reports/fit-<robot>-<date>.html) go to the current folder, so
  the same config run from two folders writes two sets of results and never into the config's folder.

The test runs a config kept in one folder from another and checks where each file was read and
written (a kinematic fit of a second).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sysid.cli import main
from tests.helpers.fit_doubles import noisy_runs


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the config's folder, the current folder): runs beside the config, another run in the cwd."""
    cfg_dir, cwd = tmp_path / "project" / "configs", tmp_path / "work"
    (cfg_dir / "runs").mkdir(parents=True)
    (cwd / "mine").mkdir(parents=True)
    train, held = noisy_runs(4.0)
    for r in train:
        r.save(cfg_dir / "runs" / f"{r.name}.npz")
    held.save(cwd / "mine" / "held.npz")
    (cfg_dir / "fit.yaml").write_text(yaml.safe_dump({
        "robot": "helhest",  # a bundled name: found from the config's folder up, else the package
        "simulator": "kinematic",
        "data": {"train": ["runs/train-*.npz"]},  # relative to this file
        "fit": {"dt": 0.05, "max_iter": 3, "calibration": False, "baseline": False},
        "sweep": {"enabled": False},
        "output": {"report": "out/report.html"},  # relative to the current folder
    }))
    monkeypatch.chdir(cwd)
    return cfg_dir, cwd


def test_config_inputs_from_its_folder_outputs_and_flags_from_the_current_folder(layout, capsys) -> None:
    cfg_dir, cwd = layout
    before = _files(cfg_dir.parent)
    assert main(["fit", "-q", "-c", str(cfg_dir / "fit.yaml"), "--held-out", "mine/held.npz"]) == 0
    out = capsys.readouterr().out
    assert _files(cfg_dir.parent) == before  # nothing written beside the config
    written = _files(cwd) - {"mine/held.npz"}
    params = [f for f in written if f.startswith("models/helhest/params-")]
    assert written == {"out/report.html", "out/report.json", *params} and len(params) == 1, written
    assert f"wrote {params[0]}\nwrote out/report.html" in out
    doc = json.loads((cwd / "out" / "report.json").read_text())
    # the training runs exist only beside the config, the held-out run only under the current folder
    assert {(r["name"], r["split"]) for r in doc["runs"]} == {("train-0-turn", "train"), ("train-1-accel", "train"),
                                                             ("held-0-slalom", "held_out")}


def test_output_flags_are_relative_to_the_current_folder(layout) -> None:
    cfg_dir, cwd = layout
    assert main(["fit", "-q", "-c", str(cfg_dir / "fit.yaml"), "-o", "run1", "--report-out", "elsewhere/r.html"]) == 0
    assert {"run1/params.yaml", "run1/report.json", "elsewhere/r.html"} <= _files(cwd)
    assert not (cwd / "run1" / "report.html").exists()  # --report-out wins for its file


def test_a_missing_config_input_names_where_it_was_looked_for(layout, capsys) -> None:
    cfg_dir, _cwd = layout
    cfg = yaml.safe_load((cfg_dir / "fit.yaml").read_text())
    cfg["data"]["train"] = ["../runs/missing.npz"]
    (cfg_dir / "moved.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["fit", "-q", "-c", str(cfg_dir / "moved.yaml")]) == 2
    err = capsys.readouterr().err
    # resolved against the config's folder, named once and without '..'
    assert f"'../runs/missing.npz' does not exist (resolved to {cfg_dir.parent / 'runs' / 'missing.npz'})" in err, err
    assert "/../" not in err
