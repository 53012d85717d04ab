"""Jupyter notebooks as one Python module: the code cells joined, with a map back to cells.

The cells are joined rather than linted one by one because a notebook is one program:
the optimizer built in cell 2 is the one the loop in cell 5 steps, so per-cell linting
would lose exactly the context the rules need (Ruff joins cells for the same reason).
IPython syntax (`%magic`, `!shell`, `x = !cmd`, `obj?`, `%%cell` magics) is not Python;
those lines are blanked so the rest of the cell still parses and keeps its line numbers.
"""

from __future__ import annotations

import bisect
import io
import json
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gradlint.rule import Diagnostic

SUFFIX = ".ipynb"
# An IPython escape at the start of a logical line: `%time f()`, `!pip install x`,
# `files = !ls`, `out = %sx ls`, `torch.nn?`, `??model`.
_ESCAPE = re.compile(r"^\s*(?:[%!]|[\w.]+\s*=\s*[%!]|\?*[\w.]+\?{1,2}\s*$)")
# Cell magics whose body is Python and is linted; any other `%%magic` cell (`%%bash`,
# `%%writefile`, `%%html`, ...) holds no Python and is skipped whole.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})


class NotebookError(ValueError):
    """A file that is not a notebook gradlint can read (bad JSON, not nbformat 4)."""


@dataclass(frozen=True)
class Notebook:
    """The code cells of a notebook joined into `source`, and where each line came from."""

    source: str
    lines: tuple[str, ...]  # the original cell lines, magics included, one per line of `source`
    starts: tuple[int, ...]  # the 1-based line of `source` where each listed cell begins
    cells: tuple[int, ...]  # the 1-based cell index (among all cells) beginning at each start

    def locate(self, diagnostic: Diagnostic) -> Diagnostic:
        """`diagnostic`, found in `source`, moved to its cell and line within that cell."""
        position = bisect.bisect_right(self.starts, diagnostic.line) - 1
        if position < 0:
            return diagnostic
        offset = self.starts[position] - 1
        return replace(
            diagnostic,
            cell=self.cells[position],
            line=diagnostic.line - offset,
            end_line=max(diagnostic.end_line - offset, 1),
        )

    def line(self, cell: int, line: int) -> str | None:
        """The original text of `line` (1-based) of `cell`, or None if there is no such line."""
        if cell not in self.cells:
            return None
        position = self.cells.index(cell)
        index = self.starts[position] - 1 + line - 1
        end = self.starts[position + 1] - 1 if position + 1 < len(self.starts) else len(self.lines)
        return self.lines[index] if line > 0 and index < end else None


def read_notebook(data: bytes) -> Notebook:
    """The notebook in `data` (nbformat 4 JSON); raises NotebookError if it cannot be read."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise NotebookError(f"not a notebook: invalid JSON: {error}") from error
    if not isinstance(document, dict) or document.get("nbformat") != 4 or not isinstance(document.get("cells"), list):
        raise NotebookError("not a notebook in nbformat 4 (no 'nbformat': 4 and 'cells' list)")
    code: list[str] = []
    original: list[str] = []
    starts: list[int] = []
    cells: list[int] = []
    for number, cell in enumerate(document["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        lines = _cell_lines(cell.get("source", ""))
        if not lines:
            continue
        starts.append(len(code) + 1)
        cells.append(number)
        original.extend(lines)
        code.extend(python_lines(lines))
    return Notebook("".join(f"{line}\n" for line in code), tuple(original), tuple(starts), tuple(cells))


def _cell_lines(source: object) -> list[str]:
    # nbformat stores a cell's source as one string or as a list of line strings.
    if isinstance(source, list):
        source = "".join(part for part in source if isinstance(part, str))
    if not isinstance(source, str):
        raise NotebookError("a code cell's 'source' is neither a string nor a list of strings")
    return source.splitlines()


def python_lines(lines: Sequence[str]) -> list[str]:
    """The lines of one cell with IPython syntax blanked; a non-Python cell magic blanks all."""
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split(maxsplit=1)
        if not magic or magic[0] not in _PYTHON_CELL_MAGICS:
            return [""] * len(lines)
        lines = ["", *lines[1:]]
    result: list[str] = []
    continued = False
    for line in lines:
        if continued or (_ESCAPE.match(line) and _starts_statement(result)):
            # An indented escape becomes `pass`, so a block it was alone in stays valid.
            indent = line[: len(line) - len(line.lstrip())]
            result.append(f"{indent}pass" if indent and not continued else "")
            continued = line.endswith("\\")
        else:
            result.append(line)
    return result


def _starts_statement(previous: list[str]) -> bool:
    """Whether the next line begins a logical line, outside any bracket or string."""
    if previous and previous[-1].endswith("\\"):
        return False
    text = "".join(f"{line}\n" for line in previous)
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except (tokenize.TokenError, SyntaxError):
        return False  # inside an open bracket or string: `%` and `!` are Python here
    return True
