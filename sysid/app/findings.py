"""What the screened runs' odometry does that no simulator models, as one table.

``sysid.app.runs.screen_odometry`` finds two kinds of problem in the runs it loads: a **lag** (the
odometry's speed trails the wheels by more than ``LAG_WARN`` while its heading does not; once per
whole run, however many pieces it is cut into) and **jumps** (the odometry position stepping faster
than ``data.odometry_jumps.max_accel`` allows; per piece, since a piece with jumps can be dropped).
Each is a *finding*, a plain mapping kept in the results (``odometry_findings``)::

    {"split": "train", "run": "right_turn_a", "piece": None, "kind": "lag", "action": "scored",
     "speed_lag_s": 0.83, "heading_lag_s": 0.06, "text": "<the finding in one sentence>"}
    {"split": "held_out", "run": "09_57_51", "piece": "09_57_51[0.0-11.5 s]", "kind": "jumps",
     "action": "scored" | "dropped", "times_s": [10.25, ...], "max_step_m": 0.29, "max_accel": 115.0,
     "text": "..."}

The command line prints them as one table (``table_lines``) under one warning line (``summary``),
and the report shows the same columns (``cells``) in one HTML table, instead of a warning per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("run", "split", "kind", "time", "size", "action")


def cells(f: Mapping[str, Any], every_time: bool = False) -> tuple[str, str, str, str, str, str]:
    """The finding's row: (run or piece, split, kind, time, size, action). A piece's jumps are timed
    by their first and last (``every_time``: all of them), in seconds from the run's start."""
    name = str(f.get("piece") or f["run"])
    split = str(f["split"]).replace("_", "-")
    if f["kind"] == "lag":
        time = "whole run"
        size = f"speed {_num(f['speed_lag_s'], '.2f')} s, heading {_num(f['heading_lag_s'], '.2f')} s late"
    else:
        times = [float(t) for t in f.get("times_s") or [] if t is not None]
        if every_time or len(times) < 3:
            time = ", ".join(f"{t:.2f}" for t in times) + " s"
        else:
            time = f"{times[0]:.2f} .. {times[-1]:.2f} s"
        size = (f"{len(times)} jump{'s' if len(times) != 1 else ''} <= {_num(f['max_step_m'], '.2f')} m "
                f"({_num(f['max_accel'], '.0f')} m/s^2)")
    return name, split, str(f["kind"]), time, size, str(f.get("action", "scored"))


def _num(v: Any, spec: str) -> str:
    """A finding's figure; ``n/a`` where it is missing or not finite (odometry that runs off to 1e300)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def summary(findings: Sequence[Mapping[str, Any]]) -> str:
    """One line: how many runs lag and how many runs or pieces jump, and what is done about it."""
    lags = [f for f in findings if f["kind"] == "lag"]
    jumps = [f for f in findings if f["kind"] == "jumps"]
    dropped = [f for f in jumps if f.get("action") == "dropped"]
    noun = "piece" if any(f.get("piece") for f in jumps) else "run"
    modelled = bool(lags) and all(f.get("action") == "modelled" for f in lags)  # odom_delay fitted
    parts = []
    if lags:
        parts.append(f"lag in {_n(len(lags), 'run')}" + (" (modelled: odom_delay)" if modelled else ""))
    if jumps:
        parts.append(f"jumps in {_n(len(jumps), noun)}" + (f" ({len(dropped)} left out)" if dropped else ""))
    what = "jumps " if modelled else ""
    if len(dropped) < len(jumps):
        todo = f"{what}not modelled, scored as logged (--odometry-jumps drop leaves out {noun}s with jumps)"
    elif jumps:
        todo = f"{what}not modelled; the {noun}s with jumps are left out (--odometry-jumps drop)"
    elif modelled:
        return f"odometry {', '.join(parts)}"
    else:
        todo = "not modelled, scored as logged (fit odom_delay to model the lag)"
    return f"odometry {', '.join(parts)}; {todo}"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'s' if k != 1 else ''}"


def table_lines(findings: Sequence[Mapping[str, Any]], indent: str = "  ") -> list[str]:
    """The findings as a plain-text table: a header and one line per finding, columns aligned."""
    rows = [COLUMNS] + [cells(f) for f in findings]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
            for r in rows]


def terminal_text(findings: Sequence[Mapping[str, Any]]) -> str:
    """``warning: <summary>`` and the table below it (empty when there is nothing to say)."""
    if not findings:
        return ""
    return "\n".join([f"warning: {summary(findings)}:", *table_lines(findings)])
