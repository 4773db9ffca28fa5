"""Self-contained HTML report of a cross-validation (``sysid cv``), built with the fit report's
machinery (``sysid.app.report``: CSS, inline SVG figures, the render-status script, the parameter table).

Sections: the verdict and the held-out error per run (the mean over its pieces, from the fold that
held it out) beside the kinematic baseline fitted on the same training runs, with the means over
runs, folds and pieces; a bar chart of the same; failed folds with their errors; the spread of
each parameter across folds (table and one panel per parameter: every fold's value and 95 %
interval, the across-fold mean); then per fold its training and held-out runs, the fit's
convergence and its parameter tables (model and baseline); the execution (serial or Ray, workers,
wall times).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from sysid.app import page
from sysid.app.page import esc, fmt
from sysid.app.report import parameter_table, shift_table

WHO_LABEL = {"model": "model", "baseline": "kinematic baseline"}


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _pair(r: Mapping[str, Any], key: str, who: Sequence[str]) -> str:
    """The cells of one score for ``who`` (identified, starting values, kinematic baseline), the
    lowest in bold."""
    vals = [(r.get(w) or {}).get(key) for w in who]
    finite = [math.inf if v is None else v for v in vals]
    best = min(finite)
    return "".join(f"<td><b>{fmt(v, '.3f')}</b></td>" if len(who) > 1 and fv == best and math.isfinite(fv)
                   else f"<td>{fmt(v, '.3f')}</td>" for v, fv in zip(vals, finite, strict=True))


def error_table(doc: Mapping[str, Any]) -> str:
    """Per held-out run (fold, pieces) and the means: mean xy and combined, the identified model |
    its starting values | the kinematic baseline."""
    s = doc["summary"]
    who = [w for w in ("model", "start", "baseline") if isinstance(s.get(w), dict)]
    model = esc(doc["simulator"]["name"])
    rows = []
    for r in s["runs"]:
        rows.append(f"<tr data-run='{esc(r['run'])}'><td class='l'>{esc(r['run'])}</td><td>{r['fold'] + 1}</td>"
                    f"<td>{len(r['pieces'])}</td>" + _pair(r, "mean_xy", who) + _pair(r, "combined", who)
                    + "</tr>")
    if s["runs"]:
        for label, key in ((f"mean over {_n(s['n_runs'], 'run')}", "mean_over_runs"),
                           (f"mean over {_n(s['n_ok'], 'fold')}", "mean_over_folds"),
                           (f"mean over {_n(s['n_pieces'], 'piece')}", "mean_over_pieces")):
            r = {w: s[w][key] for w in who}
            rows.append(f"<tr data-run='{key}'><td class='l'><i>{label}</i></td><td></td><td></td>"
                        + _pair(r, "mean_xy", who) + _pair(r, "combined", who) + "</tr>")
    span = len(who)
    heads = {"model": f"{model}, identified", "start": f"{model}, starting values", "baseline": "kinematic baseline"}
    sub = "".join(f"<th class='wrap'>{heads[w]}</th>" for w in who)  # a simulator's name may be a long path
    head = (f"<tr><th class='l' rowspan='2'>held-out run</th><th rowspan='2'>fold</th><th rowspan='2'>pieces</th>"
            f"<th colspan='{span}'>mean xy distance [m]</th><th colspan='{span}'>combined error [m]</th></tr>"
            f"<tr>{sub}{sub}</tr>")
    return page.scroll(f"<table data-cv='held_out'>{head}{''.join(rows)}</table>")


def error_figure(doc: Mapping[str, Any]) -> str:
    import numpy as np

    s = doc["summary"]
    runs = s["runs"]
    fig, ax = page.plt.subplots(figsize=(max(5.0, 1.0 * len(runs) + 2), 3.4))
    x = np.arange(len(runs))
    def errors(who: str) -> list[float]:  # a diverged replay (None) draws no bar
        return [np.nan if r[who]["mean_xy"] is None else r[who]["mean_xy"] for r in runs]

    em = errors("model")
    if s.get("has_baseline"):
        eb = errors("baseline")
        ax.bar(x - 0.2, em, 0.4, color=page.COLORS["identified"], label="model")
        ax.bar(x + 0.2, eb, 0.4, color=page.COLORS["baseline"], label="kinematic baseline\n(same training runs)")
    else:
        ax.bar(x, em, 0.5, color=page.COLORS["identified"], label="model")
    if em and np.all(np.isfinite(em)):
        ax.axhline(float(np.mean(em)), color=page.COLORS["identified"], ls=":", lw=1, label=f"mean {np.mean(em):.3f} m")
    ax.set_xticks(x, [r["run"] for r in runs], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("held-out mean xy distance [m]")
    ax.set_title("held-out error per run (mean over its pieces)")
    return page.framed_svg(fig, ax, "cv-bars", axis="y")


def spread_table(rows: Sequence[Mapping[str, Any]], n_folds: int) -> str:
    head = ("<tr><th class='l'>parameter</th><th>unit</th>"
            + "".join(f"<th>fold {i + 1}</th>" for i in range(n_folds))
            + "<th>mean</th><th>std</th><th>relative spread</th><th>intervals holding the mean</th>"
              "<th>not determined</th><th>spread / interval half-width</th></tr>")
    body = []
    for p in rows:
        cells = ["<td>–</td>" if pf is None else _fold_cell(pf, p) for pf in p["folds"]]
        rel = p.get("relative_spread")
        soc = p.get("spread_over_ci")
        body.append(
            f"<tr data-param='{esc(p['name'])}'><td class='l'><b>{esc(p['name'])}</b></td>"
            f"<td>{esc(p.get('unit') or '')}</td>{''.join(cells)}<td><b>{fmt(p['mean'])}</b></td>"
            f"<td>{fmt(p['std'], '.3g')}</td>"
            f"<td>{fmt(None if rel is None else 100 * rel, '.1f')}{' %' if rel is not None else ''}</td>"
            f"<td>{p['folds_ci_contain_mean']} of {p['folds_with_ci']}</td>"
            f"<td class='{'bad' if p.get('folds_not_determined') else ''}'>{p.get('folds_not_determined', 0)}</td>"
            f"<td class='{'bad' if soc is not None and soc > 1 else ''}'>{fmt(soc, '.2f')}</td></tr>")
    return page.scroll(f"<table data-table='spread'>{head}{''.join(body)}</table>")


def _fold_cell(pf: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """A fold's cell of the spread table: its value, a bound it stopped at, its interval and
    whether its runs determine the parameter (`sysid.app.cv.fold_interval`)."""
    from sysid.app.cv import fold_interval

    iv = fold_interval(pf, row).strip()
    nd = iv.endswith("not determined")
    iv = iv.removesuffix("not determined").strip()
    ci_s = f"<br><span class='muted'>{esc(iv)}</span>" if iv else ""
    if nd:
        ci_s += "<br><span class='bad' data-determined='not'>not determined</span>"
    bound = f" <span class='bad'>({esc(pf['at_bound'])} bound)</span>" if pf.get("at_bound") else ""
    return f"<td>{fmt(pf['value'])}{bound}{ci_s}</td>"


def spread_figure(rows: Sequence[Mapping[str, Any]], salt: str) -> str:
    import numpy as np

    n = len(rows)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = page.plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.6 * nrows), squeeze=False)
    for ax, p in zip(axes.flat, rows, strict=False):
        got = [pf for pf in p["folds"] if pf is not None and pf["value"] is not None]
        x = np.array([pf["fold"] + 1 for pf in got], float)
        v = np.array([pf["value"] for pf in got], float)
        lo = np.array([v[i] - pf["ci95"][0] if pf.get("ci95") and pf["ci95"][0] is not None else 0.0
                       for i, pf in enumerate(got)])
        hi = np.array([pf["ci95"][1] - v[i] if pf.get("ci95") and pf["ci95"][1] is not None else 0.0
                       for i, pf in enumerate(got)])
        ax.errorbar(x, v, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt="o", color=page.COLORS["identified"],
                    ecolor="#999", capsize=3, ms=4)
        if p.get("mean") is not None:
            ax.axhline(p["mean"], color="#555", ls=":", lw=1)
        ax.set_title(f"{p['name']}" + (f" [{p['unit']}]" if p.get("unit") else ""), fontsize=9)
        ax.set_xticks(x)
        ax.set_xlim(0.5, len(p["folds"]) + 0.5)  # every fold's slot, none on the frame
        ax.set_xlabel("fold", fontsize=8)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    return page.svg(fig, salt)


def fold_section(f: Mapping[str, Any]) -> str:
    held = ", ".join(f.get("held_out_runs") or [])
    wall = (f.get("execution") or {}).get("wall_time")
    parts = [f"<h3 data-fold='{f['index']}'>Fold {f['index'] + 1}: held out {esc(held)}"
             + (f" <span class='muted'>({wall:.1f} s)</span>" if wall is not None else "") + "</h3>"]
    if f["status"] != "ok":
        parts.append(f"<div class='warn'><b>failed</b>: {esc(f.get('error'))}</div>")
        if f.get("traceback"):
            parts.append(f"<pre class='muted'>{esc(f['traceback'])}</pre>")
        return "".join(parts)
    parts.append(f"<p class='muted'>trained on {esc(', '.join(f.get('train_runs') or []))}</p>")
    for who in ("model", "baseline"):
        rows = (f.get("parameters") or {}).get(who)
        fit = (f.get("fit") or {}).get(who)
        if not rows or not fit:
            continue
        parts.append(f"<p><b>{WHO_LABEL[who]}</b>: loss {fmt(fit.get('loss_initial'))} → {fmt(fit.get('loss_final'))} "
                     f"m² in {esc(fit.get('iterations'))} evaluations; converged: {esc(fit.get('converged'))} "
                     f"({esc(fit.get('convergence'))})</p>" + parameter_table(rows))
    if f.get("run_shifts"):
        rows = (f.get("parameters") or {}).get("model") or []
        parts.append(shift_table(f["run_shifts"], {r["name"]: float(r["value"]) for r in rows},
                                 {r["name"]: r for r in rows}))
    if f.get("baseline_status") != "fitted" and f.get("baseline_reason"):
        parts.append(f"<p class='muted'>kinematic baseline {esc(f['baseline_reason'])}</p>")
    warns = f.get("warnings") or []
    if warns:
        parts.append("".join(f"<div class='warn'>{esc(w)}</div>" for w in warns))
    return "".join(parts)


def render_cv_report(doc: Mapping[str, Any], base: str | os.PathLike[str] | None = None) -> str:
    """The HTML text of the CV report for a CV document (``sysid.app.cv.cross_validate``); the config
    is named relative to ``base``, the page's folder (the working folder when None)."""
    s = doc["summary"]
    cfg = doc.get("config") or {}
    ex = doc.get("execution") or {}
    from sysid.app.cv import folds_label

    parts = [f"<h1>Cross-validation: {esc(doc['robot'])}</h1>"]
    parts.append(
        f"<p class='muted'>model <b>{esc(doc['simulator']['name'])}</b>"
        f"{page.options_text(doc['simulator'].get('options'))}, timestep {fmt(cfg.get('dt'))} s, optimiser "
        f"{esc(cfg.get('optimizer'))}, {esc(folds_label(doc))} over "
        f"{_n(len(doc.get('runs') or []), 'run')}"
        + (f", runs cut into {fmt(cfg['split'])} s pieces (a run's pieces stay in one fold)"
           if cfg.get("split") else "")
        + f"; every fold fitted with the same settings. Created {esc(doc.get('created'))} by sysid "
        f"{esc(doc.get('sysid_version', ''))}; config {esc(page.relative_path(cfg.get('source', ''), base))}.</p>")
    parts.append("<h2>Held-out error</h2>")
    if s.get("verdict"):
        v = s["verdict"]
        parts.append(f"<p class='verdict'><b>{esc(v[0].upper() + v[1:])}.</b>"
                     + ("" if s.get("has_baseline") else " No kinematic baseline to compare with.") + "</p>")
    elif s["runs"]:
        m = s["model"]["mean_over_runs"]
        parts.append(f"<p class='verdict'><b>Held-out mean xy distance {fmt(m['mean_xy'], '.3f')} m, combined error "
                     f"{fmt(m['combined'], '.3f')} m (mean over {_n(s['n_runs'], 'run')})</b>; no kinematic "
                     "baseline to compare with.</p>")
    if s["n_failed"]:
        parts.append("".join(f"<div class='warn'><b>fold {f['fold'] + 1} (held out {esc(', '.join(f['held_out']))}) "
                             f"failed</b>: {esc(f['error'])}</div>" for f in s["failed"]))
    if s["runs"]:
        parts.append(error_table(doc))
        parts.append(page.figure("cv-bars", error_figure(doc), "held-out mean xy distance per run, each scored by the "
                             "fold that held it out"))
        parts.append("<p class='muted'>A run's figure is the mean over its pieces; each run is held out exactly "
                     "once. The mean over runs counts each run once, over folds each fold once, over pieces each "
                     "piece once.</p>")
    for who in ("model", "baseline"):
        rows = [p for p in (doc.get("parameters") or {}).get(who) or [] if p["free"]]
        if not rows:
            continue
        parts.append(f"<h2>Parameters across folds: {WHO_LABEL[who]}</h2>")
        parts.append(spread_table(rows, s["n_folds"]))
        parts.append(page.figure(f"spread-{who}", spread_figure(rows, f"spread-{who}"),
                             "each fold's estimate and 95 % interval; dotted: the mean across folds"))
    parts.append("<p class='muted'>Spread across folds measures transfer: an estimate that moves between folds "
                 "by more than its intervals (spread / interval half-width above 1, in red) is fitted to its "
                 "training runs rather than to the robot.</p>")
    parts.append("<h2>Folds</h2>" + "".join(fold_section(f) for f in doc.get("folds") or []))
    walls = [w for w in ex.get("fold_wall_times") or [] if w is not None]
    parts.append(
        f"<p class='muted'>execution: {esc(ex.get('backend'))}, {esc(ex.get('workers'))} worker(s)"
        + (f", Ray {esc(ex.get('ray_version'))} ({fmt(ex.get('cluster_cpus'), 'g')} CPUs"
           + (f", address {esc(ex['address'])}" if ex.get("address") else ", local cluster") + ")"
           if ex.get("backend") == "ray" else "")
        + (f", kernel warm-up {fmt(ex.get('warm_up_s'), '.1f')} s" if ex.get("warm_up_s") is not None else "")
        + f"; wall time {fmt(ex.get('wall_time'), '.1f')} s"
        + (f" (folds {', '.join(f'{w:.1f}' for w in walls)} s, sum {sum(walls):.1f} s)" if walls else "") + ".</p>")
    return page.html_page(f"sysid cross-validation: {doc['robot']}", parts)
