"""Values that enter a backpropagated loss as constants but still carry a network's gradient.

Semi-gradient methods treat parts of a loss as fixed numbers: a bootstrapped TD target
(`r + gamma * q_next`), the advantage or importance weight that multiplies a
log-probability or a probability ratio, a teacher's or target network's outputs used as
the target of a criterion. Each backpropagated loss is walked back through assignments
and same-module helpers along the paths that keep a gradient (a `.detach()`, `.item()`,
a value computed under `no_grad` ends a path); on the way, such constant positions whose
value reaches a network call with a gradient are found. A network whose parameters are
frozen, or whose call runs without grad, gives no gradient.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.facts.leaves import Leaves
from gradlint.analysis.facts.lineage import (
    CUTTING_METHODS,
    REWRAPPING,
    STOPPING_BUILTINS,
    Backpropagated,
    Bindings,
    Lineage,
    Lineages,
    criterion_sides,
    is_data_name,
)
from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.facts.roles import Roles
from gradlint.analysis.facts.steps import EventIndex
from gradlint.analysis.facts.values import DETACHING_METHODS, graphless_call
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name

MAX_HELPER_DEPTH = 4
LOG_PROB_CALLS = frozenset({"log", "log_softmax", "log_prob", "logsigmoid", "log_sigmoid"})
LOG_PROB_NAME = re.compile(r"(?i)(\w*_)?(log_?probs?|log_?pis?|logps?|lprobs?|log_?likelihoods?|log_?p)(_\w+)?")
RATIO_NAME = re.compile(r"(?i)(\w+_)?(ratios?|is_ratios?|importance_weights?)(_\w+)?")
ADVANTAGE_NAME = re.compile(r"(?i)(\w+_)?(advs?|advantages?|deltas?|td_errors?|td_err)(_\w+)?")
# Reductions of a loss that leave it the loss (`loss.mean()`, `losses.sum(dim=0)`).
REDUCTIONS = frozenset({"mean", "sum", "squeeze", "reshape", "view"})
MAX_SUM_DEPTH = 12
DISCOUNT_NAME = re.compile(r"(?i)(\w+_)?(gamma|gammas|discount|discounts|discount_factor)(_\w+)?")
# The part of a network's name that says it is a teacher, an EMA copy or a target network.
TEACHER_NAME = re.compile(r"(?i)teacher|target|(^|_)(ema|momentum|tgt|targ|shadow)(_|\d|$)")
# Calls of a policy that return sampled actions or tokens (with their log-probabilities).
SAMPLING_METHODS = frozenset({"sample", "generate", "greedy", "greedy_decode", "beam_search", "sample_sequence"})
# Objects that hold data rather than run a network: replay buffers, rollout storage.
STORAGE_NAME = re.compile(r"(?i)(\w+_)?(rb|buffer|memory|replay|replay_buffer|storage|rollouts?|dataset|loader)\d*")
# Calls that keep a value's role: `log_probs.sum(1)` is still a log-probability.
# A rollout's per-step values stacked or concatenated (`torch.stack(log_probs)`, `torch.cat(values)`) are
# still what each of them is.
PASSING_METHODS = frozenset(
    {
        "sum", "mean", "squeeze", "unsqueeze", "view", "reshape", "gather", "flatten", "clamp", "clip", "expand_as",
        "stack", "cat", "concat", "concatenate", "hstack", "vstack",
    }
)  # fmt: skip


class Position(Enum):
    """The constant position of a loss a value was found in."""

    BOOTSTRAP = "a bootstrapped target"
    WEIGHT = "a weight of a log-probability or probability ratio"
    TEACHER = "the target of a criterion, from a teacher or target network"


@dataclass(frozen=True)
class UndetachedTarget:
    """A value in a constant position of a backpropagated loss, with the network calls it carries a gradient from."""

    node: cst.CSTNode
    position: Position
    sources: tuple[cst.Call, ...]


_Test = Callable[[cst.BaseExpression, cst.CSTNode, int], bool]
Visit = tuple[cst.CSTNode, cst.CSTNode, frozenset[tuple[str, Lineage]]]


class Targets:
    """Walks each backpropagated loss and finds the constants in it that carry a gradient."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        events: EventIndex,
        origins: Origins,
        lineage: Lineages,
        leaves: Leaves,
        callers: CallerGradMode,
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins
        self.lineage = lineage
        self.leaves = leaves
        self.callers = callers
        self._seen: set[Visit] = set()
        self._found: dict[cst.CSTNode, UndetachedTarget] = {}
        self._loss_sums: set[cst.CSTNode] = set()

    def undetached(self) -> list[UndetachedTarget]:
        """Every constant position of a backpropagated loss whose value carries a network's gradient."""
        for loss in self._losses():
            self._mark_sums(loss.value, loss.at, 0)
            self._walk(loss.value, loss.at, {}, 0)
        bootstrapped = {
            source for found in self._found.values() if found.position is Position.BOOTSTRAP for source in found.sources
        }
        # A target network's output already reported inside its bootstrap is not reported again at the criterion.
        return [
            found
            for found in self._found.values()
            if found.position is not Position.TEACHER or not set(found.sources) <= bootstrapped
        ]

    def _losses(self) -> Iterator[Backpropagated]:
        for backpropagated in self.lineage.backpropagated():
            yield Backpropagated(backpropagated.value, backpropagated.at)
        hooks = set(backpropagated_returns(self.collected))
        for function in self.collected.functions:
            if function in hooks or not self._computes_loss(function):
                continue
            for statement in self.collected.statements_in_scope(function):
                if isinstance(statement, cst.Return) and statement.value is not None:
                    yield Backpropagated(statement.value, statement)

    def _computes_loss(self, function: cst.FunctionDef) -> bool:
        # Ex) def compute_loss(...)  /  class DistillCriterion(nn.Module): def forward(...)
        if "loss" in function.name.value.lower():
            return True
        owner = self.collected.owners.get(function)
        return (
            function.name.value == "forward"
            and owner is not None
            and any(word in owner.name.value.lower() for word in ("loss", "criterion"))
        )

    def _walk(self, node: cst.BaseExpression, at: cst.CSTNode, bindings: Bindings, depth: int) -> None:
        visit = (node, at, frozenset(bindings.items()))
        if visit in self._seen:
            return
        self._seen.add(visit)
        if isinstance(node, (cst.Name, cst.Attribute)):
            self._walk_symbol(node, at, bindings, depth)
        elif isinstance(node, cst.Call):
            self._walk_call(node, at, bindings, depth)
        elif isinstance(node, cst.BinaryOperation):
            self._walk_operation(node, at, bindings, depth)
        elif isinstance(node, cst.UnaryOperation):
            self._walk(node.expression, at, bindings, depth)
        elif isinstance(node, cst.Subscript):
            self._walk(node.value, at, bindings, depth)
        elif isinstance(node, cst.IfExp):
            self._walk_all([node.body, node.orelse], at, bindings, depth)
        elif isinstance(node, (cst.Tuple, cst.List)):
            self._walk_all([element.value for element in node.elements], at, bindings, depth)

    def _walk_all(self, nodes: list[cst.BaseExpression], at: cst.CSTNode, bindings: Bindings, depth: int) -> None:
        for node in nodes:
            self._walk(node, at, bindings, depth)

    def _walk_symbol(self, node: cst.Name | cst.Attribute, at: cst.CSTNode, bindings: Bindings, depth: int) -> None:
        if isinstance(node, cst.Attribute) and node.attr.value == "data":
            return
        key = dotted_name(node)
        if key is None:
            if isinstance(node, cst.Attribute):
                self._walk(node.value, at, bindings, depth)
            return
        for definition in self.origins.definitions(key, at):
            if definition.binding is Binding.OUTSIDE or definition.binding is Binding.LOOP:
                continue
            context = self.collected.contexts.get(definition.node)
            if context is not None and context.no_grad:
                continue  # computed under no_grad: no gradient to carry
            self._walk(definition.value, definition.node, bindings, depth)
        for item, statement in self.lineage.appended(key, at):
            self._walk(item, statement, bindings, depth)  # Ex) terms.append(-log_prob * advantage)

    def _walk_call(self, call: cst.Call, at: cst.CSTNode, bindings: Bindings, depth: int) -> None:
        name = last_name(call.func) or ""
        if isinstance(call.func, cst.Attribute) and (name in CUTTING_METHODS or name in DETACHING_METHODS):
            return  # .detach(), .item(), .numpy(): no gradient goes further
        if isinstance(call.func, cst.Name) and name in STOPPING_BUILTINS:
            return
        qualified = self.roles.imports.resolve(call.func) or ""
        if qualified.startswith("torch.") and name in REWRAPPING:
            return
        arguments = [arg.value for arg in call.args]
        if self.lineage.is_criterion_call(call):
            self._check_criterion(call, at, bindings)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None and depth < MAX_HELPER_DEPTH:
            inner = self.lineage.call_bindings(call, helper, at, bindings)
            for statement in self.collected.statements_in_scope(helper):
                if isinstance(statement, cst.Return) and statement.value is not None:
                    self._walk(statement.value, statement, inner, depth + 1)
        elif isinstance(call.func, cst.Attribute):
            self._walk(call.func.value, at, bindings, depth)
        self._walk_all(arguments, at, bindings, depth)

    def _walk_operation(self, node: cst.BinaryOperation, at: cst.CSTNode, bindings: Bindings, depth: int) -> None:
        if isinstance(node.operator, cst.Multiply):
            factors = _factors(node)
            self._check_product(factors, at, bindings)
            self._walk_all(factors, at, bindings, depth)
            return
        if isinstance(node.operator, cst.Add):
            self._check_bootstrap(node, at, bindings)
        self._walk_all([node.left, node.right], at, bindings, depth)

    def _mark_sums(self, node: cst.BaseExpression, at: cst.CSTNode, depth: int) -> None:
        """Mark the sums that are the loss itself: reached from it through its terms (`+`, `-`), their scaling, a
        reduction (`.mean()`) or a name's assignment. A sum there is what is backpropagated, never a target
        (`recon + kld + gamma * tc` is no reward plus a discounted bootstrap): a bootstrapped expression is a
        target only where a prediction is regressed onto it (squared, in a criterion); one the loss holds
        linearly (a dual objective's `w * (c + gamma * nu(s') - nu(s))`) is the objective, differentiated
        through on purpose."""
        if depth > MAX_SUM_DEPTH or node in self._loss_sums:
            return
        linear = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, linear):
            self._loss_sums.add(node)
            for side in (node.left, node.right):
                self._mark_sums(side, at, depth + 1)
        elif isinstance(node, cst.UnaryOperation):
            self._mark_sums(node.expression, at, depth + 1)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._mark_sums(element.value, at, depth + 1)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in REDUCTIONS:
            self._mark_sums(node.func.value, at, depth + 1)
        elif isinstance(node, (cst.Name, cst.Attribute)) and (key := dotted_name(node)) is not None:
            for definition in self.origins.definitions(key, at):
                if definition.binding in (Binding.ASSIGN, Binding.AUGMENT):
                    self._mark_sums(definition.value, definition.node, depth + 1)

    def _check_bootstrap(self, node: cst.BinaryOperation, at: cst.CSTNode, bindings: Bindings) -> None:
        # Ex) target = rewards + self.gamma * target_net(next_states).max(1)[0] * (1 - dones)
        if node in self._loss_sums:
            return  # the loss itself, summed from its terms
        terms = _terms(node)
        discounted = [term for term in terms if any(self._is_discount(factor) for factor in _factors(term))]
        # A number beside it is an offset (`0.99 * mask + 0.005`, a smoothing), not a reward.
        rewards = [term for term in terms if term not in discounted and not _is_number(term)]
        if not discounted or not rewards:
            return
        if any(self.lineage.of(term, at, bindings).known_live for term in rewards):
            return  # Ex) loss + gamma * penalty: terms of a loss, not a reward and its bootstrap
        for term in discounted:
            sources = self._trained_sources(self.lineage.of(term, at, bindings))
            if sources:
                self._record(UndetachedTarget(node, Position.BOOTSTRAP, sources))
                return

    def _check_product(self, factors: list[cst.BaseExpression], at: cst.CSTNode, bindings: Bindings) -> None:
        # Ex) -(log_probs * (returns - values))  /  ratio * advantages  /  -coeff * pi * torch.log(pi) * (q - v)
        policy = [factor for factor in factors if self._is_log_prob(factor, at) or self._is_ratio(factor, at)]
        if not policy:
            return
        policy_sources: set[cst.Call] = set()
        for factor in policy:
            policy_sources.update(self._trained_sources(self.lineage.of(factor, at, bindings)))
        others = [factor for factor in factors if all(factor is not p for p in policy)]
        for factor in others:
            lineage = self.lineage.of(factor, at, bindings)
            # Ex) sampled, log_probs = captioner.sample(images): the sampled ids carry no gradient
            sources = tuple(s for s in self._trained_sources(lineage) if last_name(s.func) not in SAMPLING_METHODS)
            if not sources:
                continue
            # Ex) -(probs * log_probs).sum(): an entropy, whose probabilities are meant to train
            advantage = any(self._is_advantage(other, at) for other in others)
            if set(sources) <= policy_sources and not advantage:
                continue
            self._record(UndetachedTarget(factor, Position.WEIGHT, sources))

    def _check_criterion(self, call: cst.Call, at: cst.CSTNode, bindings: Bindings) -> None:
        # Ex) F.kl_div(F.log_softmax(student(x), -1), F.softmax(teacher(x), -1))
        for target in criterion_sides(call)[1]:
            sources = self._trained_sources(self.lineage.of(target, at, bindings))
            # A target side that also comes from a trained network is a prediction: F.mse_loss(target, pred)
            if sources and all(_is_teacher_call(source) for source in sources):
                self._record(UndetachedTarget(target, Position.TEACHER, sources))

    def _record(self, found: UndetachedTarget) -> None:
        if found.node not in self._found:
            self._found[found.node] = found

    def _trained_sources(self, lineage: Lineage) -> tuple[cst.Call, ...]:
        """The network calls a value carries a gradient from: run with grad, by a network that is not frozen."""
        if not lineage.known_live:
            return ()
        return tuple(
            source
            for source in lineage.sources
            if isinstance(source, cst.Call)
            and _is_forward(source)
            and not self._without_grad(source)
            and not self._frozen(source.func)
        )

    def _without_grad(self, call: cst.Call) -> bool:
        return call in self.collected.contexts and self.callers.without_grad(call)

    def _frozen(self, func: cst.BaseExpression) -> bool:
        if self.leaves.is_frozen(func):
            return True
        return (
            isinstance(func, cst.Attribute) and dotted_name(func.value) != "self" and self.leaves.is_frozen(func.value)
        )

    def _is_log_prob(self, factor: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
        core = _core(factor)
        if isinstance(core, cst.Call):
            # np.log(probs) is a number array, not a log-probability autograd tracks
            return last_name(core.func) in LOG_PROB_CALLS and not graphless_call(core.func, self.roles.imports)
        return self._named_or_defined(core, at, LOG_PROB_NAME, self._is_log_prob, depth)

    def _is_ratio(self, factor: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
        # Ex) ratio = torch.exp(log_prob - old_log_prob)  /  (new_logp - old_logp).exp()
        core = _core(factor)
        if isinstance(core, cst.Call):
            exponent = _exponent(core)
            return (
                isinstance(exponent, cst.BinaryOperation)
                and isinstance(exponent.operator, cst.Subtract)
                and any(self._is_log_prob(side, at, depth + 1) for side in (exponent.left, exponent.right))
            )  # not log_alpha.exp(): a Lagrange multiplier
        return self._named_or_defined(core, at, RATIO_NAME, self._is_ratio, depth)

    def _is_advantage(self, factor: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
        core = _core(factor)
        if isinstance(core, cst.BinaryOperation):
            # returns - values; not 1 - p, a complement (the binary entropy's `(1 - p) * (1 - p).log()`)
            return isinstance(core.operator, cst.Subtract) and not _is_number(core.left) and not _is_number(core.right)
        return self._named_or_defined(core, at, ADVANTAGE_NAME, self._is_advantage, depth)

    def _named_or_defined(
        self, node: cst.BaseExpression, at: cst.CSTNode, pattern: re.Pattern[str], test: _Test, depth: int
    ) -> bool:
        """A name the pattern matches, or one whose every assignment reaching `at` passes `test`."""
        key = dotted_name(node)
        if key is None:
            return False
        if pattern.fullmatch(key.rsplit(".", 1)[-1]):
            return True
        if depth >= MAX_HELPER_DEPTH:
            return False
        definitions = [d for d in self.origins.definitions(key, at) if d.binding is Binding.ASSIGN]
        return bool(definitions) and all(test(d.value, d.node, depth + 1) for d in definitions)

    def _is_discount(self, factor: cst.BaseExpression) -> bool:
        if isinstance(factor, cst.BinaryOperation) and isinstance(factor.operator, cst.Power):
            return self._is_discount(factor.left)  # gamma ** n_steps
        if isinstance(factor, cst.Float):
            return 0.9 <= float(factor.value) < 1.0
        name = last_name(factor) if isinstance(factor, (cst.Name, cst.Attribute)) else None
        return name is not None and DISCOUNT_NAME.fullmatch(name) is not None


def _is_number(node: cst.BaseExpression) -> bool:
    """A numeric literal, signed or not: `0.005`, `-1`, `1.0`."""
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


def _factors(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The factors of a product, through unary minus: `-a * b * (c - d)` has a, b and c - d."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return [*_factors(node.left), *_factors(node.right)]
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return _factors(node.expression)
    return [node]


def _terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return [*_terms(node.left), *_terms(node.right)]
    return [node]


def _core(node: cst.BaseExpression) -> cst.BaseExpression:
    """The value under reductions and reshapes: `log_probs` in `log_probs.sum(1).unsqueeze(-1)`."""
    while True:
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            node = node.expression
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in PASSING_METHODS
        ):
            # Ex) torch.clamp(ratio, 0.8, 1.2)  /  log_probs.sum(-1)
            torch_function = dotted_name(node.func.value) == "torch" and node.args
            node = node.args[0].value if torch_function else node.func.value
        else:
            return node


def _exponent(call: cst.Call) -> cst.BaseExpression | None:
    """`x` in `torch.exp(x)` or `x.exp()`."""
    if last_name(call.func) != "exp":
        return None
    if isinstance(call.func, cst.Attribute) and dotted_name(call.func.value) != "torch":
        return call.func.value
    return call.args[0].value if call.args else None


def _is_forward(call: cst.Call) -> bool:
    """A call that runs a network: not `model.get_targets(sample)`, nor `teacher_probs.detach()` on an output."""
    if not isinstance(call.func, cst.Attribute):
        return True
    method = call.func.attr.value
    if method in CUTTING_METHODS or method in DETACHING_METHODS:
        return False
    if STORAGE_NAME.fullmatch(last_name(call.func.value) or ""):
        return False  # teacher_rb.sample(batch_size): a batch from a replay buffer named after its network
    return not is_data_name(method.removeprefix("get_"))


def _is_teacher_call(call: cst.Call) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "forward":
        func = func.value
    key = dotted_name(func) or ""
    return any(TEACHER_NAME.search(part) for part in key.split(".") if part != "self")
