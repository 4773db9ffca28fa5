"""A config is data: the simulator it names must be one that code made known (built in, registered, a
package's ``sysid.simulators`` entry point, or allowed with ``--allow-simulator``), and any other name
is refused in one line, exit 2, before its module is imported (sysid/simulators/protocol.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sysid.cli import main
from sysid.errors import SimulatorError
from sysid.simulators.protocol import available_simulators, check_simulator_name, get_simulator, unwrap
from tests.helpers.fit_doubles import KinematicDouble, write_dataset

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = "tests.helpers.fit_doubles:make_double"
PARAMS = ROOT / "models" / "helhest" / "params-pallet-sample.yaml"

# Runs several commands in one fresh interpreter (no conftest: nothing allowed) and reports, per command,
# the exit status and stderr, then which of the named modules were imported.
PROBE = """
import contextlib, io, json, sys
from sysid.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    out.append([rc, err.getvalue()])
print(json.dumps({"results": out, "imported": [m for m in ("this", "sidefx") if m in sys.modules]}))
"""


def write_config(path: Path, dataset: Path, simulator: str) -> Path:
    path.write_text(yaml.safe_dump({
        "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
        "simulator": {"name": simulator},
        "data": {"train": [str(dataset / "train-*.npz")], "held_out": [str(dataset / "held-*.npz")]},
        "fit": {"dt": 0.05, "max_iter": 3},
        "sweep": {"enabled": False},
    }))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("runs"), ("slalom",))


def test_config_names_no_code_it_was_not_allowed(dataset, tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    marker = tmp_path / "sidefx-imported"
    (mods / "sidefx.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
                                    "def make(robot=None, **options):\n    raise SystemExit('called')\n")
    cfg = {name: write_config(tmp_path / f"{i}.yaml", dataset, name)
           for i, name in enumerate(("os:system", "this:x", "sidefx:make", DOUBLE))}
    out = tmp_path / "out"
    commands = [
        ["fit", "-c", str(cfg["os:system"]), "-q", "-o", str(out)],
        ["fit", "-c", str(cfg["this:x"]), "-q", "-o", str(out)],
        ["cv", "-c", str(cfg["sidefx:make"]), "--folds", "2", "--workers", "1", "-q", "-o", str(out)],
        ["evaluate", "-c", str(cfg["sidefx:make"]), "--params", str(PARAMS), "-q"],
        ["fit", "-c", str(cfg["os:system"]), "--simulator", "this:x", "-q", "-o", str(out)],
        ["fit", "-c", str(cfg[DOUBLE]), "-q", "-o", str(out)],  # the test double, not allowed here
        ["fit", "-c", str(cfg["this:x"]), "--allow-simulator", "this x", "-q", "-o", str(out)],
    ]
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(mods)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    names = ["os:system", "this:x", "sidefx:make", "sidefx:make", "this:x", DOUBLE]
    for (rc, err), name in zip(doc["results"], names, strict=False):
        assert rc == 2, err
        assert err.count("\n") == 1 and err.startswith(f"error: unknown simulator {name!r}; known: "), err
        assert "ostrich, kinematic, mujoco" in err and "'sysid.simulators'" in err, err
        assert f"--allow-simulator {name}" in err, err
    rc, err = doc["results"][-1]
    assert rc == 2 and err == "error: --allow-simulator 'this x' must look like 'package.module:factory'\n", err
    assert doc["imported"] == [] and not marker.exists()  # refused before any import of the named module
    assert not out.exists()


def test_allow_simulator_flag(dataset, tmp_path):
    cfg = write_config(tmp_path / "fit.yaml", dataset, DOUBLE)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "sysid.cli", "fit", "-c", str(cfg), "--allow-simulator", DOUBLE,
                          "-q", "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load((out / "params.yaml").read_text())["metadata"]["simulator"] == DOUBLE


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed package's entry points: a dist-info folder on the import path."""
    dist = tmp_path / "site" / "sysid_plugin_test-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sysid-plugin-test\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[sysid.simulators]\n"
        f"plugin-double = {DOUBLE}\n"
        "plugin-broken = sysid_no_such_module:make\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "plugin-double"


def test_entry_point_simulator(plugin, dataset, tmp_path, capsys):
    assert plugin in available_simulators() and "plugin-broken" in available_simulators()
    assert isinstance(unwrap(get_simulator(plugin)), KinematicDouble)
    with pytest.raises(SimulatorError, match="known: ostrich, kinematic, mujoco, plugin-broken, plugin-double"):
        check_simulator_name("nope")
    with pytest.raises(SimulatorError, match=r"'plugin-broken' \(entry point 'sysid_no_such_module:make' in "
                                             r"the group 'sysid.simulators'\) cannot be loaded"):
        get_simulator("plugin-broken")
    cfg = write_config(tmp_path / "fit.yaml", dataset, plugin)
    assert main(["fit", "-c", str(cfg), "-q", "-o", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "out" / "params.yaml").read_text())["metadata"]["simulator"] == plugin
