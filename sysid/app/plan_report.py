"""HTML page of a `sysid plan` result: trajectories, loss history, wheel commands, per-trial table
(the fit report's machinery: inline SVG figures, one stylesheet, the render-status marker)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from sysid.app import page
from sysid.app.page import esc, fmt
from sysid.app.run_figure import pallet_polygon


def _terrain(doc: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The plan's heightmap: (grid coordinates along x and y [m], heights (x, y) [m]); None off terrain."""
    t = doc.get("terrain")
    if not t:
        return None
    z = np.asarray(t["heights"], float)
    return np.linspace(-t["size"] / 2, t["size"] / 2, z.shape[0]), z


def _tip(pose: Any, length: float) -> tuple[float, float]:
    return float(pose[0]) + length * math.cos(pose[2]), float(pose[1]) + length * math.sin(pose[2])


def _window(doc: Mapping[str, Any], margin: float = 0.4) -> tuple[tuple[float, float, float, float], float]:
    """The view (x0, x1, y0, y1 [m]) around every trial's paths, start and goal and their heading
    arrows, and the arrows' length [m] (long enough to see at the view's scale)."""
    pts = [np.asarray(t[k], float)[:, :2] for t in doc["trials"] for k in ("chassis_xy", "initial_xy")]
    pts += [np.asarray([t["start"][:2], t["goal"][:2]], float) for t in doc["trials"]]
    p = np.concatenate(pts)
    p = p[np.all(np.isfinite(p), axis=1)]
    length = max(0.25, 0.08 * float(np.ptp(p, axis=0).max()))
    p = np.concatenate([p, [_tip(t[k], length) for t in doc["trials"] for k in ("start", "goal")]])
    lo, hi = p.min(axis=0) - margin, p.max(axis=0) + margin
    return (lo[0], hi[0], lo[1], hi[1]), length


def _heading(ax: Any, pose: Any, length: float, color: str) -> None:
    """An arrow from ``pose``'s position along its heading (inside the view: matplotlib leaves out an
    annotation whose tip is outside it)."""
    ax.annotate("", xy=_tip(pose, length), xytext=(float(pose[0]), float(pose[1])),
                arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.4, "mutation_scale": 12,
                            "shrinkA": 0, "shrinkB": 0})


def trajectory_figure(doc: Mapping[str, Any]) -> str:
    from matplotlib.lines import Line2D

    fig, ax = page.plt.subplots(figsize=(7.5, 4.6))
    (x0, x1, y0, y1), length = _window(doc)
    grid = _terrain(doc)
    if grid is not None:  # the heightmap under the paths, cropped to the view
        g, z = grid
        step = g[1] - g[0]
        ix, iy = (g >= x0 - step) & (g <= x1 + step), (g >= y0 - step) & (g <= y1 + step)
        gx, gy, zc = g[ix], g[iy], z[np.ix_(ix, iy)]
        shade = ax.contourf(gx, gy, zc.T, levels=14, cmap="cividis", alpha=0.45)
        ax.contour(gx, gy, zc.T, levels=shade.levels, colors="k", linewidths=0.4, alpha=0.35)
        fig.colorbar(shade, ax=ax, label="terrain height [m]", orientation="horizontal", fraction=0.05, pad=0.15,
                     aspect=40)
    for i, t in enumerate(doc["trials"]):
        if t.get("pallet"):
            ax.add_patch(
                pallet_polygon(
                    {"x": t["pallet"][0], "y": t["pallet"][1], "yaw": t["pallet"][2], "size": doc["pallet_size"]}
                )
            )
        xy = np.asarray(t["chassis_xy"], float)
        ini = np.asarray(t["initial_xy"], float)
        lab = i == 0
        ax.plot(ini[:, 0], ini[:, 1], color="0.35", lw=0.9, ls="--", label="first guess" if lab else None)
        ax.plot(
            xy[:, 0],
            xy[:, 1],
            color=page.COLORS["identified"] if t["success"] else "C3",
            lw=1.5,
            label="plan (success)" if lab and t["success"] else ("plan" if lab else None),
        )
        g = t["goal"]
        ax.plot([g[0]], [g[1]], marker="*", color="k", ms=10, ls="none", label="goal" if lab else None)
        _heading(ax, g, length, "k")
        s = t["start"]
        ax.plot([s[0]], [s[1]], marker="o", color="k", ms=5, ls="none", label="start" if lab else None)
        _heading(ax, s, length, "0.35")
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.grid(alpha=0.3)
    handles = list(dict(zip(ax.get_legend_handles_labels()[1], ax.get_legend_handles_labels()[0],
                            strict=True)).values())  # one entry per label (each trial's pallet has one)
    handles.append(Line2D([], [], color="k", marker=r"$\rightarrow$", ms=12, ls="none", label="heading (arrow)"))
    page.legend_outside(ax, handles=handles)
    return page.svg(fig, "plan-xy")


