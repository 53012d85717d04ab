"""Parse successive versions of a document, re-parsing only the top-level statements an edit changed.

The language server keeps one `IncrementalParser` per open document. LibCST writes a
module as its header, then each top-level statement (with the blank lines and comments
before it, and the trailing comments of its indented block), then its footer; a statement
starts at column 0 with no bracket or string open, so it parses alone as it does in its
module. An edit's changed statements, with one unchanged neighbour on each side (a
comment line between two statements belongs to the first one's indented block or to the
second, depending on both), are parsed as one small module and spliced into the last
module in place of the old ones. Anything this cannot settle falls back to a full parse.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from gradlint.analysis.syntax.positions import WrittenStatements

Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement  # what a module's body holds


class IncrementalParser:
    """`libcst.parse_module` for successive versions of one text, reusing the statements an edit left alone."""

    def __init__(self) -> None:
        self._module: cst.Module | None = None
        # The code of the module's header, of each top-level statement and of its footer,
        # which concatenated give the last text parsed.
        self._pieces: list[str] = []
        # The last module's top-level statements written out with their positions: an edit
        # leaves most of them, and only the others are written out again (`analysis.positions`).
        self.written = WrittenStatements()

    def parse(self, text: str) -> cst.Module:
        """The module `text` holds, equal to `libcst.parse_module(text)`; raises what that raises."""
        module = self._splice(text)
        if module is None:
            module = cst.parse_module(text)
            self._remember(module, [_code(module, module.header), *map(module.code_for_node, module.body)])
        return module

    def _remember(self, module: cst.Module, pieces: list[str]) -> None:
        self._module = module
        self._pieces = [*pieces, _code(module, module.footer)] if module.has_trailing_newline else []

    def _splice(self, text: str) -> cst.Module | None:
        """The last module with the statements `text` changed parsed again; None where a full parse must decide."""
        old, pieces = self._module, self._pieces
        if old is None or not pieces or not text.endswith(("\n", "\r")):
            return None  # LibCST adds a missing final line break, which this bookkeeping does not follow
        same = _unchanged(pieces, text)
        if same is None:
            return old
        first, end = same
        # One unchanged neighbour on each side. Never the header or the first statement: their
        # text sets the line break and encoding the whole module is read with.
        first, end = first - 1, end + 1
        if first < 2:
            return None
        if end >= len(pieces) - 1:
            end = len(pieces)  # the footer too: its lines belong to the last statement's block or to it
        start = sum(map(len, pieces[:first]))
        stop = len(text) - sum(map(len, pieces[end:]))
        indent_known = _has_block(old.body[: first - 1])
        replaced = _parse_slice(old, text[start:stop], to_end=end == len(pieces), indent_known=indent_known)
        if replaced is None:
            return None
        statements, footer, codes = replaced
        body = (*old.body[: first - 1], *statements, *old.body[end - 1 :])
        module = old.with_changes(body=body, footer=footer if footer is not None else old.footer)
        self._remember(module, [*pieces[:first], *codes, *pieces[end : len(pieces) - 1]])
        return module


def _code(module: cst.Module, lines: Sequence[cst.EmptyLine]) -> str:
    return "".join(module.code_for_node(line) for line in lines)


def _unchanged(pieces: list[str], text: str) -> tuple[int, int] | None:
    """The pieces `text` may have changed, as a range [first, end); None when it is the same text."""
    first, position = 0, 0
    while first < len(pieces) and text.startswith(pieces[first], position):
        position += len(pieces[first])
        first += 1
    if first == len(pieces):
        if position == len(text):
            return None
        first, position = first - 1, position - len(pieces[-1])  # text was added at the end: the footer changed
    end, stop = len(pieces), len(text)
    while end > first and stop - len(pieces[end - 1]) >= position and text.endswith(pieces[end - 1], 0, stop):
        stop -= len(pieces[end - 1])
        end -= 1
    return first, max(end, first + 1)


def _has_block(statements: Sequence[Statement]) -> bool:
    """Whether a statement has an indented body (others may have one in an `else`: they are not counted)."""
    return any(isinstance(getattr(statement, "body", None), cst.IndentedBlock) for statement in statements)


def _parse_slice(
    old: cst.Module, text: str, *, to_end: bool, indent_known: bool
) -> tuple[list[Statement], Sequence[cst.EmptyLine] | None, list[str]] | None:
    """The statements `text` holds, the module footer (`to_end`: `text` ends the module) and each statement's code.

    `text` replaces whole statements of `old`; None when its statements would not read
    alone as they read in the module. `indent_known`: the statements before `text` have
    an indented block.
    """
    try:
        alone = cst.parse_module(text)
    except Exception:  # noqa: BLE001  (the full parse reports the error as it would without this module)
        return None
    if (alone.default_newline, alone.default_indent) != (old.default_newline, old.default_indent) or not alone.body:
        return None  # a line break or indent stored as "the default" would mean another one in `old`
    if not indent_known and not _has_block(alone.body):
        # LibCST takes the default indent from the first indented block: with none before or
        # in `text`, it comes from the statements after it, which an edit may have made first.
        return None
    if not to_end and (alone.footer or not alone.has_trailing_newline):
        return None  # lines after the last statement that the next statement's text does not hold
    # Alone, the lines before the first statement are a header; in the module they lead the statement.
    head = alone.body[0]
    statements = [head.with_changes(leading_lines=(*alone.header, *head.leading_lines)), *alone.body[1:]]
    codes = [old.code_for_node(statement) for statement in statements]
    footer = alone.footer if to_end else None
    # Written back with the module's line break and indent, the statements must give `text` exactly.
    if "".join(codes) + (_code(old, footer) if footer is not None else "") != text:
        return None
    return statements, footer, codes
