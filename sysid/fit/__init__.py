"""Identification: fit a simulator's physical parameters to robot logs.

Modules, in the order the work flows:

- ``params``: parameters with bounds and priors (``ParameterSet``) and the identified-parameter file;
- ``residuals``: runs prepared for simulation (``RunSet``) and the residual vector with its Jacobian
  (``Residuals``), per-run nuisance parameters (``NUISANCE_SPECS``);
- ``options``: every tolerance and budget of a fit (``FitOptions``);
- ``optimizer``: the entry point ``optimize`` and its ``FitResult`` (covariance, intervals, warnings);
  the optimisers it drives: ``lm`` (bounded Gauss-Newton / Levenberg-Marquardt), ``multistart``
  (batched start points, refinement fits), ``adam`` (torch, imported only when it runs);
  ``uncertainty`` (sandwich covariance, autocorrelation times), ``trace`` (the iterate log);
- ``calibration``: the command-scale calibration on a flat segment;
- ``evaluation`` and ``sweep``: metrics of given parameters on runs, the timestep sweep;
- ``metrics``: the paper's trajectory errors; ``fanout``: independent work as Ray tasks.

Depends on ``sysid.simulators`` (and on ``ingest`` for the ``Run`` type), never on the application layer (``sysid.app``,
``sysid.cli``). The names below are imported on first use, so ``import sysid.fit`` stays light (no
scipy, no torch); no module is named like a function it exports (``optimizer`` holds ``optimize``), as
an imported submodule would otherwise shadow the lazily exported function of its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.lazy import lazy_getattr

if TYPE_CHECKING:
    from sysid.fit.calibration import Calibration, calibrate
    from sysid.fit.evaluation import evaluate, simulate
    from sysid.fit.fanout import Fanout, FanoutError
    from sysid.fit.metrics import LEVER_ARM, run_metrics
    from sysid.fit.multistart import start_batches, start_points
    from sysid.fit.optimizer import FitResult, optimize
    from sysid.fit.options import FitOptions
    from sysid.fit.params import Parameter, ParameterSet, Prior, default_parameters, load_params, save_params, unit_of
    from sysid.fit.residuals import NUISANCE_SPECS, NuisanceSpec, Residuals, RunSet, Window, align_start
    from sysid.fit.sweep import Sweep, find_plateau, sweep_dt
    from sysid.fit.uncertainty import autocorrelation_time, covariance

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Calibration", "calibrate"), "calibration"),
    **dict.fromkeys(("autocorrelation_time", "covariance"), "uncertainty"),
    **dict.fromkeys(("evaluate", "simulate"), "evaluation"),
    **dict.fromkeys(("Fanout", "FanoutError"), "fanout"),
    **dict.fromkeys(("LEVER_ARM", "run_metrics"), "metrics"),
    **dict.fromkeys(("start_batches", "start_points"), "multistart"),
    **dict.fromkeys(("FitResult", "optimize"), "optimizer"),
    "FitOptions": "options",
    **dict.fromkeys(("Parameter", "ParameterSet", "Prior", "default_parameters", "load_params", "save_params",
                     "unit_of"), "params"),
    **dict.fromkeys(("NUISANCE_SPECS", "NuisanceSpec", "Residuals", "RunSet", "Window", "align_start"), "residuals"),
    **dict.fromkeys(("Sweep", "find_plateau", "sweep_dt"), "sweep"),
}

__all__ = [
    "Calibration", "Fanout", "FanoutError", "FitOptions", "FitResult", "LEVER_ARM", "NUISANCE_SPECS", "NuisanceSpec",
    "Parameter", "ParameterSet", "Prior", "Residuals", "RunSet", "Sweep", "Window", "align_start",
    "autocorrelation_time", "calibrate", "covariance", "default_parameters", "evaluate", "find_plateau",
    "load_params", "optimize", "run_metrics", "save_params", "simulate", "start_batches", "start_points", "sweep_dt",
    "unit_of",
]


__getattr__ = lazy_getattr("sysid.fit", _EXPORTS)
