"""The one error type of the synthetic-dataset generator."""

from __future__ import annotations


class SynthError(Exception):
    """Bad input to `sysid.synth`: the message says what was wrong and what to do about it."""
