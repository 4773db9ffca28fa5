"""A run in the fit's report: its figure (the top-down path with the pallet's footprint, z and yaw over
time: the odometry, the model at its initial and identified parameters, the kinematic baseline; the
cruise and climb segments shaded, odometry jumps marked) and the missed-climb check (a replay that does
not climb the pallet its odometry climbs is flagged in the run's heading and among the warnings).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from matplotlib.patches import Polygon

from sysid.app.page import COLORS, esc, fmt, plt, svg
from sysid.app.results import RunEntry


def pallet_polygon(p: Mapping[str, Any]) -> Polygon:
    import numpy as np

    half_l, half_w = p["size"][0] / 2, p["size"][1] / 2
    c, s = math.cos(p["yaw"]), math.sin(p["yaw"])
    corners = np.array([[-half_l, -half_w], [half_l, -half_w], [half_l, half_w], [-half_l, half_w]])
    rot = corners @ np.array([[c, s], [-s, c]]) + [p["x"], p["y"]]
    return Polygon(
        rot,
        closed=True,
        facecolor=COLORS["pallet"],
        alpha=0.25,
        edgecolor=COLORS["pallet"],
        label="pallet footprint",
    )


def _nan(values: Sequence[float | None]) -> list[float]:
    """A results series for plotting: None (a non-finite value in the JSON) back to NaN."""
    return [v if v is not None else float("nan") for v in values]


SEGMENT_BANDS = {"cruise": "#1f77b4", "climb": COLORS["pallet"]}  # segments shaded in the time panels
BAND_ALPHA = 0.08
MIN_Z_SPAN = 0.05  # [m] smallest height range of a z panel (5 cm)
CLIMB_MIN = 0.05  # [m] a run whose odometry rises more than this climbs (the pallet is 0.144 m)
CLIMB_SHARE = 0.5  # a replay rising less than this share of the odometry's rise did not climb


def climb_check(run: RunEntry) -> dict[str, float] | None:
    """How high the odometry and the replay at the identified parameters rise above their start [m]
    (``measured``, ``simulated``); None when the odometry does not climb or a series is missing. A run
    whose segments are listed climbs only where ingest found a climb (a lidar odometry's z drifts by
    centimetres on flat ground)."""
    import numpy as np

    if "segments" in run and "climb" not in (run["segments"] or {}):
        return None
    try:
        zm = np.asarray(_nan(run["measured"]["z"]), float)
        zs = np.asarray(_nan(run["sim_identified"]["z"]), float)
    except (KeyError, TypeError):
        return None
    if zm.size < 2 or zs.size < 2 or not np.isfinite(zm[0]) or not np.isfinite(zs[0]):
        return None
    rise_m, rise_s = float(np.nanmax(zm) - zm[0]), float(np.nanmax(zs) - zs[0])
    if not rise_m > CLIMB_MIN:
        return None
    return {"measured": rise_m, "simulated": rise_s, "climbs": bool(rise_s >= CLIMB_SHARE * rise_m)}


def climb_warnings(runs: Sequence[RunEntry]) -> list[str]:
    """One line per run whose odometry climbs (the pallet) while its replay does not."""
    out = []
    for r in runs:
        c = climb_check(r)
        if c and not c["climbs"]:
            what = "training run" if r.get("split") == "train" else "held-out run"
            out.append(f"{what} {r['name']} does not climb the pallet in the replay: the simulated base rises "
                       f"{c['simulated']:.3f} m at the identified parameters, the odometry {c['measured']:.3f} m "
                       f"(below {CLIMB_SHARE:.0%}); its error after the pallet measures the missed climb (check the "
                       "approach heading, the pallet pose and the wheel friction)")
    return out


# results key, legend label, line style, colour: the replays drawn beside the odometry
RUN_SERIES: tuple[tuple[Literal["measured", "sim_initial", "sim_baseline", "sim_identified"], str, str, str], ...] = (
    ("measured", "odometry (measured)", "-", "measured"),
    ("sim_initial", "model @ initial θ (the fit's start)", "--", "initial"),
    ("sim_baseline", "kinematic baseline (fitted on the same training runs)", "-.", "baseline"),
    ("sim_identified", "model @ identified θ", "-", "identified"),
)


def run_figure(run: RunEntry, idx: int) -> str:
    """A run's top-down path, z and yaw over time: the odometry, the model at its initial and its
    identified parameters, and the kinematic baseline where the results hold its replay; one legend
    under the panels."""
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = plt.figure(figsize=(11, 4.6))
    gs = fig.add_gridspec(2, 2, width_ratios=[1.1, 1.4])
    ax_xy = fig.add_subplot(gs[:, 0])
    ax_z = fig.add_subplot(gs[0, 1])
    ax_yaw = fig.add_subplot(gs[1, 1], sharex=ax_z)
    t = run["t"]
    handles: list[Any] = []  # the replays first, then what the panels mark
    for key, label, ls, color in RUN_SERIES:
        s = run.get(key)
        if not s:
            continue
        (line,) = ax_xy.plot(_nan(s["x"]), _nan(s["y"]), ls, color=COLORS[color], lw=1.4, label=label)
        ax_z.plot(t, _nan(s["z"]), ls, color=COLORS[color], lw=1.2)
        ax_yaw.plot(t, _nan(s["yaw"]), ls, color=COLORS[color], lw=1.2)
        handles.append(line)
    ax_xy.plot([run["measured"]["x"][0]], [run["measured"]["y"][0]], "o", color=COLORS["measured"], ms=4)
    if pallet := run.get("pallet"):
        handles.append(ax_xy.add_patch(pallet_polygon(pallet)))
    ax_xy.set_aspect("equal", adjustable="datalim")
    ax_xy.set_xlabel("x [m]")
    ax_xy.set_ylabel("y [m]")
    ax_xy.grid(True, alpha=0.3)
    ax_z.set_ylabel("z [m]")
    ax_z.grid(True, alpha=0.3)
    ax_z.tick_params(labelbottom=False)
    ax_yaw.set_ylabel("yaw [rad]")
    ax_yaw.set_xlabel("t [s]")
    ax_yaw.grid(True, alpha=0.3)
    named: set[str] = set()
    for name, (a, b) in (run.get("segments") or {}).items():
        if name in SEGMENT_BANDS:
            for ax in (ax_z, ax_yaw):
                ax.axvspan(a, b, color=SEGMENT_BANDS[name], alpha=BAND_ALPHA)
            if name not in named:
                named.add(name)
                handles.append(Patch(facecolor=SEGMENT_BANDS[name], alpha=3 * BAND_ALPHA, label=f"{name} segment"))
    jumps = (run.get("meta") or {}).get("odometry_jumps") or []
    if jumps:  # where the odometry is not motion: mark it on every panel
        tj = [j["t"] for j in jumps]
        m = run["measured"]
        (mark,) = ax_xy.plot(np.interp(tj, t, _nan(m["x"])), np.interp(tj, t, _nan(m["y"])), "x", color="#d62728",
                             ms=6, mew=1.5, label=f"odometry jumps ({len(jumps)})")
        handles.append(mark)
        for ax in (ax_z, ax_yaw):
            for tt in tj:
                ax.axvline(tt, color="#d62728", lw=0.8, ls=":")
        handles.append(Line2D([], [], color="#d62728", lw=0.8, ls=":", label="odometry jump (time panels)"))
    lo, hi = ax_z.get_ylim()  # flat ground: millimetres of noise are not drawn as a landscape
    if hi - lo < MIN_Z_SPAN:
        mid = 0.5 * (lo + hi)
        ax_z.set_ylim(mid - MIN_Z_SPAN / 2, mid + MIN_Z_SPAN / 2)
    m0, m1 = run["metrics_initial"], run["metrics_identified"]
    mb = run.get("metrics_baseline")
    fig.suptitle(
        f"{run['name']} ({run['split'].replace('_', '-')}): combined error {fmt(m0['combined'], '.3f')} → "
        f"{fmt(m1['combined'], '.3f')} m, mean xy {fmt(m1['mean_xy'], '.3f')} m"
        + (f" (kinematic baseline {fmt(mb.get('combined'), '.3f')} m)" if mb else ""),
        fontsize=10,
    )
    ncol = min(4, len(handles))
    rows = math.ceil(len(handles) / ncol)
    bottom = (0.15 + 0.19 * rows) / fig.get_figheight()  # room under the panels for the legend's rows
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False)
    return svg(fig, f"run{idx}")


def run_heading(r: RunEntry) -> str:
    """A run figure's heading, marked when the replay misses a climb the odometry makes."""
    c = climb_check(r)
    mark = ""
    if c and not c["climbs"]:
        mark = (f" <span class='bad' data-climb='missed'>does not climb the pallet (replay {c['simulated']:.3f} m, "
                f"odometry {c['measured']:.3f} m)</span>")
    return f"<h3>{esc(r['name'])}{mark}</h3>"
