"""The figures of the fit, cv and plan reports are laid out for reading, checked in matplotlib as they
are rendered (artists' window extents, `tests.helpers.figure_layout`): no legend over a bar, a marker
or a line, no tick labels running into each other, plain tick labels on a loss range under a decade,
whole-number iteration ticks; the run figures draw the kinematic baseline beside the model; the plan
of a terrain scene draws the terrain and the height along the path; the pages name files by paths
relative to the page, never absolute ones."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from sysid.app import report  # noqa: E402
from tests.helpers.figure_layout import capture_figures, legend_overlaps, renderer_of, tick_problems  # noqa: E402
from tests.helpers.report_fixtures import plan_document  # noqa: E402


@pytest.fixture(scope="module")
def fitted(baseline_fit) -> tuple[dict, Path]:
    return baseline_fit


def _problems(seen) -> list[tuple[str, list[str]]]:
    return [(salt, p) for salt, _fig, p in seen if p]


def test_the_checks_see_a_covered_bar_and_crowded_ticks():
    """The checks are not vacuous: a legend on a tall bar, "2×10⁰" labels and half-iteration ticks are found."""
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([0, 1, 2], [1.0, 1.0, 1.0], label="tall")
    ax.legend(loc="upper right")
    assert any("bar" in p for p in legend_overlaps(fig))
    ax.get_legend().set_bbox_to_anchor((1.02, 1.0))
    ax.get_legend().set_loc("upper left")
    assert legend_overlaps(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.semilogy([0, 1, 2, 3], [2.4, 2.0, 1.85, 1.8], "o-", label="loss")
    ax.set_xlabel("iteration")
    probs = tick_problems(fig)
    assert any("scientific" in p for p in probs) and any("fractional" in p for p in probs), probs
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], "-", label="diagonal")
    ax.legend(loc="center")
    assert any("line" in p for p in legend_overlaps(fig))
    plt.close(fig)


def test_fit_report_figures_are_laid_out(fitted, monkeypatch):
    doc, _path = fitted
    with capture_figures(monkeypatch) as seen:
        html = report.render_report(doc)
    assert len(seen) == html.count('class="fig"') >= 4
    assert _problems(seen) == []


@pytest.mark.parametrize("losses", [
    [2.42, 2.1, 1.95, 1.8],  # under a decade: plain labels, four iterates
    [2.42, 2.3, 2.25, 2.2, 2.19, 2.185, 2.18, 2.18, 2.179, 2.179, 2.179, 2.179],
    [120.0, 3.0, 0.2, 0.05, 0.011],  # four decades: a log axis
])
def test_trace_ticks_are_plain_and_whole(losses, monkeypatch):
    trace = [{"iter": i, "loss": v, "time": 0.1 * i, "theta": {}} for i, v in enumerate(losses)]
    with capture_figures(monkeypatch) as seen:
        report.trace_figure(trace, "lm")
    (_salt, fig, probs), = seen
    assert probs == []
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 2, labels  # the loss axis is labelled where the curve is


@pytest.mark.parametrize("n", [1, 3, 8])
def test_bar_legend_covers_no_bar(fitted, n, monkeypatch):
    doc, _path = fitted
    held = [r for r in doc["runs"] if r["split"] == "held_out"]
    runs = [copy.deepcopy(held[i % len(held)]) for i in range(n)]
    for i, r in enumerate(runs):
        r["name"] = f"held-out piece {i}"
        # the initial parameters' error tallest, as after a fit that helps
        r["metrics_initial"]["combined"] = 0.3 + 0.01 * i
        r["metrics_identified"]["combined"] = 0.1
        r["metrics_baseline"]["combined"] = 0.28
    with capture_figures(monkeypatch) as seen:
        report.bar_figure(runs, "held-out combined error per piece")
    assert [p for _s, _f, p in seen] == [[]]


def test_sweep_legend_covers_no_point(monkeypatch):
    sweep = {"dts": [0.01, 0.02, 0.05, 0.1, 0.2], "errors": [0.05, 0.05, 0.06, 0.2, None],
             "wall_times": [4, 2, 1, 0.5, 0.3], "plateau": [0.01, 0.05], "factor": 2.0}
    with capture_figures(monkeypatch) as seen:
        report.sweep_figure(sweep)
    assert [p for _s, _f, p in seen] == [[]]


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()] + [
        t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_run_figures_draw_the_baseline_beside_the_model(fitted, monkeypatch):
    doc, _path = fitted
    runs = [r for r in doc["runs"] if r.get("sim_baseline")]
    assert len(runs) == len(doc["runs"]), "the results hold the baseline's replay of every scored run"
    with capture_figures(monkeypatch) as seen:
        report.run_figure(runs[0], 0)
    (_salt, fig, probs), = seen
    assert probs == []
    texts = " | ".join(_legend_texts(fig))
    assert "kinematic baseline" in texts and "identified" in texts and "initial" in texts, texts
    old = copy.deepcopy(runs[0])  # results written without the baseline's replay still render
    old.pop("sim_baseline")
    with capture_figures(monkeypatch) as seen:
        report.run_figure(old, 1)
    assert "kinematic baseline" not in " | ".join(_legend_texts(seen[0][1]))


def test_report_paths_are_relative_to_the_page(fitted, tmp_path):
    doc, path = fitted
    folder = path.parent.parent
    html = path.read_text()
    assert str(folder) not in html and "config ../fit.yaml" in html, "the page names its config relative to itself"
    d = copy.deepcopy(doc)
    d["runs"][0]["meta"]["source"] = str(folder / "bags" / "run_1")
    again = report.render_report(d, base=tmp_path / "pages")
    assert str(folder) not in again and str(tmp_path) not in again
    assert os.path.relpath(folder / "bags" / "run_1", tmp_path / "pages") in again


def test_cv_report_figures_are_laid_out(cv_doc, tmp_path_factory, monkeypatch):
    from sysid.app.cv import write_cv

    doc = cv_doc
    out = tmp_path_factory.mktemp("cv-out")
    with capture_figures(monkeypatch) as seen:
        _json, page = write_cv(doc, out)
    assert len(seen) >= 2 and _problems(seen) == []
    html = page.read_text()
    assert str(Path(doc["config"]["source"]).parent) not in html  # no absolute path


@pytest.mark.parametrize("scene", ["terrain", "pallet", "flat"])
def test_plan_report_draws_what_its_captions_name(scene, monkeypatch):
    from matplotlib.patches import FancyArrowPatch

    from sysid.app.plan_report import render_plan_report

    doc = plan_document(scene)
    with capture_figures(monkeypatch) as seen:
        html = render_plan_report(doc)
    assert _problems(seen) == []
    figs = {salt: fig for salt, fig, _p in seen}
    xy = figs["plan-xy"]
    renderer = renderer_of(xy)
    arrows = [a for ax in xy.axes for a in ax.get_children() if isinstance(a, FancyArrowPatch)]
    arrows += [a.arrow_patch for ax in xy.axes for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    sizes = [a.get_window_extent(renderer) for a in arrows if a.get_visible()]
    assert any(b.width > 4 or b.height > 4 for b in sizes), "the goal's heading arrow the caption names is drawn"
    assert "arrow" in html
    assert str(Path(doc["params"]).parent) not in html  # the parameter file named relative to the page
    if scene == "terrain":
        ax = xy.axes[0]
        assert ax.images or any(type(c).__name__.endswith("ContourSet") for c in ax.collections), \
            "the terrain's heightmap is drawn under the path"
        assert "plan-z" in figs, "a terrain plan shows the height along the path"
        z = figs["plan-z"]
        assert any(len(line.get_xdata()) == len(doc["trials"][0]["chassis_z"]) for a in z.axes for line in a.lines)
