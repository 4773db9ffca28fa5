"""Importing the page modules (and the fit's, which compute the report's tables) and drawing a page figure leave
matplotlib's global state alone: a notebook that imports `sysid.app` keeps its inline plots."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import matplotlib
matplotlib.use("svg")  # any backend the caller chose (a notebook's inline one)
import matplotlib.pyplot as plt
import sysid.app.document, sysid.app.fitting, sysid.app.report, sysid.app.cv_report, sysid.app.plan_report
from sysid.app import page
fig, ax = page.plt.subplots(figsize=(2, 1))
ax.plot([0, 1], [0, 1])
assert page.svg(fig, "t").startswith("<svg")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert plt.get_fignums() == [], plt.get_fignums()  # the page's figure is not one of pyplot's
"""


def test_page_modules_keep_the_callers_matplotlib_backend():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
