"""Command-line conventions shared by ``ingest`` and ``sysid`` (one error format, checks before work).

- Every user error is one line on stderr, ``error: <what was wrong and what to do>``, exit status 2;
  argparse's own errors (unknown flag, bad number) follow the same format and name the subcommand's
  ``--help``. No traceback reaches a user: an unexpected exception is one ``error: internal error``
  line (exit 1; ``SYSID_DEBUG=1`` shows the traceback), Ctrl-C exits 130 (SIGTERM 143 where the entry
  point handles it), with one line saying what is on disk.
- Numeric flags are checked by their argparse type (``positive_int``, ``positive_float``, ...), so a
  bad value stops before any work.
- Output paths are checked before any work (``output_problem``): nothing is created by the check.
- Progress bars are drawn only on a terminal (``show_progress``), never into a log file or pipe.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

DEBUG_ENV = "SYSID_DEBUG"


def version() -> str:
    """The installed distribution's version (``sysid`` ships both programs)."""
    try:
        from importlib.metadata import version as _v

        return _v("sysid")
    except Exception:  # noqa: BLE001 - not installed (a bare checkout): the source's version
        try:  # from the checkout's pyproject.toml (ingest imports no sysid)
            import tomllib
            from pathlib import Path

            doc = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
            return str(doc["project"]["version"])
        except Exception:  # noqa: BLE001
            return "unknown"


def one_line(message: object) -> str:
    """``message`` on one line (newlines and runs of spaces collapsed; doubled full stops removed)."""
    text = re.sub(r"\s*\n\s*", " ", str(message)).strip()
    return re.sub(r"(?<=[^.\s/])\.\.(?=\s|$)", ".", text)  # "corrupt.. Re-copy": one full stop


def print_error(message: object) -> int:
    """Print ``error: <message>`` (one line) to stderr; returns the exit status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``error: ...`` line (exit 2) naming the ``--help`` to read.

    Subparsers made by ``add_subparsers`` are of the same class (argparse uses ``type(self)``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # argparse API
        sys.stderr.write(f"error: {one_line(message)} (see `{self.prog} --help`)\n")
        sys.exit(2)


def deprecated_alias(
    parser: argparse._ActionsContainer, *names: str, dest: str, **kwargs: Any
) -> argparse.Action:
    """An earlier spelling of a flag, kept working but hidden from ``--help``: it stores into the same
    ``dest`` as the documented flag (docs/fit.md, "Command-line conventions")."""
    return parser.add_argument(*names, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


# -- argparse types: a bad value is an argparse error before any work ------------------------------


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _checked(text: str, kind: type[int] | type[float], ok: Callable[[float], bool], rule: str) -> float:
    """``text`` as a finite ``kind`` that satisfies ``ok``; else an argparse error "must be {rule}"."""
    v = kind(_number(text, kind))
    if not ok(v):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return int(_checked(text, int, lambda v: v >= 1, "an integer >= 1"))


def nonnegative_int(text: str) -> int:
    return int(_checked(text, int, lambda v: v >= 0, "an integer >= 0"))


def finite_float(text: str) -> float:
    return float(_number(text, float))


def positive_float(text: str) -> float:
    return float(_checked(text, float, lambda v: v > 0, "a number > 0"))


def nonnegative_float(text: str) -> float:
    return float(_checked(text, float, lambda v: v >= 0, "a number >= 0"))


# -- output paths and progress ---------------------------------------------------------------------


def output_problem(path: str | Path, what: str = "output", suffixes: Sequence[str] = ()) -> str | None:
    """Why ``path`` cannot be written as a file (None when it can); creates nothing.

    The file may exist (it is replaced) unless it is a directory; missing parent folders are fine when
    the nearest existing ancestor is a writable folder (they are created on writing).
    """
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        return f"{what} {str(path)!r} is not a file name"
    if "\x00" in str(path):  # the OS refuses such a name; pathlib's checks would just say "does not exist"
        return f"{what} {str(path)!r} contains a NUL character; give a file name"
    if suffixes and p.suffix not in suffixes:
        return f"{what} {str(p)!r} must end in {' or '.join(suffixes)}"
    if p.is_dir():
        return f"{what} {str(p)!r} is a directory; give a file name"
    problem = _ancestor_problem(p, p.parent, what)
    if problem:
        return problem
    if p.exists() and not os.access(p, os.W_OK):
        return f"{what} {str(p)!r} exists and is not writable"
    return None


def _ancestor_problem(p: Path, start: Path, what: str) -> str | None:
    """Why nothing can be created below the nearest existing folder of ``start`` and its parents
    (None when something can): that ancestor is a file, or a probe file cannot be written in it."""
    parent = start
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        return f"{what} {str(p)!r}: {str(parent)!r} is a file, not a folder"
    problem = _write_probe(parent)
    if problem:
        return f"{what} {str(p)!r}: cannot write in {str(parent)!r} ({problem})"
    return None


PROBE_BYTES = 64 * 1024  # written by the probe: an empty file can still be created on a full disk


def _write_probe(folder: Path) -> str | None:
    """Why no file can be written in ``folder`` (None when one can): a probe file with
    ``PROBE_BYTES`` of data written, flushed and removed at once (permission bits alone say nothing
    for root, read-only mounts or /proc, and creating an empty file succeeds on a full disk)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-", delete=True) as fh:
            fh.write(bytes(PROBE_BYTES))
            fh.flush()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def folder_problem(path: str | Path, what: str = "output folder") -> str | None:
    """Why ``path`` cannot be (created and) written as a folder (None when it can); creates nothing."""
    p = Path(path)
    if str(path) == "":
        return f"{what} '' is not a folder name"
    if p.exists() and not p.is_dir():
        return f"{what} {str(p)!r} is a file, not a folder"
    return _ancestor_problem(p, p, what)


