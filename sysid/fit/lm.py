"""The bounded Gauss-Newton / Levenberg-Marquardt optimiser: scipy ``least_squares(method="trf")``
in normalised coordinates z in [0, 1] with the exact residual Jacobian, stopped by the tolerances of
``FitOptions`` within a budget of residual evaluations; and the words that say why it stopped."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.optimize  # type: ignore[import-untyped, unused-ignore]

from sysid.fit.options import FitOptions
from sysid.fit.residuals import Residuals
from sysid.fit.trace import Record

# scipy's status -> the criterion that ended the run
CRITERIA = {1: "gtol", 2: "ftol", 3: "xtol", 4: "ftol+xtol", 0: "budget", -1: "failed"}


def run_lm(res: Residuals, z_start: np.ndarray, options: FitOptions, max_iter: int, record: Record) -> dict[str, Any]:
    """One bounded LM run from ``z_start``: final z, scipy status, criterion, evaluation counts."""
    last_key: list[bytes] = []
    counts = {"f": 0, "j": 0}

    def fun(z: np.ndarray) -> np.ndarray:
        counts["f"] += 1
        r, _ = res.evaluate(z)
        return np.where(np.isfinite(r), r, 1e6)  # trf shrinks its radius on a huge residual

    def jac(z: np.ndarray) -> np.ndarray:
        counts["j"] += 1
        r, j = res.evaluate(z, jac=True)
        key = z.tobytes()
        if not last_key or last_key[-1] != key:  # jac is evaluated once per accepted iterate
            last_key.append(key)
            if len(last_key) > 1:
                record(z, r, counts["f"])
        assert j is not None
        return j

    sol = scipy.optimize.least_squares(
        fun,
        z_start,
        jac=jac,
        bounds=(np.zeros_like(z_start), np.ones_like(z_start)),
        method="trf",
        x_scale="jac",
        ftol=options.ftol,
        xtol=options.xtol,
        gtol=options.gtol,
        max_nfev=max_iter,
        verbose=0,
    )
    z = np.clip(sol.x, 0, 1)
    r, _ = res.evaluate(z)
    return {
        "z": z,
        "loss": res.loss(r),
        "status": int(sol.status),
        "criterion": CRITERIA.get(int(sol.status), str(sol.status)),
        "scipy_message": str(sol.message),
        "nfev": int(sol.nfev),
        "njev": int(sol.njev or counts["j"]),
    }


def lm_message(run: dict[str, Any], options: FitOptions, max_iter: int) -> str:
    """What ended the LM run ``run`` (of ``run_lm``), in words: the criterion met, or why none was."""
    crit = run["criterion"]
    if crit == "budget":
        return (
            f"not converged: the budget of max_iter={max_iter} residual evaluations ran out before a "
            f"criterion was met (ftol={options.ftol:g}, xtol={options.xtol:g}, gtol={options.gtol:g}); "
            "raise fit.max_iter"
        )
    if crit == "failed":
        return f"not converged: {run['scipy_message']}"
    why = {
        "ftol": f"the last accepted step lowered the loss by less than ftol={options.ftol:g} of it",
        "xtol": f"the step fell below xtol={options.xtol:g} (normalised coordinates)",
        "ftol+xtol": f"the last step lowered the loss by less than ftol={options.ftol:g} and fell below "
        f"xtol={options.xtol:g}",
        "gtol": f"the scaled gradient fell below gtol={options.gtol:g}",
    }[crit]
    return f"converged ({crit}): {why}, after {run['nfev']} evaluations"
