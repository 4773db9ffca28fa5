"""Blocked cross-validation (`sysid cv` with ``cv: {folds: blocks}`` or folds given as lists of runs):
contiguous blocks of the runs in name order (numbers as numbers), a gap of neighbours kept out of
training, at most so many runs per fold; fitted for real on tiny synthetic runs with the kinematic
simulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sysid.app.config import CVSection, FitConfig
from sysid.app.cv import cross_validate, fold_configs, fold_plan, format_table, natural_key, prepare, spread
from sysid.cli import main
from sysid.errors import ConfigError
from tests.helpers.fit_doubles import make_runs

ROOT = Path(__file__).resolve().parents[2]
STEPS = [f"step_{i}" for i in range(1, 13)]  # 12 runs; "step_10" sorts after "step_9"


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("steps")
    kinds = ("turn", "slalom", "accel", "random")
    for i, name in enumerate(STEPS):
        run = make_runs((kinds[i % 4],), duration=4.0, truth_dt=0.05, seed=i, prefix=name)[0]
        run.name = name
        run.save(folder / f"{name}.npz")
    return folder


def write_config(folder: Path, steps: Path, cv: dict) -> Path:
    cfg = {
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": "kinematic",
        "data": {"train": [str(steps / "step_*.npz")]},  # glob order: step_1, step_10, step_11, step_12, step_2, ...
        "fit": {"dt": 0.05, "max_iter": 4, "calibration": False},
        "sweep": {"enabled": False},
        "cv": cv,
    }
    path = folder / "fit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def names(idx: list[int], of: list[str]) -> list[str]:
    return [of[i] for i in idx]


def test_blocks_in_name_order_with_gap_and_limits() -> None:
    shuffled = sorted(STEPS)  # the config's (glob) order is not the steps' order
    assert shuffled[:3] == ["step_1", "step_10", "step_11"]
    cv = CVSection(blocks=3, gap=1)
    plan = fold_plan(shuffled, "blocks", cv)
    held = [names(h, shuffled) for h, _ in plan]
    assert held == [STEPS[0:4], STEPS[4:8], STEPS[8:12]]  # contiguous, disjoint, covering every run
    train = [names(t, shuffled) for _, t in plan]
    assert train[0] == STEPS[5:]  # step_5, the held-out block's neighbour, is the gap
    assert train[1] == STEPS[:3] + STEPS[9:]  # step_4 and step_9 left out on both sides
    assert train[2] == STEPS[:7]
    limited = fold_plan(shuffled, "blocks", CVSection(blocks=3, gap=1, train_per_fold=3, held_out_per_fold=2))
    assert [names(h, shuffled) for h, _ in limited] == [["step_1", "step_4"], ["step_5", "step_8"],
                                                         ["step_9", "step_12"]]
    assert [names(t, shuffled) for _, t in limited][1] == ["step_1", "step_3", "step_12"]  # first, middle, last
    assert spread([1, 2, 3, 4, 5], 1) == [3] and spread([1, 2], 5) == [1, 2]
    assert sorted(["a10", "a9", "a1"], key=natural_key) == ["a1", "a9", "a10"]


def test_given_folds_and_bad_folds() -> None:
    given = [["step_1", "step_2"], {"held_out": ["step_5"], "train": ["step_9", "step_10"]}]
    plan = fold_plan(STEPS, given)
    assert [names(h, STEPS) for h, _ in plan] == [["step_1", "step_2"], ["step_5"]]
    assert names(plan[0][1], STEPS) == STEPS[2:] and names(plan[1][1], STEPS) == ["step_9", "step_10"]
    for folds, match in (([["step_1"], ["step_1", "step_2"]], "again"),
                         ([["step_1"], ["step_99"]], "no run named"),
                         ([{"held_out": ["step_1"], "train": ["step_1"]}, ["step_2"]], "trains on runs it holds out"),
                         ([["step_1"]], "at least 2 folds")):
        with pytest.raises(ConfigError, match=match):
            fold_plan(STEPS, folds)
    with pytest.raises(ConfigError, match="cv.blocks must be between 2 and"):
        fold_plan(STEPS, "blocks", CVSection(blocks=13))
    with pytest.raises(ConfigError, match="no training run left after the gap"):
        fold_plan(STEPS[:4], "blocks", CVSection(blocks=2, gap=2))


def test_config_cv_section(tmp_path: Path, steps: Path) -> None:
    cfg = FitConfig.from_file(write_config(tmp_path, steps, {"folds": [["step_1"], {"held_out": ["step_2"],
                                                                                    "train": ["step_3"]}]}))
    base, sources, _robot = prepare(cfg)
    configs = fold_configs(base, sources, cfg.cv.folds)
    assert [[Path(p).stem for p in c.data.held_out] for c in configs] == [["step_1"], ["step_2"]]
    assert [Path(p).stem for p in configs[1].data.train] == ["step_3"]
    assert len(configs[0].data.train) == 11
    for bad, match in (({"folds": "blocks", "blocks": 0}, "cv.blocks must be > 0"), ({"gap": -1}, "cv.gap"),
                       ({"folds": "thirds"}, "folds must be"), ({"block": 3}, "unknown")):
        with pytest.raises(ConfigError, match=match):
            FitConfig.from_file(write_config(tmp_path, steps, bad))


def test_blocked_cv_fits_every_fold(tmp_path: Path, steps: Path) -> None:
    cv = {"folds": "blocks", "blocks": 3, "gap": 1, "train_per_fold": 3, "held_out_per_fold": 2}
    doc = cross_validate(FitConfig.from_file(write_config(tmp_path, steps, cv)), workers=1)
    assert doc["folds_spec"] == "blocks" and doc["fold_settings"] == {"blocks": 3, "gap": 1, "train_per_fold": 3,
                                                                      "held_out_per_fold": 2}
    s = doc["summary"]
    assert s["n_folds"] == 3 and s["n_ok"] == 3, s["failed"]
    blocks = [STEPS[0:4], STEPS[4:8], STEPS[8:12]]
    for f, block in zip(doc["folds"], blocks, strict=True):
        assert set(f["held_out_runs"]) <= set(block) and len(f["held_out_runs"]) == 2
        k = STEPS.index(block[0])
        near = set(block) | {STEPS[i] for i in (k - 1, k + len(block)) if 0 <= i < len(STEPS)}
        assert len(f["train_runs"]) == 3 and not set(f["train_runs"]) & near
        assert all(r["model"]["mean_xy"] is not None for r in f["held_out"]["runs"])
    assert sorted(r["run"] for r in s["runs"]) == sorted(["step_1", "step_4", "step_5", "step_8", "step_9", "step_12"])
    assert "3 blocks in name order, gap 1; at most 3 training runs per fold, at most 2 held-out runs per fold" \
        in format_table(doc)


def test_cli_block_flags(tmp_path: Path, steps: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, steps, {})
    with pytest.raises(SystemExit) as exc:
        main(["cv", "--config", str(cfg), "--folds", "blocks", "--blocks", "0", "-o", str(tmp_path / "out")])
    assert exc.value.code == 2 and "--blocks" in capsys.readouterr().err
    rc = main(["cv", "--config", str(cfg), "--folds", "blocks", "--blocks", "2", "--train-per-fold", "2",
               "--held-out-per-fold", "1", "--workers", "1", "-q", "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and "2 blocks in name order" in out and (tmp_path / "out" / "cv.json").is_file()
