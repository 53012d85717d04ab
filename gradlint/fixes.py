"""Build a rule's Fix from LibCST nodes, as edits of the source that keep its formatting.

A fix is an edit at the position of a node the rule found: the node's source replaced by
the code LibCST renders for a new node, or lines inserted and indented around a
statement. Only the changed span is touched, so comments, quotes and blank lines stay as
they were, and building a fix costs the size of the node, not of the module.
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Sequence

import libcst as cst

from gradlint.analysis import ModuleAnalysis
from gradlint.analysis.syntax.names import ImportMap
from gradlint.decoding import LINE_BREAK
from gradlint.rule import Edit, Fix


def replace_node(
    analysis: ModuleAnalysis, old: cst.CSTNode, new: cst.CSTNode, description: str, safe: bool = True
) -> Fix:
    """A Fix that turns the source of `old` into the code of `new` (an expression, a call).

    The edit covers only the span where the two differ. `new` may drop lines of `old` but
    should not add any, as they would lack the indentation of the block around them.
    """
    module = analysis.module
    before, after = module.code_for_node(old), module.code_for_node(new)
    start, end_before, end_after = _changed_span(before, after)
    first, last = _source_position(analysis, old, before, start), _source_position(analysis, old, before, end_before)
    return Fix(description, (Edit(*first, *last, after[start:end_after]),), safe)


def _changed_span(before: str, after: str) -> tuple[int, int, int]:
    """Where `before` and `after` differ: a common start, and the end in each."""
    start, limit = 0, min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    end_before, end_after = len(before), len(after)
    while end_before > start and end_after > start and before[end_before - 1] == after[end_after - 1]:
        end_before, end_after = end_before - 1, end_after - 1
    return start, end_before, end_after


def _source_position(analysis: ModuleAnalysis, node: cst.CSTNode, rendered: str, offset: int) -> tuple[int, int]:
    """The 1-based source position of `offset` in `rendered`, the code LibCST renders for `node` alone.

    Rendered alone, the continuation lines of a node lack the indentation of the block it
    sits in, and are otherwise its source lines. An offset at the start of such a line
    maps to the start of the source line, so that removing whole lines removes their
    indentation too.
    """
    where = analysis.positions[node]
    lines = LINE_BREAK.split(rendered[:offset])
    index, column = len(lines) - 1, len(lines[-1])
    if index == 0:
        return where.start.line, where.start.column + column + 1
    if column == 0:
        return where.start.line + index, 1
    source, alone = analysis.lines[where.start.line - 1 + index], LINE_BREAK.split(rendered)[index]
    missing = (len(source) - len(source.lstrip())) - (len(alone) - len(alone.lstrip()))
    return where.start.line + index, column + missing + 1


def insert_before(
    analysis: ModuleAnalysis, statement: cst.CSTNode, new: cst.BaseSmallStatement, description: str, safe: bool = True
) -> Fix | None:
    """A Fix adding `new` on a line of its own just above `statement`; None if it shares its line."""
    where = analysis.positions[statement]
    indent = _indentation(analysis, statement)
    if indent is None:
        return None
    text = f"{analysis.module.code_for_node(new)}{analysis.module.default_newline}{indent}"
    line, column = where.start.line, where.start.column + 1
    return Fix(description, (Edit(line, column, line, column, text),), safe)


def wrap_in_with(
    analysis: ModuleAnalysis,
    statement: cst.CSTNode,
    context: cst.BaseExpression,
    description: str,
    safe: bool = True,
    body: Sequence[cst.BaseSmallStatement] = (),
    last: cst.CSTNode | None = None,
) -> Fix | None:
    """A Fix running `statement` (through `last`, a later statement of its block) under `with context:`.

    `body`, one line each, replaces the statement if given. None when the statement shares a line with
    others, or `body` would replace more than one line. Every line moves one indentation
    level in, except the continuation lines of multi-line strings, whose text must not change.
    """
    where, end_where = analysis.positions[statement], analysis.positions[last if last is not None else statement]
    indent = _indentation(analysis, statement)
    module = analysis.module
    if indent is None or (body and where.start.line != where.end.line):
        return None
    header = f"with {module.code_for_node(context)}:{module.default_newline}{indent}{module.default_indent}"
    start, end = (where.start.line, where.start.column + 1), (where.end.line, where.end.column + 1)
    if body:
        lines = f"{module.default_newline}{indent}{module.default_indent}".join(map(module.code_for_node, body))
        return Fix(description, (Edit(*start, *end, header + lines),), safe)
    shifted = _code_lines(analysis.lines[where.start.line - 1 : end_where.end.line], where.start.line)
    if shifted is None:
        return None
    below = [line for line in shifted if line != where.start.line]
    edits = [Edit(*start, *start, header), *(Edit(line, 1, line, 1, module.default_indent) for line in below)]
    return Fix(description, tuple(edits), safe)


def remove_statement(
    analysis: ModuleAnalysis, statement: cst.CSTNode, description: str, safe: bool = True
) -> Fix | None:
    """A Fix deleting the lines of `statement`; None if it shares them, or is alone in its block."""
    where = analysis.positions[statement]
    if _indentation(analysis, statement) is None:
        return None
    lines = analysis.lines
    if where.end.line >= len(lines):
        return None  # the last line, without a line break to remove with it
    remaining = "\n".join(lines[: where.start.line - 1] + lines[where.end.line :])
    try:
        cst.parse_module(remaining)  # Ex) the only statement of an `if` body: nothing may be left
    except cst.ParserSyntaxError:
        return None
    return Fix(description, (Edit(where.start.line, 1, where.end.line + 1, 1, ""),), safe)


def _indentation(analysis: ModuleAnalysis, statement: cst.CSTNode) -> str | None:
    """The whitespace before `statement` on its first line, None if it shares a line with others."""
    where = analysis.positions[statement]
    first, last = analysis.lines[where.start.line - 1], analysis.lines[where.end.line - 1]
    before, after = first[: where.start.column], last[where.end.column :].strip()
    if before.strip() or (after and not after.startswith("#")):
        return None  # Ex) `if ready: p -= lr * p.grad` or `p -= g; q -= h`
    return before


def _code_lines(lines: list[str], first: int) -> list[int] | None:
    """The numbers of `lines` (the first numbered `first`) that hold code, not string continuations."""
    inside: set[int] = set()
    source = "\n".join(lines) + "\n"
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            inside.update(range(token.start[0] + 1, token.end[0] + 1))  # rows a multi-line token continues on
    except (tokenize.TokenError, SyntaxError):
        return None
    return [first + index for index, text in enumerate(lines) if text.strip() and index + 1 not in inside]


def method_call(receiver: cst.BaseExpression, method: str) -> cst.Call:
    """`receiver.method()`, parenthesizing `receiver` when it is not an atom (`(a + b).item()`)."""
    atomic = isinstance(receiver, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or receiver.lpar
    if not atomic:
        receiver = receiver.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(method)))


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
