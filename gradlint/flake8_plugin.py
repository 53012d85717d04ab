"""The flake8 adapter: `flake8 --select GL` reports what `gradlint` reports, through the engine.

flake8 owns selection and `# noqa` in flake8 mode, so the adapter lints with every rule
and leaves noqa comments to flake8; the engine uses flake8's own noqa rules, so the
findings that survive are the ones the gradlint command prints. The rules in preview run
with `--gradlint-preview` (or `gradlint-preview = true` in flake8's configuration), as
they run with `gradlint --preview`: a default-ignore list would not do, since flake8 lets
an explicit `--select GL` override it.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gradlint import __version__
from gradlint.config import Config
from gradlint.engine import lint_source, whole_program
from gradlint.project import Project
from gradlint.rule import Diagnostic

if TYPE_CHECKING:
    from flake8.options.manager import OptionManager  # type: ignore[import-untyped]  # flake8 ships no types

    from gradlint.engine import Program

Flake8Error = tuple[int, int, str, type]


class Plugin:
    """flake8's entry point `GL`: one instance per file, as for any AST plugin."""

    name = "gradlint"
    version = __version__
    config = Config()

    @staticmethod
    def add_options(manager: OptionManager) -> None:
        """Register `--gradlint-preview`."""
        manager.add_option(
            "--gradlint-preview",
            action="store_true",
            parse_from_config=True,
            help="Also run gradlint's rules in preview (see `gradlint rules`).",
        )

    @classmethod
    def parse_options(cls, options: argparse.Namespace) -> None:
        """Take the run's `--gradlint-preview`."""
        cls.config = Config(preview=True) if options.gradlint_preview else Config()

    def __init__(self, tree: ast.AST, lines: list[str], filename: str) -> None:
        # flake8 hands every plugin that asks for `tree` its own ast; gradlint parses
        # with LibCST instead, from the same lines flake8 read (after its BOM handling).
        del tree
        self.lines = lines
        self.filename = filename

    def run(self) -> Iterator[Flake8Error]:
        """Yield flake8's (line, column, "CODE message", type) for every finding."""
        program = _program(self.filename)
        for diagnostic in lint_source("".join(self.lines), self.filename, self.config, noqa=False, program=program):
            yield to_flake8(diagnostic, type(self))


# One model per project per flake8 process: the files of a run share the summaries of their modules.
_PROGRAMS: dict[tuple[Path, ...], Program] = {}


def _program(filename: str) -> Program | None:
    """The whole-program model of the project `filename` belongs to (None for stdin)."""
    if filename in ("-", "stdin") or not Path(filename).is_file():
        return None
    project = Project()
    project.add_file(Path(filename))
    roots = tuple(project.roots)
    if roots not in _PROGRAMS:
        _PROGRAMS[roots] = whole_program([Path(filename)])
    return _PROGRAMS[roots]


def to_flake8(diagnostic: Diagnostic, plugin: type) -> Flake8Error:
    """The finding in flake8's terms: plugins yield 0-based columns and flake8 adds 1 when it prints."""
    return diagnostic.line, diagnostic.column - 1, f"{diagnostic.code} {diagnostic.message}", plugin
