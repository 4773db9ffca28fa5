"""Kernels that let one recorded step serve every step of a rollout (`graphs.StepGraphs`): the
step index lives on the device, and these copy a step's row of an input buffer in and its outputs
out at that index. Warp kernel code only (pyproject's mypy section says why these modules are not
type-checked by mypy)."""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})


# One kernel per element type, not one generic kernel: warp 1.19's CPU capture registers a kernel's
# code by its key, which a generic kernel's overloads share, so a replay ran the float overload on
# transforms (found by tests/engine/test_engine_graphs.py).
@wp.kernel
def take_row(
    # Data in:
    step_in: wp.array(dtype=int),
    src: wp.array2d(dtype=float),
    # Data out:
    dst_out: wp.array(dtype=float),
):
    """dst = src[step] (a per-step input: servo targets, a parameter schedule, a record)."""
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_int(step_in: wp.array(dtype=int), src: wp.array2d(dtype=int), dst_out: wp.array(dtype=int)):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_vec3(step_in: wp.array(dtype=int), src: wp.array2d(dtype=wp.vec3), dst_out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_transform(step_in: wp.array(dtype=int), src: wp.array2d(dtype=wp.transform),
                       dst_out: wp.array(dtype=wp.transform)):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def take_row_spatial(step_in: wp.array(dtype=int), src: wp.array2d(dtype=wp.spatial_vector),
                     dst_out: wp.array(dtype=wp.spatial_vector)):
    i = wp.tid()
    dst_out[i] = src[step_in[0], i]


@wp.kernel
def put_row_float(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=float),
                  dst_out: wp.array2d(dtype=float)):
    """dst[step + offset] = src (a per-step output: the state after the step, the step's record)."""
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_float64(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=wp.float64),
                    dst_out: wp.array2d(dtype=wp.float64)):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_int(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=int),
                dst_out: wp.array2d(dtype=int)):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_vec3(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=wp.vec3),
                 dst_out: wp.array2d(dtype=wp.vec3)):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_transform(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=wp.transform),
                      dst_out: wp.array2d(dtype=wp.transform)):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


@wp.kernel
def put_row_spatial(step_in: wp.array(dtype=int), offset: int, src: wp.array(dtype=wp.spatial_vector),
                    dst_out: wp.array2d(dtype=wp.spatial_vector)):
    i = wp.tid()
    dst_out[step_in[0] + offset, i] = src[i]


TAKE_ROW = {wp.float32: take_row, wp.int32: take_row_int, wp.vec3: take_row_vec3, wp.transform: take_row_transform,
            wp.spatial_vector: take_row_spatial}
PUT_ROW = {wp.float64: put_row_float64, wp.float32: put_row_float,
           wp.int32: put_row_int, wp.vec3: put_row_vec3, wp.transform: put_row_transform,
           wp.spatial_vector: put_row_spatial}


@wp.kernel
def advance(step_out: wp.array(dtype=int)):
    """The next step."""
    step_out[0] = step_out[0] + 1


@wp.kernel
def retreat(step_out: wp.array(dtype=int)):
    """The previous step (a backward sweep)."""
    step_out[0] = step_out[0] - 1


@wp.kernel
def wrap_index(
    # Data in:
    step_in: wp.array(dtype=int),
    rows: int,
    # Data out:
    index_out: wp.array(dtype=int),
):
    """index = step mod rows: the row of a checkpointed rollout's segment-long record buffers."""
    index_out[0] = step_in[0] % rows


@wp.kernel
def keep_max(
    # Data in:
    src: wp.array(dtype=int),
    # Data out:
    acc_out: wp.array(dtype=int),
):
    """acc = max(acc, src) per entry (e.g. contacts dropped per world, reduced over a rollout)."""
    i = wp.tid()
    acc_out[i] = wp.max(acc_out[i], src[i])
