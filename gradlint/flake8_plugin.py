"""The flake8 adapter: `flake8 --select GL` reports what `gradlint` reports, through the engine.

flake8 owns selection and `# noqa` in flake8 mode, so the adapter lints with every rule
and leaves noqa comments to flake8; the engine uses flake8's own noqa rules, so the
findings that survive are the ones the gradlint command prints.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gradlint import __version__
from gradlint.engine import lint_source
from gradlint.rule import Diagnostic

Flake8Error = tuple[int, int, str, type]


class Plugin:
    """flake8's entry point `GL`: one instance per file, as for any AST plugin."""

    name = "gradlint"
    version = __version__

    def __init__(self, tree: ast.AST, lines: list[str], filename: str) -> None:
        # flake8 hands every plugin that asks for `tree` its own ast; gradlint parses
        # with LibCST instead, from the same lines flake8 read (after its BOM handling).
        del tree
        self.lines = lines
        self.filename = filename

    def run(self) -> Iterator[Flake8Error]:
        """Yield flake8's (line, column, "CODE message", type) for every finding."""
        for diagnostic in lint_source("".join(self.lines), self.filename, noqa=False):
            yield to_flake8(diagnostic, type(self))


def to_flake8(diagnostic: Diagnostic, plugin: type) -> Flake8Error:
    """The finding in flake8's terms: plugins yield 0-based columns and flake8 adds 1 when it prints."""
    return diagnostic.line, diagnostic.column - 1, f"{diagnostic.code} {diagnostic.message}", plugin
