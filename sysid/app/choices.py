"""Values the command line checks while parsing its arguments, shared with the application.

Standard library only: the ``sysid`` parser reads these on every ``--help`` and argument error,
which must not wait for numpy, Warp or Ray.
"""

from __future__ import annotations

from sysid.errors import ConfigError

LOO = "leave-one-run-out"  # `sysid cv --folds loo`: one fold per run
SCENES = ("flat", "pallet", "terrain")  # `sysid plan --scene`: what the robot drives on


def parse_folds(value: str | int) -> str | int:
    """``"loo"`` / ``"leave-one-run-out"`` -> ``LOO``; an integer (or its text) >= 2 -> K."""
    if isinstance(value, str) and value.strip().lower().replace("_", "-") in ("loo", LOO):
        return LOO
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"folds must be 'loo' (leave-one-run-out) or a number of folds >= 2, got {value!r}") from None
    if isinstance(value, float | str) and str(value).strip() != str(k):
        raise ConfigError(f"folds must be 'loo' or an integer >= 2, got {value!r}")
    if k < 2:
        raise ConfigError(f"folds must be 'loo' or an integer >= 2 (one fold has nothing to hold out), got {k}")
    return k
