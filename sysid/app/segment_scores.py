"""Where along a run a replay's error is: per run entry, the mean xy distance and the combined error [m]
of each compared replay (the identified model, its starting values, the kinematic baseline) over the
run's ``cruise`` and ``climb`` segments, ``after`` the climb (from its end to the run's end) and over
the ``whole run`` (results ``runs[i].segment_scores``, the report's "Error per segment" table).

A fit computes them from the replays it already made, at the odometry's full rate
(`sysid.app.document.run_entries`), so the whole run's figures are the accuracy table's when the fit
scores whole runs; the report computes them from the document's (downsampled) series for a results
file written without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ingest.transforms import euler_to_quat as yaw_quat
from sysid.app import page
from sysid.app.page import esc, fmt
from sysid.app.results import REFERENCE_COLUMNS, Compared, RunEntry, WindowScores
from sysid.fit.metrics import LEVER_ARM, combined_error, mean_xy_distance
from sysid.fit.residuals import align_start

WINDOWS = ("cruise", "climb", "after", "whole run")  # the table's columns, in order
SCORES = ("mean_xy", "combined")
# the run entry's series of each compared replay
SeriesKey = Literal["sim_identified", "sim_initial", "sim_baseline"]
REPLAYS: tuple[tuple[Compared, SeriesKey], ...] = (("model", "sim_identified"), ("start", "sim_initial"),
                                                   ("baseline", "sim_baseline"))

Series = Mapping[str, Any]  # x, y, z [m] and yaw [rad] as arrays or lists (None: not finite) at the run's times


def window_bounds(t: np.ndarray, segments: Mapping[str, Sequence[float]]) -> dict[str, tuple[float, float]]:
    """The windows a run has [s, on its clock]: its cruise and climb segments, after the climb (the climb's
    end to the last sample; none when the run ends with the climb) and the whole run."""
    out: dict[str, tuple[float, float]] = {}
    for name in ("cruise", "climb"):
        if name in segments:
            a, b = segments[name]
            out[name] = (float(a), float(b))
    if "climb" in out and t.size and t[-1] > out["climb"][1]:
        out["after"] = (out["climb"][1], float(t[-1]))
    if t.size:
        out["whole run"] = (float(t[0]), float(t[-1]))
    return out


def _array(values: Any) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _scores(meas: np.ndarray, sim: np.ndarray, lever_arm: float) -> dict[str, float]:
    """Mean xy distance and combined error [m] of the pose rows ``sim`` against ``meas``, as the accuracy
    table scores a run (`sysid.fit.metrics`); infinite where either is not finite (the replay diverged)."""
    if not (np.all(np.isfinite(sim)) and np.all(np.isfinite(meas))):
        return {"mean_xy": float("inf"), "combined": float("inf")}
    with np.errstate(over="ignore"):  # a replay far off (1e300 m) scores inf, as in run_metrics
        return {"mean_xy": mean_xy_distance(sim, meas), "combined": combined_error(sim, meas, lever_arm)}


def _window_scores(meas: np.ndarray, replays: Mapping[Compared, np.ndarray],
                   segments: Mapping[str, Sequence[float]] | None, lever_arm: float) -> dict[str, WindowScores]:
    """`segment_scores` of pose arrays (rows t, x, y, z, qx, qy, qz, qw) at the same times."""
    tt = meas[:, 0]
    out: dict[str, WindowScores] = {}
    for name, (a, b) in window_bounds(tt, segments or {}).items():
        mask = (tt > a) if name == "after" else (tt >= a) & (tt <= b)
        if not mask.any():
            continue
        w: WindowScores = {"t": [a, b], "samples": int(mask.sum())}
        for who, sim in replays.items():
            w[who] = _scores(meas[mask], sim[mask], lever_arm)
        out[name] = w
    return out


def _poses(t: np.ndarray, series: Series) -> np.ndarray:
    """A series (x, y, z [m], yaw [rad]) as pose rows at the times ``t`` (a yaw-only orientation)."""
    x, y, z, yaw = (_array(series[k]) for k in ("x", "y", "z", "yaw"))
    return np.column_stack([t, x, y, z, yaw_quat(yaw)])


def segment_scores(t: Any, measured: Series, replays: Mapping[Compared, Series],
                   segments: Mapping[str, Sequence[float]] | None, lever_arm: float = LEVER_ARM
                   ) -> dict[str, WindowScores]:
    """Per window the run has (`window_bounds`; a cruise or climb segment holding no sample is left
    out), its bounds [s], sample count and each replay's mean xy distance and combined error [m].
    ``measured`` and ``replays`` are series at the times ``t`` [s], each replay translated onto the
    odometry's first position as it is scored; a window's samples are those with t0 <= t <= t1 (after
    the climb: later than its end)."""
    tt = _array(t)
    return _window_scores(_poses(tt, measured), {who: _poses(tt, s) for who, s in replays.items()}, segments,
                          lever_arm)


def pose_segment_scores(meas: np.ndarray, poses: Mapping[Compared, np.ndarray],
                        segments: Mapping[str, Sequence[float]] | None, lever_arm: float = LEVER_ARM
                        ) -> dict[str, WindowScores]:
    """`segment_scores` of full-rate pose arrays: the odometry ``meas`` and the replays ``poses``
    (each as long as ``meas``, translated here onto its first position as they are scored)."""
    m = np.asarray(meas, float)
    return _window_scores(m, {who: align_start(np.asarray(p, float), m[0, 1:4]) for who, p in poses.items()},
                          segments, lever_arm)


def entry_segment_scores(entry: RunEntry, lever_arm: float = LEVER_ARM) -> dict[str, WindowScores]:
    """A run entry's ``segment_scores``, or, for one written without them, those of its series
    (downsampled, each replay already translated onto the odometry's start)."""
    if "segment_scores" in entry:
        return entry["segment_scores"]
    replays = {who: s for who, key in REPLAYS if (s := entry.get(key))}
    return segment_scores(entry["t"], entry["measured"], replays, entry.get("segments"), lever_arm)


def segment_table(runs: Sequence[RunEntry], lever_arm: float = LEVER_ARM, item: str = "run") -> str:
    """The report's error-per-segment table: a row per run (``item``: per piece with ``data.split``;
    held-out first) and compared replay, a column pair (mean xy distance, combined error [m]) per
    window; "–" where the run has no such window, "n/a" where the replay diverged in it."""
    order = sorted(runs, key=lambda r: r["split"] != "held_out")  # stable: the document's order within a split
    rows = []
    for r in order:
        scores = entry_segment_scores(r, lever_arm)
        present = [who for who, key in REPLAYS if r.get(key)]
        split = "held-out" if r["split"] == "held_out" else "training"
        for i, who in enumerate(present):
            head = (f"<td class='l' rowspan='{len(present)}'>{esc(r['name'])}</td>"
                    f"<td class='l' rowspan='{len(present)}'>{split}</td>") if i == 0 else ""
            cells = []
            for w in WINDOWS:
                m = (scores.get(w) or {}).get(who)
                for k in SCORES:
                    v = "–" if m is None else fmt(m.get(k), ".3f")
                    cells.append(f"<td>{'<b>' + v + '</b>' if who == 'model' and k == 'mean_xy' else v}</td>")
            rows.append(f"<tr data-run='{esc(r['name'])}' data-replay='{who}'>{head}"
                        f"<td class='l'>{REFERENCE_COLUMNS[who]}</td>{''.join(cells)}</tr>")
    top = "".join(f"<th colspan='2'>{f'whole {item}' if w == 'whole run' else w}</th>" for w in WINDOWS)
    sub = "<th>mean xy [m]</th><th>combined [m]</th>" * len(WINDOWS)
    return page.scroll(
        f"<table data-table='segments'><tr><th class='l' rowspan='2'>{item}</th><th class='l' rowspan='2'>split</th>"
        f"<th class='l' rowspan='2'>replay</th>{top}</tr><tr>{sub}</tr>{''.join(rows)}</table>")


def segment_section(runs: Sequence[RunEntry], lever_arm: float = LEVER_ARM, item: str = "run") -> str:
    """The report's "Error per segment" section: one sentence and `segment_table`; empty without runs."""
    if not runs:
        return ""
    return (f"<h3>Error per segment</h3><p class='muted'>Where along each {item} the error is: the mean xy distance "
            "and combined error of each replay over the cruise and climb segments ingest found, after the climb "
            f"(its end to the {item}'s end) and over the whole {item}; – : the {item} has no such segment.</p>"
            + segment_table(runs, lever_arm, item))
