"""The Ostrich engine: backward-Euler rigid bodies, hard contact, friction, joints and servos,
one non-smooth Newton solve per step, and adjoint gradients through the converged steps."""

from .solver_ostrich import EngineError, SolverOstrich, StepStatus, UnsupportedModelError
from .types import SolverOptions

__all__ = ["EngineError", "SolverOptions", "SolverOstrich", "StepStatus", "UnsupportedModelError"]
