"""Fan-out on Ray beyond `sysid cv` (sysid/fit/fanout.py): `sysid sweep-dt --workers N` runs each timestep
as a Ray task, a multi-start `sysid fit --workers N` runs its start batches and refinement fits as Ray
tasks when the starts exceed one batch; both give the serial path's results to the printed digits
(and beyond: the same floats). Small cases on the kinematic test double and Ray's local cluster."""

import copy
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
import sysid.fit.fanout  # noqa: E402
import sysid.fit.multistart  # noqa: E402
import sysid.fit.sweep  # noqa: E402
import tests.fit.test_cv as cv_tests  # noqa: E402
from sysid.app.config import FitConfig  # noqa: E402
from sysid.app.pipeline import run_fit  # noqa: E402
from sysid.app.sweep import run_sweep  # noqa: E402
from sysid.cli import main  # noqa: E402
from sysid.errors import ConfigError  # noqa: E402
from sysid.fit import FitOptions, start_batches  # noqa: E402
from sysid.fit.fanout import FanoutError, check_workers, run_tasks  # noqa: E402
from tests.fit.test_cv import write_config  # noqa: E402
from tests.helpers.fit_doubles import write_dataset  # noqa: E402

DTS = [0.02, 0.05, 0.1, 0.2]
ray_cluster = cv_tests.ray_cluster  # the CV tests' module-scoped local Ray cluster (2 CPUs)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom",))


@pytest.fixture()
def spy(monkeypatch):
    """Count the Ray fan-outs of sysid.fit (multistart, sweep; and their tasks) while calling the real one."""
    calls: list[tuple[str, int]] = []

    def counted(fn, items, *args, **kwargs):
        calls.append((fn.__name__, len(items)))
        return run_tasks(fn, items, *args, **kwargs)

    monkeypatch.setattr(sysid.fit.multistart, "run_tasks", counted)
    monkeypatch.setattr(sysid.fit.sweep, "run_tasks", counted)
    return calls


def test_start_batches():
    assert start_batches(1, 4) == []
    assert start_batches(5, 4) == [slice(1, 5)]
    assert start_batches(7, 2) == [slice(1, 3), slice(3, 5), slice(5, 7)]
    with pytest.raises(ConfigError, match="per_batch"):
        FitOptions(starts_per_batch=0)


# -- sweep-dt -------------------------------------------------------------------------------------


def sweep_config(tmp_path, dataset, workers=None):
    cfg = FitConfig.from_file(write_config(tmp_path / "fit.yaml", dataset))
    return cfg.merged({"sweep.dts": DTS, "fit.workers": workers})


def test_sweep_ray_equals_serial(tmp_path, dataset, ray_cluster, spy):
    serial = run_sweep(sweep_config(tmp_path, dataset), None, progress=False)
    assert spy == []
    ray = run_sweep(sweep_config(tmp_path, dataset, workers=2), None, progress=False)
    assert spy == [("_sweep_task", len(DTS))]  # one task per timestep
    assert ray.dts == serial.dts == DTS
    assert ray.errors == serial.errors and ray.per_run == serial.per_run  # the same floats
    assert ray.plateau == serial.plateau and ray.best_dt == serial.best_dt


def test_sweep_cli_prints_the_same_table(tmp_path, dataset, ray_cluster, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    dts = ",".join(map(str, DTS))
    tables = []
    for workers in ("1", "2"):
        assert main(["sweep-dt", "-c", str(cfg), "--dts", dts, "--workers", workers, "-q"]) == 0
        out = capsys.readouterr().out.splitlines()
        # every printed digit but the wall-time column (each rollout's own clock)
        tables.append([line[:30] if line[:10].strip().replace(".", "").isdigit() else line for line in out])
    assert tables[0] == tables[1]
    assert len(tables[0]) == len(DTS) + 2


def test_workers_flags_errors(tmp_path, dataset, capsys):
    cfg = write_config(tmp_path / "fit.yaml", dataset)
    with pytest.raises(SystemExit) as exc:
        main(["sweep-dt", "-c", str(cfg), "--workers", "0", "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--workers" in err[0]
    with pytest.raises(ConfigError, match="serially"):
        check_workers(1, "auto")
    bad = write_config(tmp_path / "bad.yaml", dataset, workers=0)
    with pytest.raises(ConfigError, match="fit.workers"):
        FitConfig.from_file(bad)


# -- multi-start fit ------------------------------------------------------------------------------


STARTS = {"n": 7, "per_batch": 2, "refine": 3, "seed": 3, "spread": 0.3}


def fit_doc(tmp_path, dataset, workers, starts=STARTS):
    cfg = FitConfig.from_file(write_config(tmp_path / "fit.yaml", dataset, starts=starts, workers=workers))
    return run_fit(cfg, progress=False, write=False)


def comparable(doc):
    """The fit's numbers without what differs by construction: clocks."""
    d = copy.deepcopy({k: doc[k] for k in ("parameters", "fit", "baseline", "generalisation")})
    for f in (d["fit"], d["baseline"]["fit"]):
        for key in ("wall_time", "sim_time"):
            f.pop(key)
        for entry in f["trace"]:
            entry.pop("time")
    d["baseline"].pop("wall_time")
    return d


def test_multistart_ray_equals_serial(tmp_path, dataset, ray_cluster, spy):
    serial = fit_doc(tmp_path, dataset, 1)
    assert spy == []
    ray = fit_doc(tmp_path, dataset, 2)
    # model and baseline: 6 starts beyond the nominal in 3 batches of 2, then 3 refinement fits
    assert spy == [("_start_batch_task", 3), ("_refine_task", 3)] * 2
    assert len(serial["fit"]["starts"]) == 7 and sum(bool(s.get("chosen")) for s in serial["fit"]["starts"]) == 1
    # a Ray task cannot reuse an evaluation the serial loop finds in the driver's cache: the baseline's
    # count may exceed the serial one by at most one rollout per refinement task
    extra = ray["baseline"]["fit"]["n_sim_calls"] - serial["baseline"]["fit"]["n_sim_calls"]
    assert 0 <= extra <= STARTS["refine"]
    for d in (ray, serial):
        d["baseline"]["fit"].pop("n_sim_calls")
    assert json.dumps(comparable(ray), sort_keys=True) == json.dumps(comparable(serial), sort_keys=True)
    assert ray["fit"]["n_sim_calls"] == serial["fit"]["n_sim_calls"]


def test_one_batch_stays_in_process(tmp_path, dataset, ray_cluster, spy):
    fit_doc(tmp_path, dataset, 2, {"n": 3, "per_batch": 2, "refine": 2})  # 2 starts beyond the nominal: 1 batch
    assert spy == []


def _boom(x):
    if x == 1:
        raise ValueError("task one fails")
    return x * 10


def test_run_tasks_failure_reported(ray_cluster):
    with pytest.raises(FanoutError, match="task 2 of 3 failed on Ray: ValueError: task one fails"):
        run_tasks(_boom, [(0,), (1,), (2,)], 2)
    got, info = run_tasks(_boom, [(0,), (1,), (2,)], 2, on_error=lambda i, text: text)
    assert got[0] == 0 and got[2] == 20 and "task one fails" in got[1] and info["backend"] == "ray"


def test_fanout_module_used_by_cv():
    import sysid.app.cv
    import sysid.app.warm

    assert sysid.app.cv.run_tasks is sysid.fit.fanout.run_tasks
    assert sysid.app.cv.warm_kernels is sysid.app.warm.warm_kernels
