"""Self-contained HTML report of a fit: figures are inline SVG (matplotlib), the script is inline,
nothing is fetched, so the file opens offline.

Sections: first, generalisation: per held-out run (mean over its pieces) and mean over runs and
pieces, the model's mean xy distance and combined error beside those at its starting values and
of the kinematic baseline fitted on the same training runs, with a one-line verdict (whether it
beats both), and the same for the training runs (in-sample); then the parameter table (initial,
identified, bounds, 95 % intervals marked where they reach a bound, whether the runs determine
each parameter, truth when known) and the least-determined combination,
optimisation trace, held-out error bar chart, the score table (one row per run, or per piece with
``data.split``, then each run's mean over its pieces), the error per segment (cruise, climb, after the
climb, whole run: `sysid.app.segment_scores`), one figure per run or piece (top-down
trajectory with pallet footprint, z over time — at least 5 cm of height, so flat-ground noise is not
drawn as relief — and yaw over time, the cruise / climb segment bands and odometry jumps in a
legend), the timestep sweep with its plateau (a plateau reaching the sweep's largest h is said to be
the sweep's edge, not a found limit), warnings (a run whose replay does not climb the pallet its
odometry climbs is flagged) and run metadata. Wide tables sit in containers that scroll sideways.
The inline script checks that every figure rendered and records it in ``#sysid-render-status``
(``data-ok``, ``data-figures``, ``data-errors``; ``data-overflow``: how far the page runs off the
window sideways; ``data-clipped``: tables cut off by the window), which the tests read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sysid.app import page
from sysid.app.page import esc, fmt
from sysid.app.results import (
    FitResults,
    Generalisation,
    MetricName,
    NuisanceRow,
    OdometryFinding,
    RunEntry,
    SplitBlock,
    aggregate_split,
    as_results,
    generalisation,
)
from sysid.app.run_figure import MIN_Z_SPAN, SEGMENT_BANDS, climb_warnings, run_figure, run_heading
from sysid.app.segment_scores import segment_section
from sysid.fit.uncertainty import beyond_interval


def _unit(row: Mapping[str, Any]) -> str:
    """A parameter row's unit ("1": dimensionless), from the package's tables when the row has none."""
    from sysid.fit.params import unit_of

    return row.get("unit") or unit_of(str(row.get("name", ""))) or "–"


def _inf(x: Any) -> float:
    return math.inf if x is None else float(x)


def _interval_cell(r: Mapping[str, Any]) -> str:
    """The 95 % interval as the data give it: an end at or past a bound is the bound marked
    ``(bound)`` (``sysid.fit.identifiability.interval_text``), never a silently clipped number."""
    from sysid.fit.identifiability import interval_text

    iv = r.get("interval") or r.get("ci95")
    if not iv:
        return "–"
    return esc(interval_text(iv[0], iv[1], r["lower"], r["upper"]))


def _determined_cell(r: Mapping[str, Any]) -> str:
    """Whether the training runs determine a free parameter (red when they do not and nothing else
    holds it), with the reason as its tooltip."""
    status = r.get("determined")
    if not status:
        return "–"
    why = esc(r.get("determined_why") or "")
    prior = r.get("prior")
    if status == "not determined" and not prior:
        return f"<span class='bad' data-determined='not' title='{why}'><b>not determined</b></span>"
    cls = {"determined": "ok", "weakly determined": "warnc"}.get(status, "")
    held = ", held by its prior" if prior and status != "determined" else ""
    return f"<span class='{cls}' data-determined='{esc(status)}' title='{why}'>{esc(status)}</span>{held}"


def identifiability_note(res: FitResults) -> str:
    """Below the parameter table: what 'determined' means, the parameters the runs do not determine
    (in red, with the three remedies) and the least-determined combination."""
    from sysid.fit.identifiability import combination_text

    rows = [r for r in res.parameters if r.get("determined")]
    if not rows:
        return ""
    method = ("the runs' jackknife: the spread of the estimates without each run"
              if ((res.fit or {}).get("options") or {}).get("intervals") == "runs"
              else "Fisher information of the residuals")
    parts = ["<p class='muted' data-identifiability='rule'>Determined by these runs: the training runs' 95 % "
             f"interval ({method}, checked by the loss along each parameter's profile) is "
             "narrower than half the bound range and inside the bounds; weakly determined: wider, or it reaches a "
             "bound; not determined: it spans the bounds or the parameter has no effect.</p>"]
    loose = [r["name"] for r in rows if r["determined"] == "not determined" and not r.get("prior")]
    if loose:
        names = ", ".join(f"<b>{esc(n)}</b>" for n in loose)
        one = len(loose) == 1
        parts.append(f"<p class='bad' data-identifiability='undetermined'>Not determined by these runs: {names}. "
                     + ("Its value is" if one else "Their values are") + " whatever the optimiser reached, not "
                     f"{'a measurement' if one else 'measurements'}: give {'it' if one else 'each'} a prior "
                     "(<code>parameters.&lt;name&gt;.prior: {mean, std}</code>, the strength chosen by "
                     f"<code>sysid cv</code>), freeze {'it' if one else 'it'} at a value from another source (and say "
                     f"which), or add runs that excite {'it' if one else 'them'}.</p>")
    weakest = (res.fit or {}).get("weakest")
    if weakest and len(weakest.get("direction") or {}) > 1:
        half = weakest.get("half_width")
        size = "unbounded" if half is None else f"±{fmt(half, '.2g')} of the bound ranges"
        parts.append(f"<p class='muted' data-identifiability='weakest'>Least-determined combination (the smallest "
                     f"eigenvalue of the normalised Fisher matrix): <code>{esc(combination_text(weakest))}</code>, "
                     f"dominated by {esc(', '.join(weakest.get('dominant') or []))}; its 95 % interval is {size} "
                     "along it.</p>")
    return "".join(parts)


def run_shift_table(res: FitResults) -> str:
    """What each training run decides: how far each free parameter would move without it
    (``fit.run_shifts``, one Gauss-Newton step), red where that passes the parameter's 95 % interval."""
    fit: Mapping[str, Any] = dict(res.fit or {})
    return shift_table(fit.get("run_shifts") or {}, {r["name"]: float(r["value"]) for r in res.parameters},
                       fit.get("identifiability") or {})


