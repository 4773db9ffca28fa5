"""The commit of a set of outputs under signals (`sysid.app.outputs`, `sysid.app.signals`).

A subprocess commits a set of three files in two folders through the command line's boundary
(``run_guarded`` inside ``handled_signals``, as ``sysid`` and ``ingest`` run) and sends itself a
signal at the k-th step of the commit (``outputs.STEP_HOOK``), for every k until the commit runs
through. After each, the folders hold exactly the complete earlier set or the complete new set
(byte for byte), nothing else (no ``.part``, ``.bak``, ``.tmp``, journal or lock), the exit status is
130 (SIGINT) or 143 (SIGTERM) and the one printed line says which set is in place. SIGKILL (no
handler runs) leaves the leftovers for the next run, whose lock puts them right (`recover`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sysid.app.outputs as outputs

ROOT = Path(__file__).resolve().parents[2]

HARNESS = r"""
import json, os, signal, sys
from pathlib import Path
import sysid.app.outputs as outputs
from ingest.clikit import run_guarded
from ingest.fileio import atomic_write_text
from sysid.app.signals import handled_signals
from sysid.errors import SysidError

targets, new, mode, at, log = json.loads(sys.argv[1])

def hook(k, step):
    if at == 0:  # list the steps
        with open(log, "a") as fh:
            fh.write(step + "\n")
    elif k == at:
        Path(log).write_text(step)
        os.kill(os.getpid(), getattr(signal, mode))

outputs.STEP_HOOK = hook
writers = {what: (lambda tmp, text=new[what]: atomic_write_text(tmp, text)) for what, _t in targets}
with handled_signals():
    status = run_guarded(lambda: outputs.commit_outputs([(w, Path(t)) for w, t in targets], writers) or 0,
                         (SysidError,))
sys.exit(status)
"""

NAMES = {"parameter file": "models/params.yaml", "results": "out/report.json", "report": "out/report.html"}


def _targets(root: Path) -> list[tuple[str, str]]:
    return [(what, str(root / rel)) for what, rel in NAMES.items()]


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, hidden ones included."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _set(root: Path, label: str) -> dict[str, bytes]:
    return {rel: f"{label} {what}\n".encode() * 2000 for what, rel in NAMES.items()}


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _start(root: Path, mode: str, at: int) -> tuple[subprocess.Popen[str], Path]:
    """The harness committing the new set into ``root``, stopped by ``mode`` before step ``at``
    (0: not stopped, every step's name logged)."""
    log = root.parent / f"{root.name}.step"
    new = {what: f"new {what}\n" * 2000 for what in NAMES}
    arg = json.dumps([_targets(root), new, mode, at, str(log)])
    return subprocess.Popen([sys.executable, "-c", HARNESS, arg], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}), log


def _run_at_every_step(tmp_path: Path, mode: str, old: dict[str, bytes]
                       ) -> list[tuple[str, Path, subprocess.CompletedProcess[str]]]:
    """Commit into a fresh copy of ``old`` once per step of the commit, each stopped by ``mode`` at its
    step (the runs in parallel); returns (step, folder, finished process) per step."""
    root = tmp_path / "through"
    _write(root, old)
    proc, log = _start(root, mode, 0)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert _snapshot(root) == _set(root, "new")  # unstopped, the commit writes the new set
    steps = log.read_text().splitlines()
    started = []
    for k in range(1, len(steps) + 1):
        at = tmp_path / f"at-{k}"
        _write(at, old)
        started.append((at, *_start(at, mode, k)))
    done = []
    for (at, proc, log), step in zip(started, steps, strict=True):
        out, err = proc.communicate(timeout=120)
        assert log.read_text() == step
        done.append((step, at, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)))
    return done


