"""Where the bundled robots are (``models/<name>/robot.yaml``, URDF, wheel map), for ``ingest`` and
``sysid`` alike: ``sysid/models`` inside an installed wheel (pyproject's package ``sysid.models``),
else the checkout's ``models/`` beside the packages (a bare checkout or an editable install)."""

from __future__ import annotations

from pathlib import Path

_SITE = Path(__file__).resolve().parents[1]  # the folder holding the ``ingest`` and ``sysid`` packages


def models_dir() -> Path:
    """The bundled robots' folder (``<it>/helhest/robot.yaml``); the checkout's ``models/`` when
    neither exists, so messages name the expected place."""
    for cand in (_SITE / "sysid" / "models", _SITE / "models"):
        if cand.is_dir():
            return cand
    return _SITE / "models"
