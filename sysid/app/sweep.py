"""``sysid sweep-dt``: the error of a parameter file (or the nominal values) over a grid of timesteps
(`run_sweep`), fanned out over Ray workers when the config asks for them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from sysid.app.config import FitConfig, check_steps, validate_static
from sysid.app.findings import terminal_text as odometry_terminal_text
from sysid.app.fit_outputs import check_inputs_kept, input_files
from sysid.app.fitting import accepted_parameters, fanout_of
from sysid.app.runs import load_runs, load_warnings, score_windows, screen_odometry
from sysid.app.warm import warm_kernels
from sysid.errors import ConfigError
from sysid.fit.fanout import check_workers, cluster
from sysid.fit.params import load_params
from sysid.fit.sweep import Sweep, sweep_dt


def run_sweep(cfg: FitConfig, params_file: str | Path | None, progress: bool = True,
              outputs: Sequence[tuple[str, str | Path]] = ()) -> Sweep:
    """The error over ``cfg.sweep.dts`` at a parameter file's values (else the nominals); ``outputs``
    as `run_evaluate`'s."""
    given = [("the parameter file", Path(params_file))] if params_file is not None else []
    check_inputs_kept(outputs, [*given, *input_files(cfg)], "-o/--output")
    robot = cfg.load_robot()
    sim, accepted = accepted_parameters(cfg, robot)
    base, train_src, held_src = validate_static(cfg, accepted, robot, need_train=False)
    theta = base.values()
    if params_file is not None:
        ps, _ = load_params(params_file, accepted=accepted)
        theta.update({k: v for k, v in ps.values().items() if k in accepted})
    sources = held_src or train_src
    if not sources:
        raise ConfigError("no runs for the sweep: give --runs, data.held_out or a manifest")
    if not cfg.sweep.dts:
        raise ConfigError("no timesteps to sweep: give --dts")
    runs, _dropped, findings = screen_odometry(cfg, load_runs(cfg, sources, "runs", progress), "swept")
    check_steps(runs, [("--dts", min(cfg.sweep.dts))])
    for w in load_warnings(runs):
        tqdm.write(f"warning: {w}", file=sys.stderr)
    if findings:
        tqdm.write(odometry_terminal_text(findings), file=sys.stderr)
    check_workers(cfg.fit.workers, cfg.fit.ray_address, "the timesteps")
    with cluster(cfg.fit.workers, cfg.fit.ray_address) as started:
        if started:  # a local cluster shares this machine's kernel cache: compile once, here
            warm_kernels(cfg, robot)
        with tqdm(total=len(cfg.sweep.dts), desc="sweep dt", unit="dt", disable=not progress, leave=False) as bar:

            def step(_h: float) -> None:
                bar.update(1)

            return sweep_dt(sim, runs, theta, cfg.sweep.dts, lever_arm=cfg.fit.lever_arm,
                            windows=score_windows(cfg, runs), progress=step, fanout=fanout_of(cfg, robot))
