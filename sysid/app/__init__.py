"""The application layer: configuration (`config`), the fit pipeline as named phases (`pipeline`, over
`runs`, `fitting`, `document` and `fit_outputs`), the typed results document it produces (`results`),
the ``evaluate`` and ``sweep-dt`` commands (`evaluate`, `sweep`), cross-validation (`cv`), findings and
the HTML reports (`report`, `cv_report`, `plan_report`). The command line over it is `sysid.cli`.

The names below are the layer's public API for scripts and notebooks (``from sysid.app import
FitConfig``): a fit config and what it builds (the robot, the simulator, the parameters, the
kinematic baseline), the whole fit (``run_fit``) and the progress bar of a fit's evaluations. They
are imported on first use, so ``import sysid.app`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.lazy import lazy_getattr

if TYPE_CHECKING:
    from sysid.app.config import FitConfig, build_baseline_parameters, build_parameters
    from sysid.app.fitting import baseline_simulator, make_simulator
    from sysid.app.pipeline import run_fit
    from sysid.app.progress import EvaluationBar
    from sysid.app.report import render_report

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("FitConfig", "build_baseline_parameters", "build_parameters"), "config"),
    **dict.fromkeys(("baseline_simulator", "make_simulator"), "fitting"),
    "run_fit": "pipeline",
    "EvaluationBar": "progress",
    "render_report": "report",
}

__all__ = ["EvaluationBar", "FitConfig", "baseline_simulator", "build_baseline_parameters", "build_parameters",
           "make_simulator", "render_report", "run_fit"]


__getattr__ = lazy_getattr("sysid.app", _EXPORTS)
