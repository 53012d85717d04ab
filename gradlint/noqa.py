"""`--add-noqa`: silence every current finding with a `# noqa: CODE` comment where it is honoured.

A project adopting gradlint marks what is there today and is held to the rules from then
on. Each comment goes on the line where the engine looks for it (the last line of a
multi-line string or a backslash-continued line, never inside the string), joins a
`# noqa: ...` comment already there, and the file is written as `--fix` writes it.
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from gradlint import notebook
from gradlint.config import Config
from gradlint.decoding import LINE_BREAK, source_encoding
from gradlint.engine import NOQA, lint_source, noqa_lines
from gradlint.fix import apply_edits, write_atomically
from gradlint.rule import Diagnostic, Edit, all_rules


@dataclass(frozen=True)
class NoqaFile:
    """What adding comments to one file did: how many lines got one, the findings no comment
    silences (GL000, GL999, or all of them when the file was not written), and why not."""

    path: str
    added: int = 0
    remaining: list[Diagnostic] = field(default_factory=list)
    skipped: str | None = None


def add_noqa(diagnostics: Iterable[Diagnostic], config: Config) -> Iterator[NoqaFile]:
    """Add comments to each file that has a rule's finding among `diagnostics` (a run's findings)."""
    found: dict[str, list[Diagnostic]] = {}
    for diagnostic in diagnostics:
        found.setdefault(diagnostic.path, []).append(diagnostic)
    rules = all_rules()
    for path, file_diagnostics in found.items():
        if any(d.code in rules for d in file_diagnostics):
            yield add_noqa_file(Path(path), config, file_diagnostics)
        else:
            yield NoqaFile(path, remaining=file_diagnostics)


def add_noqa_file(path: Path, config: Config, found: list[Diagnostic]) -> NoqaFile:
    """Lint the file as it is now and comment its findings; `found` stands if it cannot be read or written."""
    try:
        data = path.read_bytes()
        source = _read(path, data)
    except (OSError, SyntaxError, LookupError, UnicodeDecodeError, notebook.NotebookError) as error:
        return NoqaFile(str(path), remaining=found, skipped=f"cannot read: {error}")
    diagnostics = lint_source(source.linted, str(path), config)
    edits = noqa_edits(source.text, diagnostics)
    rules = all_rules()
    remaining = sorted(source.locate(d) for d in diagnostics if d.code not in rules)
    if not edits:
        return NoqaFile(str(path), remaining=remaining)
    try:
        skipped = write_atomically(path, source.encode(apply_edits(source.text, edits)), data)
    except notebook.NotebookError as error:
        skipped = str(error)
    if skipped is not None:
        return NoqaFile(str(path), remaining=found, skipped=skipped)
    return NoqaFile(str(path), len(edits), remaining)


@dataclass(frozen=True)
class _Source:
    """A file's text, what the engine lints for it, and how edited text becomes the file's bytes again."""

    text: str
    linted: str | bytes
    encode: Callable[[str], bytes]
    locate: Callable[[Diagnostic], Diagnostic]  # a finding in `text` -> where the engine reports it


def _read(path: Path, data: bytes) -> _Source:
    if path.suffix == notebook.SUFFIX:
        cells = notebook.read_notebook(data)
        return _Source(cells.source, cells.source, cells.rebuild, cells.locate)
    encoding = source_encoding(data)  # the bytes and the cookie stay as they were
    return _Source(data.decode(encoding), data, partial(str.encode, encoding=encoding), lambda found: found)


def noqa_edits(text: str, diagnostics: Iterable[Diagnostic]) -> list[Edit]:
    """The edits that silence each rule's finding in `text`: one per line that gets a comment.

    A finding is silenced where the engine looks (`noqa_lines`): the comment goes on the
    last line of its group, whose end lies outside any string. A `# noqa: ...` comment on
    that line gains the codes; any other line gets `  # noqa: CODES` at its end.
    """
    groups, rules = noqa_lines(text), all_rules()
    wanted: dict[int, set[str]] = {}
    for diagnostic in diagnostics:
        if diagnostic.code in rules:  # GL000 and GL999 are never silenced
            group = groups.get(diagnostic.line, range(diagnostic.line, diagnostic.line + 1))
            wanted.setdefault(group.stop - 1, set()).add(diagnostic.code)
    lines, comments = LINE_BREAK.split(text), _comments(text)
    return [_edit(number, lines[number - 1], comments.get(number), sorted(codes)) for number, codes in wanted.items()]


def _comments(text: str) -> dict[int, tokenize.TokenInfo]:
    """The comment ending each line that has one."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):  # then the file has GL000, not a rule's finding
        return {}
    return {token.start[0]: token for token in tokens if token.type == tokenize.COMMENT}


def _edit(line: int, text: str, comment: tokenize.TokenInfo | None, codes: list[str]) -> Edit:
    match = NOQA.search(comment.string) if comment is not None else None
    if comment is None or match is None or match.group("codes") is None:
        # Ex) `total += loss` ends in a new comment, `noqa: GL001`
        content = len(text.rstrip()) + 1
        return Edit(line, content, line, len(text) + 1, f"  # noqa: {', '.join(codes)}")
    # Ex) a trailing `noqa: GL007` becomes `noqa: GL007, GL001`
    listed = match.group("codes").rstrip()
    end = comment.start[1] + match.start("codes") + len(listed) + 1
    return Edit(line, end, line, end, f"{'' if listed.endswith(',') else ','} {', '.join(codes)}")