def _resolved(path: str | Path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop or a NUL character: the path as written, made absolute
        return Path(os.path.abspath(Path(path).expanduser()))


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode where both exist (hard links, symlinks),
    else the same absolute path once symlinks, ``~`` and ``..`` are resolved."""
    try:
        if os.path.samefile(a, b):
            return True
    except (OSError, ValueError):
        pass
    return _resolved(a) == _resolved(b)


def input_clash(outputs: Sequence[tuple[str, str | Path]], inputs: Sequence[tuple[str, str | Path]]) -> str | None:
    """Why writing an output would overwrite an input (None when none would), for the ``error:`` line.

    ``outputs`` and ``inputs`` are (what, path) pairs. An output is refused when it is the same
    file as an input (``same_file``: relative paths, symlinks and hard links included), or an
    existing file inside an input folder (a ROS 2 bag's files)."""
    for what, out in outputs:
        for in_what, inp in inputs:
            if same_file(out, inp):
                relation = "is also" if str(out) == str(inp) else "is the same file as"
                return f"{what} {str(out)!r} {relation} {in_what} {str(inp)!r}: writing it would overwrite that input"
            if Path(inp).is_dir() and Path(out).is_file() and _resolved(inp) in _resolved(out).parents:
                return (f"{what} {str(out)!r} is a file inside {in_what} {str(inp)!r}: writing it would "
                        "overwrite part of that input")
    return None


def show_progress(quiet: bool = False, stream: Any = None) -> bool:
    """Progress bars only when not quiet and stderr is a terminal (no frames in logs or pipes)."""
    if quiet:
        return False
    s = sys.stderr if stream is None else stream
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


NOTHING_WRITTEN = "no output was written (outputs are only renamed into place when complete)"


def interrupted_line(exc: BaseException) -> str:
    """The one line printed when a signal stops a command: which signal (Ctrl-C is plain
    ``interrupted``) and what is on disk (the exception's ``outcome``; none: nothing was written)."""
    signum = int(getattr(exc, "signum", signal.SIGINT))
    name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    return f"interrupted{name}: {one_line(getattr(exc, 'outcome', None) or NOTHING_WRITTEN)}"


def run_guarded(func: Callable[[], int], user_errors: tuple[type[BaseException], ...]) -> int:
    """Run a command: user errors -> one line, exit 2; Ctrl-C -> 130; anything else -> one line, exit 1."""
    try:
        return int(func() or 0)
    except user_errors as exc:
        return print_error(exc)
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM where the entry point made it one (sysid.app.signals)
        print(interrupted_line(exc), file=sys.stderr)
        return int(getattr(exc, "status", 128 + signal.SIGINT))
    except BrokenPipeError:  # `... | head`
        return 0
    except Exception as exc:  # noqa: BLE001 - the last boundary: no traceback reaches a user
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(
            f"error: internal error ({type(exc).__name__}: {one_line(exc)[:300]}); this is a bug, please report it "
            f"with the command line (set {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
