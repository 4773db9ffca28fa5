"""Public entry points: ``load_run`` (bag, cache file or a JSON run file) and ``load_helhest_json``."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .build import StreamsInfo, as_topicmap, check_clouds, make_run, read_streams, streams_from_raw, world_to_run
from .errors import IngestError, PalletFitError, RunFormatError
from .inputs import input_problem, read_json_file
from .reader import BagReader, resolve_paths
from .run import PalletPose, Run
from .segments import detect_segments
from .topicmap import RobotReader, TopicMap
from .transforms import yaw_to_quat

CACHE_ENV = "SYSID_INGEST_CACHE"


def default_cache_dir() -> Path:
    """``$SYSID_INGEST_CACHE`` or ``~/.cache/sysid/ingest``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "sysid" / "ingest"


def _is_helhest_json(p: Path) -> bool:
    return p.is_file() and p.suffix == ".json"


def _is_cache(p: Path) -> bool:
    return p.is_file() and p.suffix in (".npz", ".parquet")


@functools.cache
def code_digest() -> str:
    """Hash of the ingest package's own source: part of every cache key, so a run cached by other
    ingest code (an upgrade, another checkout sharing ``~/.cache``) is read anew, never reused."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(paths: Sequence[Path], options: dict[str, Any]) -> str:
    """Hash of the bag files (path, size, mtime), every ingest option and ingest's code (`code_digest`)."""
    h = hashlib.sha256()
    h.update(code_digest().encode())
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def load_run(
    source: str | Path | Sequence[str | Path],
    config: TopicMap | str | Path | dict[str, Any] | None = None,
    dt: float | None = 0.01,
    *,
    resample: str = "zoh",
    normalize_start: bool = True,
    resample_odom: bool = True,
    fit_pallet: bool | str = "auto",
    segments: bool = True,
    cache: bool | str | Path = False,
    name: str | None = None,
    progress: bool = True,
    robot: str | Path | Any | None = None,
    robot_reader: RobotReader | None = None,
) -> Run:
    """Load one run from a bag, a cache file (``.npz`` / ``.parquet``) or a JSON run file (the
    helhest-real format, any robot: `load_helhest_json`).

    Args:
        source: ROS 1 ``.bag`` (or split parts as a list / glob / directory), ROS 2 bag directory,
            ``.db3`` / ``.mcap``, a run cache file, or a helhest ``.json``.
        config: topic map (``TopicMap``, YAML path, YAML text or dict); None auto-detects topics.
        dt: simulation step [s] for resampling commands (and odometry); None keeps native stamps.
        resample: "zoh" (hold the last command) or "average" (mean of the held command per step).
        normalize_start: move the first pose to the origin with zero yaw.
        resample_odom: interpolate odometry on the ``dt`` grid (False: native stamps in the window).
        fit_pallet: fit the pallet from the cloud topic: "auto" (when a cloud topic exists; a failed
            fit is recorded in ``meta["pallet_error"]``), True (a failed fit raises), False.
        segments: detect stationary / cruise / climb segments.
        cache: False; True (default cache directory, see ``default_cache_dir``); or a directory.
            A bag is parsed once per distinct set of options; nothing is cached when ingest fails.
        name: run name (default: the bag's name).
        progress: show tqdm progress bars.
        robot: the robot whose wheels the run's columns are (a `sysid.robot.scenes.RobotDescription`, its
            robot.yaml / wheel map / URDF, or a bundled name; `TopicMap.with_robot`); None: the
            topic map's ``robot:``, else the Helhest's three wheels. What does not fit the bag (a
            JointState naming none of its wheels) raises; what cannot be checked (wheel speeds
            from a twist with the default robot; topics naming another known robot) is listed in
            ``meta["warnings"]``.
        robot_reader: reads a robot file ingest cannot read on its own (a wheel map or URDF, given as
            ``robot`` or as the topic map's ``robot:``): ``sysid.robot.load_robot`` (`RobotReader`).

    Raises:
        IngestError (a subclass naming the problem and the fix) for every kind of bad input.
    """
    if isinstance(source, (str, Path)):
        p = Path(source)
        problem = input_problem(p) if p.suffix in (".json", ".npz", ".parquet") else None
        if problem not in (None, "does not exist"):  # a named pipe would block, a link loop is not missing
            raise RunFormatError(f"run file {str(p)!r} {problem}")
        if _is_cache(p):
            return Run.load(p)
        if _is_helhest_json(p):
            return load_helhest_json(p, dt=dt, resample=resample, normalize_start=normalize_start, robot=robot,
                                     robot_reader=robot_reader)
    tmap = as_topicmap(config, robot_reader)
    if robot is not None:
        tmap = tmap.with_robot(robot, reader=robot_reader)
    kind, paths = resolve_paths(source)
    options = {
        "config": tmap.to_dict(),
        "dt": dt,
        "resample": resample,
        "normalize_start": normalize_start,
        "resample_odom": resample_odom,
        "fit_pallet": fit_pallet,
        "segments": segments,
        "name": name,
    }
    cache_file = None
    if cache:
        cdir = default_cache_dir() if cache is True else Path(cache)
        cache_file = cdir / f"{(name or _bag_name(paths))}-{cache_key(paths, options)}.npz"
        if cache_file.exists():
            try:
                return Run.load(cache_file)
            except RunFormatError:
                cache_file.unlink(missing_ok=True)  # stale or broken cache: re-ingest
    run = _ingest_bag(source, tmap, dt, resample, normalize_start, resample_odom, fit_pallet, segments, name, progress)
    if cache_file is not None:
        run.save(cache_file)  # atomic; only reached when ingest succeeded
        run.meta["cache_file"] = str(cache_file)
    return run


