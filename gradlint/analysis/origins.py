"""Where a name's value was computed: the assignments that may reach a point of the program.

A forward walk over each scope records, before every statement, which definitions of
each name or attribute may still hold (reaching definitions): branches merge, loops are
walked twice so a value carried round the loop reaches its top. Names bound outside the
scope (parameters, globals read in a function) have no definition: unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from gradlint.analysis.collect import Collected, Scope
from gradlint.analysis.names import dotted_name
from gradlint.analysis.values import names_in


class Binding(Enum):
    """How a definition binds its name."""

    ASSIGN = "assign"  # x = value: the name holds exactly `value`
    UNPACK = "unpack"  # a, b = value: the name holds a part of `value`
    AUGMENT = "augment"  # x += value: the old value combined with `value`
    LOOP = "loop"  # for x in value: one item of `value`
    OUTSIDE = "outside"  # bound before the scope (a parameter, a global) or on a path not seen


@dataclass(frozen=True)
class Definition:
    """One statement that binds a name, and the expression it binds it from."""

    node: cst.CSTNode
    value: cst.BaseExpression
    binding: Binding


Reaching = Mapping[str, frozenset[Definition]]

# Stands for every value a name may have from outside the walked scope.
OUTSIDE = Definition(cst.Name("__outside__"), cst.Name("__outside__"), Binding.OUTSIDE)


class Origins:
    """Answers which definitions of a name may reach a statement."""

    def __init__(self, collected: Collected) -> None:
        self.collected = collected
        self._before: dict[cst.CSTNode, Reaching] = {}
        self._walked: set[Scope] = set()

    def definitions(self, key: str, at: cst.CSTNode) -> frozenset[Definition]:
        """The definitions of `key` (`loss`, `self.h`) that may hold just before statement `at`."""
        context = self.collected.contexts.get(at)
        scope = context.scope if context is not None else self.collected.module
        if scope not in self._walked:
            self._walked.add(scope)
            _Walker(self._before).walk_scope(scope)
        return self._before.get(at, {}).get(key, frozenset({OUTSIDE}))

    def reads(self, expression: cst.BaseExpression, key: str, at: cst.CSTNode) -> bool:
        """Whether `expression`, evaluated just before `at`, may be computed from the value of `key`."""
        seen: set[tuple[str, cst.CSTNode]] = set()
        pending: list[tuple[cst.BaseExpression, cst.CSTNode]] = [(expression, at)]
        while pending:
            current, where = pending.pop()
            for name in names_in(current):
                if name == key or name.startswith(key + ".") or key.startswith(name + "."):
                    return True
                # `out.sum` reads `out`: each prefix may have been assigned.
                parts = name.split(".")
                for prefix in (".".join(parts[: index + 1]) for index in range(len(parts))):
                    if (prefix, where) not in seen:
                        seen.add((prefix, where))
                        pending.extend((d.value, d.node) for d in self.definitions(prefix, where) if d is not OUTSIDE)
        return False

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The function or module a statement belongs to."""
        context = self.collected.contexts.get(node)
        return context.scope if context is not None else self.collected.module


class _Walker:
    """One forward pass over a scope, recording the reaching definitions before each statement."""

    def __init__(self, before: dict[cst.CSTNode, Reaching]) -> None:
        self.before = before
        self.env: dict[str, frozenset[Definition]] = {}

    def walk_scope(self, scope: Scope) -> None:
        if isinstance(scope, cst.Module):
            self._walk(scope.body)
        else:
            self._block(scope.body)

    def _walk(self, statements: Sequence[cst.CSTNode]) -> None:
        for statement in statements:
            self._statement(statement)

    def _block(self, node: cst.BaseSuite | None) -> None:
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            self._walk(node.body)

    def _statement(self, statement: cst.CSTNode) -> None:
        # A later visit (the second loop pass) merges with the first.
        previous = self.before.get(statement)
        self.before[statement] = self.env if previous is None else _merge(previous, self.env)
        if isinstance(statement, cst.SimpleStatementLine):
            self._walk(statement.body)
        elif isinstance(statement, cst.BaseSmallStatement):
            self._apply(statement)
        elif isinstance(statement, cst.If):
            self._walk_if(statement)
        elif isinstance(statement, (cst.For, cst.While)):
            self._walk_loop(statement)
        elif isinstance(statement, cst.With):
            self._block(statement.body)
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            self._walk_try(statement)

    def _walk_if(self, statement: cst.If) -> None:
        before = self.env
        self._block(statement.body)
        after_body, self.env = self.env, before
        if isinstance(statement.orelse, cst.If):
            self._statement(statement.orelse)
        elif statement.orelse is not None:
            self._block(statement.orelse.body)
        self.env = _merge(after_body, self.env)

    def _walk_loop(self, statement: cst.For | cst.While) -> None:
        before = self.env
        for _ in range(2):  # the second pass sees what the first carried round the loop
            if isinstance(statement, cst.For):
                self._bind(statement.target, Definition(statement, statement.iter, Binding.LOOP))
            self._block(statement.body)
            self.env = _merge(before, self.env)
        if statement.orelse is not None:
            self._block(statement.orelse.body)

    def _walk_try(self, statement: cst.Try | cst.TryStar) -> None:
        before = self.env
        self._block(statement.body)
        for handler in statement.handlers:
            self.env = _merge(before, self.env)
            self._block(handler.body)
        if statement.orelse is not None:
            self._block(statement.orelse.body)
        if statement.finalbody is not None:
            self._block(statement.finalbody.body)

    def _apply(self, statement: cst.BaseSmallStatement) -> None:
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                self._bind(target.target, Definition(statement, statement.value, Binding.ASSIGN))
        elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
            self._bind(statement.target, Definition(statement, statement.value, Binding.ASSIGN))
        elif isinstance(statement, cst.AugAssign):
            self._bind(statement.target, Definition(statement, statement.value, Binding.AUGMENT))

    def _bind(self, target: cst.BaseExpression, definition: Definition) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            unpacked = Definition(definition.node, definition.value, Binding.UNPACK)
            for element in target.elements:
                self._bind(element.value, unpacked if definition.binding is Binding.ASSIGN else definition)
            return
        key = dotted_name(target)
        if key is None:
            return
        # Rebinding `x` also forgets what was known about `x.attr`.
        prefix = key + "."
        self.env = {name: defs for name, defs in self.env.items() if not name.startswith(prefix)}
        self.env[key] = frozenset({definition})


def _merge(first: Reaching, second: Reaching) -> dict[str, frozenset[Definition]]:
    # A name bound on one path only may still hold its value from outside on the other.
    outside = frozenset({OUTSIDE})
    return {key: first.get(key, outside) | second.get(key, outside) for key in {*first, *second}}