def shift_table(shifts: Mapping[str, Mapping[str, float]], value: Mapping[str, float],
                identifiability: Mapping[str, Mapping[str, Any]]) -> str:
    """``run_shift_table`` from its parts: per left-out run the shifts, the parameters' values and their
    identifiability records (each with its ``interval``); empty without shifts."""
    if not shifts:
        return ""
    names = list(next(iter(shifts.values())))
    interval = {n: (identifiability.get(n) or {}).get("interval") for n in names}
    head = "<tr><th class='l'>left out</th>" + "".join(f"<th>{esc(n)}</th>" for n in names) + "</tr>"
    body = []
    for run, sh in shifts.items():
        cells = []
        for n in names:
            d, iv = sh[n], interval[n]
            # an end written as None is unbounded (infinite variance): nothing is past it
            past = iv is not None and n in value and beyond_interval(
                d, value[n], -math.inf if iv[0] is None else float(iv[0]), _inf(iv[1]))
            mark = " class='bad'" if past else ""
            cells.append(f"<td{mark}>{fmt(d, '+.3g')}</td>")
        body.append(f"<tr><td class='l'>{esc(run)}</td>{''.join(cells)}</tr>")
    return ("<h3>What each run decides</h3><p class='muted' data-run-shifts='rule'>How far each parameter would move "
            "if that training run were left out of the fit (one Gauss-Newton step from the estimate); red: past its "
            "95 % interval, a run the model describes differently from the others.</p>"
            + page.scroll(f"<table>{head}{''.join(body)}</table>"))


def parameter_table(rows: Sequence[Mapping[str, Any]]) -> str:
    has_truth = any(r.get("truth") is not None for r in rows)
    has_ident = any(r.get("determined") for r in rows)
    head = (
        "<tr><th class='l'>parameter</th><th>unit</th><th>initial</th><th>identified</th><th>95% CI</th>"
        "<th>std</th><th>bounds</th><th class='l'>status</th>"
        + ("<th class='l'>determined by these runs</th>" if has_ident else "")
        + ("<th>truth</th><th>error</th>" if has_truth else "")
        + "</tr>"
    )
    body = []
    for r in rows:
        status = "calibrated (cruise)" if r.get("calibrated") else ("frozen" if r.get("frozen") else "free")
        if r.get("prior") and not r.get("frozen"):
            status += f", prior N({fmt(r['prior']['mean'])}, {fmt(r['prior']['std'])}²)"
        if r.get("at_bound"):
            status += f", <span class='bad'>at {r['at_bound']} bound</span>"
        cells = (
            f"<td class='l'><b>{esc(r['name'])}</b></td><td>{esc(_unit(r))}</td>"
            f"<td>{fmt(r['initial'])}</td><td><b>{fmt(r['value'])}</b></td><td>{_interval_cell(r)}</td>"
            f"<td>{fmt(r.get('std'))}</td>"
            f"<td>[{fmt(r['lower'])}, {fmt(r['upper'])}]</td><td class='l'>{status}</td>"
            + (f"<td class='l'>{_determined_cell(r)}</td>" if has_ident else "")
        )
        if has_truth:
            t = r.get("truth")
            rel = abs(r["value"] - t) / abs(t) if t not in (None, 0) else None
            cells += f"<td>{fmt(t)}</td><td>{fmt(100 * rel, '.2f') + ' %' if rel is not None else '–'}</td>"
        body.append(f"<tr>{cells}</tr>")
    return page.scroll(f"<table>{head}{''.join(body)}</table>")


