"""The terms a loss is summed from, and which of them were cut from the graph before the sum.

A loss such as `loss = ce + beta * kl.item()` is a sum of terms. Following the loss back
through `+`, `-`, `+=` and the assignments of the names it reads gives, per path through
the code (an `if` that adds a term on one branch only), the list of terms summed. A term
is cut when it has no path with a gradient (its lineage is not live) and the reason is an
operation that drops autograd history from a value that had some: `.detach()`, `.item()`,
`.data`, `.numpy()`, `.tolist()`, `float()`, or a copy by `torch.tensor(...)`, the last
also with `requires_grad=True`, which makes a new leaf instead of keeping the old graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import libcst as cst

from gradlint.analysis.facts.lineage import Lineage, Lineages, criterion_sides
from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in
from gradlint.analysis.syntax.tree import descendants

MAX_DEPTH = 8
MAX_ALTERNATIVES = 32
# Reductions linear in their operand: the mean (or sum) of a sum is the sum of the terms' means.
LINEAR_REDUCTIONS = frozenset({"mean", "sum"})
CUTTING_METHODS = frozenset({"detach", "item", "numpy", "tolist"})
CUTTING_BUILTINS = frozenset({"float", "int"})
# torch constructors that copy their argument's values into a new tensor without history.
REWRAPPING = frozenset({"tensor", "Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "Variable"})


@dataclass(frozen=True)
class Term:
    """One summand of a loss, read just before statement `at`."""

    value: cst.BaseExpression
    at: cst.CSTNode


@dataclass(frozen=True)
class CutTerm:
    """A summand cut from the graph by `operation`, summed with terms that keep a gradient."""

    term: Term
    operation: cst.CSTNode


class LossTerms:
    """Splits a loss into the terms it sums and finds those cut from the graph."""

    def __init__(self, collected: Collected, lineages: Lineages, origins: Origins) -> None:
        self.collected = collected
        self.lineages = lineages
        self.origins = origins

    def cut_terms(self, loss: cst.BaseExpression, at: cst.CSTNode, *, backpropagated: bool = True) -> list[CutTerm]:
        """The cut terms of `loss` (read just before `at`) that are summed with a term that keeps a gradient.

        For a loss only returned (`backpropagated=False`), a criterion call counts as a term
        that keeps a gradient even where its inputs are not traced (a list filled by `append`).
        """
        found: list[CutTerm] = []
        for terms in self.sums(loss, at):
            for term in terms:
                cut = self._cut(term)
                if cut is None or any(cut.operation == other.operation for other in found):
                    continue
                rest = [other for other in terms if other is not term]
                if self._kept_beside(cut, rest, backpropagated):
                    found.append(cut)
        return found

    def sums(self, value: cst.BaseExpression, at: cst.CSTNode) -> list[list[Term]]:
        """Each list of terms `value` may be the sum of, one list per path through the code."""
        return self._sums(value, at, frozenset(), 0)

    def _sums(
        self, value: cst.BaseExpression, at: cst.CSTNode, seen: frozenset[tuple[str, cst.CSTNode]], depth: int
    ) -> list[list[Term]]:
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
            left = self._sums(value.left, at, seen, depth + 1)
            right = self._sums(value.right, at, seen, depth + 1)
            return [a + b for a, b in product(left, right)][:MAX_ALTERNATIVES]
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
            scaled = self._scaled(value, at)
            if scaled is not None:
                return self._sums(scaled, at, seen, depth + 1)  # (ce + aux.item()) / accumulation_steps
        reduced = self._reduced(value)
        if reduced is not None and depth <= MAX_DEPTH:
            # Ex) (alpha * log_prob - q.detach()).mean(): a mean or sum of a sum is the sum of its terms' means
            return self._sums(reduced, at, seen, depth + 1)
        key = dotted_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        if key is None or depth > MAX_DEPTH or (key, at) in seen:
            return [[Term(value, at)]]
        definitions = self.origins.definitions(key, at)
        if not definitions or any(d.binding not in (Binding.ASSIGN, Binding.AUGMENT) for d in definitions):
            return [[Term(value, at)]]
        inner = seen | {(key, at)}
        alternatives: list[list[Term]] = []
        for definition in definitions:
            sums = self._sums(definition.value, definition.node, inner, depth + 1)
            if definition.binding is Binding.AUGMENT:
                if not _adds(definition.node):
                    return [[Term(value, at)]]  # loss *= w: the name is one term
                before = self._sums(value, definition.node, inner, depth + 1)
                sums = [a + b for a, b in product(before, sums)]
            alternatives.extend(sums)
        return alternatives[:MAX_ALTERNATIVES]

    def _reduced(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """The sum a linear reduction takes (`X` of `X.mean()`, `X.sum(1)`, `torch.mean(X)`), when it is one."""
        if not isinstance(value, cst.Call) or last_name(value.func) not in LINEAR_REDUCTIONS:
            return None
        operand: cst.BaseExpression | None = None
        if (self.collected.imports.resolve(value.func) or "").startswith("torch."):
            operand = value.args[0].value if value.args and value.args[0].keyword is None else None  # torch.mean(X)
        elif isinstance(value.func, cst.Attribute):
            operand = value.func.value  # X.mean(), a tensor's method
        return operand if operand is not None and _is_sum(operand) else None

    def returns_cut(self, function: cst.FunctionDef) -> bool:
        """Whether every `return` of `function` gives a value cut from the autograd history it had (`return
        out.detach()`, `return torch.tensor(losses)`, a return in `@torch.no_grad()` code of a value with history):
        a caller in another module that adds it to its loss adds a term that trains nothing."""
        returns = [
            statement
            for statement in self.collected.statements_in_scope(function)
            if isinstance(statement, cst.Return) and statement.value is not None
        ]
        if not returns or not (
            self.collected.contexts[returns[0]].no_grad
            or any(self._is_cutting(node) for node in self.collected.calls_in_scope(function))
            or any(isinstance(node, cst.Attribute) and self._is_cutting(node) for node in descendants(function))
        ):
            return False
        return all(self._cut_return(statement) for statement in returns)

    def _cut_return(self, statement: cst.Return) -> bool:
        value = statement.value
        if value is None:
            return False
        if self.collected.contexts[statement].no_grad:
            return self._had_history(value, statement)  # computed without history, whatever it reads
        return not self._live(value, statement) and self._blame(value, statement, frozenset(), 0) is not None

    def _scaled(self, product: cst.BinaryOperation, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The sum in `product` that a weight without history scales: `(a + b)` in `(a + b) / k` or `0.5 * (a + b)`."""
        sides = [product.right] if isinstance(product.operator, cst.Divide) else [product.left, product.right]
        for side in sides:
            other = product.left if side is product.right else product.right
            if not self._live(side, at) and _is_sum(other):
                return other
        return None

    def _cut(self, term: Term) -> CutTerm | None:
        operation = self._blame(term.value, term.at, frozenset(), 0)
        if operation is None:
            return None
        if _forced_leaf(operation) or not self._live(term.value, term.at):
            return CutTerm(term, operation)
        return None

    def _live(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether a term keeps a gradient; in a product, a weight read from an object (`cfg.beta`) does not."""
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
            return self._factor_live(value.left, at) or self._factor_live(value.right, at)
        return self.lineages.of(value, at).live

    def _factor_live(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        # A weight read from a name, an object or a sequence bound outside the scope (`beta`, `cfg.beta`,
        # `betas[0]`) is a setting unless known to carry history; a value computed here is judged as computed.
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)):
            return self._factor_live(value.left, at) or self._factor_live(value.right, at)
        symbol = value.value if isinstance(value, cst.Subscript) else value
        key = dotted_name(symbol) if isinstance(symbol, (cst.Name, cst.Attribute)) else None
        computed = key is not None and any(
            definition.binding is not Binding.OUTSIDE for definition in self.origins.definitions(key, at)
        )
        if key is not None and not _is_data(symbol) and not computed:
            return self.lineages.of(value, at).known_live  # bound elsewhere: a setting, unless known otherwise
        return self.lineages.of(value, at).live

    def _criterion(self, term: Term, backpropagated: bool) -> bool:
        value = term.value
        if backpropagated or not isinstance(value, cst.Call) or not self.lineages.is_criterion_call(value):
            return False
        return not self.lineages.of(value, term.at).cuts

    def _kept_beside(self, cut: CutTerm, rest: list[Term], backpropagated: bool) -> bool:
        """Whether a term of `rest` keeps a gradient, and the cut is no stop-gradient on purpose."""
        live = [term for term in rest if self._live(term.value, term.at) or self._criterion(term, backpropagated)]
        if not live:
            return False  # no gradient anywhere: GL006's loss, not a partly cut one
        # Ex) y + (y_hard - y).detach(): the detached part shares `y` with a kept term
        source = _source_of(cut.operation)
        shared = set(names_in(source)) if source is not None else set()
        same = self._same_values(source, cut.term.at) if source is not None else []
        if any(part.deep_equals(value) for value in same for term in live for part in _factors(term.value)):
            return False  # Ex) aux.mean() - aux.mean().detach(): the same value, once kept and once cut
        return not any(shared & _exposed(term.value) for term in live)

    def _same_values(self, value: cst.BaseExpression, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """`value`, and what it was assigned from where a name holds exactly one value."""
        key = dotted_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        definitions = list(self.origins.definitions(key, at)) if key is not None else []
        if len(definitions) == 1 and definitions[0].binding is Binding.ASSIGN:
            return [value, definitions[0].value]
        return [value]

    def _blame(
        self, node: cst.BaseExpression, at: cst.CSTNode, seen: frozenset[tuple[str, cst.CSTNode]], depth: int
    ) -> cst.CSTNode | None:
        """The innermost operation in `node` that drops history from a value that had some."""
        if depth > MAX_DEPTH:
            return None
        source = _source_of(node) if isinstance(node, (cst.Call, cst.Attribute)) else None
        if source is not None and self._is_cutting(node):
            inner = self._blame(source, at, seen, depth + 1)
            if inner is not None and not _forced_leaf(node):
                return inner
            return node if inner is not None or self._had_history(source, at) else None
        if isinstance(node, (cst.Name, cst.Attribute)) and (key := dotted_name(node)) is not None:
            return self._blame_definitions(key, at, seen, depth)
        helper = self._helper(node)
        if helper is not None:
            return self._blame_returns(helper, seen, depth)
        if isinstance(node, cst.Call) and self.lineages.cut_elsewhere(node):
            return node  # Ex) loss = recon + reg(model), where `reg` of another module returns `penalty.item()`
        operands = _operands(node)
        if isinstance(node, cst.Call) and self.lineages.is_criterion_call(node):
            # A criterion's target side holds no term of the loss: a teacher's output under no_grad is fine.
            operands = criterion_sides(node)[0]
        for child in operands:
            found = self._blame(child, at, seen, depth + 1)
            if found is not None:
                return found
        return None

    def _blame_definitions(
        self, key: str, at: cst.CSTNode, seen: frozenset[tuple[str, cst.CSTNode]], depth: int
    ) -> cst.CSTNode | None:
        if (key, at) in seen:
            return None
        for definition in self.origins.definitions(key, at):
            if definition.binding in (Binding.ASSIGN, Binding.AUGMENT, Binding.UNPACK):
                context = self.collected.contexts.get(definition.node)
                if context is not None and context.no_grad and self._had_history(definition.value, definition.node):
                    return definition.node  # Ex) with torch.no_grad(): aux = head(features): computed without history
                found = self._blame(definition.value, definition.node, seen | {(key, at)}, depth + 1)
                if found is not None:
                    return found
        return None

    def _helper(self, node: cst.BaseExpression) -> cst.FunctionDef | None:
        if not isinstance(node, cst.Call) or node not in self.collected.contexts:
            return None
        return self.lineages.events.resolve_helper(node)

    def _blame_returns(
        self, helper: cst.FunctionDef, seen: frozenset[tuple[str, cst.CSTNode]], depth: int
    ) -> cst.CSTNode | None:
        # Ex) loss = recon + adversarial_term(disc, fake), where the helper returns `disc(fake).mean().item()`
        for statement in self.collected.statements_in_scope(helper):
            if isinstance(statement, cst.Return) and statement.value is not None:
                found = self._blame(statement.value, statement, seen, depth + 1)
                if found is not None:
                    return found
        return None

    def _is_cutting(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Attribute):
            return node.attr.value == "data"
        if not isinstance(node, cst.Call):
            return False
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in CUTTING_METHODS:
            return True
        if isinstance(func, cst.Name) and func.value in CUTTING_BUILTINS:
            return func.value not in self.collected.imports.aliases
        qualified = self.collected.imports.resolve(func) or ""
        return qualified.startswith("torch.") and last_name(func) in REWRAPPING

    def _had_history(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `value` carried autograd history: known to, or may and is named as a loss."""
        lineage: Lineage = self.lineages.of(value, at)
        if lineage.grad and not lineage.live and not lineage.cuts:
            return False  # made a number where it was kept (`norms.append(x.norm().item())`): nothing left to cut
        if lineage.grad or lineage.known_live:
            return True
        if "loss" not in " ".join(names_in(value)).lower():
            return False
        return lineage.live or self._is_container(value, at)

    def _is_container(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A list of losses the lineage does not trace into, unless all its items are numbers (`.item()`)."""
        # Ex) aux_losses = [] ... aux_losses.append(aux_head(h)): torch.tensor(aux_losses) copies them
        key = dotted_name(value)
        definitions = self.origins.definitions(key, at) if key is not None else frozenset()
        if not definitions or not all(_is_list(d.value) for d in definitions):
            return False
        items = [(d.value.elt, d.node) for d in definitions if isinstance(d.value, cst.ListComp)]
        items += self.lineages.appended(key or "", at)
        return any(self._may_carry(item, statement) for item, statement in items)

    def _may_carry(self, item: cst.BaseExpression, at: cst.CSTNode) -> bool:
        lineage = self.lineages.of(item, at)
        if lineage.live:
            return True
        # Not traced (another module's call, an unpacked result): may carry history, unless a number
        if lineage.grad or isinstance(item, (cst.BaseNumber, cst.BaseString)) or self._is_cutting(item):
            return False
        return self._blame(item, at, frozenset(), 0) is None

    def returned_rewraps(self, value: cst.Tuple, at: cst.CSTNode) -> list[CutTerm]:
        """Losses a function returns copied by `torch.tensor(...)` beside an output that keeps a gradient."""
        # Ex) return logits, torch.mean(torch.tensor(aux_losses)): the caller adds a loss without history
        elements = [element.value for element in value.elements]
        found = []
        for element in elements:
            cut = self._cut(Term(element, at))
            if (
                cut is None
                or not isinstance(cut.operation, cst.Call)
                or last_name(cut.operation.func) not in REWRAPPING
            ):
                continue
            rest = [Term(other, at) for other in elements if other is not element]
            if self._kept_beside(cut, rest, backpropagated=True):
                found.append(cut)
        return found


def _source_of(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The value an operation copies or detaches: `x` in `x.detach()`, `x.data`, `float(x)`, `torch.tensor(x)`."""
    if isinstance(node, cst.Attribute):
        return node.value
    if not isinstance(node, cst.Call):
        return None
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in CUTTING_METHODS:
        return node.func.value
    return node.args[0].value if node.args and node.args[0].keyword is None else None


def _forced_leaf(node: cst.CSTNode) -> bool:
    """`torch.tensor(x, requires_grad=True)`: a new leaf that trains nothing upstream."""
    return isinstance(node, cst.Call) and any(
        arg.keyword is not None and arg.keyword.value == "requires_grad" and last_name(arg.value) == "True"
        for arg in node.args
    )


def _operands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The sub-expressions a value is computed from, for finding a cut inside it."""
    if isinstance(node, cst.BinaryOperation):
        return [node.left, node.right]
    if isinstance(node, cst.UnaryOperation):
        return [node.expression]
    if isinstance(node, cst.Subscript):
        return [node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [element.value for element in node.elements]
    if isinstance(node, cst.Call):
        receiver = [node.func.value] if isinstance(node.func, cst.Attribute) else []
        return receiver + [arg.value for arg in node.args]
    return []


def _exposed(term: cst.BaseExpression) -> set[str]:
    """The names a term is, up to sign and scaling: `y` in `y`, `-y` or `2 * y`, not in `f(y)`."""
    if isinstance(term, cst.UnaryOperation):
        return _exposed(term.expression)
    if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Multiply, cst.Divide)):
        return _exposed(term.left) | _exposed(term.right)
    key = dotted_name(term) if isinstance(term, (cst.Name, cst.Attribute)) else None
    return {key} if key is not None else set()


def _factors(term: cst.BaseExpression) -> list[cst.BaseExpression]:
    """A term and what it is up to sign and scaling: `f(y)` in `-f(y)` or `2 * f(y)`."""
    if isinstance(term, cst.UnaryOperation):
        return [term, *_factors(term.expression)]
    if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Multiply, cst.Divide)):
        return [term, *_factors(term.left), *_factors(term.right)]
    return [term]


def _is_data(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == "data"


def _is_list(value: cst.BaseExpression) -> bool:
    """A list display or comprehension, or a tuple of them unpacked (`states, losses = [], []`)."""
    if isinstance(value, cst.Tuple):
        return bool(value.elements) and all(_is_list(element.value) for element in value.elements)
    return isinstance(value, (cst.List, cst.ListComp))


def _is_sum(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract))


def _adds(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.AugAssign) and isinstance(statement.operator, (cst.AddAssign, cst.SubtractAssign))
