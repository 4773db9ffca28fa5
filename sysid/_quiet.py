"""Initialise Warp without its noise: no banner, and no ``Warp CUDA warning: Could not find or load the
NVIDIA CUDA driver`` on machines without a GPU (printed by Warp's native library straight to file
descriptor 2, so neither ``wp.config.log_level`` nor Python's ``sys.stderr`` can silence it).

``SYSID_WARP_VERBOSE=1`` keeps Warp's messages.
"""

from __future__ import annotations

import os
import sys
import tempfile

CUDA_DRIVER_WARNING = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"


def init_warp_quietly() -> None:
    """``warp.init()`` with the missing-driver warning dropped; every other line Warp prints is kept."""
    try:
        import warp as wp
    except ImportError:  # the kinematic baseline and the report need no Warp
        return
    if os.environ.get("SYSID_WARP_VERBOSE"):
        wp.init()
        return
    wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)
    # the native library writes to descriptor 2 whatever Python's sys.stderr is (in a Jupyter kernel
    # sys.stderr is a stream on another descriptor, or none)
    fd = 2
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            wp.init()
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    kept = [line for line in text.splitlines() if CUDA_DRIVER_WARNING not in line]
    if kept:
        print("\n".join(kept), file=sys.stderr)
