"""One command-line convention across `sysid` and `ingest` (issue 20, point 9), checked on every
subcommand's parser as built (a new subcommand is checked too):

- ``-c/--config FIT.YAML`` is the sysid fit config in both programs (``ingest load/inspect -c`` read a
  bag as ``sysid fit`` does), ``-o/--output`` is where a command writes (a file, or a folder), ``-q/--quiet``
  hides progress, ``-p/--params`` a parameter file: a short flag means one thing everywhere;
- output flags are named alike: ``-o/--output`` on every command that writes, and ``--<what>-out``
  only for fit's single files; the earlier spellings (``--out``, ``--json PATH``, ``--report``,
  ``--results``) still parse but are hidden from ``--help``;
- every subcommand's help shows examples, and every flag has help text.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets" / "pallet-sample"
SHORT = {"-c": "--config", "-o": "--output", "-q": "--quiet", "-p": "--params", "-h": "--help"}
# commands that write files: the place is -o/--output (fit's single files have --<what>-out besides)
WRITERS = {("sysid", "fit"), ("sysid", "evaluate"), ("sysid", "sweep-dt"), ("sysid", "report"), ("sysid", "cv"),
           ("sysid", "synth"), ("sysid", "plan"), ("ingest", "load"), ("sysid", "ingest load")}
FILE_OUTS = {"--params-out", "--report-out", "--results-out"}
OLD_OUTPUT_NAMES = {"--out", "--report", "--results", "--dest", "--save", "--write", "--output-dir", "--out-dir"}


def _subcommands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    from sysid.cli import build_parser as sysid_parser
    from sysid.cli.ingest_program import build_parser as ingest_parser

    def walk(program: str, prefix: str, parser: argparse.ArgumentParser) -> None:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        for name, p in (sub.choices.items() if sub is not None else ()):
            out.append((program, prefix + name, p))
            walk(program, prefix + name + " ", p)  # `sysid robot check`, `sysid ingest load`

    out: list[tuple[str, str, argparse.ArgumentParser]] = []
    for program, root in (("sysid", sysid_parser(with_synth=True)), ("ingest", ingest_parser())):
        walk(program, "", root)
    return out


def _has_subcommands(p: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in p._actions)


SUBCOMMANDS = _subcommands()
IDS = [f"{p} {c}" for p, c, _ in SUBCOMMANDS]


def _visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_every_subcommand_is_covered() -> None:
    names = {(p, c) for p, c, _ in SUBCOMMANDS}
    assert {("sysid", c) for c in ("fit", "evaluate", "sweep-dt", "report", "cv", "synth")} <= names
    assert {("ingest", "inspect"), ("ingest", "load")} <= names
    assert {("sysid", "robot check"), ("sysid", "ingest inspect"), ("sysid", "ingest load")} <= names


@pytest.mark.parametrize(("program", "cmd", "parser"), SUBCOMMANDS, ids=IDS)
def test_examples_and_help_for_every_flag(program: str, cmd: str, parser: argparse.ArgumentParser) -> None:
    epilog = parser.epilog or ""
    assert "example" in epilog and f"{program} {cmd} " in epilog, f"{program} {cmd} --help shows no example"
    for a in parser._actions:
        assert a.help and a.help.strip(), f"{program} {cmd}: {a.option_strings or a.dest} has no help text"
    parser.format_help()  # renders (no bad % in help texts)


def test_a_short_flag_means_one_thing_in_both_programs() -> None:
    seen: dict[str, set[str]] = {}
    for _program, _cmd, p in SUBCOMMANDS:
        for a in p._actions:
            shorts = [s for s in a.option_strings if not s.startswith("--")]
            longs = [s for s in a.option_strings if s.startswith("--")]
            for s in shorts:
                seen.setdefault(s, set()).update(longs)
    for short, longs in seen.items():
        assert short in SHORT, f"{short} ({longs}) is not one of the shared short flags {sorted(SHORT)}"
        assert longs == {SHORT[short]}, f"{short} means {sorted(longs)}"
    configs = [(prog, cmd, a.metavar) for prog, cmd, p in SUBCOMMANDS for a in p._actions if "-c" in a.option_strings]
    assert {("ingest", "load"), ("ingest", "inspect"), ("sysid", "fit"), ("sysid", "cv")} <= {c[:2] for c in configs}
    assert {m for *_, m in configs} == {"FIT.YAML"}, configs


@pytest.mark.parametrize(("program", "cmd", "parser"), SUBCOMMANDS, ids=IDS)
def test_output_flags_named_alike(program: str, cmd: str, parser: argparse.ArgumentParser) -> None:
    flags = {s for a in _visible(parser) for s in a.option_strings}
    assert not flags & OLD_OUTPUT_NAMES, f"{program} {cmd}: {sorted(flags & OLD_OUTPUT_NAMES)}; use -o/--output"
    json_path = [a for a in _visible(parser) if "--json" in a.option_strings and a.nargs != 0]
    assert not json_path, f"{program} {cmd}: --json takes a path; the output file is -o/--output"
    if (program, cmd) in WRITERS:
        assert {"-o", "--output"} <= flags, f"{program} {cmd} writes files but has no -o/--output"
    outs = {f for f in flags if f.endswith("-out") and f != "--held-out"}  # --held-out: the held-out runs
    assert outs <= FILE_OUTS and (not outs or cmd == "fit"), outs
    if cmd not in ("report", "robot check") and not _has_subcommands(parser):  # these draw no progress
        assert {"-q", "--quiet"} <= flags


@pytest.mark.parametrize(("program", "cmd", "parser"), SUBCOMMANDS, ids=IDS)
def test_one_spelling_per_flag(program: str, cmd: str, parser: argparse.ArgumentParser) -> None:
    """A parameter file read is ``-p/--params`` and replacing what exists is ``--force`` in every
    command (``synth --overwrite`` is its hidden earlier spelling); robots are a name, robot.yaml or URDF."""
    for a in _visible(parser):
        if a.dest == "params":
            assert {"-p", "--params"} <= set(a.option_strings), f"{program} {cmd}: {a.option_strings}"
        if a.dest in ("force", "overwrite"):
            assert a.option_strings == ["--force"], f"{program} {cmd}: {a.option_strings}"
        if "--robot" in a.option_strings:
            assert "URDF" in (a.help or ""), f"{program} {cmd}: --robot help does not say a URDF works"


@pytest.mark.parametrize(("program", "argv", "dest", "value"), [
    ("sysid", ["fit", "--report", "r.html"], "report", "r.html"),
    ("sysid", ["fit", "--results", "r.json"], "results", "r.json"),
    ("sysid", ["fit", "--report-out", "r.html"], "report", "r.html"),
    ("sysid", ["evaluate", "-p", "p.yaml", "--json", "e.json"], "output", "e.json"),
    ("sysid", ["sweep-dt", "--json", "s.json"], "output", "s.json"),
    ("sysid", ["cv", "-c", "f.yaml", "--out", "d"], "out", "d"),
    ("sysid", ["cv", "-c", "f.yaml", "-o", "d"], "out", "d"),
    ("sysid", ["synth", "--out", "d"], "out", Path("d")),
    ("sysid", ["synth", "-o", "d"], "out", Path("d")),
])
def test_earlier_spellings_still_parse(program: str, argv: list[str], dest: str, value: object) -> None:
    from sysid.cli import build_parser

    args = build_parser(with_synth=argv[0] == "synth").parse_args(argv)
    assert getattr(args, dest) == value


def test_fit_output_folder_names_the_three_files(tmp_path: Path) -> None:
    from sysid.cli import build_parser
    from sysid.cli.common import merged_config

    args = build_parser().parse_args(["fit", "-o", str(tmp_path / "o"), "--report-out", str(tmp_path / "x.html")])
    cfg = merged_config(args)
    assert cfg.output.params == str(tmp_path / "o" / "params.yaml")
    assert cfg.output.results == str(tmp_path / "o" / "report.json")
    assert cfg.output.report == str(tmp_path / "x.html")  # a --*-out wins for its file


# -- ingest -c FIT.YAML reads a bag as sysid fit does --------------------------------------------------


def test_ingest_takes_topic_map_dt_and_robot_from_a_fit_config(tmp_path: Path) -> None:
    from sysid.cli.ingest_program import fit_config_settings

    got = fit_config_settings(str(ROOT / "examples" / "fit.yaml"))  # the topic map named by its manifest
    assert got == {"dt": 0.01, "robot": str(ROOT / "models" / "helhest" / "robot.yaml"),
                   "topics": str(SAMPLE / "topics.yaml")}
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "t.yaml").write_text("topics: {odom: {topic: /odom}}\n")
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(yaml.safe_dump({"robot": "husky", "data": {"train": ["x.bag"], "topics": "maps/t.yaml",
                                                               "ingest": {"dt": 0.02}}}))
    got = fit_config_settings(str(cfg))
    assert got == {"dt": 0.02, "robot": str(ROOT / "models" / "husky" / "robot.yaml"),
                   "topics": str(tmp_path / "maps" / "t.yaml")}  # relative to the config, as in sysid
    assert fit_config_settings(str(tmp_path / "maps" / "t.yaml")) == {"topic_map": str(tmp_path / "maps" / "t.yaml")}


def test_ingest_load_passes_the_fit_configs_settings_and_flags_win(tmp_path: Path, monkeypatch) -> None:
    import ingest
    import ingest.load
    from sysid.cli.ingest_program import _load, build_parser

    seen: list[dict] = []

    class Stop(Exception):
        pass

    def fake_load_run(source, **kw):
        seen.append(kw)
        raise Stop

    monkeypatch.setattr(ingest.load, "load_run", fake_load_run)
    cfg = str(ROOT / "examples" / "fit.yaml")
    for argv in (["load", str(SAMPLE / "run_10"), "-c", cfg],
                 ["load", str(SAMPLE / "run_10"), "-c", cfg, "--dt", "0.05", "--robot", "husky"]):
        with pytest.raises(Stop):
            _load(build_parser().parse_args(argv))
    # the config's topic map, read once by the program (to refuse a map whose run identifies nothing)
    assert seen[0]["config"] == ingest.TopicMap.from_yaml(SAMPLE / "topics.yaml") and seen[0]["dt"] == 0.01
    assert seen[0]["robot"] == str(ROOT / "models" / "helhest" / "robot.yaml")
    assert seen[1]["dt"] == 0.05 and seen[1]["robot"] == "husky"


def test_ingest_inspect_with_a_fit_config_checks_its_topic_map(tmp_path: Path, monkeypatch, capsys) -> None:
    from sysid.cli.ingest_program import main

    monkeypatch.chdir(tmp_path)  # any folder: the config's paths are its own
    assert main(["inspect", str(SAMPLE / "run_10"), "-q", "-c", str(ROOT / "examples" / "fit.yaml")]) == 0
    out = capsys.readouterr().out
    assert "odometry:        /local_odom [nav_msgs/msg/Odometry] (topic map)" in out, out
    assert "can be fitted: odometry /local_odom, wheel commands /wheel_cmd" in out
