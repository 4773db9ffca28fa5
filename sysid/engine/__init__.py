"""The Ostrich engine: backward-Euler rigid bodies, hard contact, friction, joints and servos,
one non-smooth Newton solve per step, and adjoint gradients through the converged steps.

The public API is ``__all__``: the solver (`SolverOstrich`, its `SolverOptions` and per-step `StepStatus`),
rollouts with their gradients and tangents (`Simulation`, `Tape`, `ForwardResult`, `Gradients`, `Tangents`,
`TangentResult`), worlds split across CPU threads (`run_threads` and its helpers), a warm-up that compiles
kernels on a background thread (`warm_up_in_background`) and the errors. Code outside the engine imports
these names from ``sysid.engine`` only (tests/engine/test_public_api.py); the engine's modules are its own.
The torch bridge (`sysid.engine.torch_bridge`) is imported by itself, since it loads torch.

Importing the engine leaves Warp's settings as they are; sysid's commands initialise Warp quietly
(`sysid.quiet_warp`) before any engine work.
"""

from .backward import Gradients
from .errors import EngineError, OptionsError, ParameterError, UnsupportedModelError
from .graphs import REPLAY_ON_WORKERS
from .parallel import ENV_THREADS, resolve_threads, run_threads, split_counts, split_ranges
from .preload import background as warm_up_in_background
from .simulation import Simulation
from .solver_ostrich import SolverOstrich, StepStatus
from .tangent import TangentResult, Tangents
from .tape import ForwardResult, Tape
from .types import (
    AdjointMode,
    AdjointSolver,
    FrictionCombine,
    LinearSolver,
    ResidualNorm,
    SafeguardMode,
    SolverOptions,
)

__all__ = [
    "ENV_THREADS",
    "REPLAY_ON_WORKERS",
    "AdjointMode",
    "AdjointSolver",
    "EngineError",
    "ForwardResult",
    "FrictionCombine",
    "Gradients",
    "LinearSolver",
    "OptionsError",
    "ParameterError",
    "ResidualNorm",
    "SafeguardMode",
    "Simulation",
    "SolverOptions",
    "SolverOstrich",
    "StepStatus",
    "TangentResult",
    "Tangents",
    "Tape",
    "UnsupportedModelError",
    "resolve_threads",
    "run_threads",
    "split_counts",
    "split_ranges",
    "warm_up_in_background",
]
