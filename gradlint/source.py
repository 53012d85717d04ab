"""The source lines findings point at, read back from disk for `--show-source`."""

from __future__ import annotations

from pathlib import Path

from gradlint import notebook
from gradlint.decoding import LINE_BREAK
from gradlint.rule import Diagnostic, Related

# LibCST counts CRLF, CR and LF as line breaks, and nothing else (unlike str.splitlines).


class SourceLines:
    """Reads each file once and answers the text of the line a finding points at."""

    def __init__(self) -> None:
        self._files: dict[str, list[str] | notebook.Notebook | None] = {}

    def line(self, diagnostic: Diagnostic | Related) -> str | None:
        """The line a finding (or a place related to it) points at, without its line break; None if unreadable."""
        if diagnostic.path not in self._files:
            self._files[diagnostic.path] = _read(Path(diagnostic.path))
        source = self._files[diagnostic.path]
        if isinstance(source, notebook.Notebook):
            return None if diagnostic.cell is None else source.line(diagnostic.cell, diagnostic.line)
        if source is None or not 0 < diagnostic.line <= len(source):
            return None
        return source[diagnostic.line - 1]


def _read(path: Path) -> list[str] | notebook.Notebook | None:
    try:
        data = path.read_bytes()
        if path.suffix == notebook.SUFFIX:
            return notebook.read_notebook(data)
    except (OSError, notebook.NotebookError):
        return None
    return LINE_BREAK.split(data.decode("utf-8", "replace"))
