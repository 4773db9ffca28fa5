"""Kernels that let one recorded step serve every step of a rollout (`graphs.StepGraphs`): the
step index lives on the device, and these copy a step's row of an input buffer in and its outputs
out at that index. Warp kernel code only (pyproject's mypy section says why these modules are not
type-checked by mypy).

Flat arrays, no struct groups (docs/architecture.md, "Kernel convention"): a copy works on any per-step buffer
and a record takes the contact fields one by one, as the record buffers it fills; and a thread per element would
copy a group (a few KiB) per element."""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})


# One kernel per element type, not one generic kernel: warp 1.19's CPU capture registers a kernel's
# code by its key, which a generic kernel's overloads share, so a replay ran the float overload on
# transforms (found by tests/engine/test_engine_graphs.py).
@wp.kernel
def take_row(
    # Data in:
    step_in: wp.array[int],
    src: wp.array2d[float],
    # Data out:
    dst_out: wp.array[float],
):
    """dst = src[step] (a per-step input: servo targets, a parameter schedule, a record)."""
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_int(step_in: wp.array[int], src: wp.array2d[int], dst_out: wp.array[int]):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_vec3(step_in: wp.array[int], src: wp.array2d[wp.vec3], dst_out: wp.array[wp.vec3]):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_transform(step_in: wp.array[int], src: wp.array2d[wp.transform],
                       dst_out: wp.array[wp.transform]):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_spatial(step_in: wp.array[int], src: wp.array2d[wp.spatial_vector],
                     dst_out: wp.array[wp.spatial_vector]):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def put_row_float(step_in: wp.array[int], offset: int, src: wp.array[float],
                  dst_out: wp.array2d[float]):
    """dst[step + offset] = src (a per-step output: the state after the step, the step's record)."""
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_float64(step_in: wp.array[int], offset: int, src: wp.array[wp.float64],
                    dst_out: wp.array2d[wp.float64]):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_int(step_in: wp.array[int], offset: int, src: wp.array[int],
                dst_out: wp.array2d[int]):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_vec3(step_in: wp.array[int], offset: int, src: wp.array[wp.vec3],
                 dst_out: wp.array2d[wp.vec3]):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_transform(step_in: wp.array[int], offset: int, src: wp.array[wp.transform],
                      dst_out: wp.array2d[wp.transform]):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_spatial(step_in: wp.array[int], offset: int, src: wp.array[wp.spatial_vector],
                    dst_out: wp.array2d[wp.spatial_vector]):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_contact_record(
    row_in: wp.array[int],
    max_contacts: int,
    max_rows: int,
    jrows: int,
    # Data in (the solver's contacts and best multipliers):
    count: wp.array[int],
    shape0: wp.array[int],
    shape1: wp.array[int],
    p0: wp.array[wp.vec3],
    p1: wp.array[wp.vec3],
    n: wp.array[wp.vec3],
    nbody: wp.array[int],
    thick: wp.array[float],
    axial0: wp.array[float],
    axial1: wp.array[float],
    fric_shape: wp.array[int],
    single: wp.array[int],
    lam: wp.array[float],
    # Data out (row row_in[0] of each record buffer):
    count_out: wp.array2d[int],
    shape0_out: wp.array2d[int],
    shape1_out: wp.array2d[int],
    p0_out: wp.array2d[wp.vec3],
    p1_out: wp.array2d[wp.vec3],
    n_out: wp.array2d[wp.vec3],
    nbody_out: wp.array2d[int],
    thick_out: wp.array2d[float],
    axial0_out: wp.array2d[float],
    axial1_out: wp.array2d[float],
    fric_shape_out: wp.array2d[int],
    single_out: wp.array2d[int],
    lam_out: wp.array2d[float],
):
    """World w's step record of its contacts and multipliers: its count, its first count contact slots and its
    jrows + 3 count multiplier rows (what anything reads of them; the slots and rows past them keep what they
    held). A thread per world: a row copied element by element swept every world's 48 slots (and 3 rows each)
    through memory after every step, where the robot uses a handful."""
    w = wp.tid()
    t = row_in[0]
    nc = count[w]
    count_out[t, w] = nc
    for c in range(nc):
        k = w * max_contacts + c
        shape0_out[t, k] = shape0[k]
        shape1_out[t, k] = shape1[k]
        p0_out[t, k] = p0[k]
        p1_out[t, k] = p1[k]
        n_out[t, k] = n[k]
        nbody_out[t, k] = nbody[k]
        thick_out[t, k] = thick[k]
        axial0_out[t, k] = axial0[k]
        axial1_out[t, k] = axial1[k]
        fric_shape_out[t, k] = fric_shape[k]
        single_out[t, k] = single[k]
    for i in range(jrows + 3 * nc):
        r = w * max_rows + i
        lam_out[t, r] = lam[r]


TAKE_ROW = {wp.float32: take_row, wp.int32: take_row_int, wp.vec3: take_row_vec3, wp.transform: take_row_transform,
            wp.spatial_vector: take_row_spatial}
PUT_ROW = {wp.float64: put_row_float64, wp.float32: put_row_float,
           wp.int32: put_row_int, wp.vec3: put_row_vec3, wp.transform: put_row_transform,
           wp.spatial_vector: put_row_spatial}


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
