"""A JSON array of findings; the schema is documented in docs/output-formats.md."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gradlint.rule import Diagnostic, Related

FIELDS = ("path", "line", "column", "end_line", "end_column", "code", "name", "message")
RELATED_FIELDS = ("path", "line", "column", "end_line", "end_column", "note")


def as_dict(diagnostic: Diagnostic) -> dict[str, object]:
    """One finding as a JSON-ready dict with the documented keys (`cell` only in notebooks)."""
    found: dict[str, object] = {field: getattr(diagnostic, field) for field in FIELDS}
    found["related"] = [_place(place) for place in diagnostic.related]
    return found if diagnostic.cell is None else {"path": diagnostic.path, "cell": diagnostic.cell, **found}


def _place(place: Related) -> dict[str, object]:
    found: dict[str, object] = {field: getattr(place, field) for field in RELATED_FIELDS}
    return found if place.cell is None else {"path": place.path, "cell": place.cell, **found}


def render(diagnostics: Sequence[Diagnostic]) -> str:
    """The findings as a JSON array."""
    return json.dumps([as_dict(d) for d in diagnostics], indent=2) + "\n"
