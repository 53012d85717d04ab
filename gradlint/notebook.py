"""Jupyter notebooks as one Python module: the code cells joined, with a map back to cells.

The cells are joined rather than linted one by one because a notebook is one program:
the optimizer built in cell 2 is the one the loop in cell 5 steps, so per-cell linting
would lose exactly the context the rules need (Ruff joins cells for the same reason).
Each cell is preceded by a marker comment, so that fixed source can be split back into
its cells. IPython syntax (`%magic`, `!shell`, `x = !cmd`, `obj?`, `%%cell` magics, and the
automagics `pip install ...` and `conda install ...`) is not Python: each such line becomes a
numbered placeholder `pass` that the fix path restores.
"""

from __future__ import annotations

import bisect
import io
import json
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gradlint.rule import Diagnostic

SUFFIX = ".ipynb"
# An IPython escape at the start of a logical line: `%time f()`, `!pip install x`, `files = !ls`,
# `out = %sx ls`, `torch.nn?`, `??model`, `?create_dataset`, `?torch.*grad*`; and the package managers'
# automagics (`pip install -U x`, `conda install y` without the `%`), a name followed by a subcommand: never Python.
_ESCAPE = re.compile(
    r"^\s*(?:[%!]|[\w.]+\s*=\s*[%!]|\?*[\w.]+\?{1,2}\s*$|\?{1,2}[\w.*]+\s*$"
    r"|(?:pip|conda|mamba)\s+(?:install|uninstall|list|show|freeze|download|update|upgrade|remove|create|env)\b)"
)
# Cell magics whose body is Python and is linted; any other `%%magic` cell (`%%bash`,
# `%%writefile`, `%%html`, ...) holds no Python and is masked whole.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})
_CELL_MARKER = "# gradlint: cell {}"
_CELL_MARKER_LINE = re.compile(r"^# gradlint: cell (\d+)$")
_PLACEHOLDER = "pass  # gradlint: ipython {}"
_PLACEHOLDER_LINE = re.compile(r"^(\s*)pass  # gradlint: ipython (\d+)$")
# The indentation of the first key tells how the file was written (nbformat: one space).
_INDENT = re.compile(rb"\A\{\r?\n( *)\"")


class NotebookError(ValueError):
    """A file that is not a notebook gradlint can read (bad JSON, not nbformat 4), or fixed
    source that no longer splits into the notebook's cells."""


@dataclass(frozen=True)
class _Masked:
    """An IPython line replaced by a placeholder: its text and the indentation kept for it."""

    text: str
    indent: str


@dataclass(frozen=True)
class Notebook:
    """A notebook's code cells as one Python `source`, and how to map it back to the file."""

    document: dict[str, Any]
    source: str
    lines: tuple[str, ...]  # the original cell lines, magics included, one per line of `source`
    starts: tuple[int, ...]  # the 1-based line of `source` where each listed cell's code begins
    cells: tuple[int, ...]  # the 1-based cell index (among all cells) beginning at each start
    masked: tuple[_Masked, ...]  # what each numbered placeholder stands for
    indent: int | None  # the JSON layout of the file, kept when it is rewritten
    ascii_only: bool  # Jupyter writes non-ASCII as is, other tools as \u escapes
    final_newline: bool

    def locate(self, diagnostic: Diagnostic) -> Diagnostic:
        """`diagnostic`, found in `source`, moved to its cell and line within that cell."""
        if not self.cells:
            return diagnostic
        # A finding on the first marker line (GL999 and some GL000 are reported at 1:1)
        # belongs to the first line of the first cell.
        cell, line, end_line = self._place(diagnostic.line, diagnostic.end_line)
        related = tuple(
            replace(place, cell=cell_, line=line_, end_line=end_)
            for place in diagnostic.related
            for cell_, line_, end_ in [self._place(place.line, place.end_line)]
        )
        return replace(diagnostic, cell=cell, line=line, end_line=end_line, related=related)

    def _place(self, line: int, end_line: int) -> tuple[int, int, int]:
        """The cell, line and end line within it of a span of `source`."""
        position = max(bisect.bisect_right(self.starts, line) - 1, 0)
        offset = min(self.starts[position] - 1, line - 1)
        return self.cells[position], line - offset, max(end_line - offset, 1)

    def line(self, cell: int, line: int) -> str | None:
        """The original text of `line` (1-based) of `cell`, or None if there is no such line."""
        if cell not in self.cells or line < 1:
            return None
        position = self.cells.index(cell)
        end = self.starts[position + 1] - 1 if position + 1 < len(self.starts) else len(self.lines) + 1
        index = self.starts[position] + line - 1
        return self.lines[index - 1] if index < end else None

    def rebuild(self, fixed: str) -> bytes:
        """The notebook file with its code cells replaced by those of `fixed` (a changed
        `source`); outputs, metadata and every other cell stay exactly as they were."""
        texts = _split_cells(fixed)
        if list(texts) != list(self.cells):
            raise NotebookError("the fixed source no longer splits into the notebook's cells")
        document = json.loads(json.dumps(self.document))
        for number, lines in texts.items():
            cell = document["cells"][number - 1]
            restored = [self._restore(line) for line in lines]
            original = _source_text(cell["source"])
            if restored == original.splitlines():
                continue  # untouched by the fixes: keep it byte for byte (CRLF included)
            text = "".join(f"{line}\n" for line in restored)
            text = text if original.endswith("\n") else text[:-1]
            cell["source"] = text.splitlines(keepends=True) if isinstance(cell["source"], list) else text
        text = json.dumps(document, indent=self.indent, ensure_ascii=self.ascii_only)
        return (text + "\n" if self.final_newline else text).encode("utf-8")

    def _restore(self, line: str) -> str:
        match = _PLACEHOLDER_LINE.match(line)
        if match is None:
            return line
        masked = self.masked[int(match[2])]
        # A fix may have re-indented the block around the placeholder: keep that shift.
        return match[1] + masked.text[len(masked.indent) :]


