"""Progress bars of the fit (tqdm, on stderr)."""

from __future__ import annotations

from typing import Any


class EvaluationBar:
    """A fit's progress in residual evaluations, what its summary counts ("after 7 evaluations";
    Adam: steps). Pass it as ``progress`` to `sysid.fit.optimize` or `sysid.fit.calibrate`: while the
    fit runs it counts against the budget ``max_iter`` (at most: LM usually stops well before); ``done``
    ends it at 100 % of the evaluations spent. A context manager (leaving it closes the bar)."""

    def __init__(self, desc: str, max_iter: int, *, enabled: bool = True, leave: bool = False, **tqdm_kw: Any):
        from tqdm import tqdm

        self.bar = tqdm(total=max_iter, desc=desc, unit="eval", disable=not enabled, leave=leave, **tqdm_kw)
        self.counted = False  # whether the entries carry their evaluations (LM) or are steps (Adam)

    def __call__(self, entry: dict[str, Any]) -> None:
        """The optimiser's progress callback: one trace entry (an accepted iterate)."""
        n = entry.get("evaluations")
        if n is not None:
            self.counted = True
        elif self.counted or entry.get("iter", 0) == 0:  # a start point or the final iterate: nothing new
            n = self.bar.n
        else:  # an Adam step
            n = self.bar.n + 1
        if self.bar.total is None or n > self.bar.total:
            self.bar.total = n
        self.bar.update(n - self.bar.n)
        if entry.get("loss") is not None:
            self.bar.set_postfix(loss=f"{entry['loss']:.4g}")

    def done(self, fit: Any) -> None:
        """Close the bar at the fit's count (``fit.iterations``): n/n, 100 %."""
        self.bar.total = self.bar.n = int(fit.iterations)
        self.bar.refresh()
        self.bar.close()

    def __enter__(self) -> EvaluationBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
