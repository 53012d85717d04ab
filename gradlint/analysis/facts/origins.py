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
from gradlint.analysis.syntax.names import dotted_name, names_in, prefixes
from gradlint.analysis.syntax.refs import all_params


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
        self._locals: dict[cst.FunctionDef, frozenset[str]] = {}
        self._compound: dict[Scope, list[cst.CSTNode]] | None = None

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
        if OUTSIDE in found and len(found) > 1 and key in self._plain_locals(scope):
            # A name the function assigns is local to it all through: on a path that bound it nowhere (an
            # `if`/`elif` without `else`), reading it raises, so no value from outside reaches.
            found = found - {OUTSIDE}
        if len(found) == 1:
            return tuple(found)
        order = self.collected.order
        return tuple(sorted(found, key=lambda definition: order.get(definition.node, -1)))

    def _plain_locals(self, scope: Scope) -> frozenset[str]:
        """The names a function binds only by assignments and loops, which the walk follows: local all through
        the function (not its parameters, nor names it declares `global` or `nonlocal`, nor ones it also binds
        in ways the walk does not follow: `with ... as`, `except ... as`, imports, nested `def` and `class`)."""
        if not isinstance(scope, cst.FunctionDef):
            return frozenset()
        if scope not in self._locals:
            assigned: set[str] = set()
            other: set[str] = set(all_params(scope))
            for statement in self.collected.statements_in_scope(scope):
                if isinstance(statement, cst.Assign):
                    assigned.update(name for target in statement.targets for name in _bound_names(target.target))
                elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)):
                    assigned.update(_bound_names(statement.target))
                elif isinstance(statement, (cst.Global, cst.Nonlocal)):
                    other.update(item.name.value for item in statement.names)
                elif isinstance(statement, (cst.Import, cst.ImportFrom)) and not isinstance(
                    statement.names, cst.ImportStar
                ):
                    other.update(_imported_name(alias) for alias in statement.names)
            for node in self._compounds().get(scope, ()):
                if isinstance(node, cst.For):
                    assigned.update(_bound_names(node.target))
                elif isinstance(node, cst.With):
                    other.update(name for item in node.items if item.asname for name in _bound_names(item.asname.name))
                elif isinstance(node, cst.Try):
                    other.update(
                        name for handler in node.handlers if handler.name for name in _bound_names(handler.name.name)
                    )
                elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    other.add(node.name.value)
            self._locals[scope] = frozenset(assigned - other)
        return self._locals[scope]

    def _compounds(self) -> dict[Scope, list[cst.CSTNode]]:
        """The compound statements of each scope that bind names (`for`, `with`, `try`, `def`, `class`)."""
        if self._compound is None:
            self._compound = {}
            for node, context in self.collected.contexts.items():
                if isinstance(node, (cst.For, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)):
                    self._compound.setdefault(context.scope, []).append(node)
        return self._compound

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
                for prefix in prefixes(name):
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


def _imported_name(alias: cst.ImportAlias) -> str:
    """The name an import binds: `np` for `import numpy as np`, `os` for `import os.path`."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return (dotted_name(alias.name) or "").split(".")[0]


def _bound_names(target: cst.BaseExpression) -> list[str]:
    """The plain names an assignment target binds (`a`, `a, (b, c)`; not `self.x` or `x[0]`)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _bound_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []
