"""Values the command line checks while parsing its arguments, shared with the application.

Standard library only: the ``sysid`` parser reads these on every ``--help`` and argument error,
which must not wait for numpy, Warp or Ray.
"""

from __future__ import annotations

from typing import Any

from sysid.errors import ConfigError

LOO = "leave-one-run-out"  # `sysid cv --folds loo`: one fold per run
BLOCKS = "blocks"  # `sysid cv --folds blocks`: contiguous blocks of the runs in name order, one fold each
SCENES = ("flat", "pallet", "terrain")  # `sysid plan --scene`: what the robot drives on


def parse_folds(value: Any) -> Any:
    """``"loo"`` / ``"leave-one-run-out"`` -> ``LOO``; ``"blocks"`` -> ``BLOCKS``; an integer (or its
    text) >= 2 -> K; a list of folds (config only), each a list of the run names it holds out or a
    mapping ``{held_out: [...], train: [...]}`` -> a list of ``{"held_out": [...], "train": [...] | None}``."""
    if isinstance(value, list | tuple):
        return _explicit_folds(value)
    if isinstance(value, str) and value.strip().lower().replace("_", "-") in ("loo", LOO):
        return LOO
    if isinstance(value, str) and value.strip().lower() == BLOCKS:
        return BLOCKS
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"folds must be 'loo' (leave-one-run-out), 'blocks' or a number of folds >= 2, got {value!r}"
                          ) from None
    if isinstance(value, float | str) and str(value).strip() != str(k):
        raise ConfigError(f"folds must be 'loo', 'blocks' or an integer >= 2, got {value!r}")
    if k < 2:
        raise ConfigError(f"folds must be 'loo', 'blocks' or an integer >= 2 (one fold has nothing to hold out), "
                          f"got {k}")
    return k


def _names(where: str, value: Any) -> list[str]:
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a non-empty list of run names (file or bag names without suffix), "
                          f"got {value!r}")
    return [str(v) for v in value]


def _explicit_folds(value: list[Any] | tuple[Any, ...]) -> list[dict[str, Any]]:
    if len(value) < 2:
        raise ConfigError(f"cv.folds as a list needs at least 2 folds, got {len(value)}")
    out = []
    for i, f in enumerate(value):
        where = f"cv.folds[{i}]"
        if isinstance(f, dict):
            unknown = sorted(set(f) - {"held_out", "train"})
            if unknown or "held_out" not in f:
                raise ConfigError(f"{where} must be a list of run names or {{held_out: [...], train: [...]}}, "
                                  f"got {f!r}")
            out.append({"held_out": _names(f"{where}.held_out", f["held_out"]),
                        "train": _names(f"{where}.train", f["train"]) if f.get("train") is not None else None})
        else:
            out.append({"held_out": _names(where, f), "train": None})
    return out
