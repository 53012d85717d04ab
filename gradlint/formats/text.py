"""`path:line:col: CODE message`, one finding per line, as flake8 and ruff print them."""

from __future__ import annotations

from collections.abc import Sequence

from gradlint.rule import Diagnostic


def render(diagnostics: Sequence[Diagnostic]) -> str:
    """The findings as flake8-style lines."""
    return "".join(f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}\n" for d in diagnostics)
