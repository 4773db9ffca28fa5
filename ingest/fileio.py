"""Small file I/O shared by both packages: atomic writes, JSON/YAML-safe values, reading YAML or raising.

``ingest`` is the leaf that `sysid` imports, so the one copy of each lives here:

- `atomic_path` / `atomic_write_text`: a temporary file in the target's folder renamed over it, so an
  interruption (Ctrl-C, a full disk) leaves either the old file or the new one, never half of one;
- `json_safe`: numpy scalars and arrays as plain lists and numbers, non-finite floats as None
  (JSON has no NaN; YAML readers of other tools choke on ``.nan``);
- `read_yaml`: a file's YAML or the caller's error type, with a one-line message naming the file,
  line and column (`ingest.yamlerr.yaml_problem`).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .yamlerr import yaml_problem


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on leaving the block without an exception it
    gets the usual permissions (0666 less the umask) and replaces ``path`` in one rename. On any
    exception (KeyboardInterrupt included) the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600: readable like any file the user writes
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (`atomic_path`), flushed to disk before the rename."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return Path(path)


def json_safe(obj: Any, other: str = "keep") -> Any:
    """A copy of ``obj`` as plain JSON/YAML data: mappings (keys as str), lists (tuples, arrays),
    Python numbers (numpy scalars unwrapped), non-finite floats as None. Any other object is kept
    as it is (``other="keep"``) or written as its ``str`` (``other="str"``)."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v, other) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v, other) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist(), other)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if other == "str" and not (isinstance(obj, str | int | float | bool) or obj is None):
        return str(obj)
    return obj


def read_yaml(path: str | os.PathLike[str], error: type[Exception], what: str, missing: str | None = None) -> Any:
    """The parsed YAML of the file ``path``. A missing file raises ``error(missing)`` (default
    ``"<what> '<path>' does not exist"``), invalid YAML ``error("<what> is not valid YAML: <file>,
    line L, column C: <problem>")``."""
    p = Path(path)
    if not p.is_file():
        raise error(missing if missing is not None else f"{what} {str(p)!r} does not exist")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise error(f"{what} is not valid YAML: {yaml_problem(exc, p)}") from None