def _drop_climb(run: Run) -> None:
    """Segment ``run`` again without a climb (its lidar shows no obstacle) and say so in its warnings."""
    climb = run.segments["climb"]
    segs, info = detect_segments(run, obstacle=False)
    run.segments = {k: v for k, v in run.segments.items() if not k.startswith(("stationary", "cruise", "climb"))}
    run.segments.update(segs)
    run.meta["segments_info"] = info
    run.meta["warnings"] = [*run.meta.get("warnings", []),
        f"{run.name}: the odometry rises {info['climb_check']['rise_max_m']:.3f} m from {climb[0]:.2f} s but the "
        "lidar shows no obstacle (pallet fit failed: see meta pallet_error); no climb segment"]


def _bag_name(paths: Sequence[Path]) -> str:
    p = paths[0]
    return p.stem if p.is_file() else p.name


def _ingest_bag(
    source: Any,
    tmap: TopicMap,
    dt: float | None,
    resample: str,
    normalize_start: bool,
    resample_odom: bool,
    fit_pallet: bool | str,
    segments: bool,
    name: str | None,
    progress: bool,
) -> Run:
    with BagReader(source, tmap.custom_types) as bag:
        raw, info = read_streams(bag, tmap, progress=progress, want_clouds=bool(fit_pallet))
        run_name = name or bag.name
        paths = [str(p) for p in bag.paths]
        fmt = "ros1" if bag.is_ros1 else "ros2"
        paths_topics = list(bag.topics)
    streams, clouds, origin_ns, report = streams_from_raw(raw, tmap)
    od, cmd = streams["odom"], streams["wheel_cmd"]
    meas = streams.get("wheel_meas")
    meta: dict[str, Any] = {
        "source": paths,
        "format": fmt,
        "time_policy": tmap.time,
        "origin_ns": int(origin_ns),
        **info,
        **report,
        "n_samples": {r: int(s.t.size) for r, s in streams.items()},
        "geometry": {"wheel_radius": tmap.geometry.wheel_radius, "track_width": tmap.geometry.track_width},
        "cmd_conversion": "left=(v-w*track/2)/r, right=(v+w*track/2)/r, rear=v/r (Twist sources)",
        "wheels": None if tmap.wheels is None else tmap.wheels.to_dict(),
    }
    warnings = robot_warnings(tmap, info, paths_topics)
    if warnings:
        meta["warnings"] = warnings
    run = make_run(
        run_name,
        od.t,
        od.values,
        cmd.t,
        cmd.values,
        dt=dt,
        resample=resample,
        normalize_start=normalize_start,
        resample_odom=resample_odom,
        t_meas=None if meas is None else meas.t,
        meas=None if meas is None else meas.values,
        meta=meta,
        wheel_names=tmap.wheel_names,
    )
    run.meta["t0_ns"] = int(origin_ns + round(run.meta["t0_s"] * 1e9))
    if segments:
        segs, seg_info = detect_segments(run)
        run.segments.update(segs)
        run.meta["segments_info"] = seg_info
    if clouds is not None and fit_pallet:
        from .pallet import fit_pallet_from_clouds

        run.meta["n_clouds"] = len(clouds.points)
        try:
            check_clouds(clouds)
            fit = fit_pallet_from_clouds(
                clouds.t,
                clouds.points,
                od.t,
                od.values,
                size=tmap.pallet_size,
                lidar_xyz=tmap.lidar_xyz,
                lidar_rpy=tmap.lidar_rpy,
                progress=progress,
            )
        except IngestError as err:
            if fit_pallet is True:
                raise
            run.meta["pallet_error"] = f"{type(err).__name__}: {err}"
            if segments and "climb" in run.segments:  # a climb needs the obstacle the run's lidar would show
                _drop_climb(run)
        else:
            xy, yaw = world_to_run(run, np.array([fit.x, fit.y]), fit.yaw)
            run.pallet = PalletPose(
                float(xy[0]), float(xy[1]), float(_wrap_half(yaw)),
                (float(fit.size[0]), float(fit.size[1]), float(fit.size[2])), float(fit.rms),
            )
            run.meta["pallet_fit"] = fit.report()
            onset = run.meta.get("segments_info", {}).get("climb_onset")
            if onset is not None:
                from .pallet import onset_cross_check

                run.meta["pallet_check"] = onset_cross_check(
                    run.pallet, onset, tmap.geometry.wheel_radius, tmap.geometry.track_width
                )
    elif fit_pallet is True:
        raise PalletFitError("fit_pallet=True but the bag has no PointCloud2 topic; name one as `cloud` in the map")
    run.validate()
    return run


