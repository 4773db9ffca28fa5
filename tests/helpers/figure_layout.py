"""Layout checks of a drawn matplotlib figure, from its artists' window extents (display pixels, the
Agg renderer: deterministic and independent of any browser):

- a legend drawn over data: a bar, a marker or a line (errorbars, filled bands) of its axes;
- tick labels of one axis running into each other;
- tick labels in the "2×10⁰" style (a log axis spanning less than a decade labelled by its minor ticks);
- fractional ticks on an iteration axis.

Backgrounds (images, contours, shaded spans, the pallet's footprint) are not data: a legend may sit on them.
``capture_figures`` collects every figure the reports render (their ``svg``) so a test checks each.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.container import BarContainer
from matplotlib.path import Path as MplPath
from matplotlib.transforms import Bbox

PAD = 1.0  # [px] extents closer than this do not count as overlapping (antialiasing, rounding)


def _overlap(a: Bbox, b: Bbox) -> bool:
    return a.x0 + PAD < b.x1 and b.x0 + PAD < a.x1 and a.y0 + PAD < b.y1 and b.y0 + PAD < a.y1


def _clip(box: Bbox, to: Bbox) -> Bbox | None:
    x0, y0, x1, y1 = max(box.x0, to.x0), max(box.y0, to.y0), min(box.x1, to.x1), min(box.y1, to.y1)
    return Bbox([[x0, y0], [x1, y1]]) if x1 > x0 and y1 > y0 else None


def _runs(xy: np.ndarray) -> Iterator[np.ndarray]:
    """The finite stretches of a polyline (NaN breaks a line)."""
    ok = np.all(np.isfinite(xy), axis=1)
    start = None
    for i, good in enumerate([*ok, False]):
        if good and start is None:
            start = i
        elif not good and start is not None:
            yield xy[start:i]
            start = None


def _polyline_hits(xy: np.ndarray, box: Bbox, joined: bool, marker_px: float) -> bool:
    grown = box.expanded(1.0, 1.0).padded(marker_px / 2 - PAD)
    for part in _runs(xy):
        inside = ((part[:, 0] > grown.x0) & (part[:, 0] < grown.x1) & (part[:, 1] > grown.y0) & (part[:, 1] < grown.y1))
        if marker_px > 0 and inside.any():
            return True
        if joined and len(part) > 1 and MplPath(part).intersects_bbox(box.padded(-PAD), filled=False):
            return True
        if joined and len(part) == 1 and inside.any():
            return True
    return False


def renderer_of(fig: Any) -> Any:
    """``fig`` drawn by Agg (a closed figure gets an Agg canvas again); its renderer."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def visible_axes(fig: Any) -> Iterator[tuple[int, Any]]:
    """(index, axes) of ``fig``'s visible axes."""
    return ((k, ax) for k, ax in enumerate(fig.axes) if ax.get_visible())


