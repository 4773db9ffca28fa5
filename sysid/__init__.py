"""sysid: system identification for real robot logs on a differentiable hard-contact simulator."""

__version__ = "0.1.0"
