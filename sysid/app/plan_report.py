"""HTML page of a `sysid plan` result: trajectories, loss history, wheel commands, per-trial table
(the fit report's machinery: inline SVG figures, one stylesheet, the render-status marker)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sysid.app.report import COLORS, CSS, SCRIPT, _esc, _f, _figure, _pallet_polygon, _scroll, _svg, plt


def trajectory_figure(doc: Mapping[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, t in enumerate(doc["trials"]):
        if t.get("pallet"):
            ax.add_patch(
                _pallet_polygon(
                    {"x": t["pallet"][0], "y": t["pallet"][1], "yaw": t["pallet"][2], "size": doc["pallet_size"]}
                )
            )
        xy = np.asarray(t["chassis_xy"], float)
        ini = np.asarray(t["initial_xy"], float)
        lab = i == 0
        ax.plot(ini[:, 0], ini[:, 1], color="0.6", lw=0.8, ls="--", label="first guess" if lab else None)
        ax.plot(
            xy[:, 0],
            xy[:, 1],
            color=COLORS["identified"] if t["success"] else "C3",
            lw=1.3,
            label="plan (success)" if lab and t["success"] else ("plan" if lab else None),
        )
        g = t["goal"]
        ax.plot([g[0]], [g[1]], marker="*", color="k", ms=9, ls="none", label="goal" if lab else None)
        ax.annotate(
            "",
            xy=(g[0] + 0.25 * np.cos(g[2]), g[1] + 0.25 * np.sin(g[2])),
            xytext=(g[0], g[1]),
            arrowprops={"arrowstyle": "->", "color": "k", "lw": 0.8},
        )
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _svg(fig, "plan-xy")


def loss_figure(doc: Mapping[str, Any]) -> str:
    H = np.asarray(doc["best_history"], float)  # (iterations, trials)
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    it = np.arange(H.shape[0])
    if H.shape[1] > 1:
        lo, med, hi = np.percentile(H, [25, 50, 75], axis=1)
        ax.fill_between(it, lo, hi, alpha=0.25, label="interquartile range over trials")
        ax.plot(it, med, label="median running-best loss")
    else:
        ax.plot(it, H[:, 0], label="running-best loss")
    ax.set_yscale("log")
    ax.set_xlabel("iteration (forward + backward)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig, "plan-loss")


def command_figure(doc: Mapping[str, Any], trial: int = 0) -> str:
    t = doc["trials"][trial]
    times = np.asarray(doc["times"], float)
    u = np.asarray(t["commands"], float)
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    for k, name in enumerate(doc["wheels"]):
        ax.step(times, u[:, k], where="post", label=name, lw=1.1)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("wheel command [rad/s]")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=min(4, len(doc["wheels"])))
    return _svg(fig, f"plan-cmd-{trial}")


def trial_table(doc: Mapping[str, Any]) -> str:
    rows = [
        "<table><tr><th>trial</th><th>start x, y, yaw</th><th>goal x, y, yaw</th><th>position error [m]</th>"
        "<th>yaw error [deg]</th><th>terminal speed [m/s]</th><th>success</th><th>first success [iteration]</th>"
        "<th>best loss</th><th>worst step residual [m/s]</th></tr>"
    ]
    for i, t in enumerate(doc["trials"]):
        s = ", ".join(_f(v, ".2f") for v in t["start"])
        g = ", ".join(_f(v, ".2f") for v in t["goal"])
        first = t["iterations_to_success"]
        rows.append(
            f"<tr><td>{i}</td><td>{s}</td><td>{g}</td><td>{_f(t['position_error'], '.3f')}</td>"
            f"<td>{_f(np.degrees(t['yaw_error']), '.1f')}</td><td>{_f(t['terminal_speed'], '.3f')}</td>"
            f"<td>{'yes' if t['success'] else '<b>no</b>'}</td><td>{first if first >= 0 else '–'}</td>"
            f"<td>{_f(t['loss'], '.4g')}</td><td>{_f(t['residual_max'], '.2g')}</td></tr>"
        )
    rows.append("</table>")
    return _scroll("".join(rows))


def render_plan_report(doc: Mapping[str, Any]) -> str:
    """The HTML text of a plan document (`sysid.app.plan.plan`)."""
    s = doc["summary"]
    o = doc["options"]
    parts = [f"<h1>Plan: {_esc(doc['robot'])} to ({', '.join(_f(v, '.2f') for v in doc['trials'][0]['goal'])})</h1>"]
    parts.append(
        f"<p class='muted'>parameters {_esc(doc['params'])}; scene {_esc(o['scene'])}; horizon "
        f"{_f(o['duration'])} s at h = {_f(o['dt'])} s ({o['steps']} steps); {o['knots']} knots per channel "
        f"({_esc(', '.join(doc['channels']))}); {_esc(o['optimizer'])}, {o['iterations']} iterations, lr "
        f"{_f(o['lr'])} rad/s; pull-back {_esc(o['pullback'])}; {len(doc['trials'])} trial(s) as parallel worlds. "
        f"Created {_esc(doc['created'])}.</p>"
    )
    parts.append(
        f"<p class='verdict'><b>{s['successes']} of {len(doc['trials'])} trial(s) reach the goal</b> (final position "
        f"within {_f(o['position_tol'])} m and terminal speed below {_f(o['speed_tol'])} m/s"
        + (f", heading within {_f(np.degrees(o['yaw_tol']), '.1f')} deg" if o.get("yaw_tol") is not None else "")
        + "); best trial "
        f"{s['best_trial']}: position error {_f(s['best_position_error'], '.3f')} m, yaw error "
        f"{_f(np.degrees(s['best_yaw_error']), '.1f')} deg; {_f(s['iteration_s_median'], '.2f')} s per iteration "
        "(median, forward + backward of all trials).</p>"
    )
    parts.append(trial_table(doc))
    parts.append(
        _figure(
            "plan-xy",
            trajectory_figure(doc),
            "chassis path of every trial: first guess (dashed) and "
            "the best iterate; star and arrow: goal position and heading",
        )
    )
    parts.append(_figure("plan-loss", loss_figure(doc), "running-best loss per iteration"))
    b = s["best_trial"]
    parts.append(
        _figure(
            "plan-commands",
            command_figure(doc, b),
            f"wheel commands of trial {b} (the written command sequence), per step",
        )
    )
    parts.append("<p id='sysid-render-status' data-ok='pending'>rendering…</p>")
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>sysid plan: {_esc(doc['robot'])}</title><style>{CSS}</style></head>"
        f"<body>\n{body}\n<script>{SCRIPT}</script></body></html>\n"
    )
