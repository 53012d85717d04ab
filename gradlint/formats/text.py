"""`path:line:col: CODE message`, one finding per line, as flake8 and ruff print them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gradlint.rule import Diagnostic

# Returns the source line a finding points at, or None when it cannot be read.
SourceLine = Callable[[Diagnostic], "str | None"]


def render(diagnostics: Sequence[Diagnostic], source_line: SourceLine | None = None) -> str:
    """The findings as flake8-style lines; with `source_line`, each is followed by its code and a caret."""
    return "".join(_finding(d, source_line) for d in diagnostics)


def _location(diagnostic: Diagnostic) -> str:
    """`path:line:col`, or `path:cell N:line:col` in a notebook, as Ruff prints it."""
    cell = "" if diagnostic.cell is None else f"cell {diagnostic.cell}:"
    return f"{diagnostic.path}:{cell}{diagnostic.line}:{diagnostic.column}"


def _finding(diagnostic: Diagnostic, source_line: SourceLine | None) -> str:
    header = f"{_location(diagnostic)}: {diagnostic.code} {diagnostic.message}\n"
    line = source_line(diagnostic) if source_line else None
    if line is None:
        return header
    return header + f"    {line}\n    {_caret(diagnostic, line)}\n"


def _caret(diagnostic: Diagnostic, line: str) -> str:
    """Carets under the reported span of `line`, up to its end if the span goes on."""
    start = min(diagnostic.column - 1, len(line))
    end = diagnostic.end_column - 1 if diagnostic.end_line == diagnostic.line else len(line.rstrip())
    # Keep tabs from the line so the caret lands under the same column as the code.
    padding = "".join(char if char == "\t" else " " for char in line[:start])
    return padding + "^" * max(end - start, 1)
