"""Apply the fixes of findings to source files without ever losing or corrupting code.

A file is fixed in passes: lint, apply the fixes whose edits do not overlap, check that
the result still parses, and lint again, until no fix is left. The result is written
through a temporary file and an atomic rename, in the file's own encoding, BOM, line
endings and mode, and only if the file did not change on disk in the meantime.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import stat
import tempfile
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import libcst as cst

from gradlint import notebook
from gradlint.config import Config
from gradlint.engine import lint_notebook, lint_paths, lint_source
from gradlint.rule import LINE_BREAK, Diagnostic, Edit, Fix

# Each pass fixes every finding whose edits do not overlap another's; a few passes settle
# the rest. The cap keeps a fix that keeps re-triggering its own rule from looping.
MAX_PASSES = 8


@dataclass(frozen=True)
class FixedSource:
    """The text after fixing, how many fixes went in, and the findings left in it."""

    text: str
    applied: int
    remaining: list[Diagnostic]


@dataclass(frozen=True)
class FileFix:
    """What fixing one file did; `skipped` says why the fixed text was not written."""

    path: str
    before: str = ""
    after: str = ""
    applied: int = 0
    remaining: list[Diagnostic] = field(default_factory=list)
    skipped: str | None = None

    @property
    def changed(self) -> bool:
        """Whether fixing changes the file's text."""
        return self.before != self.after

    def diff(self) -> str:
        """A unified diff of the change, empty when nothing changes."""
        lines = difflib.unified_diff(
            self.before.splitlines(keepends=True),
            self.after.splitlines(keepends=True),
            fromfile=f"a/{self.path}",
            tofile=f"b/{self.path}",
        )
        return "".join(
            line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines
        )


def fix_paths(
    paths: Iterable[Path],
    config: Config,
    unsafe: bool = False,
    write: bool = True,
    *,
    jobs: int | None = None,
    cache: Path | None = None,
) -> Iterator[FileFix]:
    """Fix every file with findings under `paths`; with `write=False` compute the changes only.

    The files are linted first as `lint_paths` does (in parallel, through the cache);
    only those with a fix to apply are read again and fixed.
    """
    found: dict[str, list[Diagnostic]] = {}
    for diagnostic in lint_paths(paths, config, jobs=jobs, cache=cache):
        found.setdefault(diagnostic.path, []).append(diagnostic)
    for path, diagnostics in found.items():
        if any(d.fix is not None and (d.fix.safe or unsafe) for d in diagnostics):
            yield fix_file(Path(path), config, unsafe, write)
        else:
            yield FileFix(path, remaining=diagnostics)


def fix_file(path: Path, config: Config, unsafe: bool = False, write: bool = True) -> FileFix:
    """Fix one file; it is only rewritten when the fixed text parses and lints."""
    if path.suffix == notebook.SUFFIX:
        return fix_notebook(path, config, unsafe, write)
    try:
        data = path.read_bytes()
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        text = data.decode(encoding)
    except (OSError, SyntaxError, LookupError, UnicodeDecodeError):
        # Unreadable or undecodable: the engine reports why (GL000); nothing is fixed.
        return FileFix(str(path), remaining=list(lint_paths([path], config)))
    fixed = fix_source(text, str(path), config, unsafe, encoding)
    result = FileFix(str(path), text, fixed.text, fixed.applied, fixed.remaining)
    if not write or not result.changed:
        return result
    relint = partial(lint_source, path=str(path), config=config)
    return _written(result, path, fixed.text.encode(encoding), data, relint)


def fix_notebook(path: Path, config: Config, unsafe: bool = False, write: bool = True) -> FileFix:
    """Fix a notebook's code cells as one module; outputs, metadata and other cells stay as they were."""
    try:
        data = path.read_bytes()
        cells = notebook.read_notebook(data)
    except (OSError, notebook.NotebookError):
        return FileFix(str(path), remaining=list(lint_paths([path], config)))
    relint = partial(lint_notebook, path=str(path), config=config)
    fixed = fix_source(cells.source, str(path), config, unsafe)
    try:
        after = cells.rebuild(fixed.text)
    except notebook.NotebookError as error:
        return FileFix(str(path), remaining=relint(data), skipped=str(error))
    before = data.decode("utf-8")
    result = FileFix(str(path), before, after.decode("utf-8"), fixed.applied, relint(after))
    if not write or not result.changed:
        return result
    return _written(result, path, after, data, relint)


