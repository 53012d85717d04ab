"""`path:line:col: CODE message`, one finding per line, as flake8 and ruff print them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gradlint.rule import Diagnostic, Related

# Returns the source line a finding (or a place related to it) points at, or None when it cannot be read.
SourceLine = Callable[[Diagnostic | Related], "str | None"]


def render(diagnostics: Sequence[Diagnostic], source_line: SourceLine | None = None) -> str:
    """The findings as flake8-style lines.

    With `source_line`, each is followed by its code and a caret, then each related
    place with its note, its line and carets, as rustc and Ruff show them.
    """
    return "".join(_finding(d, source_line) for d in diagnostics)


def _location(place: Diagnostic | Related) -> str:
    """`path:line:col`, or `path:cell N:line:col` in a notebook, as Ruff prints it."""
    cell = "" if place.cell is None else f"cell {place.cell}:"
    return f"{place.path}:{cell}{place.line}:{place.column}"


def _finding(diagnostic: Diagnostic, source_line: SourceLine | None) -> str:
    header = f"{_location(diagnostic)}: {diagnostic.code} {diagnostic.message}\n"
    if source_line is None:
        return header
    parts = [header, _quoted(diagnostic, source_line(diagnostic))]
    for place in diagnostic.related:
        parts.append(f"  {_location(place)}: note: {place.note}\n")
        parts.append(_quoted(place, source_line(place)))
    return "".join(parts)


def _quoted(place: Diagnostic | Related, line: str | None) -> str:
    return "" if line is None else f"    {line}\n    {_caret(place, line)}\n"


def _caret(diagnostic: Diagnostic | Related, line: str) -> str:
    """Carets under the reported span of `line`, up to its end if the span goes on."""
    start = min(diagnostic.column - 1, len(line))
    end = diagnostic.end_column - 1 if diagnostic.end_line == diagnostic.line else len(line.rstrip())
    # Keep tabs from the line so the caret lands under the same column as the code.
    padding = "".join(char if char == "\t" else " " for char in line[:start])
    return padding + "^" * max(end - start, 1)
