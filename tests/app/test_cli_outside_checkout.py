"""`sysid fit` from any folder (issue 20, point 4): the bundled robots are found from the installed
package, and the dated default parameter file never silently replaces an earlier one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sysid.app.config import FitConfig, bundled_model_roots
from sysid.cli import main
from sysid.cli.common import unused_path

RUN = Path(__file__).resolve().parents[3] / "shared" / "data" / "helhest-real" / "right_turn_a.json"


def test_bundled_robot_is_found_from_an_unrelated_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = FitConfig(base_dir=tmp_path)  # robot: helhest, no models/ anywhere above tmp_path
    assert bundled_model_roots()
    assert cfg.robot_path() == bundled_model_roots()[0] / "models" / "helhest" / "robot.yaml"
    assert cfg.load_robot()["wheels"]["radius"] > 0


def test_unknown_robot_lists_the_bundled_ones(tmp_path: Path) -> None:
    from sysid.errors import ConfigError

    with pytest.raises(ConfigError, match=r"among the bundled robots \[.*'helhest'.*\]"):
        FitConfig(base_dir=tmp_path, robot="nosuchbot").robot_path()


def test_unused_path_suffixes_and_force(tmp_path: Path) -> None:
    p = tmp_path / "params-2026-01-01.yaml"
    assert unused_path(p) == p
    p.write_text("a")
    assert unused_path(p).name == "params-2026-01-01-2.yaml"
    (tmp_path / "params-2026-01-01-2.yaml").write_text("b")
    assert unused_path(p).name == "params-2026-01-01-3.yaml"
    assert unused_path(p, force=True) == p


@pytest.mark.skipif(not RUN.exists(), reason="../shared/data/helhest-real missing")
def test_fit_in_an_empty_folder_twice_keeps_both_parameter_files(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "--train", str(RUN), "--simulator", "kinematic", "--no-sweep", "--no-baseline",
            "--no-calibration", "--max-iter", "2", "-q"]
    assert main(argv) == 0
    assert main(argv) == 0
    names = sorted(p.name for p in (tmp_path / "models" / "helhest").glob("params-*.yaml"))
    second = [n for n in names if n.endswith("-2.yaml")]
    assert len(names) == 2 and len(second) == 1, names
    assert f"wrote models/helhest/{second[0]}" in capsys.readouterr().out
    assert main([*argv, "--force"]) == 0  # --force replaces today's file: still two
    assert len(list((tmp_path / "models" / "helhest").glob("params-*.yaml"))) == 2
