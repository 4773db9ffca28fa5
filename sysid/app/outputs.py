"""How the commands write a set of outputs: together, under a lock, recoverably.

- ``commit_outputs``: every file of a set (the fit's parameter file, results JSON and report; the
  plan's two files; cross-validation's two) is written to a temporary ``.part`` beside its target,
  then the set replaces the earlier one as a whole: hard-link backups ``.bak`` of the earlier files,
  the renames, and the commit point, all with SIGINT and SIGTERM held back
  (`sysid.app.signals.deferred`). A signal while the files are written stops at once and leaves the
  complete earlier set; one during the replacement waits for it and leaves the complete new set;
  never a mix, no ``.part`` or ``.bak`` behind, and the printed line says which. A failure (a full
  disk) puts the earlier set back.
- A journal (``.sysid-commit.<token>.json`` in the first target's folder, a ``.ptr`` to it in the
  others) records the commit from before its first file until its commit point (the journal renamed
  to ``.done``), so that what a killed run (SIGKILL, a power cut) left can be put right.
- ``output_lock``: a lock file (``flock``) in every output folder, held from before the work to the
  end of the command: a second command writing into the same folder stops at once with one line.
  Taking a folder's lock first runs ``recover`` there: a commit killed before its commit point is
  rolled back (the earlier set restored from its ``.bak`` files), one killed after it is cleaned up,
  in every folder it wrote to; stray ``.part``, ``.bak`` and abandoned ``.tmp`` files are removed.

``STEP_HOOK`` is called before each step of a commit (tests deliver signals there).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from ingest.fileio import OURS as TEMPORARY
from ingest.fileio import hold_lock, remove_if_abandoned
from sysid.app.signals import Interrupted, deferred, set_outcome, take_pending
from sysid.errors import OutputError, SysidError

__all__ = ["OutputBusyError", "commit_outputs", "output_lock", "recover"]

LOCK_NAME = ".sysid-lock"
PART, BACKUP = "part", "bak"
_TOKEN = r"[0-9a-f]{8}"
# ``.<target>.sysid-<token>.part`` (also the ``tempfile.mkstemp`` names of earlier versions)
_STAGED = re.compile(rf"\.(?P<target>.+)\.(?P<token>sysid-{_TOKEN}|[a-z0-9_]{{8}})\.(?P<kind>{PART}|{BACKUP})")
_JOURNAL = re.compile(rf"\.sysid-commit\.(?P<token>{_TOKEN})\.(?P<kind>json|done|ptr)")

# Called as STEP_HOOK(k, step) before the k-th step (1-based) of every commit; None in normal use.
STEP_HOOK: Callable[[int, str], None] | None = None


class OutputBusyError(SysidError):
    """Another command holds the lock of an output folder."""


# -- the lock ------------------------------------------------------------------------------------


@dataclass
class _Held:
    fd: int
    count: int
    created: list[Path]  # folders made for the lock (removed again if left empty)


_held: dict[Path, _Held] = {}


def _absolute(folder: Path) -> Path:
    try:
        return folder.expanduser().resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(folder))


@contextmanager
def output_lock(folders: Iterable[str | Path]) -> Iterator[None]:
    """Hold the lock of every folder in ``folders`` (made when missing, removed again if left empty)
    inside the block; re-entrant within one process. On first taking a folder's lock, what a killed
    earlier run left there is put right (``recover``; each repair is one ``warning:`` line on stderr).
    `OutputBusyError` when another process holds one of them."""
    wanted = sorted({_absolute(Path(f)) for f in folders})
    taken: list[Path] = []
    try:
        for folder in wanted:
            first = folder not in _held
            _acquire(folder)
            taken.append(folder)
            if first:
                for note in recover(folder):
                    print(f"warning: {note}", file=sys.stderr)
        yield
    finally:
        for folder in reversed(taken):
            _release(folder)


def _acquire(folder: Path) -> None:
    if folder in _held:
        _held[folder].count += 1
        return
    created = []
    parent = folder
    while not parent.exists() and parent != parent.parent:
        created.append(parent)
        parent = parent.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output folder {str(folder)!r} ({exc.strerror or exc}); "
                          "nothing was computed or written") from None
    lock = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            _remove_folders(created[::-1])
            raise OutputError(f"cannot create the lock file {str(lock)!r} ({exc.strerror or exc}); "
                              "nothing was computed or written") from None
        if not hold_lock(fd):
            holder = _read_pid(fd)
            os.close(fd)
            _remove_folders(created[::-1])
            raise OutputBusyError(
                f"another sysid command{f' (process {holder})' if holder else ''} is writing into "
                f"{str(folder)!r} (it holds {LOCK_NAME} there); wait for it to finish, or give this one "
                "another output folder; nothing was computed or written")
        try:  # the holder may have removed (and another process re-made) the file before we locked it
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:  # the process id is only for the message of a second command
        pass
    _held[folder] = _Held(fd, 1, created[::-1])


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if text.isdigit() else ""


def _release(folder: Path) -> None:
    held = _held[folder]
    held.count -= 1
    if held.count:
        return
    del _held[folder]
    try:
        os.unlink(folder / LOCK_NAME)  # while still locked: a waiting process then re-opens a fresh file
    except OSError:
        pass
    os.close(held.fd)
    _remove_folders(held.created)


def _remove_folders(created: Sequence[Path]) -> None:
    for d in reversed(created):  # innermost first; a folder that holds anything stays
        try:
            d.rmdir()
        except OSError:
            pass


# -- recovery ------------------------------------------------------------------------------------


class _JournalEntry(TypedDict):
    """One target of a commit as its journal records it (absolute paths)."""

    target: str
    part: str  # the new content, staged beside the target
    backup: str  # a hard link to the earlier file, while the set is replaced
    existed: bool  # whether the target existed before the commit


def _journal_path(folder: Path, token: str, kind: str) -> Path:
    return folder / f".sysid-commit.{token}.{kind}"


def _state(base: Path, kind: str) -> Path:
    """The journal ``base`` (``.sysid-commit.<token>``) in one state: json (open) or done (committed)."""
    return base.parent / f"{base.name}.{kind}"


def _staged_path(target: Path, token: str, kind: str) -> Path:
    return target.parent / f".{target.name}.sysid-{token}.{kind}"


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _same_inode(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.stat(a, follow_symlinks=False), os.stat(b, follow_symlinks=False))
    except OSError:
        return False


def _roll_back(entries: Sequence[_JournalEntry], pointers: Sequence[str], journal: Path | None) -> list[str]:
    """Put the earlier set back (idempotent: a rollback cut short can be run again): each target
    with a backup gets it back, each target that did not exist before is removed, the temporaries,
    pointers and the journal (last) go. Returns the targets restored."""
    restored = []
    for e in entries:
        target, backup = Path(e["target"]), Path(e["backup"])
        if os.path.lexists(backup):
            if _same_inode(backup, target):  # not replaced yet (and rename() between two links of one file is a no-op)
                os.unlink(backup)
            else:
                os.replace(backup, target)
                restored.append(str(target))
        elif not e["existed"] and os.path.lexists(target):
            os.unlink(target)  # the new file of an output that had none before
        _unlink(e["part"])
    for p in pointers:
        _unlink(p)
    if journal is not None:
        _unlink(journal)
    return restored


def _finish(entries: Sequence[_JournalEntry], pointers: Sequence[str], done: Path) -> None:
    """Remove what a commit past its commit point leaves: the backups, pointers and the journal (last)."""
    for e in entries:
        _unlink(e["backup"])
        _unlink(e["part"])
    for p in pointers:
        _unlink(p)
    _unlink(done)


def _read_journal(path: Path) -> tuple[list[_JournalEntry], list[str]] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return list(doc["targets"]), list(doc["pointers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recover(folder: str | Path) -> list[str]:
    """Put right what killed earlier runs left in ``folder`` (call it holding the folder's lock, as
    ``output_lock`` does): a commit that never reached its commit point is rolled back (its earlier
    set restored from the backups, in every folder it wrote to), the backups of a completed commit and
    stray temporaries are removed (in every folder it wrote to). Returns one note per repair."""
    folder = Path(folder)
    notes: list[str] = []
    with deferred():
        try:
            names = sorted(e.name for e in os.scandir(folder))
        except OSError:
            return notes
        bases: list[Path] = []  # journals without their suffix (.json: not committed, .done: committed)
        for name in names:
            m = _JOURNAL.fullmatch(name)
            if m is None:
                continue
            path = folder / name
            if m["kind"] == "ptr":
                try:
                    base = Path(path.read_text(encoding="utf-8").strip())
                except (OSError, UnicodeDecodeError):
                    base = Path()
                if not (_state(base, "json").is_file() or _state(base, "done").is_file()):
                    _unlink(path)  # its journal is gone: what is left here are strays, removed below
                    continue
                bases.append(base)
            else:
                bases.append(path.parent / path.stem)
        for base in dict.fromkeys(bases):
            journal, done = _state(base, "json"), _state(base, "done")
            read = _read_journal(journal if journal.is_file() else done)
            if read is None:  # cut short while it was written: nothing else of that commit exists yet
                _unlink(journal)
                _unlink(done)
                continue
            entries, pointers = read
            outputs = ", ".join(str(e["target"]) for e in entries)
            if journal.is_file():
                restored = _roll_back(entries, pointers, journal)
                notes.append(f"an earlier run was stopped while it wrote {outputs}: the earlier set is back in "
                             "place" + (f" ({', '.join(restored)} restored)" if restored else ""))
            else:
                _finish(entries, pointers, done)
                notes.append(f"an earlier run was stopped after it wrote {outputs}: its leftovers were removed")
        removed = []
        for name in sorted(e.name for e in os.scandir(folder)):
            path = folder / name
            if _STAGED.fullmatch(name) and path.is_file():  # the leftovers of no journal (or an older version's)
                _unlink(path)
                removed.append(name)
            elif TEMPORARY.fullmatch(name) and remove_if_abandoned(path):
                removed.append(name)
        if removed:
            notes.append(f"removed {len(removed)} temporary file(s) that a stopped earlier run left in "
                         f"{str(folder)!r}: {', '.join(removed)}")
    return notes


# -- the commit ----------------------------------------------------------------------------------


_step_count = 0


def _step(name: str) -> None:
    global _step_count
    _step_count += 1
    if STEP_HOOK is not None:
        STEP_HOOK(_step_count, name)


def _backup(target: Path, backup: Path, token: str) -> None:
    """A hard link (else a copy) of an existing output under ``backup``. A copy is made under a
    temporary name first: a backup exists only complete (a rollback puts it over the target)."""
    try:
        os.link(target, backup, follow_symlinks=False)
        return
    except OSError:
        pass
    copy = _staged_path(target.with_name(f"{target.name}.copy"), token, PART)
    try:
        shutil.copy2(target, copy, follow_symlinks=False)
        os.replace(copy, backup)
    finally:
        _unlink(copy)


def _rename_into_place(tmp: Path, target: Path) -> None:
    """The commit of one output (a separate function so that tests can inject a failure here)."""
    os.replace(tmp, target)


def _write_new(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _earlier_set(targets: Sequence[Path], existed: Mapping[Path, bool]) -> str:
    before = [str(t) for t in targets if existed[t]]
    absent = [str(t) for t in targets if not existed[t]]
    if not before:
        return f"none of {', '.join(absent)} existed before, and none does now"
    text = f"the earlier set is in place: {', '.join(before)} as {'it was' if len(before) == 1 else 'they were'} before"
    return text + (f" ({', '.join(absent)} still absent)" if absent else "")


def commit_outputs(targets: Sequence[tuple[str, Path]], writers: Mapping[str, Callable[[Path], Any]]) -> None:
    """Commit a set of output files together: ``writers[what](temporary)`` writes each target's
    content to a temporary ``.part`` beside it, then the set replaces the earlier one as a whole (see
    the module). An OSError becomes `OutputError` naming the file that failed, SIGINT / SIGTERM
    `Interrupted`; either way the message says which set is in place (the earlier one, byte for byte),
    and after a signal held back during the renames, that the new one is.

    The steps: the journal (in the first target's folder: every target, its temporary and backup
    names, whether it existed) and a pointer to it in every other folder; the temporaries; hard-link
    backups of the earlier files; the renames; the commit point (the journal renamed to ``.done``);
    the backups, pointers and journal removed. A run killed before the commit point is rolled back
    by the next lock of any of the folders, one killed after it is cleaned up (``recover``)."""
    global _step_count
    _step_count = 0
    paths = [Path(t) for _w, t in targets]
    names = ", ".join(str(t) for t in paths)
    with output_lock(p.parent for p in paths):
        token = secrets.token_hex(4)
        existed = {p: os.path.lexists(p) for p in paths}
        earlier = _earlier_set(paths, existed)
        entries: list[_JournalEntry] = [{"target": str(_absolute(p.parent) / p.name),
                                          "part": str(_staged_path(_absolute(p.parent) / p.name, token, PART)),
                                          "backup": str(_staged_path(_absolute(p.parent) / p.name, token, BACKUP)),
                                          "existed": existed[p]} for p in paths]
        folders = list(dict.fromkeys(Path(e["target"]).parent for e in entries))
        journal = _journal_path(folders[0], token, "json")
        pointers = [str(_journal_path(f, token, "ptr")) for f in folders[1:]]
        what = "journal of the commit"
        try:  # 1. the journal, then the new files beside their targets; a signal here stops at once
            _step("write the journal")
            _write_new(journal, json.dumps({"targets": entries, "pointers": pointers}))
            for ptr in pointers:
                _step("write a pointer to the journal")
                _write_new(Path(ptr), str(journal.parent / journal.stem))
            umask = os.umask(0)
            os.umask(umask)
            for (what, _t), e in zip(targets, entries, strict=True):
                _step(f"stage the {what}")
                os.close(os.open(e["part"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                writers[what](Path(e["part"]))
                os.chmod(e["part"], 0o666 & ~umask)  # readable like any file the user writes
            with deferred():  # 2. replace the set as a whole; a signal waits until it is done
                for (w, _t), e in zip(targets, entries, strict=True):
                    what = f"backup of the earlier {w}"
                    _step(f"back up the earlier {w}")
                    if e["existed"]:
                        _backup(Path(e["target"]), Path(e["backup"]), token)
                for (w, _t), e in zip(targets, entries, strict=True):
                    what = w
                    _step(f"rename the {w} into place")
                    _rename_into_place(Path(e["part"]), Path(e["target"]))
                what = "journal of the commit"
                _step("commit point: mark the journal done")
                os.replace(journal, _state(journal.parent / journal.stem, "done"))
        except BaseException as exc:
            with deferred():
                _roll_back(entries, pointers, journal)
            _raise_failure(exc, what, names, earlier, take_pending())
        done = f"the outputs were written before it stopped: the new set is in place: {names}"
        set_outcome(done)
        with deferred():
            _step("remove the backups")
            _finish(entries, pointers, _state(journal.parent / journal.stem, "done"))
            _step("done")
        signum = take_pending()
        if signum is not None:
            raise Interrupted(signum, done)


def _raise_failure(exc: BaseException, what: str, names: str, earlier: str, signum: int | None) -> NoReturn:
    """Report a commit undone: a signal (also one held back) as `Interrupted`, an OSError as
    `OutputError`, anything else as it is."""
    if isinstance(exc, KeyboardInterrupt) or signum is not None:
        sig = signum if signum is not None else int(getattr(exc, "signum", 2))
        raise Interrupted(sig, f"no output was written; {earlier}") from exc
    if isinstance(exc, OSError):
        raise OutputError(f"could not write the {what} ({exc.strerror or exc}); nothing was written: {names} "
                          f"are as they were before") from exc
    raise exc