# Robots a topic or frame name may name (the bundled ones and common wheeled platforms).
KNOWN_ROBOTS = ("helhest", "husky", "jackal", "warthog", "ridgeback", "dingo", "turtlebot", "pioneer", "summit")


def robot_warnings(tmap: TopicMap, info: StreamsInfo, topics: Sequence[str]) -> list[str]:
    """What ingest cannot check about the robot against the bag, as sentences for the user.

    - wheel speeds derived from a twist (cmd_vel or the odometry's) with no robot given: they are
      the default Helhest's three wheels at its radius and track;
    - a topic naming a known robot other than the one whose wheels the run gets.
    """
    out = []
    robot = tmap.wheels.robot if tmap.wheels is not None else "helhest"
    cmd: Mapping[str, object] = info.get("roles", {}).get("wheel_cmd", {})
    twist = tmap.wheel_cmd.source == "odom_twist" or str(cmd.get("type", "")).startswith("geometry_msgs/msg/Twist")
    if tmap.wheels is None and twist:
        g = tmap.geometry
        src = "odometry twist" if not cmd.get("type") else f"twist {cmd.get('topic')!r}"
        out.append(
            f"no robot given: the wheel speeds derived from the {src} "
            f"are those of the default robot helhest (wheels left, right, rear; r {g.wheel_radius:g} m, track "
            f"{g.track_width:g} m). If the bag is of another robot, give it (--robot NAME|PATH, or `robot:` in "
            "the topic map)")
    named = sorted({k for t in topics for k in KNOWN_ROBOTS if k in t.lower() and k != robot.lower()})
    if named:
        which = [t for t in topics if any(k in t.lower() for k in named)]
        out.append(
            f"the bag's topics {which} name robot {', '.join(named)}, but the run gets the wheels of robot {robot}"
            f"{' (the default)' if tmap.wheels is None else ''}; if the bag is of that robot, give its description "
            f"(--robot {named[0]} where it is bundled, or its URDF / wheel map)")
    return out


