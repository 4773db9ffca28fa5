"""sysid: system identification for real robot logs on a differentiable hard-contact simulator."""

__version__ = "0.1.0"


def quiet_warp() -> None:
    """Initialise Warp as sysid's commands do: no banner or module-load lines, and no missing-CUDA-driver
    warning on a machine without a GPU (Warp's native library prints it on file descriptor 2; every other
    line it prints is kept). Importing sysid changes no Warp setting; a script or notebook that wants the
    commands' quiet output calls this before any engine work. ``SYSID_WARP_VERBOSE=1`` keeps Warp's messages."""
    from sysid._quiet import init_warp_quietly

    init_warp_quietly()