@pytest.mark.parametrize("earlier", [True, False], ids=["over-an-earlier-set", "no-earlier-set"])
@pytest.mark.parametrize("mode", ["SIGINT", "SIGTERM"])
def test_a_signal_at_every_step_leaves_one_whole_set(tmp_path: Path, mode: str, earlier: bool) -> None:
    status = 128 + getattr(signal, mode)
    old = _set(tmp_path, "old") if earlier else {}
    new = _set(tmp_path, "new")
    seen: dict[str, str] = {}
    for step, root, proc in _run_at_every_step(tmp_path, mode, old):
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == status, (step, proc.returncode, proc.stderr)
        assert len(err) == 1, (step, err)
        prefix = "interrupted: " if mode == "SIGINT" else "interrupted (SIGTERM): "
        assert err[0].startswith(prefix), err
        files = _snapshot(root)
        assert files in (old, new), (step, sorted(files))  # the whole earlier set or the whole new one, nothing else
        if files == new:
            assert "the new set is in place: " in err[0], (step, err)
            seen[step] = "new"
        else:
            assert "no output was written; " in err[0], (step, err)
            assert ("the earlier set is in place" if earlier else "none of") in err[0], (step, err)
            seen[step] = "old"
        assert all(str(root / rel) in err[0] for rel in NAMES.values()), err  # names every file of the set
    # a signal while the files are written stops at once; one during the replacement waits for it to finish
    assert {s for s, v in seen.items() if v == "old"} == {"write the journal", "write a pointer to the journal",
                                                          *(f"stage the {what}" for what in NAMES)}, seen
    assert {s for s, v in seen.items() if v == "new"} == {
        *(f"back up the earlier {what}" for what in NAMES), *(f"rename the {what} into place" for what in NAMES),
        "commit point: mark the journal done", "remove the backups", "done"}, seen


def test_sigkill_leftovers_are_put_right_by_the_next_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No handler runs on SIGKILL: the journal, backups and temporaries stay. The next command that
    locks one of the folders restores the earlier set when the commit point was not reached (else
    keeps the new one) and removes every leftover, in both folders."""
    old, new = _set(tmp_path, "old"), _set(tmp_path, "new")
    left_behind = set()
    for k, (step, root, proc) in enumerate(_run_at_every_step(tmp_path, "SIGKILL", old), start=1):
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        left_behind |= {Path(p).suffix for p in _snapshot(root) if Path(p).name.startswith(".")}
        committed = step in ("remove the backups", "done")
        first, second = ("out", "models") if k % 2 else ("models", "out")
        with outputs.output_lock([root / first]):  # either folder's lock finds the commit (once it has begun there)
            pass
        files = _snapshot(root)
        assert {rel: files[rel] for rel in NAMES.values() if rel in files} == (new if committed else old), step
        assert not [rel for rel in files if rel.startswith(f"{first}/.")], (step, sorted(files))
        with outputs.output_lock([root / second]):
            pass
        assert _snapshot(root) == (new if committed else old), (step, sorted(_snapshot(root)))
        notes = capsys.readouterr().err
        if step != "write the journal" and not committed:
            assert "the earlier set is back in place" in notes, (step, notes)
    assert {".part", ".bak", ".json", ".done", ".ptr"} <= left_behind  # the kills did leave each kind behind


def test_stale_temporaries_of_a_killed_writer_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """``atomic_path`` (every single-file write, the ingest cache included): a writer killed mid-write
    leaves its ``.tmp``; the next write into the folder removes it (and any other of this package's
    abandoned ones there), but not the one a live writer holds."""
    from ingest.fileio import atomic_write_text, hold_lock

    target = tmp_path / "cache" / "run-0123.npz"
    kill = ("import os, signal, sys\nfrom ingest.fileio import atomic_path\n"
            f"with atomic_path({str(target)!r}) as tmp:\n"
            "    open(tmp, 'wb').write(b'half')\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", kill], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    stale = [p.name for p in target.parent.iterdir()]
    assert len(stale) == 1 and stale[0].startswith(".run-0123.npz.") and stale[0].endswith(".tmp"), stale
    other = target.parent / ".run-4567.npz.sysid-0badcafe.tmp"  # another cache entry's, also abandoned
    other.write_bytes(b"half")
    live = target.parent / ".run-0123.npz.sysid-12345678.tmp"  # another process writing the same file now
    fd = os.open(live, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert hold_lock(fd)
        held = subprocess.run(  # the lock is another process's: a child's own flock must fail
            [sys.executable, "-c", f"from ingest.fileio import remove_if_abandoned as r; from pathlib import Path; "
             f"print(r(Path({str(live)!r})))"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert held.stdout.strip() == "False", held.stderr
        atomic_write_text(target, "complete")
        assert target.read_text() == "complete"
        assert sorted(p.name for p in target.parent.iterdir()) == [live.name, target.name]
    finally:
        os.close(fd)


def test_a_second_command_into_a_locked_folder_stops_at_once(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nimport sysid.app.outputs as o\n"
         f"with o.output_lock([{str(tmp_path / 'out')!r}]):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(outputs.OutputBusyError) as err, outputs.output_lock([tmp_path / "out"]):
            pass
        msg = str(err.value)
        assert f"(process {holder.pid}) is writing into {str(tmp_path / 'out')!r}" in msg, msg
        assert "\n" not in msg and "nothing was computed or written" in msg
    finally:
        holder.kill()
        holder.wait()
    with outputs.output_lock([tmp_path / "out"]):  # the holder's death released it (its lock file is taken over)
        assert (tmp_path / "out" / outputs.LOCK_NAME).is_file()
    assert not (tmp_path / "out" / outputs.LOCK_NAME).exists()


# ---------------------------------------------------------------------------------------------
# the whole command: `sysid fit` stopped between the renames of its three outputs

FIT = r"""
import json, os, signal, sys
args, mode, after = json.loads(sys.argv[1])
real, renamed = os.replace, []

