"""The fit's progress bars count what its summary counts: residual evaluations ("after 7
evaluations"), ending at n/n, 100 %, for the command-scale calibration and the fit alike; the trace
entries carry the evaluations spent when each iterate was accepted."""

from __future__ import annotations

import io
import re
from pathlib import Path

from sysid.app import EvaluationBar, FitConfig, build_parameters
from sysid.app.fitting import calibrate_and_fit
from sysid.fit import optimize
from tests.helpers.fit_doubles import make_double, make_runs

ROOT = Path(__file__).resolve().parents[2]


def _states(text: str, desc: str) -> list[str]:
    """Every state a bar drew (tqdm redraws in place with a carriage return)."""
    return [s.strip() for s in re.split(r"[\r\n]", text) if s.strip().startswith(desc)]


def _count(state: str) -> tuple[int, int]:
    n, total = re.search(r"(\d+)/(\d+) ", state).groups()
    return int(n), int(total)


def test_bars_end_at_the_evaluations_the_summary_counts(capsys):
    cfg = FitConfig.from_mapping({"robot": str(ROOT / "models/helhest/robot.yaml"), "fit": {"max_iter": 30}})
    robot = cfg.load_robot()
    sim = make_double(robot)
    runs = make_runs(("turn", "accel"), duration=5.0, truth_dt=0.05, noise=0.01, prefix="train")
    params = build_parameters(cfg, robot, sim.parameter_names)
    fit, cal = calibrate_and_fit(cfg, sim, runs, params, 0.05, optimizer="lm", max_iter=30, progress=True)
    err = capsys.readouterr().err
    assert cal is not None and 0 < fit.iterations < 30
    for desc, spent in (("calibrate cmd_scale", None), ("fit (lm)", fit.iterations)):
        states = _states(err, desc)
        assert states, err[-500:]
        counts = [_count(s) for s in states]
        assert [n for n, _t in counts] == sorted(n for n, _t in counts), states  # counts up
        last = states[-1]
        n, total = counts[-1]
        assert "100%" in last and n == total, f"{desc} bar ends at {last!r}"
        if spent is not None:
            assert n == spent, f"the bar counts {n}, the summary says {spent} evaluations"
        assert all(t == 30 for _n, t in counts[:-1])  # against the budget while it runs


def test_trace_entries_carry_the_evaluations_spent():
    sim = make_double()
    runs = make_runs(("turn", "accel"), duration=5.0, truth_dt=0.05, noise=0.01)
    cfg = FitConfig.from_mapping({"robot": str(ROOT / "models/helhest/robot.yaml")})
    params = build_parameters(cfg, cfg.load_robot(), sim.parameter_names)
    params.freeze(["cmd_scale"])
    out = io.StringIO()
    bar = EvaluationBar("fit", 25, file=out, mininterval=0)
    fit = optimize(sim, runs, params, 0.05, max_iter=25, progress=bar)
    bar.done(fit)
    spent = [e["evaluations"] for e in fit.trace if "evaluations" in e]
    assert spent and spent == sorted(spent) and 0 < spent[-1] <= fit.iterations
    assert "evaluations" not in fit.trace[0]  # the start point, before LM spent any
    assert f"{fit.iterations}/{fit.iterations}" in _states(out.getvalue(), "fit")[-1]
