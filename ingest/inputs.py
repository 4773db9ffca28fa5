"""Input files checked before they are read, and a YAML loader that refuses what would hang or mislead.

Both packages read their text inputs (configs, parameter files, robot descriptions, topic maps,
manifests, JSON run files, results) through here, so each check is made once:

- `input_problem` / `check_input_file`: the path is a regular file (not a directory, a named pipe,
  a device or a socket: reading one blocks or never ends), not a symbolic-link loop, and not larger
  than the limit of its kind (`MAX_BYTES`, raised for every kind by ``$SYSID_MAX_INPUT_MB``);
- `read_text`: the file as UTF-8 text, or a one-line error saying it is binary (a bag given as a config);
- `load_yaml` / `read_yaml_file`: PyYAML's safe loader with two refusals: aliases that expand to more
  than `MAX_ALIAS_EXPANSION` nodes (a "billion laughs" document: printing or checking its value would
  never end) and a mapping key given twice (the second would silently replace the first); a document
  nested deeper than Python's recursion allows is a `yaml.YAMLError` as well;
- `read_json_file`: JSON, with a document nested too deeply refused in one line.

Every function takes the caller's error type (``error``), so ``ingest`` raises its `IngestError` kinds
and `sysid` its own, each with one line naming the file and what to do.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from .yamlerr import yaml_problem

LIMIT_ENV = "SYSID_MAX_INPUT_MB"
MIB = 1 << 20
# The largest file of each kind read [bytes]; a YAML file is parsed in pure Python (about 1 MB/s),
# a JSON run file holds about 3 kB per second of log (64 MiB: hours of log).
MAX_BYTES = {"yaml": 16 * MIB, "json": 64 * MIB}
# Nodes a YAML document's aliases may add when expanded; a config, map or manifest adds a handful.
MAX_ALIAS_EXPANSION = 100_000

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def resolved(path: str | os.PathLike[str]) -> Path:
    """``path`` absolute with symlinks and ``..`` resolved; a symbolic-link loop (which `Path.resolve`
    raises on) is left as written, made absolute, for `input_problem` to name."""
    p = Path(path).expanduser()
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(p))


def size_limit(kind: str) -> int:
    """The largest input file of ``kind`` ("yaml" or "json") read [bytes]: ``$SYSID_MAX_INPUT_MB``
    MiB when set (for every kind), else ``MAX_BYTES[kind]``."""
    env = os.environ.get(LIMIT_ENV, "").strip()
    if env:
        try:
            mb = float(env)
        except ValueError:
            mb = -1.0
        if mb > 0:
            return int(mb * MIB)
    return MAX_BYTES[kind]


def input_problem(path: str | os.PathLike[str], kind: str | None = None) -> str | None:
    """Why ``path`` cannot be read as an input file (None when it can), as the words that follow
    ``<what> '<path>'`` in a message: missing, a symbolic-link loop, not a regular file, or larger than
    the limit of ``kind`` (`size_limit`; None: any size). Nothing is opened, so a named pipe never blocks."""
    p = Path(path)
    try:
        st = os.stat(p)
    except ValueError:  # the OS cannot take the name at all (a NUL byte in it)
        return "is not a valid path (it contains a NUL byte); check how it was typed or generated"
    except FileNotFoundError:
        if os.path.islink(p):
            return f"is a symbolic link to {os.readlink(p)!r}, which does not exist"
        return "does not exist"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic-link loop (a link that leads back to itself); point it at the file"
        if exc.errno == errno.ENOTDIR:
            return "does not exist (a folder on its path is a file)"
        return f"cannot be read ({exc.strerror or exc})"
    for test, name in _KINDS:
        if test(st.st_mode):
            return f"is {name}, not a regular file; give a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file; give a file"
    if kind is not None:
        limit = size_limit(kind)
        if st.st_size > limit:
            return (f"is {st.st_size / MIB:.0f} MiB, more than the {limit / MIB:g} MiB a {kind.upper()} input may be "
                    f"(is it the file you meant?); if it is, raise the limit: {LIMIT_ENV}=<MiB>")
    return None


def check_input_file(path: str | os.PathLike[str], what: str, error: type[Exception], kind: str | None = None,
                     missing: str | None = None) -> Path:
    """``path`` as a Path once `input_problem` finds nothing; else ``error("<what> '<path>' <problem>")``
    (``missing``, when given, is the whole message for a path that does not exist)."""
    problem = input_problem(path, kind)
    if problem is None:
        return Path(path)
    if problem == "does not exist" and missing is not None:
        raise error(missing)
    raise error(f"{what} {str(path)!r} {problem}")


def read_text(path: str | os.PathLike[str], what: str, error: type[Exception], kind: str,
              missing: str | None = None) -> str:
    """The UTF-8 text of the input file ``path`` (checked by `check_input_file` first); a binary file
    (a bag, an archive) is ``error`` naming the first byte that is not text."""
    p = check_input_file(path, what, error, kind, missing)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {str(p)!r}: {exc.strerror or exc}; check the path and permissions") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {str(p)!r} is not a text {kind.upper()} file (byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"is not UTF-8): did you pass a bag or another binary file? Give the {kind.upper()} file"
        ) from None


# -- YAML --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses alias expansion beyond `MAX_ALIAS_EXPANSION` nodes and
    duplicate mapping keys (both `yaml.YAMLError`s with the line, for `yamlerr.yaml_problem`)."""

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=False)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"the key {key!r} appears twice in one mapping (first on line {first.start_mark.line + 1}); "
                    "keep one of them (a second one would replace the first)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Raise when the document's aliases, expanded, would add more than `MAX_ALIAS_EXPANSION` nodes
    or an alias contains itself. An alias is the very node of its anchor, so a node's expanded size
    is counted once per node (iteratively: the composer already bounds the depth)."""
    size: dict[int, int] = {}
    distinct: set[int] = set()
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] - len(distinct) > MAX_ALIAS_EXPANSION:
                raise yaml.composer.ComposerError(
                    None, None,
                    f"its aliases (*name) expand to more than {MAX_ALIAS_EXPANSION:,} values (a YAML alias bomb?); "
                    "write the values out instead of nesting aliases", node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name) refers to a node that contains it (a recursive document); "
                "write the values out", node.start_mark)
        on_path.add(key)
        distinct.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml(text: str) -> Any:
    """The YAML document ``text`` (safe types only), refusing alias bombs, duplicate keys and nesting
    deeper than Python's recursion (each a `yaml.YAMLError`)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except RecursionError:
        raise yaml.YAMLError("it is nested too deeply to read (thousands of levels); is it the file you meant?") \
            from None


def read_yaml_file(path: str | os.PathLike[str], error: type[Exception], what: str,
                   missing: str | None = None) -> Any:
    """The parsed YAML of the input file ``path`` (`read_text`, `load_yaml`); invalid YAML is
    ``error("<what> is not valid YAML: <file>, line L, column C: <problem>")``."""
    text = read_text(path, what, error, "yaml", missing)
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} is not valid YAML: {yaml_problem(exc, Path(path))}") from None


# -- JSON --------------------------------------------------------------------------------------------


def read_json_file(path: str | os.PathLike[str], error: type[Exception], what: str,
                   missing: str | None = None, expected: str = "") -> Any:
    """The parsed JSON of the input file ``path`` (`read_text`); invalid JSON, or JSON nested deeper
    than Python's recursion, is ``error`` naming the file (``expected`` is added: what the file should be)."""
    text = read_text(path, what, error, "json", missing)
    hint = f"; {expected}" if expected else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                    f"{hint}") from None
    except RecursionError:
        raise error(f"{what} {str(path)!r} is nested too deeply to read (thousands of levels){hint}") from None
