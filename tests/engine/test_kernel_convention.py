"""The engine's kernel convention, checked on the source of every module under sysid/engine (nothing compiled).

- Arrays are annotated ``wp.array[dtype]`` / ``wp.array2d[dtype]``, never ``wp.array(dtype=...)``: in kernel and
  function parameters, struct fields and host code alike.
- newton's enums by name: no module constant that copies an enum's value as a literal (``_BOX = 7  #
  newton.GeoType.BOX``), no ``shape_type[s] == 7`` in a kernel or function.
- Parameter lists: no kernel or function lists more than `MAX_FLAT_ARRAYS` flat arrays (arrays that travel
  together are a `wp.struct` group); where a list is grouped by comments (mujoco_warp's ``# Model:`` /
  ``# Data in:`` / ``# Data out:``), an ``_out`` parameter sits under ``# Data out`` (or ``# Data in/out``) and
  an ``_in`` parameter under none of those.

Which groups there are, and where arrays stay flat: docs/architecture.md, "Kernel convention".
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "sysid" / "engine"
MAX_FLAT_ARRAYS = 12  # flat array parameters of one kernel or function, at most
ARRAY_TYPES = re.compile(r"^(array|indexedarray|fabricarray)([1-4]d)?$")
GROUP_COMMENT = re.compile(r"#\s*(Model|Data in/out|Data in|Data out|Scratch)\b")
ENUM_ARRAYS = re.compile(r"_type$")  # newton's enum-valued arrays: shape_type, joint_type, ...


def _decorated(node: ast.AST, name: str) -> bool:
    """Whether a def or class carries ``@wp.<name>`` (bare or called with options)."""
    decorators = getattr(node, "decorator_list", [])
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == f"wp.{name}" for d in decorators)


def _annotations(tree: ast.AST) -> list[ast.expr]:
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            out += [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                    if x is not None and x.annotation is not None]
            if node.returns is not None:
                out.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            out.append(node.annotation)
    return out


def _call_form(ann: ast.expr) -> list[ast.Call]:
    """The ``wp.array(dtype=...)`` calls inside an annotation."""
    return [n for n in ast.walk(ann) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and ARRAY_TYPES.match(n.func.attr) and any(k.arg == "dtype" for k in n.keywords)]


def _int_literal(value: ast.expr | None) -> bool:
    """An int literal, bare or through ``wp.constant(...)``."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "wp.constant" and len(value.args) == 1:
        value = value.args[0]
    return isinstance(value, ast.Constant) and type(value.value) is int


def _enum_array(node: ast.expr) -> bool:
    if not isinstance(node, ast.Subscript):
        return False
    base = node.value
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return bool(ENUM_ARRAYS.search(name))


def violations(path: Path, max_arrays: int = MAX_FLAT_ARRAYS) -> list[str]:
    """Every breach of the convention in one module, as ``file:line: what``; ``max_arrays``: the most flat array
    parameters a kernel or function may list."""
    src = path.read_text()
    tree = ast.parse(src)
    comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}
    where = f"{path.name}:"
    out: list[str] = []

    for ann in _annotations(tree):
        for call in _call_form(ann):
            out.append(f"{where}{call.lineno}: {ast.unparse(call)} annotation; write "
                       f"wp.{ast.unparse(call.func).split('.')[-1]}[dtype]")

    # module constants holding an int literal: a copied enum value when its comment names newton
    literal_names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _int_literal(node.value):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            literal_names.update(names)
            if "newton." in comments.get(node.lineno, ""):
                out.append(f"{where}{node.lineno}: {', '.join(names)} copies a newton enum value; use the enum by "
                           "name (wp.constant(int(newton.<Enum>.<NAME>)))")

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not (_decorated(fn, "kernel") or _decorated(fn, "func")):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_enum_array(s) for s in sides):
                    for s in sides:
                        if _int_literal(s) or (isinstance(s, ast.Name) and s.id in literal_names):
                            out.append(f"{where}{node.lineno}: {ast.unparse(node)} compares a newton enum array "
                                       "with a literal; name the enum")
        arrays = [a.arg for a in fn.args.args if a.annotation is not None and _array_annotation(a.annotation)]
        if len(arrays) > max_arrays:
            out.append(f"{where}{fn.lineno}: {fn.name} lists {len(arrays)} flat arrays (at most {max_arrays}): "
                       "group the arrays that travel together in a wp.struct")
        if not _decorated(fn, "kernel"):
            continue
        group = None
        prev = fn.lineno
        for arg in fn.args.args:
            for line in range(prev, arg.lineno + 1):
                m = GROUP_COMMENT.search(comments.get(line, ""))
                if m:
                    group = m.group(1)
            prev = arg.lineno + 1
            if group is not None and arg.arg.endswith("_out") and group not in ("Data out", "Data in/out"):
                out.append(f"{where}{arg.lineno}: kernel {fn.name}: output {arg.arg} listed under '# {group}:'")
            if group in ("Data out", "Data in/out") and arg.arg.endswith("_in"):
                out.append(f"{where}{arg.lineno}: kernel {fn.name}: input {arg.arg} listed under '# {group}:'")
    return out


