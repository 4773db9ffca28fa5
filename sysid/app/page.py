"""What every HTML page of sysid shares (the fit's report, cross-validation's, the plan's): the inline
script that checks every figure rendered and records it in ``#sysid-render-status`` (`SCRIPT`,
`RENDER_STATUS`), the style sheet, the colours, figures as inline SVG (matplotlib's object API, no pyplot),
number and text formatting, wide tables in containers that scroll sideways, paths relative to the page's
folder.
"""

from __future__ import annotations

import html
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure


class _Figures:
    """The pyplot calls the page modules make (``subplots``, ``figure``) on matplotlib's object API: a
    page's figure is drawn to SVG without pyplot, so importing or drawing a page leaves matplotlib's global state
    alone (the backend a notebook's inline plots use, pyplot's list of open figures)."""

    @staticmethod
    def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
                 **kw: Any) -> tuple[Figure, Any]:
        fig = Figure(figsize=figsize)
        return fig, fig.subplots(nrows, ncols, **kw)

    @staticmethod
    def figure(figsize: tuple[float, float] | None = None) -> Figure:
        return Figure(figsize=figsize)


plt = _Figures()

__all__ = ["COLORS", "CSS", "RENDER_STATUS", "SCRIPT", "esc", "figure", "fmt", "html_page", "legend_outside",
           "loss_axis", "options_text", "plain_tick", "plt", "relative_path", "scroll", "svg"]

COLORS = {"measured": "#222222", "initial": "#9a9a9a", "identified": "#d62728", "pallet": "#8c564b",
          "baseline": "#1f77b4"}


SCRIPT = """
(function () {
  var errors = [];
  var origError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, ' '));
    return origError.apply(console, arguments);
  };
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  function check() {
    var figs = document.querySelectorAll('figure.fig');
    var ok = 0, bad = [];
    figs.forEach(function (f) {
      var svg = f.querySelector('svg');
      var box = svg ? svg.getBoundingClientRect() : null;
      var drawn = svg ? svg.querySelectorAll('path, use, text').length : 0;
      if (svg && box.width > 10 && box.height > 10 && drawn > 0) { ok += 1; f.dataset.rendered = 'true'; }
      else { bad.push(f.dataset.fig || '?'); }
    });
    var st = document.getElementById('sysid-render-status');
    st.dataset.figures = String(figs.length);
    st.dataset.rendered = String(ok);
    st.dataset.failed = bad.join(',');
    st.dataset.errors = String(errors.length);
    var root = document.documentElement, width = root.clientWidth, clipped = [];
    st.dataset.overflow = String(Math.max(0, root.scrollWidth - width));
    document.querySelectorAll('table').forEach(function (t, i) {
      var sc = t.closest('.scroll');  // a wide table must sit in a container that scrolls sideways
      var box = sc && ['auto', 'scroll'].indexOf(getComputedStyle(sc).overflowX) >= 0 ? sc : t;
      if (box.getBoundingClientRect().right > width + 1) { clipped.push(t.dataset.table || String(i)); }
    });
    st.dataset.clipped = clipped.join(',');
    st.dataset.width = String(width);
    st.dataset.ok = String(ok === figs.length && figs.length > 0 && errors.length === 0);
    if (bad.length || errors.length) {  // said on the page only when something went wrong
      st.textContent = (bad.length ? bad.length + ' of ' + figs.length + ' figures did not render: ' + bad.join(', ')
                        : '') + (errors.length ? (bad.length ? '; ' : '') + 'errors: ' + errors.join(' | ') : '');
    }
  }
  document.querySelectorAll('button.toggle').forEach(function (b) {
    b.addEventListener('click', function () {
      var el = document.getElementById(b.dataset.target);
      el.hidden = !el.hidden;
      b.textContent = el.hidden ? 'show' : 'hide';
    });
  });
  if (document.readyState === 'loading') { document.addEventListener('DOMContentLoaded', check); } else { check(); }
})();
"""


CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .92em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
figure.fig { margin: .8em 0; } figure.fig svg { max-width: 100%; height: auto; }
figcaption { font-size: .9em; color: #555; }
.warn { background: #fff4e5; border-left: 4px solid #f0a020; padding: .4em .8em; margin: .3em 0; }
.ok { color: #2a7a2a; } .bad { color: #b02020; } .warnc { color: #a66a00; } .muted { color: #777; font-size: .9em; }
#sysid-render-status { font-size: .9em; color: #b02020; } #sysid-render-status:empty { display: none; }
.gen { display: flex; flex-wrap: wrap; gap: 0 2.5em; align-items: flex-start; }
.gen h3 { margin-bottom: .2em; } p.verdict { font-size: 1.08em; }
button.toggle { font-size: .8em; }
.scroll { overflow-x: auto; max-width: 100%; }
.gen > div { min-width: 0; max-width: 100%; }
p, h3, figcaption, td.wrap, th.wrap { overflow-wrap: anywhere; }
td.wrap, th.wrap { min-width: 6em; }
.scroll table { margin: .3em 0; }
span.band { display: inline-block; width: 1.6em; height: .8em; vertical-align: middle; margin-right: .2em; }
@media (max-width: 700px) { body { margin: 1em auto; padding: 0 .5em; } figure.fig { margin: .5em 0; } }
"""


# the page's render check writes here (data attributes for tests); it shows text only when a figure failed
RENDER_STATUS = "<p id='sysid-render-status' data-ok='pending'></p>"


def html_page(title: str, parts: list[str]) -> str:
    """The HTML document of a report: ``title`` (escaped here), the sections ``parts`` (HTML) in order, then the
    render status that `SCRIPT` fills in, with the style sheet and the script inline."""
    body = "\n".join([*parts, RENDER_STATUS])
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body>\n{body}\n<script>{SCRIPT}</script></body></html>\n"
    )


def relative_path(path: Any, base: str | os.PathLike[str] | None = None) -> str:
    """``path`` as a page shows it: an absolute path relative to ``base`` (the page's folder; the
    working folder when None), anything else (a relative path, a name, a module) as it is."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    try:
        return Path(os.path.relpath(text, os.path.abspath(base) if base is not None else None)).as_posix()
    except ValueError:  # another drive (Windows): no relative path exists
        return Path(text).name


def legend_outside(ax: Any, handles: Sequence[Any] | None = None, **kw: Any) -> Any:
    """The axes' legend beside its right edge, where it covers no data."""
    extra = {"handles": handles} if handles is not None else {}
    return ax.legend(**extra, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                     fontsize=kw.pop("fontsize", 8), **kw)


def plain_tick(v: float, _pos: Any = None) -> str:
    return f"{v:g}"


def loss_axis(ax: Any, values: Sequence[float], axis: str = "y") -> None:
    """A positive quantity's axis: logarithmic when it spans a decade or more, linear otherwise, tick
    labels as plain numbers either way (never "2×10⁰")."""
    import numpy as np
    from matplotlib.ticker import LogLocator, NullFormatter

    v = np.asarray([x for x in values if x is not None], float)
    v = v[np.isfinite(v) & (v > 0)]
    target = ax.yaxis if axis == "y" else ax.xaxis
    if v.size == 0 or v.max() / v.min() < 10:
        ax.ticklabel_format(axis=axis, style="plain", useOffset=False)  # "1.85", not "+1.8" and "0.05"
        return
    getattr(ax, f"set_{axis}scale")("log")
    decades = math.log10(v.max() / v.min())
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 3 else (1.0,)))
    target.set_major_formatter(plain_tick)
    target.set_minor_formatter(NullFormatter())


def svg(fig: Any, salt: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight")  # not pyplot's: nothing to close
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline SVG needs neither


def framed_svg(fig: Any, ax: Any, salt: str, **grid: Any) -> str:
    """``svg`` of a one-axes figure with its legend outside, a light grid (``grid``: more of ``ax.grid``'s
    arguments, e.g. ``axis="y"``) and a tight layout."""
    legend_outside(ax)
    ax.grid(True, alpha=0.3, **grid)
    fig.tight_layout()
    return svg(fig, salt)


def figure(name: str, svg_text: str, caption: str = "") -> str:
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure class="fig" data-fig="{html.escape(name)}">{svg_text}{cap}</figure>'


def fmt(v: Any, spec: str = ".4g") -> str:
    """A figure of the results as text; ``n/a`` for a missing or non-finite one (a replay that diverged)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def esc(v: Any) -> str:
    return html.escape(str(v))


def options_text(options: Mapping[str, Any] | None) -> str:
    """' with name value, ...' for a simulator's options (escaped; '' when there are none)."""
    return (" with " + ", ".join(f"{esc(k)} {esc(v)}" for k, v in options.items())) if options else ""


def scroll(table: str) -> str:
    """A wide table in a container that scrolls sideways instead of running off the page."""
    return f"<div class='scroll'>{table}</div>"
