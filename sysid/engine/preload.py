"""Kernel modules compiled ahead of their first launch, on a thread of their own.

Warp compiles a module, every kernel in it at once, on the first launch of any of its kernels, on the launching
thread. A solver's first step runs newton's collision (whose modules compile then) and then the Newton step (whose
modules compile then): on an empty kernel cache the two compile one after the other on one core. `start` compiles
the step's modules on a background thread from the moment the solver is built, so that on a CPU with a second core
they compile beside newton's, and `wait` joins that thread before the step's first launch (a module loaded on two
threads at once would be compiled twice: Warp's `Module.load` takes no lock). The compiled code, and so every
result, is the same either way; only when it is compiled changes.

CPU only: on a GPU the first launch compiles as before.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import warp as wp

_lock = threading.Lock()
_pending: dict[str, threading.Thread] = {}  # Warp module name -> the thread that loads it
_warm_ups: list[threading.Thread] = []  # threads of `background`
_exit_hook = False


def start(modules: Iterable[Any], device: wp.Device | str | None = None) -> None:
    """Compile and load, on a background thread, each of the Warp ``modules`` not yet loaded on ``device`` (a CPU;
    nothing elsewhere). A module an earlier call already took is left to it."""
    if not wp.get_device(device).is_cpu:
        return
    with _lock:
        todo: list[Any] = []
        for m in modules:
            if m.name not in _pending and not m.execs and all(m is not t for t in todo):
                todo.append(m)
        if not todo:
            return
        thread = _thread(_load, (todo,), "sysid-kernel-compile")
        for m in todo:
            _pending[m.name] = thread
        thread.start()


def background(fn: Callable[[], object], name: str = "sysid-kernel-warm-up") -> threading.Thread:
    """Run ``fn`` (a warm-up that compiles kernels by launching them) on a started daemon thread, whose
    compile a process ending meanwhile abandons quietly, like ``start``'s. The caller joins it before it
    launches Warp kernels of its own: the two would otherwise load the same modules at once."""
    with _lock:
        thread = _thread(fn, (), name)
        _warm_ups[:] = [t for t in _warm_ups if t.is_alive()] + [thread]
        thread.start()
    return thread


def _thread(target: Callable[..., object], args: tuple[Any, ...], name: str) -> threading.Thread:
    global _exit_hook
    if not _exit_hook:
        # weakref's own exit hook (which removes Warp's temporary precompiled-header folders) registered
        # first, so that this one, registered after it, runs before it
        weakref.finalize(_silence_abandoned, lambda: None)
        atexit.register(_silence_abandoned)
        _exit_hook = True
    return threading.Thread(target=target, args=args, name=name, daemon=True)


def _load(modules: list[Any]) -> None:
    for m in modules:
        try:
            wp.load_module(m, device="cpu")
        except Exception:  # noqa: BLE001 - the first launch loads the module again and raises its error there
            pass


def wait(modules: Iterable[Any]) -> None:
    """Return once no background thread is loading any of ``modules``."""
    for m in modules:
        thread = _pending.get(m.name)
        if thread is not None:
            thread.join()


def _silence_abandoned() -> None:
    """At exit, a compile still running on the background thread is abandoned with the process: its compiler's
    complaint about the temporary files removed under it would otherwise follow the command's last line."""
    if any(t.is_alive() for t in {*_pending.values(), *_warm_ups}):
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
