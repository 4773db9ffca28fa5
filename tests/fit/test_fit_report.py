"""The HTML report: self-contained, and renders every figure without console errors in headless
Chromium (Debian `chromium` package; skipped when it is not installed)."""

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from sysid.app.report import render_report  # noqa: E402
from sysid.cli import main  # noqa: E402
from tests.helpers.fit_doubles import noisy_runs  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless chromium not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    train, held = noisy_runs(5.0)
    for r in train:
        r.save(d / f"{r.name}.npz")
    from ingest.run import PalletPose

    held.pallet = PalletPose(2.0, 0.2, 0.3)  # footprint drawn in the top-down plot
    held.save(d / f"{held.name}.npz")
    out = d / "out"
    assert (
        main(
            [
                "fit",
                "-q",
                "--robot",
                str(ROOT / "models/helhest/robot.yaml"),
                "--simulator",
                "kinematic",
                "--train",
                str(d / "train-*.npz"),
                "--held-out",
                str(d / "held-0-slalom.npz"),
                "--dt",
                "0.05",
                "--sweep-dts",
                "0.02,0.05,0.1,0.2",
                "--params-out",
                str(out / "p.yaml"),
                "--report",
                str(out / "report.html"),
            ]
        )
        == 0
    )
    return json.loads((out / "report.json").read_text()), out / "report.html"


def render_in_chromium(html_path: Path) -> tuple[str, str]:
    """(dumped DOM after scripts ran, chromium's stderr log with console messages)."""
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=5000",
                "--window-size=1200,900",
                "--dump-dom",
                html_path.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, res.stderr


def status(dom: str) -> dict[str, str]:
    m = re.search(r'<p id="sysid-render-status"([^>]*)>', dom)
    assert m, "render-status element missing: the inline script did not run"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))


def test_report_is_self_contained(results):
    doc, html_path = results
    html = html_path.read_text()
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:|//)', html)  # nothing to fetch
    assert "<script src" not in html and "<link" not in html
    assert html.count('class="fig"') == 1 + 1 + 3 + 1  # trace, bars, 3 runs, sweep
    for row in doc["parameters"]:
        assert f"<b>{row['name']}</b>" in html
    assert "pallet footprint" in html and "plateau" in html


@needs_chromium
def test_report_renders_every_figure_without_console_errors(results):
    _doc, html_path = results
    dom, log = render_in_chromium(html_path)
    st = status(dom)
    assert st["ok"] == "true", st
    assert st["figures"] == st["rendered"] == "6" and st["errors"] == "0"
    console = [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console


@needs_chromium
def test_render_check_detects_a_broken_page(results, tmp_path):
    doc, _ = results
    html = render_report(doc)
    html = html.replace("<svg", "<svg style='display:none'", 1)  # one figure does not render
    html = html.replace("</body>", "<script>console.error('boom'); undefinedFunction();</script></body>")
    bad = tmp_path / "bad.html"
    bad.write_text(html)
    dom, log = render_in_chromium(bad)
    st = status(dom)
    assert st["ok"] == "false" and st["failed"] and st["rendered"] == "5", st
    assert st["errors"] == "2", st  # console.error + the uncaught ReferenceError
    assert "boom" in log  # chromium's console log, which the positive test requires to be clean


def test_report_rerenders_from_results_file(results, tmp_path):
    doc, html_path = results
    again = render_report(doc)
    # identical apart from nothing: same figures, same tables
    assert again.count("<svg") == html_path.read_text().count("<svg")


def test_report_leads_with_generalisation_without_a_second_baseline(results):
    """The model here is the kinematic baseline itself: no second copy is fitted, the results say
    why, and the report still opens with the held-out figures (per run and mean)."""
    doc, html_path = results
    assert doc["baseline"]["status"] == "skipped" and "itself the kinematic baseline" in doc["baseline"]["reason"]
    html = html_path.read_text()
    first = html.index("<h2>")
    assert html.startswith("<h2>Generalisation</h2>", first)
    held = doc["generalisation"]["held_out"]
    assert held["n_runs"] == 1 and held["runs"][0]["run"] == "held-0-slalom"
    assert f"{held['mean_over_runs']['model']['mean_xy']:.3f} m" in html[first:html.index("<h2>Parameters")]