def _wrap_half(yaw: float | None) -> float:
    """Box yaw modulo pi (a box is symmetric under a half turn), in (-pi/2, pi/2]."""
    y = float(yaw or 0.0)
    return float((y + np.pi / 2) % np.pi - np.pi / 2)


def load_helhest_json(
    path: str | Path, dt: float | None = 0.01, resample: str = "zoh", normalize_start: bool = True,
    robot: str | Path | Any | None = None, robot_reader: RobotReader | None = None,
) -> Run:
    """A run file in the format of the helhest real-robot runs (``../shared/data/helhest-real/*.json``,
    any wheeled robot) as a ``Run``.

    ``trajectory.points`` (lidar-inertial odometry, 20 Hz: t, x, y, yaw) becomes ``odom`` (z = 0, flat
    ground); the measured wheel speeds ``wheel_velocities.timeseries`` (~50 Hz: ``t`` and one key per
    wheel [rad/s], the Helhest's ``left``, ``right``, ``rear``; the same keys in every sample) become
    both ``wheel_cmd`` (the paper drives the simulator open-loop with them) and ``wheel_meas``, one
    column per key; the constant ``cmd_vel`` twist, when there is one, is kept in ``meta["cmd_vel"]``
    as (v [m/s], vy, w [rad/s]). ``robot`` (a `WheelLayout`, a description, or a robot file / bundled
    name read by ``robot_reader``, as `load_run`'s): the keys must drive its wheels, each wheel by one
    of its log names and every key some wheel (DataError otherwise); None: not checked.
    """
    path = Path(path)
    data = read_json_file(path, RunFormatError, "run file", missing=f"helhest run {path} not found",
                          expected="expected a helhest run file")
    if not isinstance(data, dict):
        raise RunFormatError(f"{path}: a run file is a JSON object with trajectory and wheel_velocities, "
                             f"got a JSON {type(data).__name__}")
    try:
        pts = _json_list(data, "trajectory", "points", path)
        ws = _json_list(data, "wheel_velocities", "timeseries", path)
        t_o = np.array([float(p["t"]) for p in pts])
        xyyaw = np.array([[float(p["x"]), float(p["y"]), float(p["yaw"])] for p in pts])
        wheels = [str(k) for k in ws[0] if k != "t"]
        for i, p in enumerate(ws):
            if sorted(str(k) for k in p if k != "t") != sorted(wheels):
                raise RunFormatError(
                    f"{path}: wheel_velocities.timeseries[{i}] has wheel keys {sorted(str(k) for k in p if k != 't')}, "
                    f"the first sample {sorted(wheels)}; every sample needs the same wheels (fix or cut the log)")
        t_w = np.array([float(p["t"]) for p in ws])
        wv = np.array([[float(p[k]) for k in wheels] for p in ws])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise RunFormatError(
            f"{path}: missing or malformed field {err}; a run file needs trajectory.points[t,x,y,yaw] "
            "and wheel_velocities.timeseries[t, one speed per wheel (the Helhest's left, right, rear)]"
        ) from None
    if not wheels:
        raise RunFormatError(f"{path}: wheel_velocities.timeseries has no wheel speeds, only t; one key per "
                             "wheel [rad/s] is needed (the Helhest's left, right, rear)")
    if robot is not None:
        from .topicmap import layout_from_robot

        layout_from_robot(robot, reader=robot_reader).run_columns(wheels, path.stem)
    from .timeline import check_times

    if t_o.size < 2 or t_w.size < 2:
        raise RunFormatError(f"{path}: needs at least 2 trajectory points and 2 wheel samples")
    order_o, rep_o = check_times(t_o, f"{path.name} trajectory", max_gap_s=1.0)
    order_w, rep_w = check_times(t_w, f"{path.name} wheel_velocities", max_gap_s=1.0)
    t_o, xyyaw = t_o[order_o], xyyaw[order_o]
    t_w, wv = t_w[order_w], wv[order_w]
    for what, arr, tt, cols in (("trajectory.points", xyyaw, t_o, ("x", "y", "yaw")),
                                ("wheel_velocities.timeseries", wv, t_w, tuple(wheels))):
        bad = ~np.isfinite(arr)
        if bad.any():
            from .errors import DataError

            i, j = (int(k) for k in np.argwhere(bad)[0])
            raise DataError(
                f"{path}: {what}[{i}].{cols[j] if j < len(cols) else j} is {arr[i, j]} at t={tt[i]:.3f} s; "
                f"{int(bad.any(axis=1).sum())} bad samples. Fix the log or cut the run"
            )
    pose = np.zeros((t_o.size, 7))
    pose[:, 0:2] = xyyaw[:, :2]
    pose[:, 3:7] = yaw_to_quat(np.unwrap(xyyaw[:, 2]))
    cmd_vel = _cmd_vel(data.get("cmd_vel"), path)
    meta = {
        "source": [str(path)],
        "format": "helhest-json",
        "bag_name": data.get("bag_name"),
        "cmd_vel": cmd_vel[0] if len(cmd_vel) == 1 else cmd_vel,
        "wheel_cmd_source": "measured wheel velocities (/joint_states)",
        "rates_hz": {"trajectory": rep_o.rate_hz, "wheel_velocities": rep_w.rate_hz},
        "frame": data["trajectory"].get("frame"),
    }
    run = make_run(
        path.stem,
        t_o,
        pose,
        t_w,
        wv,
        dt=dt,
        resample=resample,
        normalize_start=normalize_start,
        t_meas=t_w,
        meas=wv,
        meta=meta,
        wheel_names=wheels,
    )
    segs, info = detect_segments(run)
    run.segments.update(segs)
    run.meta["segments_info"] = info
    return run


