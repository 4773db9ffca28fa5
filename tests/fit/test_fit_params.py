"""Parameters: validation, the identified-parameter file, atomic writes."""

import os

import pytest
import yaml

from sysid.errors import ConfigError, ResultsError
from sysid.fit.params import (
    Parameter,
    ParameterSet,
    Prior,
    atomic_write_text,
    default_parameters,
    load_params,
    save_params,
)


def test_reversed_bounds_rejected():
    with pytest.raises(ConfigError, match="reversed"):
        Parameter("kp", nominal=100, lower=500, upper=10)


def test_nominal_outside_bounds_rejected():
    with pytest.raises(ConfigError, match="outside"):
        Parameter("mu", nominal=5.0, lower=0.1, upper=2.0)


def test_prior_needs_positive_sigma():
    with pytest.raises(ConfigError):
        Prior(1.0, 0.0)


def test_defaults_take_nominals_from_robot_yaml():
    robot = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "..", "models", "helhest", "robot.yaml")))
    ps = default_parameters(robot)
    assert ps["kp"].nominal == robot["servo"]["kp"]
    assert ps["mu_lateral"].nominal == robot["friction"]["mu_lateral"]
    assert ps["chassis_mass"].frozen
    assert set(ps.free_names) == {"kp", "mu", "mu_lateral", "cmd_scale"}
    assert ps["kp"].log_scale and not ps["cmd_scale"].log_scale


def test_duplicate_names_rejected():
    with pytest.raises(ConfigError, match="twice"):
        ParameterSet([Parameter("a", 1, 0, 2), Parameter("a", 1, 0, 2)])


def test_save_load_roundtrip(tmp_path):
    ps = default_parameters()
    ps["kp"].value = 123.0
    ps["mu"].prior = Prior(0.8, 0.1)
    path = save_params(
        tmp_path / "models" / "helhest" / "params.yaml",
        ps,
        robot="helhest",
        intervals={"kp": (100.0, 146.0)},
        std={"kp": 11.7},
        metadata={"dt": 0.02},
    )
    back, doc = load_params(path)
    assert back["kp"].value == 123.0 and back["kp"].nominal == ps["kp"].nominal
    assert back["mu"].prior == Prior(0.8, 0.1)
    assert doc["parameters"]["kp"]["ci95"] == [100.0, 146.0]
    assert doc["metadata"]["dt"] == 0.02 and doc["robot"] == "helhest"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_load_rejects_foreign_yaml(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("just: text\n")
    with pytest.raises(ResultsError, match="parameters"):
        load_params(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def boom(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new content")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temp file left behind