def read_notebook(data: bytes) -> Notebook:
    """The notebook in `data` (nbformat 4 JSON); raises NotebookError if it cannot be read."""
    try:
        document = json.loads(data.decode("utf-8"))  # Jupyter writes UTF-8 only
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise NotebookError(f"not a notebook: invalid JSON: {error}") from error
    if not isinstance(document, dict) or document.get("nbformat") != 4 or not isinstance(document.get("cells"), list):
        raise NotebookError("not a notebook in nbformat 4 (no 'nbformat': 4 and 'cells' list)")
    code: list[str] = []
    original: list[str] = []
    starts: list[int] = []
    cells: list[int] = []
    masked: list[_Masked] = []
    for number, cell in enumerate(document["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        lines = _source_text(cell.get("source", "")).splitlines()
        if not lines:
            continue
        code.append(_CELL_MARKER.format(number))
        original.append("")
        starts.append(len(code) + 1)
        cells.append(number)
        original.extend(lines)
        code.extend(_python_lines(lines, masked))
    source = "".join(f"{line}\n" for line in code)
    first_key = _INDENT.match(data)
    indent = len(first_key[1]) if first_key else None
    layout = (indent, data.isascii(), data.endswith(b"\n"))
    return Notebook(document, source, tuple(original), tuple(starts), tuple(cells), tuple(masked), *layout)


def _source_text(source: object) -> str:
    # nbformat stores a cell's source as one string or as a list of line strings.
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        return "".join(source)
    if not isinstance(source, str):
        raise NotebookError("a code cell's 'source' is neither a string nor a list of strings")
    return source


def _python_lines(lines: Sequence[str], masked: list[_Masked]) -> list[str]:
    """The lines of one cell with IPython syntax replaced by placeholders (added to `masked`)."""

    def placeholder(line: str, indent: str) -> str:
        masked.append(_Masked(line, indent))
        return indent + _PLACEHOLDER.format(len(masked) - 1)

    if lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split(maxsplit=1)
        if not magic or magic[0] not in _PYTHON_CELL_MAGICS:
            return [placeholder(line, "") for line in lines]
    result: list[str] = []
    continued = False
    for number, line in enumerate(lines):
        if continued or (number == 0 and line.lstrip().startswith("%%")):
            result.append(placeholder(line, ""))
        elif _ESCAPE.match(line) and _starts_statement(result):
            # The placeholder keeps the indentation, so a block it was alone in stays valid.
            result.append(placeholder(line, line[: len(line) - len(line.lstrip())]))
        else:
            result.append(line)
            continue
        continued = line.endswith("\\")
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


def _split_cells(source: str) -> dict[int, list[str]]:
    cells: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in source.splitlines():
        marker = _CELL_MARKER_LINE.match(line)
        if marker:
            current = cells.setdefault(int(marker[1]), [])
        elif current is not None:
            current.append(line)
    return cells