def _json_list(data: dict[str, Any], section: str, key: str, path: Path) -> list[Any]:
    """``data[section][key]`` of a run file: a list of JSON objects (RunFormatError naming the field otherwise)."""
    sec = data.get(section)
    items = sec.get(key) if isinstance(sec, dict) else None
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        got = _json_kind(items) if isinstance(sec, dict) else f"{section} {_json_kind(sec)}"
        raise RunFormatError(f"{path}: missing or malformed field {section}.{key} (got {got}); a run file needs "
                             "trajectory.points and wheel_velocities.timeseries, lists of JSON objects (a sample each)")
    return items


def _cmd_vel(value: Any, path: Path) -> list[Any]:
    """The optional ``cmd_vel.commands`` of a run file (kept in the run's meta only): a list, or nothing."""
    if value is None:
        return []
    commands = value.get("commands") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(commands, list | None):
        raise RunFormatError(f"{path}: cmd_vel must be a JSON object with a list 'commands' (or absent), got "
                             f"{_json_kind(value)}; fix or remove it (the run is replayed from its wheel speeds)")
    return commands or []


def _json_kind(v: Any) -> str:
    """A JSON value in a few words for a message: ``nothing``, ``a list of 3 values``, ``"fast"``, ``5``."""
    if v is None:
        return "nothing"
    if isinstance(v, list):
        return f"a list of {len(v)} value{'s' if len(v) != 1 else ''}"
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def load_runs(sources: Sequence[str | Path], **kwargs: Any) -> list[Run]:
    """``load_run`` over several sources."""
    return [load_run(s, **kwargs) for s in sources]