def legend_overlaps(fig: Any) -> list[str]:
    """What each legend of ``fig`` covers: bars, markers or lines of its axes (empty: nothing)."""
    renderer = renderer_of(fig)
    out: list[str] = []
    for k, ax in visible_axes(fig):
        legends = [leg for leg in (ax.get_legend(), *fig.legends) if leg is not None and leg.get_visible()]
        area = ax.get_window_extent(renderer)
        name = ax.get_title() or f"axes {k}"
        texts = [t for t in (*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label, ax.title)
                 if t.get_visible() and t.get_text()]
        for leg in legends:
            whole = leg.get_window_extent(renderer)
            hit = [t.get_text() for t in texts if _overlap(whole, t.get_window_extent(renderer))]
            if hit:
                out.append(f"{name}: legend covers the labels {hit}")
            box = _clip(whole, area)
            if box is None:  # drawn outside this axes' plotting area
                continue
            bars = [p for c in ax.containers if isinstance(c, BarContainer) for p in c.patches]
            covered = [p.get_label() for p in bars if p.get_visible() and p.get_height() != 0
                       and (pb := _clip(p.get_window_extent(renderer), area)) is not None and _overlap(box, pb)]
            if covered:
                out.append(f"{name}: legend covers {len(covered)} bar(s)")
            for line in ax.get_lines():
                if not line.get_visible():
                    continue
                xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
                joined = line.get_linestyle() not in ("None", "none", "", " ")
                marker = line.get_marker() not in (None, "None", "none", "", " ")
                marker_px = line.get_markersize() * fig.dpi / 72 if marker else 0.0
                if _polyline_hits(xy, box, joined, marker_px):
                    out.append(f"{name}: legend covers the line {line.get_label()!r}")
            for coll in ax.collections:
                if not coll.get_visible():
                    continue
                if isinstance(coll, PathCollection):  # scatter markers
                    pts = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), float))
                    if _polyline_hits(pts, box, False, 6.0):
                        out.append(f"{name}: legend covers markers {coll.get_label()!r}")
                elif isinstance(coll, LineCollection | PolyCollection) and type(coll).__name__ != "QuadContourSet":
                    tr = coll.get_transform()
                    if any(_polyline_hits(tr.transform(np.asarray(p.vertices, float)), box, True, 0.0)
                           for p in coll.get_paths()):
                        out.append(f"{name}: legend covers {type(coll).__name__} {coll.get_label()!r}")
    return out


def tick_problems(fig: Any) -> list[str]:
    """Tick labels that run into each other, "a×10^b" labels, fractional iteration ticks."""
    renderer = renderer_of(fig)
    out: list[str] = []
    for k, ax in visible_axes(fig):
        name = ax.get_title() or f"axes {k}"
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            lo, hi = sorted(axis.get_view_interval())
            ticks = [t for t in axis.get_major_ticks() + axis.get_minor_ticks()
                     if t.label1.get_visible() and t.label1.get_text() and lo - 1e-12 <= t.get_loc() <= hi + 1e-12]
            texts = [t.label1.get_text() for t in ticks]
            sci = [s for s in texts if "times" in s or "×" in s]
            if sci:
                out.append(f"{name}: {which} tick labels in scientific form {sci}")
            boxes = [t.label1.get_window_extent(renderer) for t in ticks]
            upright = [t.label1.get_rotation() % 90 == 0 for t in ticks]  # a slanted label's box is not its ink
            for i in range(len(boxes)):
                for j in range(i + 1, len(boxes)):
                    if upright[i] and upright[j] and _overlap(boxes[i], boxes[j]):
                        out.append(f"{name}: {which} tick labels {texts[i]!r} and {texts[j]!r} overlap")
            if "iteration" in axis.get_label().get_text():
                frac = [t.get_loc() for t in ticks if not math.isclose(t.get_loc(), round(t.get_loc()), abs_tol=1e-9)]
                if frac:
                    out.append(f"{name}: fractional iteration ticks {frac}")
    return out


def layout_problems(fig: Any) -> list[str]:
    return legend_overlaps(fig) + tick_problems(fig)


@contextlib.contextmanager
def capture_figures(monkeypatch: Any) -> Iterator[list[tuple[str, Any, list[str]]]]:
    """Check every figure the report modules render: yields a list that receives (figure salt, the
    figure, its layout problems) for each ``svg`` call made inside the block."""
    import sysid.app.page as page

    seen: list[tuple[str, Any, list[str]]] = []
    original = page.svg

    def checked(fig: Any, salt: str, *args: Any, **kwargs: Any) -> str:
        seen.append((salt, fig, layout_problems(fig)))
        return original(fig, salt, *args, **kwargs)

    monkeypatch.setattr(page, "svg", checked)  # the report, cv and plan pages call page.svg
    import sysid.app.run_figure as run_figure

    monkeypatch.setattr(run_figure, "svg", checked)  # a run's figure renders through its own import
    yield seen
