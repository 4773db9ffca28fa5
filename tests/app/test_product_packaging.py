"""The bundled robots ship in a non-editable install (issue 20, point 4): the wheel holds every file of
``models/`` as ``sysid/models``, and an installed (unpacked) wheel finds them from any folder through
``ingest.bundled.models_dir`` (sysid's robot lookup, ingest's default robot, the scenes' default)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _model_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT / "models")) for p in (ROOT / "models").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.name != ".gitkeep")


def test_every_package_is_listed_and_models_are_package_data() -> None:
    """pyproject lists its packages by hand (``sysid.models`` is mapped onto ``models/``): every
    package of the source tree is in the list, and every file of a bundled robot matches the package
    data patterns (a new kind of file, e.g. a mesh, must be added there)."""
    import setuptools

    found = set(setuptools.find_packages(where=str(ROOT), include=["sysid*", "ingest*"]))
    assert set(SETUPTOOLS["packages"]) == found | {"sysid.models"}, sorted(found)
    assert SETUPTOOLS["package-dir"]["sysid.models"] == "models"
    patterns = SETUPTOOLS["package-data"]["sysid.models"]
    files = _model_files()
    assert "helhest/robot.yaml" in files and "helhest/helhest.urdf" in files
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not unshipped, f"files of models/ the wheel would leave out: {unshipped} (patterns {patterns})"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (nothing is written into the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("sysid", "ingest", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = (tmp / "dist").glob("sysid-*.whl")
    return whl


def test_wheel_holds_the_bundled_robots_and_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in _model_files() if f"sysid/models/{f}" not in names]
    assert not missing, missing
    modules = [str(p.relative_to(ROOT)) for pkg in ("sysid", "ingest") for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts]
    assert [m for m in modules if m not in names] == []
    assert not any(n.startswith("models/") for n in names)  # inside the package, not a top-level folder


def test_installed_wheel_finds_the_bundled_robots_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    """The wheel unpacked as site-packages (what pip installs), run from an empty folder with no
    models/ anywhere above it: every lookup of a bundled robot lands inside the installed package."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "empty"
    work.mkdir()
    code = (
        "import sys, pathlib\n"
        "import sysid, ingest\n"
        "from sysid.app.config import FitConfig\n"
        "from ingest import topicmap\n"
        "from sysid.synth import mjcf\n"
        "cfg = FitConfig(base_dir=pathlib.Path.cwd())\n"
        "for p in (sysid.__file__, ingest.__file__, cfg.robot_path(), topicmap.DEFAULT_ROBOT, mjcf.DEFAULT_ROBOT,\n"
        "          FitConfig(base_dir=pathlib.Path.cwd(), robot='husky').robot_path()):\n"
        "    print(pathlib.Path(p).resolve(), pathlib.Path(p).is_file())\n"
        "print(cfg.load_robot()['wheels']['radius'] > 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=work,
                         env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "True"
    for line in lines[:-1]:
        path, is_file = line.rsplit(" ", 1)
        assert path.startswith(str(site.resolve())), line  # the installed copy, not the checkout
        assert is_file == "True", line
    assert lines[2].endswith("sysid/models/helhest/robot.yaml True"), lines[2]
    assert lines[5].endswith("sysid/models/husky/robot.yaml True"), lines[5]
