"""Kernels that let one recorded step serve every step of a rollout (`graphs.StepGraphs`): the
step index lives on the device, and these copy a step's row of an input buffer in and its outputs
out at that index. Warp kernel code only (pyproject's mypy section says why these modules are not
type-checked by mypy).

A row copy takes flat arrays (a thread per element would copy a group per element: docs/architecture.md, "Kernel
convention"); the contact record, a thread per world, takes the contact slots and their record as groups."""

# No `from __future__ import annotations`: the row copies are closures per element type (`_row_copies`), and Warp
# reads their annotations as objects
import warp as wp

from .types import ContactRecord, Contacts

wp.set_module_options({"enable_backward": False})


def _row_copies(dtype: type, name: str) -> tuple[wp.Kernel, wp.Kernel]:
    """(take_row, put_row) of one element type, registered as take_row_<name>, put_row_<name>. One pair per element
    type, not one generic kernel: warp 1.19's CPU capture registers a kernel's code by its key, which a generic
    kernel's overloads share, so a replay ran the float overload on transforms (found by
    tests/engine/test_engine_graphs.py)."""

    @wp.kernel(name=f"take_row_{name}")
    def take_row(
        # Data in:
        step_in: wp.array[int],
        src: wp.array2d[dtype],
        # Data out:
        dst_out: wp.array[dtype],
    ):
        """dst = src[step] (a per-step input: servo targets, a parameter schedule, a record)."""
        i = wp.tid()
        dst_out[i] = src[step_in[0], i]

    @wp.kernel(name=f"put_row_{name}")
    def put_row(
        # Data in:
        step_in: wp.array[int],
        offset: int,
        src: wp.array[dtype],
        # Data out:
        dst_out: wp.array2d[dtype],
    ):
        """dst[step + offset] = src (a per-step output: the state after the step, the step's record)."""
        i = wp.tid()
        dst_out[step_in[0] + offset, i] = src[i]

    return take_row, put_row


# element type -> its row copies
_COPIES = {t: _row_copies(t, name) for t, name in ((wp.float32, "float"), (wp.float64, "float64"), (wp.int32, "int"),
                                                    (wp.vec3, "vec3"), (wp.transform, "transform"),
                                                    (wp.spatial_vector, "spatial"))}
TAKE_ROW = {t: k[0] for t, k in _COPIES.items()}
PUT_ROW = {t: k[1] for t, k in _COPIES.items()}


@wp.kernel
def put_contact_record(
    row_in: wp.array[int],
    max_contacts: int,
    max_rows: int,
    jrows: int,
    # Data in (the solver's contacts and best multipliers):
    ct: Contacts,
    lam: wp.array[float],
    # Data out (row row_in[0] of each record buffer):
    rec: ContactRecord,
):
    """World w's step record of its contacts and multipliers: its count, its first count contact slots and its
    jrows + 3 count multiplier rows (what anything reads of them; the slots and rows past them keep what they
    held). A thread per world: a row copied element by element swept every world's 48 slots (and 3 rows each)
    through memory after every step, where the robot uses a handful."""
    w = wp.tid()
    t = row_in[0]
    nc = ct.count[w]
    rec.count[t, w] = nc
    for c in range(nc):
        k = w * max_contacts + c
        rec.shape0[t, k] = ct.shape0[k]
        rec.shape1[t, k] = ct.shape1[k]
        rec.p0[t, k] = ct.p0[k]
        rec.p1[t, k] = ct.p1[k]
        rec.n[t, k] = ct.n[k]
        rec.nbody[t, k] = ct.nbody[k]
        rec.thick[t, k] = ct.thick[k]
        rec.axial0[t, k] = ct.axial0[k]
        rec.axial1[t, k] = ct.axial1[k]
        rec.fric_shape[t, k] = ct.fric_shape[k]
        rec.single[t, k] = ct.single[k]
    for i in range(jrows + 3 * nc):
        r = w * max_rows + i
        rec.lam[t, r] = lam[r]


@wp.kernel
def advance(step_out: wp.array[int]):
    """The next step."""
    step_out[0] = step_out[0] + 1


@wp.kernel
def retreat(step_out: wp.array[int]):
    """The previous step (a backward sweep)."""
    step_out[0] = step_out[0] - 1


@wp.kernel
def wrap_index(
    # Data in:
    step_in: wp.array[int],
    rows: int,
    # Data out:
    index_out: wp.array[int],
):
    """index = step mod rows: the row of a checkpointed rollout's segment-long record buffers."""
    index_out[0] = step_in[0] % rows


@wp.kernel
def keep_max(
    # Data in:
    src: wp.array[int],
    # Data out:
    acc_out: wp.array[int],
):
    """acc = max(acc, src) per entry (e.g. contacts dropped per world, reduced over a rollout)."""
    i = wp.tid()
    acc_out[i] = wp.max(acc_out[i], src[i])
