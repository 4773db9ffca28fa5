"""The rollout's names for importers of ``sysid.engine.rollout``: `Simulation` and `ParamSpec` (simulation.py),
`Tape` and `ForwardResult` (tape.py), `Gradients` (backward.py), `Tangents` and `TangentResult` (tangent.py),
`gmres` (krylov.py), `StepRecord` and `PARAM_ARRAYS` (record.py)."""

from .backward import Gradients
from .krylov import gmres
from .record import PARAM_ARRAYS, StepRecord
from .simulation import ParamSpec, Simulation
from .tangent import TangentResult, Tangents
from .tape import ForwardResult, Tape

__all__ = ["PARAM_ARRAYS", "ForwardResult", "Gradients", "ParamSpec", "Simulation", "StepRecord", "TangentResult",
           "Tangents", "Tape", "gmres"]
