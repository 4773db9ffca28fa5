"""The runs and files a fit config names: run paths and globs expanded into run sources
(`expand_sources`: bags, ROS 2 bag folders, run caches, JSON run files, folders of them), the
manifest's split, truth and topic map (`read_manifest`), and the topic map checked against the bags'
topics (`check_topics`). Paths are relative to the config's folder (`FitConfig.resolve`).
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ingest.fileio import read_yaml
from ingest.inputs import input_problem, load_yaml, read_text
from ingest.yamlerr import yaml_problem
from sysid.errors import ConfigError, DataError

if TYPE_CHECKING:
    from sysid.app.config import FitConfig

BAG_SUFFIXES = (".bag", ".db3", ".mcap")
CACHE_SUFFIXES = (".npz", ".parquet")
RUN_SUFFIXES = BAG_SUFFIXES + CACHE_SUFFIXES + (".json",)


def _resolved(given: str, path: Path) -> str:
    """`` (resolved to PATH)`` for a message, empty when PATH is what the user wrote (no doubled paths)."""
    return "" if str(path) == str(given) else f" (resolved to {path})"


def expand_sources(cfg: FitConfig, patterns: Sequence[str], what: str) -> list[Path]:
    """Expand paths / globs (relative to the config folder) into run sources; each must exist.

    A directory that is a ROS 2 bag (has ``metadata.yaml`` or storage files) is one source;
    another directory contributes the run files inside it.
    """
    out: list[Path] = []
    for pat in patterns:
        full = str(cfg.resolve(pat))
        if any(ch in pat for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(full))
            if not matches:
                raise ConfigError(f"{what}: the pattern {pat!r} matches no file (looked in {cfg.base_dir})")
        else:
            p = Path(full)
            if not p.exists() and not p.is_symlink():
                raise ConfigError(f"{what}: {pat!r} does not exist{_resolved(pat, p)}")
            matches = [p]
        for m in matches:
            problem = None if m.is_dir() else input_problem(m)
            if problem is not None:  # a named pipe or device would block ingest; a link loop or broken link
                raise ConfigError(f"{what}: {str(m)!r} {problem}")
            if m.is_dir() and not _is_ros2_dir(m):
                inner = sorted(x for x in m.iterdir() if x.suffix in RUN_SUFFIXES or _is_ros2_dir(x))
                if not inner:
                    raise ConfigError(f"{what}: folder {str(m)!r} holds no bag or run file")
                out.extend(inner)
            else:
                out.append(m)
    seen: set[Path] = set()
    unique = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def _is_ros2_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "metadata.yaml").exists() or any(x.suffix in (".db3", ".mcap") for x in p.iterdir()))


def read_manifest(cfg: FitConfig) -> tuple[list[str], list[str], dict[str, float]]:
    """Train / held-out lists (paths relative to the manifest) and true parameters, if any.

    Accepted forms: ``{splits: {train: [...], heldout: [...]}}`` or top-level ``train`` /
    ``held_out`` lists (entries are run names listed under ``runs:`` with a ``bag``/``path``,
    plain paths, or mappings with a ``path``/``bag``/``file`` key), or ``{runs: [{path, split}]}``.
    An optional ``truth`` / ``true_parameters`` mapping holds generator values, and
    ``ingest_topic_map`` names the topic map used when the config gives none.
    """
    assert cfg.data.manifest is not None
    mp = cfg.resolve(cfg.data.manifest)
    text = read_text(mp, "data.manifest", ConfigError, "yaml",
                     missing=f"data.manifest {cfg.data.manifest!r} does not exist{_resolved(cfg.data.manifest, mp)}")
    try:
        doc = load_yaml(text) or {}  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise ConfigError(f"manifest is not valid YAML/JSON: {yaml_problem(exc, mp)}") from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"manifest {str(mp)!r} must be a mapping")

    by_name: dict[str, str] = {}
    for e in doc.get("runs") or []:
        if isinstance(e, Mapping) and "name" in e:
            for k in ("path", "bag", "file"):
                if k in e:
                    by_name[str(e["name"])] = str(e[k])
                    break

    def entry_path(e: Any) -> str:
        if isinstance(e, str):
            return str(mp.parent / by_name.get(e, e))
        if isinstance(e, Mapping):
            for k in ("path", "bag", "file", "run"):
                if k in e:
                    return str(mp.parent / str(e[k]))
        raise ConfigError(f"manifest {str(mp)!r}: cannot read a run path from entry {e!r}")

    train: list[str] = []
    held: list[str] = []
    split = next((doc[k] for k in ("splits", "split") if isinstance(doc.get(k), Mapping)), doc)
    for key, dest in (
        ("train", train),
        ("held_out", held),
        ("heldout", held),
        ("held-out", held),
        ("test", held),
    ):
        for e in split.get(key) or []:
            dest.append(entry_path(e))
    if not train and not held:
        for e in doc.get("runs") or []:
            if isinstance(e, Mapping) and "split" in e:
                s = str(e["split"]).replace("-", "_")
                if s == "train":
                    train.append(entry_path(e))
                elif s in ("held_out", "heldout", "test", "eval"):
                    held.append(entry_path(e))
    if cfg.data.topics is None and isinstance(doc.get("ingest_topic_map"), str):
        cfg.data.topics = str(mp.parent / doc["ingest_topic_map"])
    truth_doc = doc.get("truth") or doc.get("true_parameters") or doc.get("params") or {}
    truth = {}
    if isinstance(truth_doc, Mapping):
        for k, v in truth_doc.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                truth[str(k)] = float(v)
    return train, held, truth


def check_topics(cfg: FitConfig, sources: Sequence[Path]) -> None:
    """Every topic named in the topic map exists in every bag source (opens bag metadata only)."""
    if cfg.data.topics is None:
        return
    tm = cfg.data.topics
    if isinstance(tm, str):
        tp = cfg.resolve(tm)
        tm = read_yaml(tp, ConfigError, "topic map",
                       missing=f"data.topics: topic map {tm!r} does not exist{_resolved(tm, tp)}") or {}
    if not isinstance(tm, Mapping):
        raise ConfigError("data.topics must be a path to a topic map or a mapping")
    roles = tm.get("topics", tm) if isinstance(tm.get("topics", None), Mapping) else tm
    wanted = []
    for role, spec in roles.items():
        topic = spec if isinstance(spec, str) else (spec or {}).get("topic") if isinstance(spec, Mapping) else None
        if isinstance(topic, str):
            wanted.append((str(role), topic))
    bags = [s for s in sources if s.suffix in BAG_SUFFIXES or _is_ros2_dir(s)]
    if not wanted or not bags:
        return
    try:
        from ingest.reader import BagReader
    except ImportError:  # pragma: no cover
        return
    from sysid.ingest_errors import from_ingest

    for bag in bags:
        with from_ingest(f"cannot open bag {str(bag)!r}: ", DataError), BagReader(bag) as reader:
            have = reader.topics
            listing = reader.topic_list()
        for role, topic in wanted:
            if topic not in have:
                raise ConfigError(
                    f"data.topics: {role} topic {topic!r} does not exist in {str(bag)!r}; the bag has: {listing}"
                )