def nuisance_table(rows: Sequence[NuisanceRow]) -> str:
    """Per training run, its fitted nuisance values (one column per nuisance parameter)."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    cell = {(r["run"], r["name"]): r for r in rows}
    unit = {r["name"]: r.get("unit", "") for r in rows}
    head = "<tr><th class='l'>training run</th>" + "".join(
        f"<th>{esc(n)} [{esc(unit[n])}]</th>" for n in names) + "</tr>"
    body = []
    for run in runs:
        tds = []
        for n in names:
            r = cell.get((run, n))
            iv = r.get("interval") if r is not None else None
            tds.append("<td>–</td>" if r is None else
                       f"<td>{fmt(r['value'], '+.3f')}" + (f" <span class='muted'>[{fmt(iv[0], '+.3f')}, "
                                                          f"{fmt(iv[1], '+.3f')}]</span>" if iv else "") + "</td>")
        body.append(f"<tr><td class='l'>{esc(run)}</td>{''.join(tds)}</tr>")
    return page.scroll(f"<table>{head}{''.join(body)}</table>")


def trace_figure(trace: Sequence[Mapping[str, Any]], optimizer: str) -> str:
    from matplotlib.ticker import MaxNLocator

    fig, ax = page.plt.subplots(figsize=(6.5, 3.2))
    it = [e["iter"] for e in trace]
    loss = [e["loss"] if e["loss"] is not None else float("nan") for e in trace]
    ax.plot(it, loss, "o-", color=page.COLORS["identified"], ms=3)
    page.loss_axis(ax, loss)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterates are counted, not measured
    ax.set_xlabel("iteration (accepted iterate)")
    ax.set_ylabel("loss  Σ w·E² [m²]")
    ax.set_title(f"optimisation trace ({optimizer})")
    ax.grid(True, which="both", alpha=0.3)
    return page.svg(fig, "trace")


def bar_figure(runs: Sequence[RunEntry], title: str) -> str:
    import numpy as np

    fig, ax = page.plt.subplots(figsize=(max(4.0, 0.9 * len(runs) + 1.5), 3.4))
    names = [r["name"] for r in runs]
    def errors(key: Literal["metrics_initial", "metrics_identified", "metrics_baseline"]) -> list[float]:
        # a diverged replay (None) draws no bar
        return [np.nan if (c := (r.get(key) or {}).get("combined")) is None else c for r in runs]

    e0, e1 = errors("metrics_initial"), errors("metrics_identified")
    x = np.arange(len(runs))
    if runs and all(r.get("metrics_baseline") for r in runs):
        eb = errors("metrics_baseline")
        ax.bar(x - 0.27, e0, 0.27, color=page.COLORS["initial"], label="initial θ")
        ax.bar(x, e1, 0.27, color=page.COLORS["identified"], label="identified θ")
        ax.bar(x + 0.27, eb, 0.27, color=page.COLORS["baseline"], label="kinematic baseline\n(same training runs)")
    else:
        ax.bar(x - 0.2, e0, 0.4, color=page.COLORS["initial"], label="initial θ")
        ax.bar(x + 0.2, e1, 0.4, color=page.COLORS["identified"], label="identified θ")
    if np.all(np.isfinite(e1)):
        ax.axhline(float(np.mean(e1)), color=page.COLORS["identified"], ls=":", lw=1, label=f"mean {np.mean(e1):.3f} m")
    ax.set_xticks(x, names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("combined error [m]")
    ax.set_title(title)
    return page.framed_svg(fig, ax, "bars", axis="y")


def sweep_figure(sw: Mapping[str, Any]) -> str:
    import numpy as np
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    fig, ax = page.plt.subplots(figsize=(6.5, 3.4))
    h = np.array(sw["dts"], float)
    e = np.array([v if v is not None else np.inf for v in sw["errors"]], float)
    finite = np.isfinite(e)
    ceiling = (e[finite].max() * 3) if finite.any() else 1.0
    ax.plot(h[finite], e[finite], "o-", color=page.COLORS["identified"], label="mean held-out\ncombined error")
    if (~finite).any():
        ax.plot(h[~finite], np.full((~finite).sum(), ceiling), "x", color="k", ms=8, label="diverged")
    if finite.any():
        m = e[finite].min()
        ax.axhline(sw.get("factor", 2.0) * m, color="#555", ls=":", lw=1, label=f"{sw.get('factor', 2.0):g}× minimum")
    if sw.get("plateau"):
        lo, hi = sw["plateau"]
        ax.axvspan(lo, hi, color="#2ca02c", alpha=0.12, label=f"plateau {lo:g}–{hi:g} s")
        ax.axvline(hi, color="#2ca02c", lw=1.2)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(list(h)))  # the swept timesteps themselves
    ax.xaxis.set_major_formatter(page.plain_tick)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    page.loss_axis(ax, [*e[finite], ceiling, sw.get("factor", 2.0) * (e[finite].min() if finite.any() else 1.0)])
    ax.set_xlabel("timestep h [s]")
    ax.set_ylabel("combined error [m]")
    ax.set_title("timestep sweep at identified θ")
    return page.framed_svg(fig, ax, "sweep", which="both")


def _metrics_table(runs: Sequence[RunEntry], item: str = "run") -> str:
    """One row per scored run (per piece with ``data.split``: ``item`` names what a row is)."""
    base = bool(runs) and all(r.get("metrics_baseline") for r in runs)
    rows = []
    for r in runs:
        m0, m1 = r["metrics_initial"], r["metrics_identified"]
        mb = r.get("metrics_baseline") or {}
        extra = f"<td>{fmt(mb.get('combined'), '.4f')}</td><td>{fmt(mb.get('mean_xy'), '.4f')}</td>" if base else ""
        rows.append(
            f"<tr><td class='l'>{esc(r['name'])}</td><td class='l'>{esc(r['split'])}</td>"
            f"<td>{fmt(m0['combined'], '.4f')}</td><td><b>{fmt(m1['combined'], '.4f')}</b></td>"
            f"<td>{fmt(m1['mean_xy'], '.4f')}</td>{extra}<td>{fmt(m1['final_xy'], '.4f')}</td>"
            f"<td>{fmt(m1['yaw_rmse'], '.4f')}</td><td>{fmt(m1.get('z_rmse'), '.4f')}</td></tr>"
        )
    extra = "<th>combined, kinematic baseline [m]</th><th>mean xy, kinematic baseline [m]</th>" if base else ""
    return page.scroll(
        f"<table data-table='{item}s'><tr><th class='l'>{item}</th><th class='l'>split</th>"
        "<th>combined, initial [m]</th>"
        f"<th>combined, identified [m]</th><th>mean xy [m]</th>{extra}<th>final xy [m]</th><th>yaw RMSE [rad]</th>"
        "<th>z RMSE [m]</th></tr>" + "".join(rows) + "</table>"
    )


PER_RUN_KEYS: tuple[MetricName, ...] = ("combined", "mean_xy", "final_xy", "yaw_rmse", "z_rmse")


def per_run_table(runs: Sequence[RunEntry]) -> str:
    """Per logged run, the mean over its pieces of every score (held-out runs first), beside the
    starting values' and the kinematic baseline's where it was fitted; empty when no run was cut
    into pieces."""
    blocks = []
    for split in ("held_out", "train"):
        entries = [r for r in runs if r["split"] == split]
        if entries:
            blocks.append((split, aggregate_split(entries, keys=PER_RUN_KEYS)))
    if not any(b["n_pieces"] != b["n_runs"] for _s, b in blocks):
        return ""
    base = all("baseline" in b["mean_over_runs"] for _s, b in blocks)
    start = all("start" in b["mean_over_runs"] for _s, b in blocks)
    rows = []
    for split, b in blocks:
        for r in b["runs"]:
            m, mb, m0 = r["model"], r.get("baseline") or {}, r.get("start") or {}
            cols = ([m0] if start else []) + ([mb] if base else [])
            extra = "".join(f"<td>{fmt(c.get('combined'), '.4f')}</td><td>{fmt(c.get('mean_xy'), '.4f')}</td>"
                            for c in cols)
            rows.append(
                f"<tr data-run='{esc(r['run'])}'><td class='l'>{esc(r['run'])}</td><td class='l'>{esc(split)}</td>"
                f"<td>{len(r['pieces'])}</td><td><b>{fmt(m['combined'], '.4f')}</b></td>"
                f"<td>{fmt(m['mean_xy'], '.4f')}</td>"
                f"{extra}<td>{fmt(m['final_xy'], '.4f')}</td><td>{fmt(m['yaw_rmse'], '.4f')}</td>"
                f"<td>{fmt(m['z_rmse'], '.4f')}</td></tr>"
            )
    extra = "<th>combined, starting values [m]</th><th>mean xy, starting values [m]</th>" if start else ""
    extra += "<th>combined, kinematic baseline [m]</th><th>mean xy, kinematic baseline [m]</th>" if base else ""
    return page.scroll(
        "<table data-table='per-run'><tr><th class='l'>run</th><th class='l'>split</th><th>pieces</th>"
        f"<th>combined, identified [m]</th><th>mean xy [m]</th>{extra}<th>final xy [m]</th><th>yaw RMSE [rad]</th>"
        "<th>z RMSE [m]</th></tr>" + "".join(rows) + "</table>"
    )


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _model_name(simulator: str) -> str:
    return "engine" if simulator == "ostrich" else simulator


def _generalisation_table(block: SplitBlock, split: str, model: str) -> str:
    """Per run (mean over its pieces), then the means over runs and over pieces: the identified
    model's mean xy distance and combined error beside those at its starting values and of the
    kinematic baseline when it was fitted (the best of a row in bold)."""
    who = [w for w in ("model", "start", "baseline") if w in (block.get("mean_over_runs") or {})]

    def pair(r: Mapping[str, Any], key: str) -> str:
        vals = [r[w][key] for w in who]
        finite = [math.inf if v is None else v for v in vals]
        best = min(finite)
        return "".join(f"<td><b>{fmt(v, '.3f')}</b></td>" if len(who) > 1 and fv == best and math.isfinite(fv)
                       else f"<td>{fmt(v, '.3f')}</td>" for v, fv in zip(vals, finite, strict=True))

    rows = []
    for r in block["runs"]:
        rows.append(f"<tr data-run='{esc(r['run'])}'><td class='l'>{esc(r['run'])}</td><td>{len(r['pieces'])}</td>"
                    + pair(r, "mean_xy") + pair(r, "combined") + "</tr>")
    means = [(f"mean over {_n(block['n_runs'], 'run')}", "mean_over_runs", block["mean_over_runs"])]
    if block["n_pieces"] != block["n_runs"]:  # runs cut into pieces: each piece once, as well
        means.append((f"mean over {_n(block['n_pieces'], 'piece')}", "mean_over_pieces", block["mean_over_pieces"]))
    for label, key, mean in means:
        rows.append(f"<tr data-run='{key}'><td class='l'><i>{label}</i></td><td></td>"
                    + pair(mean, "mean_xy") + pair(mean, "combined") + "</tr>")
    span = len(who)
    heads = {"model": f"{esc(model)}, identified", "start": f"{esc(model)}, starting values",
             "baseline": "kinematic baseline"}
    sub = "".join(f"<th class='wrap'>{heads[w]}</th>" for w in who)  # a simulator's name may be a long path
    head = (f"<tr><th class='l' rowspan='2'>run</th><th rowspan='2'>pieces</th><th colspan='{span}'>mean xy distance "
            f"[m]</th><th colspan='{span}'>combined error [m]</th></tr><tr>{sub}{sub}</tr>")
    return page.scroll(f"<table data-gen='{split}'>{head}{''.join(rows)}</table>")


def generalisation_section(doc: FitResults | Mapping[str, Any]) -> str:
    """The report's first section: held-out accuracy per run beside the kinematic baseline fitted on
    the same training runs, the verdict, and the training runs' figures (in-sample)."""
    res = as_results(doc)
    gen: Generalisation | None = res.generalisation
    if gen is None:  # results written before this section existed: aggregate their runs here
        gen = generalisation(res.runs, res.simulator.name, res.baseline)
    model = _model_name(res.simulator.name)
    held, train = gen.get("held_out"), gen.get("train")
    base: Mapping[str, Any] = res.baseline or {}
    parts = ["<h2>Generalisation</h2>"]
    if held and (v := held.get("verdict")):
        means = held.get("mean_over_runs") or {}
        worse = "start" in means and not _inf(means["model"].get("mean_xy")) < _inf(means["start"].get("mean_xy"))
        parts.append(f"<p class='verdict{' bad' if worse else ''}'><b>{esc(v[0].upper() + v[1:])}.</b>"
                     + ("" if "baseline" in means else " No kinematic baseline to compare with"
                        + (f" ({esc(gen['baseline_skipped'])})" if gen.get("baseline_skipped") else "") + ".")
                     + "</p>")
    elif held:
        parts.append(f"<p class='verdict'><b>Held-out mean xy distance "
                     f"{fmt(held['mean_over_runs']['model']['mean_xy'], '.3f')} m, combined error "
                     f"{fmt(held['mean_over_runs']['model']['combined'], '.3f')} m (mean over "
                     f"{_n(held['n_runs'], 'run')})</b>; no kinematic baseline to compare with"
                     + (f" ({esc(gen['baseline_skipped'])})" if gen.get("baseline_skipped") else "") + ".</p>")
    else:
        parts.append("<p class='verdict'><b>No held-out runs: every figure here is in-sample and says nothing about "
                     "generalisation.</b></p>")
    cells = []
    if held:
        cells.append("<div><h3>Held-out runs (out of sample)</h3>" + _generalisation_table(held, "held_out", model)
                     + "</div>")
    if train:
        cells.append("<div><h3>Training runs (in-sample: the fit saw them)</h3>"
                     + _generalisation_table(train, "train", model) + "</div>")
    parts.append("<div class='gen'>" + "".join(cells) + "</div>")
    cfg = res.config
    per = (f"Each run is cut into {fmt(cfg['split'])} s pieces, each replayed from its own odometry start; a run's "
           "figure is the mean over its pieces. " if cfg.get("split") else "")
    if base.get("status") == "fitted":
        vals = ", ".join(f"{esc(p['name'])} {fmt(p['value'])}" for p in base.get("parameters") or []
                         if not p.get("frozen") or p.get("calibrated"))
        bfit = base.get("fit") or {}
        parts.append(
            f"<p class='muted'>{per}The kinematic baseline (<code>{esc(base.get('simulator', 'kinematic'))}</code>: "
            f"a skid-steer model without contact physics; timestep {fmt(base.get('dt'))} s) was fitted by LM on "
            "the same training runs and pieces, with the same "
            f"odometry screening, score window, lever arm and calibration, in {bfit.get('iterations', '–')} "
            f"evaluations ({fmt(base.get('wall_time'), '.1f')} s): {vals}. Its parameters are not among the "
            "parameter file's parameters, only in its metadata for <code>sysid evaluate</code> (results JSON: "
            "<code>baseline</code>). The starting values are the same simulator at the config's nominals, the "
            "calibrated parameter's included: the model before anything was fitted.</p>")
    else:
        reason = gen.get("baseline_skipped") or base.get("reason")
        parts.append(f"<p class='muted'>{per}Kinematic baseline: {esc(reason or 'not in these results')}.</p>")
    return "".join(parts)


