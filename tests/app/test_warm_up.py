"""A fit compiles the engine's kernels on a background thread while it reads its runs
(``sysid.app.warm.start_warm_up``): on an empty kernel cache the compile and the ingest share the cores instead of
following each other, and the thread is joined before the fit launches a kernel of its own. Each case runs in a
subprocess, so that no other test's loaded modules count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import threading
import sysid.app.pipeline as P
from sysid.app.config import FitConfig

class Stop(Exception):
    pass

def threads():
    return sorted(t.name for t in threading.enumerate())

seen = []
_load = P.load_runs
def load_runs(*a, **k):
    seen.append(threads())
    if {bad!r}:
        raise Stop("a bad run")
    return _load(*a, **k)
def screen_odometry(*a, **k):  # the first step after the runs are read
    raise Stop("loaded")
P.load_runs, P.screen_odometry = load_runs, screen_odometry
try:
    P.run_fit(FitConfig.from_file({config!r}), progress=False, write=False)
except Stop:
    pass
print(seen[0])
print(threads())
"""


def _run(bad: bool) -> tuple[str, str]:
    script = _SCRIPT.format(bad=bad, config=str(ROOT / "examples" / "fit.yaml"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    during, after = out.stdout.strip().splitlines()[-2:]
    return during, after


def test_kernels_compile_while_the_runs_load() -> None:
    during, after = _run(bad=False)
    assert "sysid-kernel-warm-up" in during, during  # on the old code the runs loaded before any compile began
    assert "sysid-kernel-warm-up" not in after and "sysid-kernel-compile" not in after, after


def test_a_failed_load_joins_the_warm_up() -> None:
    """A load that fails joins the warm-up before the error reaches the caller, who may launch the same modules
    next (two threads loading one Warp module compile it twice)."""
    during, after = _run(bad=True)
    assert "sysid-kernel-warm-up" in during, during
    assert "sysid-kernel-warm-up" not in after, after
