"""Build a rule's Fix from LibCST node replacements, so fixes keep comments and formatting."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar, cast

import libcst as cst

from gradlint.analysis.names import ImportMap
from gradlint.rule import Edit, Fix

# What a node is replaced with: a node, several statements (FlattenSentinel), or nothing.
Replacement = cst.CSTNode | cst.FlattenSentinel[cst.CSTNode] | cst.RemovalSentinel
_Node = TypeVar("_Node", bound=cst.CSTNode)

# Line breaks as LibCST counts lines; edits address lines by this count.
LINE_BREAK = re.compile(r"\r\n|\r|\n")


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: Mapping[cst.CSTNode, Replacement]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(
        self, original_node: _Node, updated_node: _Node
    ) -> _Node | cst.FlattenSentinel[_Node] | cst.RemovalSentinel:
        if original_node not in self.replacements:
            return updated_node
        # The caller pairs each node with a replacement that fits where the node stands.
        return cast("_Node | cst.FlattenSentinel[_Node] | cst.RemovalSentinel", self.replacements[original_node])


def replacement_fix(
    module: cst.Module,
    replacements: Mapping[cst.CSTNode, Replacement],
    description: str,
    safe: bool = True,
) -> Fix:
    """A Fix that turns `module` into `module` with each key node replaced by its value.

    LibCST regenerates the whole module, so the new nodes are rendered in place, with the
    indentation and line endings of their surroundings; the edit is the span that changed.
    """
    before = module.code
    after = module.visit(_Replace(replacements)).code
    return Fix(description, (_difference(before, after),), safe)


def method_call(receiver: cst.BaseExpression, method: str) -> cst.Call:
    """`receiver.method()`, parenthesizing `receiver` when it is not an atom (`(a + b).item()`)."""
    atomic = isinstance(receiver, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or receiver.lpar
    if not atomic:
        receiver = receiver.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(method)))


def line_of(module: cst.Module, statement: cst.BaseSmallStatement) -> cst.SimpleStatementLine | None:
    """The line holding `statement`; None when it sits in a one-line suite (`if x: y`)."""
    finder = _LineFinder(statement)
    module.visit(finder)
    return finder.line


class _LineFinder(cst.CSTVisitor):
    def __init__(self, statement: cst.BaseSmallStatement) -> None:
        super().__init__()
        self.statement = statement
        self.line: cst.SimpleStatementLine | None = None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        if self.statement in node.body:
            self.line = node
        return False  # statements never nest inside a simple line


def wrap_in_with(
    statement: cst.SimpleStatementLine | cst.BaseCompoundStatement, context: cst.BaseExpression
) -> cst.With:
    """`with context:` around `statement`; comments above it stay above the `with`."""
    return cst.With(
        items=[cst.WithItem(context)],
        body=cst.IndentedBlock([statement.with_changes(leading_lines=())]),
        leading_lines=statement.leading_lines,
    )


def insert_before(line: cst.SimpleStatementLine, statement: cst.BaseSmallStatement) -> Replacement:
    """`statement` on a line of its own, then `line` (with the comments above it) unchanged."""
    return cst.FlattenSentinel([cst.SimpleStatementLine([statement]), line])


def without_keyword(call: cst.Call, keyword: str) -> cst.Call:
    """`call` without its `keyword=...` argument, commas and any trailing comma kept tidy."""
    index = next(i for i, arg in enumerate(call.args) if arg.keyword is not None and arg.keyword.value == keyword)
    args = [*call.args[:index], *call.args[index + 1 :]]
    if args and index == len(args):  # the last argument went: its comma style passes to the new last one
        args[-1] = args[-1].with_changes(comma=call.args[index].comma)
    return call.with_changes(args=args)


def reference(imports: ImportMap, dotted: str) -> cst.BaseExpression | None:
    """An expression naming `dotted` (`torch.no_grad`) through this module's imports, if any."""
    for local, full in sorted(imports.aliases.items()):
        if dotted == full or dotted.startswith(full + "."):
            return cst.parse_expression(local + dotted[len(full) :])
    return None


def _difference(before: str, after: str) -> Edit:
    start = 0
    limit = min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    end_before, end_after = len(before), len(after)
    while end_before > start and end_after > start and before[end_before - 1] == after[end_after - 1]:
        end_before -= 1
        end_after -= 1
    line, column = _position(before, start)
    end_line, end_column = _position(before, end_before)
    return Edit(line, column, end_line, end_column, after[start:end_after])


def _position(text: str, offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of `offset`, counting CRLF, CR and LF as LibCST does."""
    line, line_start = 1, 0
    for match in LINE_BREAK.finditer(text, 0, offset):
        line, line_start = line + 1, match.end()
    return line, offset - line_start + 1
