"""The simulator interface the identification layer is written against, and a registry.

Identification needs only an open-loop replay: given runs (logged wheel commands, first odometry
pose) and physical parameters ``theta``, produce the base pose at the runs' odometry timestamps,
and its sensitivity to ``theta``. Any object with this shape is a ``Simulator``;
``get_simulator(name, robot=..., **options)`` builds the one a name stands for.

A name is code, so a config (data) can only name a simulator that code made known: a built-in,
one registered with ``register_simulator``, an entry point of an installed package in the group
``sysid.simulators`` (``name = "package.module:factory"``, read with ``importlib.metadata``), or a
``"package.module:factory"`` path allowed by ``allow_simulator`` (the command line's
``--allow-simulator``). Any other name is refused before its module is imported.

Built in:

- ``"ostrich"``: the project's differentiable hard-contact engine (``sysid.engine`` /
  ``sysid.simulators.ostrich``), registered lazily; it is looked up as ``sysid.simulators.ostrich:make_simulator``
  (a callable ``make_simulator(robot=<dict>, **options) -> Simulator``).
- ``"kinematic"``: ``sysid.simulators.kinematic.KinematicSkidSteer``, a kinematic skid-steer *baseline*
  (no contact, no pallet climb: z stays at its initial value). Fast, useful on flat ground and as
  a reference, not a physics engine.
- ``"mujoco"``: ``sysid.simulators.mujoco.MujocoReplay``, the synthetic-data generator's MuJoCo model
  replayed open-loop (finite-difference Jacobian): a reference with the data set's model class.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ingest.run import Run
from sysid.errors import SimulatorError


@runtime_checkable
class Simulator(Protocol):
    """Open-loop replay of robot runs, differentiable in the physical parameters.

    Conventions (SI units): world frame z up; a pose row is ``t`` [s], ``x, y, z`` [m],
    ``qx, qy, qz, qw`` (unit quaternion, world from base). Each run's ``wheel_cmd``
    (``left, right, rear`` [rad/s] wheel-velocity targets) drives the simulator open-loop from the
    run's first odometry pose (at rest unless the engine estimates an initial velocity); outputs
    are sampled at the run's ``odom['t']``. All runs of one call are simulated together as
    parallel worlds. ``theta`` maps every name in ``parameter_names`` to a value; a simulator
    must raise ``KeyError``/``ValueError`` naming an unknown parameter. Diverged worlds return
    non-finite poses rather than raising.
    """

    parameter_names: tuple[str, ...]

    def rollout(self, runs: Sequence[Run], theta: Mapping[str, float], dt: float) -> list[np.ndarray]:
        """Replay each run at timestep ``dt`` [s]; one ``(T_i, 8)`` pose array per run."""
        ...

    def rollout_with_jacobian(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``rollout`` plus, per run, d(x, y, z, qx, qy, qz, qw)/d(theta[names]) of shape
        ``(T_i, 7, len(names))`` (adjoint or forward sensitivities)."""
        ...


class AdjointSimulator(Simulator, Protocol):
    """Optional extension: an engine whose adjoint gives vector-Jacobian products cheaply.

    ``rollout_with_vjp`` returns the poses and a function mapping per-run pose cotangents
    (``(T_i, 7)`` arrays: d loss / d(x, y, z, qx, qy, qz, qw)) to d loss / d theta[names]
    (shape ``(len(names),)``) — one adjoint sweep. Adam uses it when present (one backward pass
    per step instead of a full Jacobian); Gauss-Newton always uses ``rollout_with_jacobian``.
    """

    def rollout_with_vjp(
        self, runs: Sequence[Run], theta: Mapping[str, float], dt: float, names: Sequence[str]
    ) -> tuple[list[np.ndarray], Callable[[list[np.ndarray]], np.ndarray]]: ...


class BatchSimulator(Simulator, Protocol):
    """Optional extension: several parameter sets in one call.

    ``rollout_many(runs, thetas, dt)`` replays every run once per ``theta`` in ``thetas`` and
    returns one list of ``(T_i, 8)`` pose arrays per theta (``out[c][i]``: run ``i`` at
    ``thetas[c]``), exactly what ``[rollout(runs, th, dt) for th in thetas]`` returns, but as one
    batched call (the engine runs every copy of every run as parallel worlds of one rollout). The
    multi-start of ``sysid.fit.optimizer.optimize`` uses it through ``rollout_many`` below.
    """

    def rollout_many(
        self, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float
    ) -> list[list[np.ndarray]]: ...


