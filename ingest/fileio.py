"""Small file I/O shared by both packages: atomic writes, JSON/YAML-safe values, reading YAML or raising.

``ingest`` is the leaf that `sysid` imports, so the one copy of each lives here:

- `atomic_path` / `atomic_write_text`: a temporary file in the target's folder renamed over it, so an
  interruption (Ctrl-C, a full disk) leaves either the old file or the new one, never half of one, and
  a temporary that a killed run left is removed by the next write of the same file;
- `json_safe`: numpy scalars and arrays as plain lists and numbers, non-finite floats as None
  (JSON has no NaN; YAML readers of other tools choke on ``.nan``);
- `read_yaml`: a file's YAML or the caller's error type, with a one-line message naming the file,
  line and column (`ingest.inputs`: the checks of every input file and the safe YAML loader).
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks (nothing is then taken for abandoned)
    fcntl = None  # type: ignore[assignment]


TEMP_SUFFIX = ".tmp"
# ``.<name>.sysid-<8 hex>.tmp``: a temporary of this package, unmistakable for another program's
OURS = re.compile(r"\..+\.sysid-[0-9a-f]{8}\.tmp")


def _temporary_name(path: Path) -> Path:
    return path.parent / f".{path.name}.sysid-{secrets.token_hex(4)}{TEMP_SUFFIX}"


def _is_temporary_of(name: str, target: str) -> bool:
    """Whether ``name`` is a temporary of ``atomic_path`` for the file ``target`` (also one of the
    ``tempfile.mkstemp`` names that earlier versions used)."""
    return re.fullmatch(rf"\.{re.escape(target)}\.(sysid-[0-9a-f]{{8}}|[a-z0-9_]{{8}}){re.escape(TEMP_SUFFIX)}",
                        name) is not None


def hold_lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on the open file ``fd`` without waiting; False when another open
    file holds it (always True where ``fcntl`` is missing)."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remove_if_abandoned(path: Path) -> bool:
    """Remove the temporary file ``path`` when no live writer holds it (every writer here holds an
    ``flock`` on its temporary while writing: one left unlocked was left by a process that died, such
    as one killed by SIGKILL); True when it was removed."""
    if fcntl is None:  # pragma: no cover - without locks a live writer's file cannot be told apart
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not hold_lock(fd):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_abandoned_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries that earlier, killed runs left beside ``path``: its own, and any other
    of this package's (``OURS``: the other files of an ingest cache, say); those of live writers
    stay. Returns the ones removed."""
    path = Path(path)
    try:
        names = [e.name for e in os.scandir(path.parent)
                 if _is_temporary_of(e.name, path.name) or OURS.fullmatch(e.name)]
    except OSError:
        return []
    return [path.parent / n for n in names if remove_if_abandoned(path.parent / n)]


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on leaving the block without an exception it
    gets the usual permissions (0666 less the umask) and replaces ``path`` in one rename. On any
    exception (KeyboardInterrupt included) the temporary file is removed and ``path`` is untouched.
    Temporaries of ``path`` left by killed earlier runs are removed first (``remove_abandoned_temporaries``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temporaries(path)
    tmp = _temporary_name(path)
    fd = -1
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        hold_lock(fd)  # held until the rename: a live writer's temporary is never taken for an abandoned one
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # created 0600: readable like any file the user writes
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.close(fd)


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
    import numpy as np  # here, not at the top: the atomic writes above are used where numpy is not loaded

    def plain(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {str(k): plain(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [plain(v) for v in obj]
        if isinstance(obj, np.ndarray):
            return plain(obj.tolist())
        if isinstance(obj, np.generic):
            obj = obj.item()
        if isinstance(obj, float) and not math.isfinite(obj):
            return None
        if other == "str" and not (isinstance(obj, str | int | float | bool) or obj is None):
            return str(obj)
        return obj

    return plain(obj)


def read_yaml(path: str | os.PathLike[str], error: type[Exception], what: str, missing: str | None = None) -> Any:
    """The parsed YAML of the file ``path`` (`ingest.inputs.read_yaml_file`: a regular text file of
    bounded size; no alias bombs, no duplicate keys). A missing file raises ``error(missing)`` (default
    ``"<what> '<path>' does not exist"``), invalid YAML ``error("<what> is not valid YAML: <file>,
    line L, column C: <problem>")``."""
    from .inputs import read_yaml_file

    return read_yaml_file(path, error, what, missing)