MIN_TURN = 0.3  # [rad] commanded heading change below which a tightness bin is not shown


def turn_table(runs: Sequence[RunEntry]) -> str:
    """Turn efficiency (heading turned / heading the wheels command) summed over ``runs``, per turn
    tightness bin (``sysid.fit.metrics.turn_efficiency``); empty when no run carries ``turns``."""
    import numpy as np

    turns = [t for r in runs if (t := r.get("turns"))]
    if not turns:
        return ""
    bins = turns[0]["bins"]
    keys = ("wheels", "measured", "sim_initial", "sim_identified")
    total = {k: np.nansum([np.asarray(t[k], dtype=float) for t in turns if t.get(k) is not None], axis=0) for k in keys}
    rows = []
    for i in range(len(bins) - 1):
        w = total["wheels"][i]
        if w < MIN_TURN:
            continue
        eff = [total[k][i] / w for k in keys[1:]]
        rows.append(f"<tr><td class='l'>{bins[i]:.2f}–{bins[i + 1]:.2f}</td><td>{w:.1f}</td>"
                    + "".join(f"<td>{fmt(float(e), '.2f')}</td>" for e in eff) + "</tr>")
    if not rows:
        return ""
    head = ("<tr><th class='l'>turn tightness |ω<sub>R</sub>−ω<sub>L</sub>| / (|ω<sub>R</sub>|+|ω<sub>L</sub>|)</th>"
            "<th>commanded heading change [rad]</th><th>measured</th><th>simulated, initial</th>"
            "<th>simulated, identified</th></tr>")
    return page.scroll("<table>" + head + "".join(rows) + "</table>")