def _written(
    result: FileFix, path: Path, data: bytes, expected: bytes, lint: Callable[[bytes], list[Diagnostic]]
) -> FileFix:
    """`result` once `data` is written over `expected`, or the file as it stays if it cannot be."""
    skipped = write_atomically(path, data, expected)
    if skipped is None:
        return result
    return FileFix(result.path, result.before, result.before, 0, lint(expected), skipped)


def fix_source(
    text: str, path: str = "<string>", config: Config | None = None, unsafe: bool = False, encoding: str = "utf-8"
) -> FixedSource:
    """Apply the fixes of `text`'s findings until none is left (safe ones, or all with `unsafe`)."""
    applied = 0
    for _ in range(MAX_PASSES):
        diagnostics = lint_source(text.encode(encoding), path, config)
        fixes = _non_overlapping([d.fix for d in diagnostics if d.fix and (d.fix.safe or unsafe)], text)
        fixed = _first_parsing(text, fixes, encoding)
        if fixed is None:
            return FixedSource(text, applied, diagnostics)
        text, count = fixed
        applied += count
    return FixedSource(text, applied, lint_source(text.encode(encoding), path, config))


def _first_parsing(text: str, fixes: list[Fix], encoding: str) -> tuple[str, int] | None:
    """All fixes applied, or failing that the first one whose result still parses."""
    if not fixes:
        return None
    for chosen in (fixes, *([fix] for fix in fixes)):
        candidate = apply_edits(text, [edit for fix in chosen for edit in fix.edits])
        if _parses(candidate, encoding):
            return candidate, len(chosen)
    return None


def _parses(text: str, encoding: str) -> bool:
    try:
        cst.parse_module(text.encode(encoding))
    except Exception:  # noqa: BLE001  (any parser failure means: do not write this)
        return False
    return True


def _non_overlapping(fixes: Sequence[Fix], text: str) -> list[Fix]:
    """The fixes, in order, skipping each one whose edits touch an earlier one's span."""
    starts = _line_starts(text)
    taken: list[tuple[int, int]] = []
    chosen = []
    for fix in fixes:
        spans = [_span(edit, starts) for edit in fix.edits]
        # Two insertions at one point also clash: their order would be arbitrary.
        if any(start <= end2 and start2 <= end for start, end in spans for start2, end2 in taken):
            continue
        taken.extend(spans)
        chosen.append(fix)
    return chosen


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """`text` with non-overlapping `edits` applied."""
    starts = _line_starts(text)
    for edit in sorted(edits, key=lambda edit: _span(edit, starts), reverse=True):
        start, end = _span(edit, starts)
        text = text[:start] + edit.text + text[end:]
    return text


def _line_starts(text: str) -> list[int]:
    return [0, *(match.end() for match in LINE_BREAK.finditer(text))]


def _span(edit: Edit, starts: list[int]) -> tuple[int, int]:
    return starts[edit.line - 1] + edit.column - 1, starts[edit.end_line - 1] + edit.end_column - 1


def write_atomically(path: Path, data: bytes, expected: bytes) -> str | None:
    """Replace the file's bytes by `data` unless they are no longer `expected`; None or why not.

    The data goes to a temporary file in the same directory, which `os.replace` renames
    over the original: a failure at any point leaves the original whole.
    """
    target = Path(os.path.realpath(path))  # rewrite a symlink's target, not the link
    try:
        if target.read_bytes() != expected:
            return "the file changed on disk since it was read; not written"
        mode = stat.S_IMODE(target.stat().st_mode)
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as error:
        return f"cannot write: {error.strerror or error}"
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except OSError as error:
        return f"cannot write: {error.strerror or error}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)  # still there only when the rename did not happen
    return None
