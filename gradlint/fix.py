"""Apply the fixes of findings to source files without ever losing or corrupting code.

A file is fixed in passes: lint, apply the fixes whose edits do not overlap, and verify
the result: it must parse, and linting it must find nothing that the text before the
fixes did not have (a fix that trades one finding for another, or breaks the code the
analysis reads, is dropped and reported, and the text stays as it was for it). Passes
repeat until no fix is left. The result is written through a temporary file and an
atomic rename, in the file's own encoding, BOM, line endings and mode, and only if the
file did not change on disk in the meantime.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from gradlint import notebook
from gradlint.config import Config
from gradlint.decoding import LINE_BREAK, source_encoding
from gradlint.engine import lint_notebook, lint_paths, lint_source, whole_program
from gradlint.rule import Diagnostic, Edit, Fix

if TYPE_CHECKING:
    from gradlint.engine import Program

# Each pass fixes every finding whose edits do not overlap another's; a few passes settle
# the rest. The cap keeps a fix that keeps re-triggering its own rule from looping.
MAX_PASSES = 8


@dataclass(frozen=True)
class RejectedFix:
    """A fix that was not applied because its result failed verification, and why."""

    diagnostic: Diagnostic  # positioned in the text as it was before fixing
    reason: str


@dataclass(frozen=True)
class FixedSource:
    """The text after fixing, how many fixes went in, the findings left in it, and the fixes dropped."""

    text: str
    applied: int
    remaining: list[Diagnostic]
    rejected: tuple[RejectedFix, ...] = ()


@dataclass(frozen=True)
class FileFix:
    """What fixing one file did; `skipped` says why the fixed text was not written."""

    path: str
    before: str = ""
    after: str = ""
    applied: int = 0
    remaining: list[Diagnostic] = field(default_factory=list)
    skipped: str | None = None
    rejected: tuple[RejectedFix, ...] = ()

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
    targets = list(paths)
    for diagnostic in lint_paths(targets, config, jobs=jobs, cache=cache):
        found.setdefault(diagnostic.path, []).append(diagnostic)
    program = whole_program(targets) if found else None
    for path, diagnostics in found.items():
        if any(d.fix is not None and (d.fix.safe or unsafe) for d in diagnostics):
            yield fix_file(Path(path), config, unsafe, write, program)
        else:
            yield FileFix(path, remaining=diagnostics)


def fix_file(
    path: Path, config: Config, unsafe: bool = False, write: bool = True, program: Program | None = None
) -> FileFix:
    """Fix one file; it is only rewritten when the fixed text parses and lints.

    It is judged with the modules of its project (`program`, or one made for it), as `gradlint check` judges it.
    """
    program = program or whole_program([path])
    if path.suffix == notebook.SUFFIX:
        return fix_notebook(path, config, unsafe, write)
    try:
        data = path.read_bytes()
        encoding = source_encoding(data)
        text = data.decode(encoding)
    except (OSError, SyntaxError, LookupError, UnicodeDecodeError):
        # Unreadable or undecodable: the engine reports why (GL000); nothing is fixed.
        return FileFix(str(path), remaining=list(lint_paths([path], config)))
    fixed = fix_source(text, str(path), config, unsafe, encoding, program)
    result = FileFix(str(path), text, fixed.text, fixed.applied, fixed.remaining, rejected=fixed.rejected)
    if not write or not result.changed:
        return result
    relint = partial(lint_source, path=str(path), config=config, program=program)
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
    result = FileFix(str(path), before, after.decode("utf-8"), fixed.applied, relint(after), rejected=fixed.rejected)
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
    return FileFix(result.path, result.before, result.before, 0, lint(expected), skipped, result.rejected)


def fix_source(
    text: str,
    path: str = "<string>",
    config: Config | None = None,
    unsafe: bool = False,
    encoding: str = "utf-8",
    program: Program | None = None,
) -> FixedSource:
    """Apply the fixes of `text`'s findings until none is left (safe ones, or all with `unsafe`).

    Each pass applies the fixes whose edits do not overlap and keeps only what verifies
    (see `_Fixer`); a dropped fix is not tried again.
    """
    fixer = _Fixer(text, path, config, unsafe, encoding, program)
    for _ in range(MAX_PASSES):
        if not fixer.apply_pass():
            break
    return FixedSource(fixer.text, fixer.applied, fixer.diagnostics, tuple(fixer.rejected.values()))


def verify_fix(
    text: str,
    fix: Fix,
    path: str = "<string>",
    config: Config | None = None,
    encoding: str = "utf-8",
    before: list[Diagnostic] | None = None,
    program: Program | None = None,
) -> str | None:
    """Why applying `fix` alone to `text` must not be offered (None when it verifies).

    `before` are `text`'s findings when the caller has them. The LSP server offers a quick
    fix only when this is None: the same check `--fix` makes.
    """
    if before is None:
        before = lint_source(text.encode(encoding), path, config, program=program)
    return _verify(text, [fix], before, path, config, encoding, program).problem


@dataclass(frozen=True)
class _Outcome:
    """The text after some fixes, its findings, and what is wrong with it (None: it verifies)."""

    text: str
    diagnostics: list[Diagnostic]
    lines: Callable[[int], int]  # a line of the new text -> the line of the text before
    problem: str | None


class _Fixer:
    """Applies verified fixes in passes, remembering which lines of the original each line came from."""

    def __init__(
        self, text: str, path: str, config: Config | None, unsafe: bool, encoding: str, program: Program | None
    ) -> None:
        self.text, self.path, self.config, self.unsafe, self.encoding = text, path, config, unsafe, encoding
        self.program = program
        self.diagnostics = lint_source(text.encode(encoding), path, config, program=program)
        self.applied = 0
        self.rejected: dict[tuple[str, str, int], RejectedFix] = {}
        self.origin: Callable[[int], int] = lambda line: line  # current line -> original line

    def apply_pass(self) -> bool:
        """Apply this pass's fixes that verify; False when there was nothing left to apply."""
        wanted = [d for d in self.diagnostics if self._wanted(d)]
        chosen = _non_overlapping(wanted, self.text)
        if not chosen:
            return False
        outcome = self._check(chosen)
        if outcome.problem is not None:
            passing = []
            for diagnostic in chosen:
                alone = self._check([diagnostic])
                if alone.problem is None:
                    passing.append(diagnostic)
                else:
                    self._reject(diagnostic, alone.problem)
            outcome = self._check(passing) if passing else outcome
            if passing and outcome.problem is not None:
                passing = passing[:1]  # together they clash; the others wait for the next pass
                outcome = self._check(passing)
            if not passing:
                return True  # every fix was dropped; the next pass looks for the rest
            chosen = passing
        self._accept(outcome, len(chosen))
        return True

    def _wanted(self, diagnostic: Diagnostic) -> bool:
        fix = diagnostic.fix
        return fix is not None and (fix.safe or self.unsafe) and self._key(diagnostic) not in self.rejected

    def _check(self, diagnostics: list[Diagnostic]) -> _Outcome:
        fixes = [d.fix for d in diagnostics if d.fix is not None]
        return _verify(self.text, fixes, self.diagnostics, self.path, self.config, self.encoding, self.program)

    def _accept(self, outcome: _Outcome, count: int) -> None:
        previous, mapping = self.origin, outcome.lines
        self.origin = lambda line: previous(mapping(line))
        self.text, self.diagnostics = outcome.text, outcome.diagnostics
        self.applied += count

    def _key(self, diagnostic: Diagnostic) -> tuple[str, str, int]:
        assert diagnostic.fix is not None
        return diagnostic.code, diagnostic.fix.description, self.origin(diagnostic.line)

    def _reject(self, diagnostic: Diagnostic, reason: str) -> None:
        line = self.origin(diagnostic.line)
        shift = line - diagnostic.line
        where = replace(diagnostic, line=line, end_line=diagnostic.end_line + shift)
        self.rejected[self._key(diagnostic)] = RejectedFix(where, reason)


