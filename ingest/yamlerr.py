"""YAML errors that name the file: ``yaml_problem(exc, path)`` -> ``"fit.yaml, line 2, column 7: expected ..."``.

PyYAML's messages name the stream (``"<unicode string>"`` when text was parsed) and quote the source
line with a caret over several lines; a user needs the file, the line and the problem, on one line.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def yaml_problem(exc: BaseException, path: str | Path | None = None) -> str:
    """One line: where (file, line, column; 1-based) and what PyYAML found wrong."""
    where = str(path) if path is not None else "YAML"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            where += f", line {mark.line + 1}, column {mark.column + 1}"
        what = "; ".join(x for x in (exc.context, exc.problem) if x)
        return f"{where}: {what or type(exc).__name__}"
    return f"{where}: {' '.join(str(exc).split())}"
