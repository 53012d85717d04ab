"""Whether two gradient events can both run in one pass through their training step.

Two events cannot both run when they sit in different branches of one `if` (the body
and the `else`/`elif` chain), in branches of two `if` statements that test one condition
the opposite way (`if fp16:` ... `else:`, then `if fp16:` again, or `if not fp16:`), or
when the first sits in a branch that ends by leaving the step (`return`, `raise`, or
`continue`/`break` of the loop both events share).

A condition that several `if` statements of a function test, and that nothing in the
function can change (`args["fp16"]`, `self.use_amp`, a parameter), is *fixed*: it has one
value for the whole call, every iteration of its loops included (`fixed_tests`).
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.steps import Event
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, names_in
from gradlint.analysis.syntax.tree import descendants

# Marks an arm named by the test of its `if` (an object's own state: `if self.is_mixed():`) rather than its place.
STATE_TEST = "self:"
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
        if _same_receiver(first.site, second.site) and _other_arms(first, second, STATE_TEST):
            return True  # Ex) amp.backward(loss) scales `if self.activated:`; amp.step(opt) clips in its `else`
        # A `return` in a helper leaves only the helper: both events must come from one body.
        same_body = first.site is second.site or (first.site is first.node and second.site is second.node)
        return same_body and any(
            self._leaves_before(statement, first, second)
            for statement in first.ifs
            if statement not in second.ifs and isinstance(statement, cst.If)
        )

    def _opposite_tests(self, first: Event, second: Event) -> bool:
        # Ex) if use_amp: scaler.step(opt)  ...  if not use_amp: opt.step()
        # Ex) if use_amp: ... else: opt.step()  ...  if use_amp: scaler.step(opt)
        for one in (node for node in first.ifs if isinstance(node, cst.If) and node not in second.ifs):
            for other in (node for node in second.ifs if isinstance(node, cst.If) and node not in first.ifs):
                taken = self.branch_of(one, first.node) is one.body
                other_taken = self.branch_of(other, second.node) is other.body
                if truth_of(other.test, one.test, taken) is (not other_taken):
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


def truth_of(test: cst.BaseExpression, known: cst.BaseExpression, value: bool) -> bool | None:
    """The value of `test` where the condition `known` has `value`: the same for the same test, the opposite for
    its negation; None when they are unrelated."""
    if test.deep_equals(known):
        return value
    return (not value) if negates(test, known) else None


def fixed_tests(collected: Collected, scope: Scope) -> list[cst.BaseExpression]:
    """The conditions that more than one `if` of `scope` tests (the same way or negated) and that nothing in the
    scope changes once the first of them is tested: built of names, attributes, constant subscripts, `not` and
    comparisons, with no call (`args["fp16"]`, `self.use_amp`, `scaler is not None`), and bound, if at all, only
    before the first test and outside the loops around the tests (`args = self.args` at the top; an assignment
    to another key, `args["warmup_steps"] = ...`, changes nothing). Each has one value for a whole call of
    `scope`, every iteration of its loops included; one representative per condition, in source order."""
    nodes = descendants(scope)
    ifs = [
        (index, node)
        for index, node in enumerate(nodes)
        if isinstance(node, cst.If) and (context := collected.contexts.get(node)) is not None and context.scope is scope
    ]
    fixed: list[cst.BaseExpression] = []
    for position, (index, branch) in enumerate(ifs):
        test = branch.test
        if not _pure(test) or any(truth_of(test, known, True) is not None for known in fixed):
            continue
        tested = [branch, *(later for _, later in ifs[position + 1 :] if truth_of(later.test, test, True) is not None)]
        if len(tested) < 2:
            continue
        loops = {loop for node in tested for loop in collected.contexts[node].loops}
        reads = _read_keys(test)
        if not any(
            _overlaps(key, reads) and (where > index or loops & set(collected.contexts[statement].loops))
            for where, statement, key in _bindings(collected, nodes)
        ):
            fixed.append(test)
    return fixed


def _bindings(collected: Collected, nodes: list[cst.CSTNode]) -> list[tuple[int, cst.CSTNode, str]]:
    """(place in `nodes`, statement, key) for every name, attribute or constant entry (`args["lr"]`) bound among
    `nodes`: assignment and loop targets, `with ... as`, `del`, `:=`."""
    found: list[tuple[int, cst.CSTNode, str]] = []
    for index, node in enumerate(nodes):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.Del, cst.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, cst.AsName) and isinstance(node.name, cst.BaseExpression):
            targets = [node.name]
        if targets and node in collected.contexts:
            found.extend((index, node, key) for target in targets for key in _bound_keys(target))
    return found


def _bound_keys(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [key for element in target.elements for key in _bound_keys(element.value)]
    key = _entry(target) or dotted_name(target)
    return [key] if key is not None else list(names_in(target))


def _read_keys(test: cst.BaseExpression) -> set[str]:
    """The names, attributes and constant entries a test reads."""
    return set(names_in(test)) | {key for node in descendants(test) if (key := _entry(node)) is not None}


def _entry(node: cst.CSTNode) -> str | None:
    """`args["fp16"]` for a subscript by one constant key of a named container, else None."""
    if not (isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)):
        return None
    index = node.slice[0].slice.value
    base = dotted_name(node.value)
    return f"{base}[{index.value}]" if base is not None and isinstance(index, (cst.SimpleString, cst.Integer)) else None


def _overlaps(key: str, reads: set[str]) -> bool:
    """Whether binding `key` changes what reading `reads` gives: the same name, or one holding the other."""
    if "[" in key:
        return key in reads
    return any(name == key or name.startswith(key + ".") or key.startswith(name + ".") for name in reads)


def _pure(test: cst.BaseExpression) -> bool:
    """Whether evaluating `test` twice gives the same value unless a name it reads is rebound: no call."""
    return not any(isinstance(node, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr)) for node in descendants(test))


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


def _other_arms(first: Event, second: Event, prefix: str = "") -> bool:
    """Whether two events one call runs in another module sit in different branches of one `if` there (with
    `prefix`, only the arms named so count: tests of the object's own state, which its methods agree on)."""
    arms = dict(arm.rpartition("=")[::2] for arm in first.arms if arm.startswith(prefix))
    return any(
        arms.get(branch, taken) != taken
        for branch, _, taken in (arm.rpartition("=") for arm in second.arms if arm.startswith(prefix))
    )


def is_state_test(test: cst.BaseExpression) -> bool:
    """Whether `test` reads only its object's own state: `self.flag`, `self.cfg.amp`, `self.is_mixed()` (no
    arguments), negated or not. A configuration an object is built with, which its methods test alike."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_state_test(test.expression)
    if isinstance(test, cst.Call) and not test.args:
        test = test.func
    key = dotted_name(test) if isinstance(test, cst.Attribute) else None
    return key is not None and key.startswith("self.")


def _same_receiver(first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """Whether two calls are methods of one named object (`amp.backward(loss)`, `amp.step(opt)`)."""
    receivers = [
        dotted_name(node.func.value) if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) else None
        for node in (first, second)
    ]
    return receivers[0] is not None and receivers[0] == receivers[1]


def only_in_eval_mode(collected: Collected, node: cst.CSTNode) -> bool:
    """Whether `node` runs only while its module is in eval mode: under `if not self.training:` (also as one side
    of an `and`), or in the `else` of `if self.training:`. `nn.Module.train()`/`eval()` set `self.training`."""
    context = collected.contexts.get(node)
    return context is not None and any(
        _training_when(branch.test, collected.in_body(branch, node)) is False
        for branch in context.ifs
        if isinstance(branch, cst.If)
    )


def _training_when(test: cst.BaseExpression, holds: bool) -> bool | None:
    """What `self.training` is whenever `test` is `holds` (None: not decided by it)."""
    if isinstance(test, cst.Attribute) and dotted_name(test) == "self.training":
        return holds
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _training_when(test.expression, not holds)
    if isinstance(test, cst.BooleanOperation) and holds == isinstance(test.operator, cst.And):
        # Both sides of a true `and`, or of a false `or`, hold as the whole does.
        left, right = _training_when(test.left, holds), _training_when(test.right, holds)
        return left if left is not None else right
    return None
