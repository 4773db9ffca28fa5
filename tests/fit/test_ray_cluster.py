"""Ray for `sysid cv` and `--workers` (sysid/fit/fanout.py): the local cluster is this process's own
(whatever else runs on the machine), listens on 127.0.0.1 only, writes nothing to Ray's default
places and leaves no process behind; a cluster started with `ray start` is joined with its token, a
failed join is one line; SIGTERM and SIGINT stop `sysid cv --workers 2` with one line and no leftovers."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from sysid.cli import main  # noqa: E402
from sysid.fit import fanout  # noqa: E402
from tests.helpers.fit_doubles import write_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
ENV_KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")

# A simulator that marks that a fold is running (in a Ray worker) and is slow enough to be stopped.
SLOWSIM = """
import os, time
from pathlib import Path
from tests.helpers.fit_doubles import KinematicDouble


class Slow(KinematicDouble):
    def rollout_with_jacobian(self, runs, theta, dt, names):
        Path(os.environ["SLOWSIM_MARKS"], str(os.getpid())).touch()
        time.sleep(0.5)
        return super().rollout_with_jacobian(runs, theta, dt, names)


def make(robot=None, **options):
    return Slow(robot, **options)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_dir(prefix: str) -> Path:
    """A folder with a short path (Ray's unix sockets sit ~65 characters below it; the limit is 107)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def listening(procs) -> list[str]:
    ips = []
    for p in procs:
        try:
            ips += [c.laddr.ip for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
    return ips


def wait_gone(procs, timeout: float = 15.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def write_config(path: Path, dataset: Path, simulator: str = "kinematic") -> Path:
    path.write_text(yaml.safe_dump({
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": simulator},
        "data": {"train": [str(dataset / "train-*.npz")], "held_out": [str(dataset / "held-*.npz")], "split": 2.5},
        "parameters": {"kp": {"bounds": [10, 2000]}, "mu_lateral": {"bounds": [0.05, 5.0]}},
        "fit": {"dt": 0.05, "max_iter": 10},
        "sweep": {"enabled": False},
    }))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom", "random"))


def test_local_cluster_listens_on_loopback_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no token configured: Ray would write ~/.ray/auth_token
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # too long a path for Ray's unix sockets below it
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    flag = ray._private.ray_constants.ENABLE_RAY_CLUSTER
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}  # e.g. a resource tracker from an earlier test
    with fanout.cluster(2, None) as started:
        assert started
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42  # a worker reaches the servers
        procs = [me, *(p for p in me.children(recursive=True) if p.pid not in before)]
        ips = listening(procs)
        session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert len(ips) >= 4 and set(ips) <= LOOPBACK, ips  # GCS, raylet (2), the driver's and the worker's servers
    assert os.environ.get("RAY_AUTH_TOKEN")  # a token of this process, handed to Ray's processes
    assert session.parent.name.startswith("sysid-ray-") and session.parent.parent == Path("/tmp")
    assert not session.parent.exists()  # the session's files removed
    assert not wait_gone(procs[1:])  # every process Ray started has ended
    assert not (home / ".ray").exists()
    assert ray._private.ray_constants.ENABLE_RAY_CLUSTER == flag and not ray.is_initialized()


def test_local_cluster_whatever_else_runs(monkeypatch):
    """A stale ``ray_current_cluster`` file and ``RAY_ADDRESS`` (what a running ``ray start`` head
    leaves) do not turn the local cluster into a join."""
    root = short_dir("sysid-test-ray-")
    try:
        (root / "ray").mkdir()
        (root / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
        monkeypatch.setenv("RAY_TMPDIR", str(root))  # Ray's default place: RAY_TMPDIR/ray
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
        with fanout.cluster(2, None) as started:
            assert started and ray.cluster_resources()["CPU"] == 2
        assert os.listdir(root / "ray") == ["ray_current_cluster"]  # nothing of this session in Ray's place
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_token_changed_since_the_last_cluster_is_read_afresh(monkeypatch):
    """Ray caches the token a process read first; when the environment names another by the next local
    cluster (a test's or a caller's environment restored), that cluster starts with the new one and the
    process must present it too (found as an InvalidAuthToken failure depending on the order of tests)."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    for token in ("a" * 64, "b" * 64):
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        with fanout.cluster(2, None) as started:
            assert started and ray.get(ray.remote(lambda: 6 * 7).remote()) == 42