def sweep_finding(sw: Mapping[str, Any]) -> str:
    """The sweep's plateau in words: a largest usable h only when the plateau ends inside the sweep."""
    plateau = sw.get("plateau")
    dts = [h for h, e in zip(sw.get("dts") or [], sw.get("errors") or [], strict=False)]
    if not plateau:
        return "<p class='bad' data-sweep='none'>No plateau: every timestep of the sweep diverged.</p>"
    lo, hi = plateau
    if dts and hi >= max(dts):
        return (f"<p data-sweep='edge'>Plateau {fmt(lo)}–{fmt(hi)} s: it reaches the <b>edge of the sweep</b> (its "
                f"largest timestep, {fmt(hi)} s), so the largest usable h is not found here: it is {fmt(hi)} s or "
                "more. Add larger timesteps to <code>sweep.dts</code> to find it.</p>")
    return (f"<p data-sweep='found'>Plateau {fmt(lo)}–<b>{fmt(hi)} s</b>: the largest usable timestep is "
            f"{fmt(hi)} s.</p>")


def odometry_findings_table(findings: Sequence[OdometryFinding]) -> str:
    """The odometry's lag and jumps (``sysid.app.findings``) as one table under one warning line: a row
    per lagging run and per run or piece with jumps (every jump time listed), not a box per run."""
    from sysid.app.findings import COLUMNS, cells, summary

    rows = "".join(
        "<tr>" + "".join(f"<td class='l'>{esc(c)}</td>" for c in cells(f, every_time=True)) + "</tr>"
        for f in findings
    )
    head = "".join(f"<th class='l'>{c}</th>" for c in COLUMNS)
    return (f"<div class='warn' data-warning='odometry'>{esc(summary(findings))}; time from each run's start, "
            "lag: how far the odometry's speed and heading trail the wheels; jumps: how many, their largest step "
            "and implied acceleration.</div>"
            + page.scroll(f"<table data-table='odometry-findings'><tr>{head}</tr>{rows}</table>"))