def terrain_under(doc: Mapping[str, Any], xy: np.ndarray) -> np.ndarray | None:
    """The heightmap's height [m] under each point of ``xy`` (bilinear); None off terrain."""
    grid = _terrain(doc)
    if grid is None:
        return None
    g, z = grid
    fx = np.clip(np.interp(xy[:, 0], g, np.arange(g.size)), 0, g.size - 1.000001)
    fy = np.clip(np.interp(xy[:, 1], g, np.arange(g.size)), 0, g.size - 1.000001)
    i, j = fx.astype(int), fy.astype(int)
    u, v = fx - i, fy - j
    h: np.ndarray = (z[i, j] * (1 - u) * (1 - v) + z[i + 1, j] * u * (1 - v) + z[i, j + 1] * (1 - u) * v
                     + z[i + 1, j + 1] * u * v)
    return h


def height_figure(doc: Mapping[str, Any]) -> str:
    """The chassis height along each trial's plan over time and, on terrain, the ground under it."""
    fig, ax = page.plt.subplots(figsize=(7.5, 2.8))
    dt = doc["options"]["dt"]
    for i, t in enumerate(doc["trials"]):
        z = np.asarray(t["chassis_z"], float)
        time = np.arange(z.size) * dt
        lab = i == 0
        ax.plot(time, z, color=page.COLORS["identified"] if t["success"] else "C3", lw=1.4,
                label="chassis z (plan)" if lab else None)
        ground = terrain_under(doc, np.asarray(t["chassis_xy"], float))
        if ground is not None:
            ax.plot(time[: ground.size], ground, color=page.COLORS["pallet"], lw=1.2, ls="--",
                    label="terrain under the chassis" if lab else None)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("height [m]")
    ax.grid(alpha=0.3)
    page.legend_outside(ax)
    return page.svg(fig, "plan-z")


def loss_figure(doc: Mapping[str, Any]) -> str:
    from matplotlib.ticker import MaxNLocator

    H = np.asarray(doc["best_history"], float)  # (iterations, trials)
    fig, ax = page.plt.subplots(figsize=(7.5, 2.8))
    it = np.arange(H.shape[0])
    if H.shape[1] > 1:
        lo, med, hi = np.percentile(H, [25, 50, 75], axis=1)
        ax.fill_between(it, lo, hi, alpha=0.25, label="interquartile range\nover trials")
        ax.plot(it, med, label="median running-best loss")
    else:
        ax.plot(it, H[:, 0], label="running-best loss")
    page.loss_axis(ax, H.ravel().tolist())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration (forward + backward)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    page.legend_outside(ax)
    return page.svg(fig, "plan-loss")


def command_figure(doc: Mapping[str, Any], trial: int = 0) -> str:
    t = doc["trials"][trial]
    times = np.asarray(doc["times"], float)
    u = np.asarray(t["commands"], float)
    fig, ax = page.plt.subplots(figsize=(7.5, 2.6))
    for k, name in enumerate(doc["wheels"]):
        ax.step(times, u[:, k], where="post", label=name, lw=1.1)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("wheel command [rad/s]")
    ax.grid(alpha=0.3)
    page.legend_outside(ax)
    return page.svg(fig, f"plan-cmd-{trial}")