def _array_annotation(ann: ast.expr) -> bool:
    """``wp.array[...]`` and its kinds (2d, indexed, ...), either form."""
    base = ann.func if isinstance(ann, ast.Call) else ann.value if isinstance(ann, ast.Subscript) else ann
    return isinstance(base, ast.Attribute) and bool(ARRAY_TYPES.match(base.attr))


def test_engine_modules_follow_the_kernel_convention() -> None:
    modules = sorted(ENGINE.rglob("*.py"))
    assert len(modules) > 10 and {p.stem for p in modules} >= {"step", "types", "contact", "linsolve_kernels"}
    found = [v for p in modules for v in violations(p)]
    assert not found, "kernel convention (tests/engine/test_kernel_convention.py):\n" + "\n".join(found)


OLD_FORM = '''
import newton
import warp as wp
from sysid.engine.types import ModelArrays

_BOX = 7  # newton.GeoType.BOX
_MESH = wp.constant(8)  # newton.GeoType.MESH
EDGE = wp.constant(1)  # a switch, not an enum


@wp.struct
class Group:
    a: wp.array(dtype=float)


@wp.func
def is_box(s: int, shape_type: wp.array2d(dtype=int)):
    return shape_type[s, 0] == _BOX


@wp.kernel
def k(
    model: ModelArrays,
    # Data in:
    shape_type: wp.array[int],
    x_out: wp.array[float],
    # Data out:
    y_in: wp.array[float],
):
    i = wp.tid()
    if shape_type[i] == 8 and EDGE != 0:
        x_out[i] = 1.0
'''

NEW_FORM = '''
import newton
import warp as wp

_BOX = wp.constant(int(newton.GeoType.BOX))
EDGE = wp.constant(1)  # a switch, not an enum


@wp.struct
class Group:
    a: wp.array[float]


@wp.func
def is_box(s: int, shape_type: wp.array2d[int]):
    return shape_type[s, 0] == _BOX


@wp.kernel
def k(
    # Data in:
    shape_type: wp.array[int],
    y_in: Group,
    # Data out:
    x_out: wp.array[float],
):
    i = wp.tid()
    if shape_type[i] == newton.GeoType.MESH and EDGE != 0:
        x_out[i] = 1.0
'''


def test_the_check_fails_on_a_kernel_written_the_other_way(tmp_path: Path) -> None:
    old = tmp_path / "old_kernels.py"
    old.write_text(OLD_FORM)
    found = violations(old, max_arrays=2)
    expected = [
        "wp.array(dtype=float) annotation",  # struct field
        "wp.array2d(dtype=int) annotation",  # func parameter
        "_BOX copies a newton enum value",
        "_MESH copies a newton enum value",
        "shape_type[s, 0] == _BOX compares a newton enum array",
        "shape_type[i] == 8 compares a newton enum array",
        "k lists 3 flat arrays (at most 2)",
        "output x_out listed under '# Data in:'",
        "input y_in listed under '# Data out:'",
    ]
    for what in expected:
        assert sum(what in v for v in found) == 1, (what, found)
    assert len(found) == len(expected), found
    new = tmp_path / "new_kernels.py"
    new.write_text(NEW_FORM)
    assert violations(new, max_arrays=2) == []


@pytest.mark.parametrize("line", ["def f(a: wp.array(dtype=wp.vec3)): pass",
                                  "x: 'int' = 0\ny: wp.array3d(dtype=float, ndim=3) | None = None"])
def test_host_annotations_in_the_call_form_are_found(tmp_path: Path, line: str) -> None:
    p = tmp_path / "host.py"
    p.write_text("import warp as wp\n" + line + "\n")
    assert len(violations(p)) == 1
