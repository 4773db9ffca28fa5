"""The optimisation trace: one entry per accepted iterate (loss, wall time [s] since the fit
started, the free parameters' values; LM: ``evaluations``, the residual evaluations the fit had
spent when it accepted the iterate, as its summary counts them), numbered in order and tagged with
its start point in a multi-start fit; ``Progress`` callbacks see every entry as it is appended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from sysid.fit.options import FitOptions
from sysid.fit.residuals import Residuals

Progress = Callable[[dict[str, Any]], None]


class Record(Protocol):
    """Records an iterate: its normalised parameters z, residuals r and (LM) the residual
    evaluations its run had spent when it was accepted."""

    def __call__(self, z: np.ndarray, r: np.ndarray, evaluations: int | None = None) -> None: ...


def trace_entry(res: Residuals, z: np.ndarray, r: np.ndarray, t: float) -> dict[str, Any]:
    """The entry of the iterate ``z`` with residuals ``r``, reached ``t`` [s] after the start."""
    return {"loss": res.loss(r), "time": t,
            "theta": {n: float(v) for n, v in zip(res.names, res.theta_free(z), strict=True)}}


def append_entry(trace: list[dict[str, Any]], entry: dict[str, Any], start: int, options: FitOptions,
                 progress: Progress | None) -> None:
    """Number ``entry``, tag it with its start point when there are several, append and report it."""
    entry = {"iter": len(trace), **entry}
    if options.starts > 1:
        entry["start"] = start
    trace.append(entry)
    if progress is not None:
        progress(entry)