def trial_table(doc: Mapping[str, Any]) -> str:
    rows = [
        "<table><tr><th>trial</th><th>start x, y, yaw</th><th>goal x, y, yaw</th><th>position error [m]</th>"
        "<th>yaw error [deg]</th><th>terminal speed [m/s]</th><th>success</th><th>first success [iteration]</th>"
        "<th>best loss</th><th>worst step residual [m/s]</th></tr>"
    ]
    for i, t in enumerate(doc["trials"]):
        s = ", ".join(fmt(v, ".2f") for v in t["start"])
        g = ", ".join(fmt(v, ".2f") for v in t["goal"])
        first = t["iterations_to_success"]
        rows.append(
            f"<tr><td>{i}</td><td>{s}</td><td>{g}</td><td>{fmt(t['position_error'], '.3f')}</td>"
            f"<td>{fmt(np.degrees(t['yaw_error']), '.1f')}</td><td>{fmt(t['terminal_speed'], '.3f')}</td>"
            f"<td>{'yes' if t['success'] else '<b>no</b>'}</td><td>{first if first >= 0 else '–'}</td>"
            f"<td>{fmt(t['loss'], '.4g')}</td><td>{fmt(t['residual_max'], '.2g')}</td></tr>"
        )
    rows.append("</table>")
    return page.scroll("".join(rows))


def render_plan_report(doc: Mapping[str, Any], base: str | os.PathLike[str] | None = None) -> str:
    """The HTML text of a plan document (`sysid.app.plan.plan`); the parameter file is named relative
    to ``base``, the page's folder (the working folder when None)."""
    s = doc["summary"]
    o = doc["options"]
    parts = [f"<h1>Plan: {esc(doc['robot'])} to ({', '.join(fmt(v, '.2f') for v in doc['trials'][0]['goal'])})</h1>"]
    parts.append(
        f"<p class='muted'>parameters {esc(page.relative_path(doc['params'], base))}; scene {esc(o['scene'])}"
        + (f" (seed {o['terrain_seed']})" if o.get("terrain_seed") is not None else "") + "; horizon "
        f"{fmt(o['duration'])} s at h = {fmt(o['dt'])} s ({o['steps']} steps); {o['knots']} knots per channel "
        f"({esc(', '.join(doc['channels']))}); {esc(o['optimizer'])}, {o['iterations']} iterations, lr "
        f"{fmt(o['lr'])} rad/s; pull-back {esc(o['pullback'])}; {len(doc['trials'])} trial(s) as parallel worlds. "
        f"Created {esc(doc['created'])}.</p>"
    )
    parts.append(
        f"<p class='verdict'><b>{s['successes']} of {len(doc['trials'])} trial(s) reach the goal</b> (final position "
        f"within {fmt(o['position_tol'])} m and terminal speed below {fmt(o['speed_tol'])} m/s"
        + (f", heading within {fmt(np.degrees(o['yaw_tol']), '.1f')} deg" if o.get("yaw_tol") is not None else "")
        + "); best trial "
        f"{s['best_trial']}: position error {fmt(s['best_position_error'], '.3f')} m, yaw error "
        f"{fmt(np.degrees(s['best_yaw_error']), '.1f')} deg; {fmt(s['iteration_s_median'], '.2f')} s per iteration "
        "(median, forward + backward of all trials).</p>"
    )
    parts.append(trial_table(doc))
    parts.append(
        page.figure(
            "plan-xy",
            trajectory_figure(doc),
            "chassis path of every trial: first guess (dashed) and the best iterate; star and arrow: goal "
            "position and heading, circle and arrow: start"
            + ("; shaded: the terrain's height (thin lines: its contours)" if doc.get("terrain") else ""),
        )
    )
    if o["scene"] != "flat":
        parts.append(page.figure("plan-z", height_figure(doc), "chassis height along the plan"
                             + (" and the terrain's height under the chassis" if doc.get("terrain") else "")))
    parts.append(page.figure("plan-loss", loss_figure(doc), "running-best loss per iteration"))
    b = s["best_trial"]
    parts.append(
        page.figure(
            "plan-commands",
            command_figure(doc, b),
            f"wheel commands of trial {b} (the written command sequence), per step",
        )
    )
    return page.html_page(f"sysid plan: {doc['robot']}", parts)