def _verify(
    text: str,
    fixes: Sequence[Fix],
    before: list[Diagnostic],
    path: str,
    config: Config | None,
    encoding: str,
    program: Program | None = None,
) -> _Outcome:
    """Apply `fixes` to `text` and check the result: it parses and has no finding `before` lacks."""
    edits = [edit for fix in fixes for edit in fix.edits]
    candidate = apply_edits(text, edits)
    lines = line_mapping(edits)
    if not _parses(candidate, encoding):
        return _Outcome(candidate, [], lines, "the fixed code would not parse")
    after = lint_source(candidate.encode(encoding), path, config, program=program)
    known = Counter((d.code, d.line) for d in before)
    for diagnostic in after:
        key = (diagnostic.code, lines(diagnostic.line))
        if known[key] > 0:
            known[key] -= 1
            continue
        return _Outcome(candidate, after, lines, f"the fixed code would have a new finding: {_describe(diagnostic)}")
    return _Outcome(candidate, after, lines, None)


def _describe(diagnostic: Diagnostic) -> str:
    return f"{diagnostic.code} at line {diagnostic.line} ({diagnostic.message})"


def line_mapping(edits: Sequence[Edit]) -> Callable[[int], int]:
    """For text changed by non-overlapping `edits`: a line of the new text -> its line in the old.

    Lines an edit wrote map to the edit's first old line, except the edit's last new line,
    which holds what followed the edit on its last old line.
    """
    segments: list[tuple[int, int, Edit]] = []  # (first new line, last new line, edit)
    offset = 0
    for edit in sorted(edits, key=lambda edit: (edit.line, edit.column)):
        added = len(LINE_BREAK.findall(edit.text))
        first = edit.line + offset
        segments.append((first, first + added, edit))
        offset += added - (edit.end_line - edit.line)

    def old_line(line: int) -> int:
        shift = 0
        for first, last, edit in segments:
            if line < first:
                break
            if line == last:
                return edit.end_line
            if line < last:
                return edit.line
            shift = last - edit.end_line
        return line - shift

    return old_line


def _parses(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)  # the fixed text must still be writable in the file's encoding
        cst.parse_module(text)
    except Exception:  # noqa: BLE001  (any parser failure means: do not write this)
        return False
    return True


def _non_overlapping(diagnostics: Sequence[Diagnostic], text: str) -> list[Diagnostic]:
    """The findings, in order, skipping each one whose fix's edits touch an earlier one's span."""
    starts = _line_starts(text)
    taken: list[tuple[int, int]] = []
    chosen = []
    for diagnostic in diagnostics:
        assert diagnostic.fix is not None
        spans = [_span(edit, starts) for edit in diagnostic.fix.edits]
        # Two insertions at one point also clash: their order would be arbitrary.
        if any(start <= end2 and start2 <= end for start, end in spans for start2, end2 in taken):
            continue
        taken.extend(spans)
        chosen.append(diagnostic)
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