def _meta_table(runs: Sequence[RunEntry], base: str | os.PathLike[str] | None = None) -> str:
    rows = []
    for r in runs:
        m = r.get("meta") or {}
        src = m.get("source")
        src = (", ".join(page.relative_path(p, base) for p in src) if isinstance(src, list)
               else (page.relative_path(src, base) if src else "–"))
        topics = m.get("topics")
        if isinstance(topics, Mapping):
            topics = ", ".join(f"{k}: {v}" for k, v in topics.items())
        segs = ", ".join(f"{k} {a:.1f}–{b:.1f} s" for k, (a, b) in (r.get("segments") or {}).items())
        sv: Mapping[str, Any] = r.get("solver") or {}
        health = "–" if not sv else f"{fmt(sv['unconverged_steps'], '.0%')} / {fmt(sv['residual_max'], '.2g')}"
        jumps = m.get("odometry_jumps")
        if jumps:
            steps = [j["step"] for j in jumps]
            largest = None if any(s is None or not math.isfinite(s) for s in steps) else max(steps)
            jumps = f"{len(jumps)} (≤ {fmt(largest, '.2f')} m)"
        else:
            jumps = "–" if jumps is None else "0"
        lag = m.get("odometry_lag")
        lag = "–" if not lag else f"{fmt(lag['translation'], '.2f')} / {fmt(lag['yaw'], '.2f')}"
        rows.append(
            f"<tr><td class='l wrap'>{esc(r['name'])}</td><td class='l'>{esc(r['split'])}</td>"
            f"<td class='l wrap'>{esc(m.get('bag_name') or '–')}</td><td class='l muted wrap'>{esc(src)}</td>"
            f"<td class='l muted wrap'>{esc(topics or '–')}</td><td>{fmt(m.get('duration_s'), '.2f')}</td>"
            f"<td>{esc(m.get('odom_samples', '–'))}</td><td class='l muted wrap'>{esc(segs or '–')}</td>"
            f"<td>{esc(health)}</td><td>{esc(jumps)}</td><td>{esc(lag)}</td></tr>"
        )
    return page.scroll(
        "<table data-table='runs'><tr><th class='l'>run</th><th class='l'>split</th><th class='l'>bag</th>"
        "<th class='l'>source</th>"
        "<th class='l'>topics</th><th>duration [s]</th><th>odom samples</th><th class='l'>segments</th>"
        "<th>solver: unconverged steps / worst residual [m/s]</th><th>odometry jumps (largest step)</th>"
        "<th>odometry lag behind wheels: speed / heading [s]</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_report(doc: FitResults | Mapping[str, Any], base: str | os.PathLike[str] | None = None) -> str:
    """The HTML text of the report for a results document (`sysid.app.results.FitResults`, or the
    results JSON's object it reads from). Files it names (the config, the runs' sources) are given
    relative to ``base``, the folder the page is written to (the working folder when None)."""
    res = as_results(doc)
    fit: Mapping[str, Any] = res.fit
    runs: list[RunEntry] = list(res.runs)
    held = [r for r in runs if r["split"] == "held_out"]
    train = [r for r in runs if r["split"] == "train"]
    parts: list[str] = []
    sim = res.simulator
    cfg = res.config
    pieces = f", runs cut into {fmt(cfg['split'])} s pieces" if cfg.get("split") else ""
    options = page.options_text(sim.options)
    parts.append(f"<h1>System identification: {esc(res.robot)}</h1>")
    parts.append(
        f"<p class='muted'>simulator <b>{esc(sim.name)}</b> ({esc(sim.label)}){options}, timestep "
        f"{fmt(cfg['dt'])} s, optimiser {esc(cfg['optimizer'])}, lever arm L = {fmt(cfg['lever_arm'])} m, "
        f"score window: {esc(cfg.get('segment') or 'whole run')}{pieces}. Created {esc(res.created)} by sysid "
        f"{esc(res.sysid_version)}; config {esc(page.relative_path(cfg.get('source', ''), base))}.</p>"
    )
    parts.append(generalisation_section(res))
    item = "piece" if cfg.get("split") else "run"  # what one scored row is
    s = res.summary
    if "held_out" in s:
        h = s["held_out"]
        parts.append(
            f"<p class='muted'>Held-out mean combined error over "
            f"{_n(len(held), 'piece' if cfg.get('split') else 'run')}: "
            f"{fmt(h['combined']['identified'], '.3f')} m at the identified parameters "
            f"(initial {fmt(h['combined']['initial'], '.3f')} m).</p>"
        )
    parts.append("<h2>Parameters</h2>" + parameter_table(res.parameters) + identifiability_note(res)
                 + run_shift_table(res))
    cal = res.calibration
    if cal:
        parts.append(
            f"<p class='muted'>{esc(cal['parameter'])} calibrated on the <i>{esc(cal['segment'])}</i> "
            f"segment of {_n(len(cal['runs']), 'training ' + item)} only (disjoint from the scored part), then "
            f"frozen: {fmt(cal['value'])}"
            + (f"; skipped (no segment): {esc(', '.join(cal['skipped']))}" if cal.get("skipped") else "")
            + ".</p>"
        )
    method = (fit.get("options") or {}).get("intervals", "iid")
    if method == "ess":
        n_eff = fit.get("n_eff")
        parts.append(
            f"<p class='muted' data-intervals='ess'>95% intervals: sandwich covariance with each training {item}'s "
            "residual variance scaled by its autocorrelation time, i.e. from an effective sample size "
            + (f"(n<sub>eff</sub> = {fmt(n_eff, '.3g')}) " if n_eff is not None else "")
            + "rather than every odometry sample as an independent observation (odometry errors are correlated "
            "in time), Student-t quantile, priors included, in the optimiser's coordinates (log for a log-scaled "
            "parameter); an end at or past a bound shows the bound marked (bound).</p>"
        )
    else:
        parts.append(
            "<p class='muted'>95% intervals: Gauss-Newton covariance s²(JᵀJ)⁻¹ with s² from the final residual, "
            "every residual taken as independent; odometry errors are correlated in time, so they are a lower "
            "bound on the uncertainty.</p>"
        )
    nuis = res.nuisance
    if nuis:
        parts.append(
            "<h2>Nuisance (per training run)</h2><p class='muted'>Fitted for each training run on its own beside "
            "the shared physical parameters, not physics: they are not in the parameter file, and every "
            "prediction (the held-out scores, the tables and plots below) runs at 0.</p>" + nuisance_table(nuis)
        )
    warnings = list(fit.get("warnings") or [])
    # the fit lists its calibration's warnings too (sysid.app.fitting.calibrate_and_fit); results written before
    # it did have them in the calibration record only
    warnings += [w for w in (cal.get("warnings") if cal else None) or [] if w not in warnings]
    warnings += climb_warnings(runs)
    warnings += [f"kinematic baseline: {w}" for w in ((res.baseline or {}).get("fit") or {}).get("warnings") or []]
    findings = res.odometry_findings
    if warnings or findings:
        parts.append("<h2>Warnings</h2>" + "".join(f"<div class='warn'>{esc(w)}</div>" for w in warnings)
                     + (odometry_findings_table(findings) if findings else ""))
    parts.append("<h2>Optimisation</h2>")
    parts.append(
        f"<p>loss {fmt(fit['loss_initial'])} → {fmt(fit['loss_final'])} m² after {fit['iterations']} "
        f"evaluations in {fmt(fit['wall_time'], '.1f')} s ({fmt(fit.get('sim_time'), '.1f')} s in "
        f"{fit.get('n_sim_calls', '–')} simulator calls); {esc(fit['message'].rstrip('.'))}; cond(JᵀJ) = "
        f"{fmt(fit.get('condition_number'), '.3g')}.</p>"
    )
    if fit.get("trace"):
        parts.append(page.figure("trace", trace_figure(fit["trace"], fit["optimizer"]), "loss per accepted iterate"))
    n_held_runs = len({r.get("run") or r["name"] for r in held})
    n_train_runs = len({r.get("run") or r["name"] for r in train})
    if held:
        parts.append(f"<h2>Held-out {item}s</h2>")
        if item == "piece":
            parts.append(f"<p class='muted'>{_n(len(held), 'piece')} of {_n(n_held_runs, 'held-out run')}, each "
                         "replayed from its own odometry start and scored on its own.</p>")
        parts.append(
            page.figure(
                "held-out-bars",
                bar_figure(held, f"held-out combined error per {item}"),
                f"combined error per held-out {item} at the initial and identified parameters",
            )
        )
    parts.append(_metrics_table(held + train, item))
    per_run = per_run_table(held + train)
    if per_run:
        parts.append("<h3>Per run: mean over its pieces</h3>" + per_run)
    parts.append(segment_section(held + train, cfg["lever_arm"], item))
    legend = (f"<p class='muted'>Time panels: <span class='band' style='background:{SEGMENT_BANDS['cruise']}33'>"
              f"</span>cruise segment (the calibration's), <span class='band' style='background:"
              f"{SEGMENT_BANDS['climb']}33'></span>climb segment (the pallet), dotted red lines: odometry jumps; "
              f"z panels span at least {MIN_Z_SPAN * 100:g} cm.</p>")
    if held:
        parts.append(legend)
    for i, r in enumerate(held):
        parts.append(run_heading(r) + page.figure(f"run-{r['name']}", run_figure(r, i)))
    if train:
        count = _n(len(train), "piece") + f" of {_n(n_train_runs, 'run')}" if item == "piece" else _n(len(train), "run")
        parts.append(
            f"<h2>Training {item}s ({count}) <button class='toggle' data-target='train-runs'>hide</button></h2>"
            "<div id='train-runs'>" + ("" if held else legend)
        )
        for i, r in enumerate(train):
            parts.append(run_heading(r) + page.figure(f"run-{r['name']}", run_figure(r, 1000 + i)))
        parts.append("</div>")
    tables = [(what, turn_table(rs)) for what, rs in (("held-out", held), ("training", train))]
    if any(t for _w, t in tables):
        parts.append(
            "<h2>Turn efficiency</h2><p>Heading turned per heading the wheels command (0 tightness: driving "
            "straight, 1: turning on the spot; intervals commanding under 0.2 rad/s left out). A model that "
            "turns too much or too little in one kind of turn shows here before it shows in the paths.</p>"
        )
        parts += [f"<h3>{what} runs</h3>{t}" for what, t in tables if t]
    sw: Mapping[str, Any] | None = res.sweep
    if sw:
        parts.append("<h2>Timestep sweep</h2>")
        parts.append(
            page.figure(
                "sweep",
                sweep_figure(sw),
                "usable plateau: the timesteps around the sweep minimum whose error stays within "
                f"{sw.get('factor', 2):g}× of it; its upper end is the largest usable h (Ostrich Fig. 3) unless it is "
                "the sweep's largest timestep",
            )
        )
        rows = "".join(
            f"<tr><td>{fmt(h)}</td><td>{fmt(e, '.4f')}</td><td>{fmt(w, '.2f')}</td></tr>"
            for h, e, w in zip(sw["dts"], sw["errors"], sw["wall_times"], strict=True)
        )
        parts.append(page.scroll(f"<table data-table='sweep'><tr><th>h [s]</th><th>mean combined [m]</th>"
                                 f"<th>wall [s]</th></tr>{rows}</table>"))
        parts.append(sweep_finding(sw))
    parts.append(f"<h2>{'Pieces' if item == 'piece' else 'Runs'}</h2>" + _meta_table(runs, base))
    dropped = res.dropped_runs
    if dropped:
        parts.append(
            f"<p><b>Left out ({len(dropped)}):</b> runs or pieces whose odometry jumps (implied acceleration above "
            f"{fmt((cfg.get('odometry_jumps') or {}).get('max_accel'), 'g')} m/s²: the lidar odometry "
            "relocalising, not motion), with <code>data.odometry_jumps.action: drop</code>: "
            + ", ".join(f"{esc(d['name'])} ({esc(d['split'])}, {len(d['jumps'])} jumps)" for d in dropped)
            + ".</p>"
        )
    timing = res.timing
    if timing:
        parts.append("<p class='muted'>timing: " + ", ".join(f"{k} {fmt(v, '.1f')} s" for k, v in timing.items())
                     + "</p>")
    return page.html_page(f"sysid report: {res.robot}", parts)