class NuisanceSimulator(Simulator, Protocol):
    """Optional extension: per-run nuisance parameters (quantities of one log that are not physics,
    e.g. an initial-velocity error or a clock offset; ``sysid.fit.residuals.NUISANCE_SPECS``).

    ``nuisance_names`` lists the accepted names; ``rollout``, ``rollout_many`` and
    ``rollout_with_jacobian`` take ``nuisance=[{name: value}, ...]`` (one mapping per run, missing
    names 0). A nuisance name in ``rollout_with_jacobian``'s ``names`` gives, for each run, the
    derivative of its poses with respect to its own value.
    """

    nuisance_names: tuple[str, ...]


def rollout_many(
    sim: Simulator, runs: Sequence[Run], thetas: Sequence[Mapping[str, float]], dt: float, **kw: Any
) -> list[list[np.ndarray]]:
    """``[sim.rollout(runs, th, dt) for th in thetas]`` as one batched call where the simulator
    can: its own ``rollout_many`` (``BatchSimulator``; the engine, ``sysid.simulators.ostrich.OstrichReplay``, runs
    several parameter sets as copies of the worlds of one rollout); otherwise one ``rollout`` per theta.
    ``kw`` (e.g. ``nuisance``, see `NuisanceSimulator`) goes to every call unchanged."""
    thetas = [dict(th) for th in thetas]
    if not thetas:
        return []
    many = getattr(sim, "rollout_many", None)
    if callable(many):
        out = [list(p) for p in many(list(runs), thetas, dt, **kw)]
    else:
        return [list(sim.rollout(list(runs), th, dt, **kw)) for th in thetas]
    if len(out) != len(thetas) or any(len(p) != len(runs) for p in out):
        raise SimulatorError(
            f"batched rollout returned {[len(p) for p in out]} trajectories for {len(thetas)} parameter sets "
            f"x {len(runs)} runs"
        )
    return out


SimulatorFactory = Callable[..., Simulator]
_REGISTRY: dict[str, SimulatorFactory | str] = {
    "ostrich": "sysid.simulators.ostrich:make_simulator",
    "kinematic": "sysid.simulators.kinematic:KinematicSkidSteer",
    "mujoco": "sysid.simulators.mujoco:make_simulator",
}


ENTRY_POINT_GROUP = "sysid.simulators"  # [project.entry-points."sysid.simulators"] of a package
_ALLOWED: set[str] = set()  # "module:factory" paths allowed by code (the command line's --allow-simulator)
_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def register_simulator(name: str, factory: SimulatorFactory | str, *, replace: bool = False) -> None:
    """Register ``factory(robot=<robot dict>, **options) -> Simulator`` under ``name``.

    ``factory`` may be a dotted ``"module:attribute"`` string, imported on first use.
    """
    if name in _REGISTRY and not replace:
        raise SimulatorError(f"simulator {name!r} is already registered")
    _REGISTRY[name] = factory


def allow_simulator(path: str) -> None:
    """Let a config name the factory ``"package.module:factory"`` (``--allow-simulator``); nothing
    is imported until the simulator is built."""
    if not _PATH.fullmatch(path):
        raise SimulatorError(f"--allow-simulator {path!r} must look like 'package.module:factory'")
    _ALLOWED.add(path)


def allowed_simulators() -> tuple[str, ...]:
    """The paths allowed by ``allow_simulator`` (a fan-out hands them to its workers)."""
    return tuple(sorted(_ALLOWED))


