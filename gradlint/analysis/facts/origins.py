"""Where a name's value was computed: the assignments that may reach a point of the program.

A forward walk over each scope records, before every statement, which definitions of
each name or attribute may still hold (reaching definitions): branches merge, loops are
walked twice so a value carried round the loop reaches its top. Names bound outside the
scope (parameters, globals read in a function) have no definition: unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.flow import ForwardWalk
from gradlint.analysis.syntax.names import dotted_name, names_in


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

    def definitions(self, key: str, at: cst.CSTNode) -> tuple[Definition, ...]:
        """The definitions of `key` (`loss`, `self.h`) that may hold just before statement `at`, in source order
        (OUTSIDE first): whoever takes the first that answers gets the same one on every run."""
        context = self.collected.contexts.get(at)
        scope = context.scope if context is not None else self.collected.module
        if scope not in self._walked:
            self._walked.add(scope)
            _Walker(self._before).walk_scope(scope)
        found = self._before.get(at, {}).get(key)
        if found is None:
            return (OUTSIDE,)
        if len(found) == 1:
            return tuple(found)
        order = self.collected.order
        return tuple(sorted(found, key=lambda definition: order.get(definition.node, -1)))

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


class _Walker(ForwardWalk[frozenset[Definition]]):
    """One forward pass over a scope, recording the reaching definitions before each statement."""

    def __init__(self, before: dict[cst.CSTNode, Reaching]) -> None:
        super().__init__()
        self.before = before

    def record(self, statement: cst.CSTNode) -> None:
        # A later visit (the second loop pass) merges with the first.
        previous = self.before.get(statement)
        self.before[statement] = self.env if previous is None else self.merge(previous, self.env)

    def enter_iteration(self, loop: cst.For | cst.While) -> None:
        if isinstance(loop, cst.For):
            self._bind(loop.target, Definition(loop, loop.iter, Binding.LOOP))

    def merge(self, first: Reaching, second: Reaching) -> dict[str, frozenset[Definition]]:
        # A name bound on one path only may still hold its value from outside on the other.
        outside = frozenset({OUTSIDE})
        return {key: first.get(key, outside) | second.get(key, outside) for key in {*first, *second}}

    def apply(self, statement: cst.BaseSmallStatement) -> None:
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
        kept = {name: defs for name, defs in self.env.items() if not name.startswith(prefix)}
        self.env = {**kept, key: frozenset({definition})}
