"""GitHub Actions workflow commands: each finding becomes an annotation on the pull request."""

from __future__ import annotations

from collections.abc import Sequence

from gradlint.rule import Diagnostic, Related


def render(diagnostics: Sequence[Diagnostic]) -> str:
    """The findings as `::error file=...,line=...::message` workflow commands."""
    return "".join(_annotation(d) + "\n" for d in diagnostics)


def _annotation(diagnostic: Diagnostic) -> str:
    properties: dict[str, object] = {"file": diagnostic.path}
    message = diagnostic.message
    if diagnostic.cell is None:
        properties.update(
            line=diagnostic.line, col=diagnostic.column, endLine=diagnostic.end_line, endColumn=diagnostic.end_column
        )
    else:
        # Annotation lines are lines of the file, which in a notebook are JSON: annotate
        # the whole file and say where in the cell.
        message = f"cell {diagnostic.cell}, line {diagnostic.line}: {message}"
    if diagnostic.related:
        # An annotation has one place: the others go into its text, one per line.
        notes = (f"{_where(place, diagnostic)}: {place.note}" for place in diagnostic.related)
        message = "\n".join([message, *notes])
    properties["title"] = f"{diagnostic.code} {diagnostic.name}"
    joined = ",".join(f"{key}={_escape_property(str(value))}" for key, value in properties.items())
    return f"::error {joined}::{_escape_data(message)}"


def _where(place: Related, diagnostic: Diagnostic) -> str:
    path = "" if place.path == diagnostic.path else f"{place.path}:"
    cell = "" if place.cell is None else f"cell {place.cell}, "
    return f"{path}{cell}line {place.line}"


def _escape_data(text: str) -> str:
    # The escapes of @actions/core's toCommandValue: '%' first, so later escapes stay intact.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
