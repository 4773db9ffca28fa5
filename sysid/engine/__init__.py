"""The Ostrich engine: backward-Euler rigid bodies, hard contact, friction, joints and servos,
one non-smooth Newton solve per step, and adjoint gradients through the converged steps."""

import os

import warp as wp

# Warp reports every module load on stdout; keep command-line output readable unless asked.
if not os.environ.get("SYSID_WARP_VERBOSE"):
    wp.config.quiet = True  # type: ignore[attr-defined]  # read by earlier warp releases; now log_level (below)
    wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)

from .errors import EngineError, UnsupportedModelError
from .solver_ostrich import SolverOstrich, StepStatus
from .types import FrictionCombine, SolverOptions

__all__ = [  # noqa: E402 (warp configured first)
    "EngineError", "FrictionCombine", "SolverOptions", "SolverOstrich", "StepStatus", "UnsupportedModelError"]

# Initialised on import, before any kernel runs: without the missing-CUDA-driver line on a CPU-only
# machine, wherever the engine is used from (a command, a script, a notebook's kernel)
from sysid._quiet import init_warp_quietly  # noqa: E402

init_warp_quietly()
