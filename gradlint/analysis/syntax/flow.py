"""The forward walk over a scope's statements that flow analyses share.

Branches are walked from the same state and merged; loops are walked twice, so what
one iteration leaves behind reaches the top of the next; `except` handlers start from
what held before the `try` or after it. Subclasses say what a simple statement does to
the state, how two states merge, and what to record before each statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

import libcst as cst

from gradlint.analysis.syntax.collect import Scope

Fact = TypeVar("Fact")


class ForwardWalk(Generic[Fact]):
    """Walks a scope once in program order, keeping one fact per name in `self.env`."""

    def __init__(self) -> None:
        self.env: Mapping[str, Fact] = {}

    def apply(self, statement: cst.BaseSmallStatement) -> None:
        """Update `self.env` for one simple statement."""
        raise NotImplementedError

    def merge(self, first: Mapping[str, Fact], second: Mapping[str, Fact]) -> Mapping[str, Fact]:
        """The state where two paths meet."""
        raise NotImplementedError

    def record(self, statement: cst.CSTNode) -> None:
        """Hook: called with the state that holds just before each statement."""

    def enter_iteration(self, loop: cst.For | cst.While) -> None:
        """Hook: called at the top of each walk of a loop body (binds a for-loop's target)."""

    def enter_branch(self, test: cst.BaseExpression, outcome: bool) -> None:
        """Hook: called on entering the branch of an `if` that runs when `test` has `outcome`."""

    def leave_loop(self, loop: cst.For | cst.While) -> None:
        """Hook: called once a loop's body has been walked, before its `else`."""

    def walk_scope(self, scope: Scope) -> None:
        """Walk a module's or function's body."""
        if isinstance(scope, cst.Module):
            self.walk_block(scope.body)
        else:
            self._suite(scope.body)

    def walk_block(self, statements: Sequence[cst.CSTNode]) -> None:
        """Walk statements in order."""
        for statement in statements:
            self.walk_statement(statement)

    def _suite(self, node: cst.BaseSuite | None) -> None:
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            self.walk_block(node.body)

    def walk_statement(self, statement: cst.CSTNode) -> None:
        """Walk one statement, simple or compound (nested defs and classes are not run)."""
        self.record(statement)
        if isinstance(statement, cst.SimpleStatementLine):
            self.walk_block(statement.body)
        elif isinstance(statement, cst.BaseSmallStatement):
            self.apply(statement)
        elif isinstance(statement, cst.If):
            self._walk_if(statement)
        elif isinstance(statement, (cst.For, cst.While)):
            self._walk_loop(statement)
        elif isinstance(statement, cst.With):
            self._suite(statement.body)
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            self._walk_try(statement)

    def _walk_if(self, statement: cst.If) -> None:
        before = self.env
        self.enter_branch(statement.test, True)
        self._suite(statement.body)
        after_body, self.env = self.env, before
        self.enter_branch(statement.test, False)
        if isinstance(statement.orelse, cst.If):
            self.walk_statement(statement.orelse)
        elif statement.orelse is not None:
            self._suite(statement.orelse.body)
        self.env = self.merge(after_body, self.env)

    def _walk_loop(self, statement: cst.For | cst.While) -> None:
        before = self.env
        for _ in range(2):  # the second pass sees what the first carried round the loop
            self.enter_iteration(statement)
            self._suite(statement.body)
            self.env = self.merge(before, self.env)
        self.leave_loop(statement)
        if statement.orelse is not None:
            self._suite(statement.orelse.body)

    def _walk_try(self, statement: cst.Try | cst.TryStar) -> None:
        before = self.env
        self._suite(statement.body)
        for handler in statement.handlers:
            self.env = self.merge(before, self.env)
            self._suite(handler.body)
        if statement.orelse is not None:
            self._suite(statement.orelse.body)
        if statement.finalbody is not None:
            self._suite(statement.finalbody.body)