def replace(src, dst, *a, **k):  # the signal comes right after the after-th output is renamed into place
    real(src, dst, *a, **k)
    if str(src).endswith(".part"):
        renamed.append(dst)
        if len(renamed) == after:
            os.kill(os.getpid(), getattr(signal, mode))

os.replace = replace
from sysid.cli import main
sys.exit(main(args))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "after"), [("SIGINT", 1), ("SIGTERM", 2)])
def test_fit_stopped_between_its_renames_leaves_one_whole_set(tmp_path: Path, mode: str, after: int) -> None:
    """What a user saw: Ctrl-C or SIGTERM (timeout, systemd, SLURM) between the renames of a fit's
    outputs left a new report.json beside the earlier params.yaml and report.html."""
    import yaml

    from sysid.cli import main
    from tests.helpers.fit_doubles import make_runs

    for r in make_runs(("turn", "accel"), duration=4.0, truth_dt=0.05, prefix="train", noise=0.01):
        r.save(tmp_path / f"{r.name}.npz")
    cfg = {"robot": str(ROOT / "models" / "helhest" / "robot.yaml"), "simulator": "kinematic",
           "data": {"train": [str(tmp_path / "train-*.npz")]}, "fit": {"dt": 0.05, "max_iter": 4},
           "sweep": {"enabled": False}}
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    args = ["fit", "-q", "-c", str(tmp_path / "fit.yaml"), "-o", str(out)]
    assert main(args) == 0
    earlier = _snapshot(out)
    assert sorted(earlier) == ["params.yaml", "report.html", "report.json"]
    proc = subprocess.run([sys.executable, "-c", FIT, json.dumps([args, mode, after])], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 128 + getattr(signal, mode), (proc.returncode, proc.stderr[-2000:])
    now = _snapshot(out)
    assert sorted(now) == sorted(earlier), sorted(now)  # no .part, .bak, journal or lock left
    changed = {name for name in now if now[name] != earlier[name]}
    assert changed in (set(), set(now)), changed  # all earlier or all new, never a mix
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted" + ("" if mode == "SIGINT" else " (SIGTERM)") + ": "), last
    said = "the new set is in place" if changed else "the earlier set is in place"
    assert said in last, last