def test_failed_join_is_one_line(dataset, tmp_path, capsys):
    port = free_port()
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    t0 = time.monotonic()
    rc = main(["cv", "-c", str(cfg), "--folds", "2", "--ray-address", f"127.0.0.1:{port}", "-q",
               "-o", str(tmp_path / "cv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot join the Ray cluster at '127.0.0.1:{port}': nothing answers there ("), err
    assert "ray start --head" in err and time.monotonic() - t0 < 60
    assert not (tmp_path / "cv").exists()


def run_cli(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "sysid.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_join_a_cluster_started_with_ray_start(dataset, tmp_path):
    """A head as docs/cluster.md starts it (its token in a file), joined by ``sysid cv --ray-address``;
    a wrong token is one line; without an address ``sysid cv`` starts its own cluster beside it."""
    root = short_dir("sysid-test-head-")
    (root / "home").mkdir()
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(HOME=str(root / "home"), RAY_TMPDIR=str(root), RAY_AUTH_TOKEN_PATH=str(token))
    port = free_port()
    address = f"127.0.0.1:{port}"
    ray_cli = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--num-cpus", "3", "--include-dashboard", "false", "--block"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and head.poll() is None, "the head did not start"
                time.sleep(0.5)

        res = run_cli(["cv", "-c", str(cfg), "--folds", "2", "--ray-address", address, "-o", str(tmp_path / "a"),
                       "-q"], env)
        assert res.returncode == 0, res.stderr
        doc = json.loads((tmp_path / "a" / "cv.json").read_text())
        ex = doc["execution"]
        assert doc["summary"]["n_ok"] == 2 and ex["backend"] == "ray" and ex["address"] == address
        assert not ex["started_cluster"] and ex["cluster_cpus"] == 3  # the head's CPUs: it ran there

        res = run_cli(["cv", "-c", str(cfg), "--folds", "2", "--ray-address", address, "-o", str(tmp_path / "b"),
                       "-q"], {**env, "RAY_AUTH_TOKEN": "0" * 64})
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"error: cannot join the Ray cluster at {address!r}: the cluster refused this "
                                     "process's authentication token (InvalidAuthToken)"), res.stderr
        assert not (tmp_path / "b").exists()

        res = run_cli(["cv", "-c", str(cfg), "--folds", "2", "--workers", "2", "-o", str(tmp_path / "c"), "-q"], env)
        assert res.returncode == 0, res.stderr
        ex = json.loads((tmp_path / "c" / "cv.json").read_text())["execution"]
        assert ex["started_cluster"] and ex["address"] is None and ex["cluster_cpus"] == 2
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def short_tmp():
    tmp = short_dir("st-")
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("signum, to", [
    (signal.SIGTERM, "process"),  # timeout, kill, SLURM
    pytest.param(signal.SIGTERM, "group", marks=pytest.mark.slow),  # docker, systemd: every process at once
    pytest.param(signal.SIGINT, "process", marks=pytest.mark.slow),
])
def test_signal_stops_ray_cleanly(signum, to, dataset, tmp_path, short_tmp):
    mods, marks = tmp_path / "mods", tmp_path / "marks"
    mods.mkdir()
    marks.mkdir()
    (mods / "slowsim.py").write_text(SLOWSIM)
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(PYTHONPATH=os.pathsep.join([str(mods), str(ROOT)]), SLOWSIM_MARKS=str(marks),
               TMPDIR=str(short_tmp), RAY_TMPDIR=str(short_tmp))  # where the run's files would stay
    out = tmp_path / "cv"
    cli = subprocess.Popen([sys.executable, "-m", "sysid.cli", "cv", "-c", str(write_config(
        tmp_path / "fit.yaml", dataset, "slowsim:make")), "--allow-simulator", "slowsim:make", "--folds", "2",
        "--workers", "2", "-o", str(out), "-q"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    tree: list = []
    try:
        deadline = time.monotonic() + 240
        while not any(marks.iterdir()):  # a fold runs in a Ray worker
            assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
            time.sleep(0.2)
        tree = psutil.Process(cli.pid).children(recursive=True)
        assert len(tree) >= 3
        if to == "group":
            os.killpg(cli.pid, signum)
        else:
            cli.send_signal(signum)
        _, err = cli.communicate(timeout=120)
        assert cli.returncode == 128 + signum, err
        assert err.count("\n") == 1 and err.startswith("interrupted"), err  # no Ray crash dump
        assert not wait_gone(tree)
        assert not out.exists()
        assert not [p for p in os.listdir(short_tmp) if p.startswith("sysid-ray-") or p == "ray"]
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
        for proc in tree:  # what a failing run left
            if proc.is_running():
                proc.kill()
