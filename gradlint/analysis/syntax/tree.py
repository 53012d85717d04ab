"""A read-only walk over LibCST nodes, in the order LibCST visits them, without rebuilding any.

LibCST's visitor protocol and its `children` property both go through each node's
`_visit_and_replace_children`, which constructs (and validates) a new node for every node
it walks: on real code that cost about twice the parse. Nothing gradlint walks is ever
replaced, so it reads the fields directly. Which fields of a node type hold children, and
in which order, is read once per type from that same `_visit_and_replace_children` (the
`visit_*(self, "field", ...)` calls it makes, in source order), so the walk follows LibCST's
order exactly, for every node type of the installed version; where its source cannot be
read, the dataclass's field order stands in.

Operators, brackets, whitespace and comments ("trivia", half of all nodes) hold nothing
the analyses look for: `children` and `descendants` leave them out.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Sequence
from functools import cache

import libcst as cst

# Operators, brackets and whitespace: nodes that hold nothing but whitespace and comments.
TRIVIA: tuple[type[cst.CSTNode], ...] = (
    *(kind for kind in vars(cst).values() if isinstance(kind, type) and kind.__module__ == "libcst._nodes.op"),
    *(cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket),
    *(cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Asynchronous),
    *(cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine),
    *(cst.Newline, cst.Comment),
)
TRIVIA_NAMES = frozenset(kind.__name__ for kind in TRIVIA)


def is_trivia(kind: type) -> bool:
    """Whether nodes of `kind` hold only whitespace and comments."""
    known = _TRIVIA_KINDS.get(kind)
    if known is None:
        known = _TRIVIA_KINDS[kind] = issubclass(kind, TRIVIA)
    return known


def is_node(kind: type) -> bool:
    """Whether values of type `kind` are nodes (cheaper than isinstance against CSTNode, an abstract class)."""
    known = _NODE_KINDS.get(kind)
    if known is None:
        known = _NODE_KINDS[kind] = issubclass(kind, cst.CSTNode)
    return known


# Per-type answers: these run on every field of every node walked.
_NODE_KINDS: dict[type, bool] = {}
_TRIVIA_KINDS: dict[type, bool] = {}


@cache
def child_fields(kind: type[cst.CSTNode]) -> tuple[str, ...]:
    """The fields of `kind` that LibCST visits, in the order it visits them."""
    try:
        source = textwrap.dedent(inspect.getsource(kind._visit_and_replace_children))
    except (OSError, TypeError):  # no source installed: the declaration order, nearly always the same
        return tuple(field.name for field in dataclasses.fields(kind))
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.startswith("visit_")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.append((node.lineno, node.col_offset, node.args[1].value))
    return tuple(dict.fromkeys(name for _, _, name in sorted(found)))


def field_children(node: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    """The nodes held by field `name` of `node`, trivia included, in order."""
    value = getattr(node, name)
    kind = type(value)
    if kind is tuple or kind is list:
        return [item for item in value if is_node(type(item))]
    return [value] if is_node(kind) else []


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The children of `node` that are not trivia, in LibCST's order (like `.children`, without rebuilding)."""
    found: list[cst.CSTNode] = []
    for name in child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            found.extend(item for item in value if is_node(type(item)) and not is_trivia(type(item)))
        elif is_node(kind) and not is_trivia(kind):
            found.append(value)
    return found


def descendants(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and every node below it that is not trivia, in pre-order."""
    found: list[cst.CSTNode] = []
    pending = [node]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(reversed(children(current)))
    return found


def block_holding(
    root: cst.CSTNode, statement: cst.CSTNode, *, into_loops: bool = True
) -> Sequence[cst.BaseStatement] | None:
    """The statement list (a block's body) under `root` one of whose lines holds `statement` directly: not in a
    function or class defined there, nor, without `into_loops`, in a loop nested in `root`."""
    skipped = (cst.FunctionDef, cst.ClassDef) if into_loops else (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)
    for block in blocks(root):
        if any(isinstance(line, cst.SimpleStatementLine) and statement in line.body for line in block):
            return block
        for line in block:
            if not isinstance(line, (cst.SimpleStatementLine, *skipped)):
                found = block_holding(line, statement, into_loops=into_loops)
                if found is not None:
                    return found
    return None


def blocks(node: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """The statement lists directly under a module or compound statement (bodies, else, except, finally)."""
    if isinstance(node, cst.Module):
        return [node.body]
    parts = [getattr(node, name, None) for name in ("body", "orelse", "finalbody")]
    parts += list(getattr(node, "handlers", ()))
    found = []
    for part in parts:
        if isinstance(part, cst.IndentedBlock):
            found.append(part.body)
        elif isinstance(part, (cst.Else, cst.Finally, cst.ExceptHandler, cst.If)):
            found.extend(blocks(part))
    return found
