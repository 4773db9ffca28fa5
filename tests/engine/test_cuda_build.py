"""The engine's kernels build for a GPU on a machine without one.

Every Warp module of `sysid.engine` that defines kernels is compiled ahead of time (`wp.compile_aot_module`)
to PTX for sm_90, the H100 / H200 that the device tool lends, by NVRTC, which the warp wheel ships and runs
without a CUDA driver. Kernel code that only a CPU build accepts (host-only calls, C++ that the CUDA compiler
rejects) fails here, in CI, instead of on the first GPU run. What only the device can show (timings, CUDA graph
capture with conditional nodes, atomics' ordering) stays with `benchmarks/bench_engine.py --device cuda` and
`bench_adjoint.py --device cuda`.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import warnings
from pathlib import Path

import pytest
import warp as wp

import sysid.engine

ARCH = 90  # sm_90: H100 / H200


def _kernel_modules() -> dict[str, int]:
    """{module name: kernels defined} for every Warp module of sysid.engine that holds kernels: each Python module's
    own and those its module-level kernels name (``@wp.kernel(module=...)``)."""
    out = {}
    for info in pkgutil.iter_modules(sysid.engine.__path__, "sysid.engine."):
        py = importlib.import_module(info.name)
        for name in {info.name} | {v.module.name for v in vars(py).values() if isinstance(v, wp.Kernel)}:
            n = len(wp.get_module(name).kernels)
            if n:
                out[name] = n
    return out


@pytest.mark.slow  # compiles every kernel module from scratch (no cache): the costliest test by far
def test_engine_kernels_compile_for_cuda(tmp_path: Path) -> None:
    """Each kernel module compiles to sm_90 PTX with no kernel skipped (a generic kernel without overloads
    would be); the modules found include the step, contact, linear-solve, adjoint and replay kernels."""
    mods = _kernel_modules()
    assert {"sysid.engine.step", "sysid.engine.contact", "sysid.engine.linsolve_kernels", "sysid.engine.adjoint",
            "sysid.engine.adjoint.angles", "sysid.engine.graph_kernels"} <= set(mods), mods
    print()
    for name, n in sorted(mods.items()):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            paths = wp.compile_aot_module(name, arch=ARCH, module_dir=tmp_path / name, use_ptx=True)
        skipped = [str(w.message) for w in caught if "skipped" in str(w.message)]
        assert not skipped, skipped
        assert len(paths) == 1 and paths[0].suffix == ".ptx" and f"sm{ARCH}" in paths[0].name, paths
        ptx = paths[0].read_text()
        assert ".entry" in ptx and f".target sm_{ARCH}" in ptx
        print(f"  {name}: {n} kernels, {ptx.count('.entry')} PTX entries, {len(ptx) / 1e6:.1f} MB, "
              f"{time.perf_counter() - t0:.1f} s")


_CPU_ONLY = '''
import warp as wp

@wp.func_native("__builtin_ia32_pause(); out[tid] = tid;")  # an x86 intrinsic: no such thing on a GPU
def spin(out: wp.array(dtype=int), tid: int): ...

@wp.kernel
def k(out: wp.array(dtype=int)):
    tid = wp.tid()
    spin(out, tid)
'''


def test_cpu_only_kernel_code_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a kernel that runs on the CPU (an x86 intrinsic in a native snippet) is
    refused by the same AOT compile for sm_90."""
    (tmp_path / "cpu_only_kernel.py").write_text(_CPU_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("cpu_only_kernel")
    out = wp.zeros(3, dtype=int, device="cpu")
    wp.launch(mod.k, 3, inputs=[out], device="cpu")
    assert out.numpy().tolist() == [0, 1, 2]
    with pytest.raises(Exception, match="CUDA kernel build failed"):  # warp raises a bare Exception here
        wp.compile_aot_module(mod, arch=ARCH, module_dir=tmp_path / "aot", use_ptx=True)
