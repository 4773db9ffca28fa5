"""Screenshots of the reports in headless Chromium: at 1400 px and at a narrow width a page renders
every figure, logs no console error, does not run off the page sideways, and no table is cut off (a
wide table sits in a container that scrolls); at 1400 px no table of the fit, cv or plan page needs
scrolling sideways at all, and no debug line shows. The screenshots are PNGs of the window's width;
with ``SYSID_REPORT_SCREENSHOTS=DIR`` they are kept in DIR. The figures' own layout (legends over
data, tick labels) is checked in matplotlib: tests/app/test_report_layout.py.

Needs the Debian ``chromium`` package (``.ci/run`` installs it); skipped only when no chromium
binary is on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers.report_fixtures import plan_document

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium; .ci/run installs it)"
)
# 500 px is the narrowest window headless Chromium lays out (narrower windows keep a 500 px viewport)
WIDTHS = (1400, 500)


@pytest.fixture(scope="module")
def report(baseline_fit) -> tuple[dict, Path]:
    return baseline_fit


def _chromium(url: str, width: int, height: int, *mode: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=5000", f"--window-size={width},{height}", *mode, url],
            capture_output=True, text=True, timeout=120,
        )


def _status(dom: str) -> dict[str, str]:
    m = re.search(r'<p id="sysid-render-status"([^>]*)>', dom)
    assert m, "render-status element missing: the report's script did not run"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("width", WIDTHS)
def test_report_screenshot(report, tmp_path, width):
    doc, html_path = report
    html = html_path.read_text()
    n_figures = html.count('class="fig"')
    # trace, bars, every scored piece's run figure, sweep
    assert n_figures == 1 + 1 + len(doc["runs"]) + 1, n_figures
    url = html_path.resolve().as_uri()

    res = _chromium(url, width, 1000, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    st = _status(res.stdout)
    assert st["ok"] == "true", st
    assert st["figures"] == st["rendered"] == str(n_figures), st
    assert st["errors"] == "0", st
    assert st["overflow"] == "0", f"the page is wider than a {width} px window: {st}"
    assert st["clipped"] == "", f"tables cut off at {width} px (not in a scrolling container): {st['clipped']}"
    assert abs(int(st["width"]) - width) <= 20, st  # laid out at the width asked for
    console = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console

    shot = tmp_path / f"report-{width}px.png"
    res = _chromium(url, width, 2400, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    w, h = _png_size(shot)
    assert (w, h) == (width, 2400)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    keep = os.environ.get("SYSID_REPORT_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)


def test_screenshot_check_sees_a_table_cut_off(report, tmp_path):
    """The layout check is not vacuous: a wide table taken out of its scrolling container is reported."""
    _doc, html_path = report
    html = html_path.read_text()
    html = html.replace("<div class='scroll'><table data-table='runs'>", "<div><table data-table='runs'>", 1)
    html = html.replace("table {", "table { white-space: nowrap; ", 1)
    bad = tmp_path / "cut.html"
    bad.write_text(html)
    res = _chromium(bad.resolve().as_uri(), 1400, 1000, "--dump-dom")
    st = _status(res.stdout)
    assert "runs" in st["clipped"].split(","), st


def test_screenshot_check_sees_a_container_that_does_not_scroll(report, tmp_path):
    _doc, html_path = report
    html = html_path.read_text().replace(".scroll { overflow-x: auto;", ".scroll { overflow-x: visible;", 1)
    html = html.replace("table {", "table { white-space: nowrap; ", 1)
    bad = tmp_path / "noscroll.html"
    bad.write_text(html)
    st = _status(_chromium(bad.resolve().as_uri(), 500, 1000, "--dump-dom").stdout)
    assert "runs" in st["clipped"].split(","), st


# Measured in the page after its own script: what runs off the window, what a reader must scroll
# sideways to see (a table wider than its container), and the text the render check shows.
LAYOUT_JS = """
<script>
document.addEventListener('DOMContentLoaded', function () {  // after the page's own check (registered first)
  var width = document.documentElement.clientWidth, cut = [], scrolled = [];
  document.querySelectorAll('table, figure svg, pre').forEach(function (el, i) {
    var name = el.dataset.table || el.tagName.toLowerCase() + i;
    var sc = el.closest('.scroll');
    var scrolls = sc && ['auto', 'scroll'].indexOf(getComputedStyle(sc).overflowX) >= 0;
    if (scrolls && sc.scrollWidth > sc.clientWidth + 1) { scrolled.push(name); }
    if (!scrolls && el.getBoundingClientRect().right > width + 1) { cut.push(name); }
  });
  var out = document.createElement('p');
  out.id = 'layout-check';
  out.dataset.cut = cut.join(',');
  out.dataset.scrolled = scrolled.join(',');
  out.dataset.overflow = String(Math.max(0, document.documentElement.scrollWidth - width));
  var st = document.getElementById('sysid-render-status');
  out.dataset.shown = st ? st.innerText.trim() : 'no render status';
  out.hidden = true;
  document.body.appendChild(out);
});
</script>
"""


def _with_probe(page: Path) -> Path:
    probe = page.with_name(f"{page.stem}-probe.html")
    probe.write_text(page.read_text().replace("</body>", LAYOUT_JS + "</body>"))
    return probe


@pytest.fixture(scope="module")
def fit_page(report) -> Path:
    return _with_probe(report[1])


@pytest.fixture(scope="module")
def cv_page(cv_doc, tmp_path_factory) -> Path:
    from sysid.app.cv import write_cv

    _jp, page = write_cv(cv_doc, tmp_path_factory.mktemp("cv-page"))
    return _with_probe(page)


@pytest.fixture(scope="module")
def plan_page(tmp_path_factory) -> Path:
    """The plan page of a terrain scene (heightmap, height profile)."""
    from sysid.app.plan_report import render_plan_report

    page = tmp_path_factory.mktemp("plan-page") / "plan.html"
    page.write_text(render_plan_report(plan_document("terrain"), base=page.parent))
    return _with_probe(page)


def _probe(dom: str) -> dict[str, str]:
    m = re.search(r'<p id="layout-check"([^>]*)>', dom)
    assert m, "the layout probe did not run"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))


@pytest.mark.parametrize("kind", ["fit", "cv", "plan"])
@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_cut_off_or_shown_by_mistake(request, kind, width):
    page = request.getfixturevalue(f"{kind}_page")
    res = _chromium(page.resolve().as_uri(), width, 1000, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    got = _probe(res.stdout)
    problems = []
    if got["cut"]:
        problems.append(f"cut off at the window's edge: {got['cut']}")
    if got["overflow"] != "0":
        problems.append(f"runs {got['overflow']} px off the window sideways")
    if got["shown"]:
        problems.append(f"shows its render check: {got['shown']!r}")
    if width >= 1400 and got["scrolled"]:  # a desktop window shows every column: tables wrap rather than scroll
        problems.append(f"tables to scroll sideways: {got['scrolled']}")
    assert not problems, f"{kind} page at {width} px: " + "; ".join(problems)


def test_probe_sees_a_table_to_scroll_and_a_cut_figure(fit_page, tmp_path):
    """The probe is not vacuous: a table that cannot wrap is seen as one to scroll; a figure wider
    than the window outside any scrolling container as cut off."""
    html = fit_page.read_text()
    html = html.replace("</style>", "td, th { white-space: nowrap; }</style>", 1)
    html = html.replace("figure.fig svg { max-width: 100%; height: auto; }", "figure.fig svg { min-width: 1600px; }", 1)
    bad = tmp_path / "bad.html"
    bad.write_text(html)
    got = _probe(_chromium(bad.resolve().as_uri(), 1400, 1000, "--dump-dom").stdout)
    assert "runs" in got["scrolled"].split(","), got
    assert got["cut"].startswith("svg"), got
