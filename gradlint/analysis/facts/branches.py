"""Whether two gradient events can both run in one pass through their training step.

Two events cannot both run when they sit in different branches of one `if` (the body
and the `else`/`elif` chain), or when the first sits in a branch that ends by leaving
the step (`return`, `raise`, or `continue`/`break` of the loop both events share).
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.steps import Event
from gradlint.analysis.syntax.tree import descendants

EXITS = (cst.Return, cst.Raise)
LOOP_EXITS = (cst.Continue, cst.Break)


class Branches:
    """Answers questions about the branches of `if` statements, caching each branch's nodes."""

    def __init__(self) -> None:
        self._nodes: dict[cst.CSTNode, frozenset[int]] = {}

    def _in(self, branch: cst.CSTNode, node: cst.CSTNode) -> bool:
        if branch not in self._nodes:
            self._nodes[branch] = frozenset(id(child) for child in descendants(branch))
        return id(node) in self._nodes[branch]

    def branch_of(self, statement: cst.If, node: cst.CSTNode) -> cst.CSTNode | None:
        """The body or `else` part of `statement` holding `node`, or None if neither does."""
        for branch in (statement.body, statement.orelse):
            if branch is not None and self._in(branch, node):
                return branch
        return None

    def exclusive(self, first: Event, second: Event) -> bool:
        """True when `first` and `second` cannot both run in one pass (`first` comes first)."""
        shared = [node for node in first.ifs if node in second.ifs and isinstance(node, cst.If)]
        for statement in shared:
            one, other = self.branch_of(statement, first.node), self.branch_of(statement, second.node)
            if one is not None and other is not None and one is not other:
                return True
        if self._opposite_tests(first, second) or (first.site is second.site and _other_arms(first, second)):
            return True
        # A `return` in a helper leaves only the helper: both events must come from one body.
        same_body = first.site is second.site or (first.site is first.node and second.site is second.node)
        return same_body and any(
            self._leaves_before(statement, first, second)
            for statement in first.ifs
            if statement not in second.ifs and isinstance(statement, cst.If)
        )

    def _opposite_tests(self, first: Event, second: Event) -> bool:
        # Ex) if use_amp: scaler.step(opt)  ...  if not use_amp: opt.step()
        for one in (node for node in first.ifs if isinstance(node, cst.If) and node not in second.ifs):
            for other in (node for node in second.ifs if isinstance(node, cst.If) and node not in first.ifs):
                if (
                    self.branch_of(one, first.node) is one.body
                    and self.branch_of(other, second.node) is other.body
                    and negates(one.test, other.test)
                ):
                    return True
        return False

    def _leaves_before(self, statement: cst.If, first: Event, second: Event) -> bool:
        # Ex) if scaler is not None: scaler.step(opt); continue  ...  opt.step()
        branch = self.branch_of(statement, first.node)
        if not isinstance(branch, cst.IndentedBlock) or not branch.body:
            return False
        last = branch.body[-1]
        if not isinstance(last, cst.SimpleStatementLine) or not last.body:
            return False
        exit_statement = last.body[-1]
        if isinstance(exit_statement, EXITS):
            return True
        return isinstance(exit_statement, LOOP_EXITS) and first.loops == second.loops


def negates(first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    """True for `x` / `not x` and `x is None` / `x is not None` (either way round)."""
    for test, other in ((first, second), (second, first)):
        if (
            isinstance(test, cst.UnaryOperation)
            and isinstance(test.operator, cst.Not)
            and test.expression.deep_equals(other)
        ):
            return True
    if not (isinstance(first, cst.Comparison) and isinstance(second, cst.Comparison)):
        return False
    if not (len(first.comparisons) == len(second.comparisons) == 1 and first.left.deep_equals(second.left)):
        return False
    operators = {type(first.comparisons[0].operator), type(second.comparisons[0].operator)}
    same_side = first.comparisons[0].comparator.deep_equals(second.comparisons[0].comparator)
    return same_side and operators in ({cst.Is, cst.IsNot}, {cst.Equal, cst.NotEqual})


def _other_arms(first: Event, second: Event) -> bool:
    """Whether two events one call runs in another module sit in different branches of one `if` there."""
    arms = dict(arm.rpartition("=")[::2] for arm in first.arms)
    return any(arms.get(branch, taken) != taken for branch, _, taken in (arm.rpartition("=") for arm in second.arms))
