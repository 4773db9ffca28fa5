"""How a model's worlds, bodies and joints lay out for `SolverOstrich`: the worlds' shared structure (checked: every
world the same bodies and joints in world order) and each world's joint rows (`types.JointRow`) by joint type."""

from __future__ import annotations

from dataclasses import dataclass

import newton
import numpy as np

from .errors import UnsupportedModelError
from .types import JointRow, host_array

_JOINT_ROWS = {
    int(newton.JointType.REVOLUTE): [JointRow.POS_X, JointRow.POS_Y, JointRow.POS_Z, JointRow.HINGE_1,
                                     JointRow.HINGE_2],
    int(newton.JointType.FIXED): [JointRow.POS_X, JointRow.POS_Y, JointRow.POS_Z, JointRow.ROT_X, JointRow.ROT_Y,
                                  JointRow.ROT_Z],
    int(newton.JointType.BALL): [JointRow.POS_X, JointRow.POS_Y, JointRow.POS_Z],
    int(newton.JointType.FREE): [],
}


@dataclass
class WorldLayout:
    """A model's layout (`world_layout`): its worlds and per-world counts; the joint rows of one world (their joint
    index within the world and their `JointRow` kind); every joint's axis, servo gains ke [N m/rad] and
    kd [N m s/rad] (revolute joints; zero elsewhere), float32."""

    world_count: int
    bodies_per_world: int
    joints_per_world: int
    jrow_joint: list[int]
    jrow_kind: list[int]
    joint_axis: np.ndarray  # (joints, 3)
    joint_ke: np.ndarray  # (joints,)
    joint_kd: np.ndarray  # (joints,)


def world_layout(model: newton.Model) -> WorldLayout:
    """The layout of ``model``; UnsupportedModelError names what `SolverOstrich` cannot simulate."""
    nb = model.body_count
    nj = model.joint_count
    if nb == 0:
        raise UnsupportedModelError("the model has no dynamic bodies; add at least one with add_body/add_link")
    bw = host_array(model.body_world)
    jw = host_array(model.joint_world)
    nw = max(int(model.world_count), 1)
    if (bw < 0).any():
        if (bw >= 0).any() or nw > 1:
            raise UnsupportedModelError("bodies outside any world next to world bodies are not supported")
        bw = np.zeros_like(bw)
        jw = np.zeros_like(jw)
    if nb % nw != 0 or not np.array_equal(bw, np.repeat(np.arange(nw), nb // nw)):
        raise UnsupportedModelError(
            "worlds must hold the same number of bodies in world order; build them with "
            "ModelBuilder.replicate (or add_world with identical robots)"
        )
    jpw = nj // nw if nj else 0
    if nj and (nj % nw != 0 or not np.array_equal(jw, np.repeat(np.arange(nw), nj // nw))):
        raise UnsupportedModelError("worlds must hold the same joints in world order (use replicate)")
    jt = host_array(model.joint_type)
    jp = host_array(model.joint_parent)
    qd0 = host_array(model.joint_qd_start)
    ke = host_array(model.joint_target_ke) if model.joint_dof_count else np.zeros(0)
    kd = host_array(model.joint_target_kd) if model.joint_dof_count else np.zeros(0)
    axis = host_array(model.joint_axis) if model.joint_dof_count else np.zeros((0, 3))
    jrow_joint: list[int] = []
    jrow_kind: list[int] = []
    joint_axis = np.zeros((nj, 3), dtype=np.float32)
    joint_ke = np.zeros(nj, dtype=np.float32)
    joint_kd = np.zeros(nj, dtype=np.float32)
    for j in range(nj):
        t = int(jt[j])
        if t not in _JOINT_ROWS:
            raise UnsupportedModelError(
                f"joint {j} has type {newton.JointType(t).name}; SolverOstrich supports FREE, REVOLUTE, "
                "FIXED and BALL joints"
            )
        if t == int(newton.JointType.FREE) and jp[j] >= 0:
            raise UnsupportedModelError(f"free joint {j} must connect a body to the world (parent -1)")
        if t == int(newton.JointType.REVOLUTE):
            joint_axis[j] = axis[qd0[j]]
            joint_ke[j] = ke[qd0[j]]
            joint_kd[j] = kd[qd0[j]]
    for jl in range(jpw):
        t = int(jt[jl])
        kinds = list(_JOINT_ROWS[t])
        if t == int(newton.JointType.REVOLUTE) and (joint_ke[jl] > 0 or joint_kd[jl] > 0):
            kinds.append(JointRow.SERVO)
        jrow_joint += [jl] * len(kinds)
        jrow_kind += kinds
    for w in range(1, nw):
        sl = slice(w * jpw, (w + 1) * jpw)
        if not np.array_equal(jt[sl], jt[:jpw]):
            raise UnsupportedModelError("worlds must hold the same joint types in the same order")
    return WorldLayout(nw, nb // nw, jpw, jrow_joint, jrow_kind, joint_axis, joint_ke, joint_kd)