def entry_point_simulators() -> dict[str, Any]:
    """The ``sysid.simulators`` entry points of the installed packages by name (not loaded)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_simulators() -> tuple[str, ...]:
    """Every name a config may give: built-in and registered, entry points, allowed paths."""
    eps = [n for n in sorted(entry_point_simulators()) if n not in _REGISTRY]
    return (*_REGISTRY, *eps, *(p for p in allowed_simulators() if p not in _REGISTRY))


def check_simulator_name(name: str) -> None:
    """Raise SimulatorError, without importing anything, unless ``name`` is a known simulator."""
    if name in _REGISTRY or name in _ALLOWED or name in entry_point_simulators():
        return
    allow = f", or allow it for one command with --allow-simulator {name}" if _PATH.fullmatch(name) else ""
    raise SimulatorError(
        f"unknown simulator {name!r}; known: {', '.join(available_simulators())}. A simulator from another "
        f"package is registered as an entry point of that package in the group {ENTRY_POINT_GROUP!r} "
        f"(docs/fit.md, 'Simulators'){allow}"
    )


def _import(path: str) -> SimulatorFactory:
    mod_name, _, attr = path.partition(":")
    if not attr:
        raise SimulatorError(f"simulator path {path!r} must look like 'package.module:factory'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise SimulatorError(
            f"cannot import simulator module {mod_name!r} ({exc}); is it installed / has it landed yet?"
        ) from exc
    try:
        obj: Any = mod
        for part in attr.split("."):
            obj = getattr(obj, part)
        factory: SimulatorFactory = obj
        return factory
    except AttributeError as exc:
        raise SimulatorError(f"module {mod_name!r} has no simulator factory {attr!r}") from exc


def resolve_factory(name: str) -> SimulatorFactory:
    """The factory ``name`` stands for (see the module docstring); raises SimulatorError, for an
    unknown name before anything is imported."""
    check_simulator_name(name)
    entry: SimulatorFactory | str | None = _REGISTRY.get(name)
    if entry is None and name not in _ALLOWED:
        ep = entry_point_simulators()[name]
        try:
            loaded: SimulatorFactory = ep.load()
            return loaded
        except (ImportError, AttributeError) as exc:
            raise SimulatorError(f"simulator {name!r} (entry point {ep.value!r} in the group "
                                 f"{ENTRY_POINT_GROUP!r}) cannot be loaded: {exc}") from exc
    if entry is None:
        entry = name
    return _import(entry) if isinstance(entry, str) else entry


def get_simulator(name: str, robot: Mapping[str, Any] | None = None, **options: Any) -> Simulator:
    """Build the simulator ``name`` for a robot description (the parsed ``robot.yaml``), observed
    through the odometry model of `sysid.simulators.observation` (the extra parameter ``odom_delay``, 0 unless
    a config gives it: then the simulator's own output)."""
    from sysid.simulators.observation import observed

    factory = resolve_factory(name)
    options = dict(options)
    history = str(options.pop("odom_history", "simulated"))  # the observation model's option
    try:
        sim = factory(robot=robot, **options)
    except TypeError as exc:
        raise SimulatorError(f"simulator {name!r} rejected its options {sorted(options)}: {exc}") from exc
    check_simulator(sim, name)
    return observed(sim, history=history, robot=robot)


def unwrap(sim: object) -> object:
    """The simulator inside `sysid.simulators.observation.OdometryDelay` (``sim`` itself when not wrapped)."""
    return getattr(sim, "inner", sim)


def check_simulator(sim: object, name: str = "simulator") -> None:
    """Raise SimulatorError unless ``sim`` has the attributes of the ``Simulator`` protocol."""
    missing = [a for a in ("parameter_names", "rollout", "rollout_with_jacobian") if not hasattr(sim, a)]
    if missing:
        raise SimulatorError(f"{name} does not implement the Simulator protocol: missing {missing}")


UNCONVERGED = 1.0e-3  # [m/s] a step returned above this Newton residual counts as unconverged


def replay_health(sim: object, runs: Sequence[Run]) -> list[dict[str, float]] | None:
    """Per run of the simulator's last single-copy rollout: the worst step's Newton residual
    [m/s] and the share of unconverged steps; None for simulators that do not report it."""
    st: Mapping[str, Any] = getattr(sim, "last_status", None) or {}
    worst, share = st.get("residual_max_per_world"), st.get("unconverged_per_world")
    if not worst or share is None or len(worst) != len(runs):
        return None
    return [{"residual_max": float(a), "unconverged_steps": float(b)} for a, b in zip(worst, share, strict=True)]
