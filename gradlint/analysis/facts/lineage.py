"""How a value depends on the tensors with autograd history it was computed from.

Tracing an expression back through assignments (reaching definitions), arithmetic,
criterion calls and same-module helpers tells whether some path reaches a value that
carries, or may carry, history without passing an operation that has no gradient
(`argmax`, `round`, a comparison, `.detach()`, re-wrapping with `torch.tensor`), and
which such operations cut the other paths. A criterion's target side counts as a
path only when it is known to carry history: labels have none.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.facts.leaves import Leaves
from gradlint.analysis.facts.origins import Binding, Definition, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import EventIndex, Kind
from gradlint.analysis.facts.values import (
    DETACHING_METHODS,
    NON_GRAD_ATTRIBUTES,
    NON_GRAD_TORCH,
    values_and_indices_source,
)
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, forward_receiver, last_name, unpacked_index
from gradlint.analysis.syntax.refs import arguments_of

MAX_DEPTH = 6
# Operations with no gradient, reported when they are applied to a value with history.
CUTTING_FUNCTIONS = frozenset(
    {"argmax", "argmin", "round", "floor", "ceil", "sign", "trunc", "eq", "ne", "lt", "gt", "le", "ge"}
)
CUTTING_METHODS = CUTTING_FUNCTIONS | {"detach", "numpy"}
# torch functions that copy their argument into a new tensor without history.
REWRAPPING = frozenset({"tensor", "as_tensor", "from_numpy", "Tensor", "FloatTensor", "DoubleTensor", "HalfTensor"})
# Calls whose result has no history, like `.item()`, without being the operation to blame.
STOPPING_BUILTINS = frozenset({"float", "int", "bool", "len", "str", "repr", "isinstance", "range"})
# Methods whose argument gives only a dtype, device or shape: `mask.type_as(out)`.
LIKE_METHODS = frozenset({"type_as", "view_as", "reshape_as", "expand_as", "to"})
# Tensor methods no module defines: `teacher_out.softmax(-1)` is a tensor named like a model.
TENSOR_METHODS = frozenset(
    {"softmax", "log_softmax", "sigmoid", "tanh", "exp", "log", "sum", "mean", "view", "reshape", "squeeze",
     "unsqueeze", "gather", "clamp", "transpose", "permute", "contiguous", "flatten", "pow", "abs", "norm"}
)  # fmt: skip
FUNCTIONAL_LOSSES = re.compile(
    r".*_loss|cross_entropy|binary_cross_entropy(_with_logits)?|kl_div|nll_loss|ctc_loss|poisson_nll_loss"
)
TARGET_KEYWORDS = frozenset({"target", "targets", "label", "labels", "y", "y_true"})
# Names that hold batches of data or labels, which never carry history (`true_mask`, `batch_x`).
# ...unless the name says it was produced (`fake_images`, `pred_y`, `recon_x`).
PRODUCED_NAME = re.compile(r"(?i)(pred|fake|gen|recon|rec|out|output|logit|est|sampled?|hat)\w*")
DATA_NAME = re.compile(
    r"(?i)(\w+_)?(loader|dataloader|dl|dataset|ds|data|batch|batches|samples?|labels?|targets?|y|gt|masks?"
    r"|images?|imgs?|inputs?|x|rewards?|returns|dones|actions?)(_(ids?|true|gt|np|\d+))?\d*"
)


@dataclass(frozen=True)
class Lineage:
    """What an expression's value was computed from, as far as gradients go.

    `live`: some path with a gradient reaches a value that carries, or may carry,
    history. `known_live`: such a path reaches one known to carry it (a model output).
    `grad`: a known one is reached by any path. `cuts`: the outermost operations
    without a gradient applied to values with history on the way. `sources`: the
    network calls (`model(x)`, `self.critic.v(s)`) whose output reaches the value
    along a path with a gradient.
    """

    live: bool
    known_live: bool
    grad: bool
    cuts: tuple[cst.CSTNode, ...] = ()
    sources: tuple[cst.CSTNode, ...] = ()

    def __or__(self, other: Lineage) -> Lineage:
        cuts = self.cuts + tuple(cut for cut in other.cuts if cut not in self.cuts)
        sources = self.sources + tuple(source for source in other.sources if source not in self.sources)
        known_live = self.known_live or other.known_live
        return Lineage(self.live or other.live, known_live, self.grad or other.grad, cuts, sources)

    def cut_by(self, operation: cst.CSTNode) -> Lineage:
        """The lineage after `operation`, which has no gradient and is to blame."""
        return Lineage(False, False, self.grad, (operation,) if self.grad else ())

    def stopped(self) -> Lineage:
        """The lineage after `.item()` or `float()`: no gradient, but not the operation to blame."""
        return Lineage(False, False, self.grad, self.cuts)

    def as_target(self) -> Lineage:
        """The lineage of a criterion's target side, where only known history counts and no cut is to blame."""
        return Lineage(self.known_live, self.known_live, self.grad, (), self.sources)


NONE = Lineage(False, False, False)
UNKNOWN = Lineage(True, False, False)
SOURCE = Lineage(True, True, True)
# What a function of another module returns after cutting the history it had.
CUT_ELSEWHERE = Lineage(False, False, True)


def network_output(call: cst.Call) -> Lineage:
    """The lineage of a network call's output: a source of history, named by the call."""
    return Lineage(True, True, True, (), (call,))


Bindings = Mapping[str, Lineage]


@dataclass(frozen=True)
class Backpropagated:
    """A value autograd backpropagates, taken just before statement `at`."""

    value: cst.BaseExpression
    at: cst.CSTNode


# Criteria symmetric in their two sides: either may be the one trained.
DISTANCES = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"})
DISTANCE_CLASSES = frozenset({"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"})


def _stops_gradient(operation: cst.CSTNode) -> bool:
    """`x.detach()` or `x.data`: a stop-gradient written on purpose."""
    if isinstance(operation, cst.Attribute):
        return operation.attr.value == "data"
    return (
        isinstance(operation, cst.Call)
        and isinstance(operation.func, cst.Attribute)
        and operation.func.attr.value in ("detach", "detach_")
    )


def criterion_sides(call: cst.Call) -> tuple[list[cst.BaseExpression], list[cst.BaseExpression]]:
    """The prediction-side and target-side arguments of a criterion call.

    `crit(out, y)` and `crit(input=out, target=y)` have one of each; with more than two
    positional arguments (`triplet_margin_loss(a, p, n)`) all of them are predictions.
    """
    positional = [arg.value for arg in call.args if arg.keyword is None]
    keyword = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    targets = [value for name, value in keyword.items() if name in TARGET_KEYWORDS]
    predictions = [value for name, value in keyword.items() if name in ("input", "inputs", "logits", "pred", "preds")]
    if len(positional) == 2:
        return [*predictions, positional[0]], [*targets, positional[1]]
    return [*predictions, *positional], targets


class Lineages:
    """Answers what a value was computed from, through a scope's assignments and its helpers."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        events: EventIndex,
        origins: Origins,
        callers: CallerGradMode,
        leaves: Leaves,
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins
        self.callers = callers
        self.leaves = leaves
        self._cache: dict[tuple[cst.CSTNode, cst.CSTNode], Lineage] = {}
        self._in_progress: set[tuple[str, cst.CSTNode]] = set()
        self._cut_short = False
        self._appended: dict[cst.CSTNode, dict[str, list[tuple[cst.BaseExpression, cst.CSTNode]]]] = {}

    def of(self, expression: cst.BaseExpression, at: cst.CSTNode, bindings: Bindings | None = None) -> Lineage:
        """The lineage of `expression` evaluated just before statement `at`.

        `bindings` give the lineages of names bound outside the scope: a helper's parameters at one call.
        """
        return self._trace(expression, at, bindings or {}, 0)

    def backpropagated(self) -> list[Backpropagated]:
        """Every value backpropagated in the module.

        The loss of each `backward()` written here, outside no_grad, and what a Lightning
        `training_step` returns (`loss` or `{"loss": loss}`), which Lightning
        backpropagates itself unless the module turned automatic optimization off.
        """
        scopes: list[cst.Module | cst.FunctionDef] = [self.collected.module, *self.collected.functions]
        found = [
            Backpropagated(event.value, self.collected.statement_of[event.node])
            for scope in scopes
            for event in self.events.scope_events(scope)
            if event.kind is Kind.BACKWARD
            and event.direct  # written here, not in a helper
            and event.value is not None
            and not event.no_grad
            and isinstance(event.node, cst.Call)
        ]
        # What a framework backpropagates after a hook returns (Lightning's training_step, a Trainer's compute_loss).
        return found + self._returned_by(backpropagated_returns(self.collected))

    def _returned_by(self, functions: list[cst.FunctionDef]) -> list[Backpropagated]:
        found = []
        for function in functions:
            for statement in self.collected.statements_in_scope(function):
                if isinstance(statement, cst.Return) and statement.value is not None:
                    value = _loss_entry(statement.value)
                    if value is not None:
                        found.append(Backpropagated(value, statement))
        return found

    def cut_elsewhere(self, call: cst.Call) -> bool:
        """Whether `call` runs a project function of another module whose every `return` gives a value cut from
        the history it had (its summary's `returns_cut`)."""
        program = self.events.program
        context = self.collected.contexts.get(call)
        if program is None or context is None:
            return False
        return program.returns_cut(call, context, self.events)

    def is_criterion_call(self, call: cst.Call) -> bool:
        """A loss function call: a criterion object (`nn.CrossEntropyLoss()`) or `F.mse_loss`."""
        qualified = self.roles.imports.resolve(call.func) or ""
        if qualified.startswith("torch.nn.functional.") or qualified.startswith("F."):
            return FUNCTIONAL_LOSSES.fullmatch(qualified.rsplit(".", 1)[-1]) is not None
        return self.roles.role(call.func) is Role.LOSS_FN

    def _trace(self, node: cst.BaseExpression, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        if depth > MAX_DEPTH:
            return UNKNOWN
        if not bindings and (node, at) in self._cache:
            return self._cache[(node, at)]
        outer, self._cut_short = self._cut_short, False
        result = self._trace_node(node, at, bindings, depth)
        if not bindings and not self._cut_short:
            self._cache[(node, at)] = result  # a result that met a cycle is partial: not kept
        self._cut_short = outer or self._cut_short
        return result

    def _trace_node(self, node: cst.BaseExpression, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        if isinstance(node, (cst.Name, cst.Attribute)):
            return self._trace_symbol(node, at, bindings, depth)
        if isinstance(node, cst.Call):
            return self._trace_call(node, at, bindings, depth)
        if isinstance(node, cst.Subscript):
            return self._trace_subscript(node, at, bindings, depth)
        if isinstance(node, cst.Comparison):
            operands = [node.left, *(target.comparator for target in node.comparisons)]
            return self._union(operands, at, bindings, depth).cut_by(node)
        if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
            return self._union([node.left, node.right], at, bindings, depth)
        if isinstance(node, cst.UnaryOperation):
            return NONE if isinstance(node.operator, cst.Not) else self._trace(node.expression, at, bindings, depth)
        if isinstance(node, cst.IfExp):
            return self._union([node.body, node.orelse], at, bindings, depth)
        if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
            return self._union([element.value for element in node.elements], at, bindings, depth)
        if isinstance(node, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self._trace_comprehension(node, at, bindings, depth)
        if isinstance(node, (cst.BaseNumber, cst.BaseString, cst.Dict, cst.DictComp)):
            return NONE
        return UNKNOWN

    def _union(self, nodes: list[cst.BaseExpression], at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        result = NONE
        for node in nodes:
            result = result | self._trace(node, at, bindings, depth)
        return result

    def _trace_comprehension(
        self, node: cst.ListComp | cst.GeneratorExp | cst.SetComp, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage:
        # Ex) torch.stack([criterion(o, y) for o in outputs]): each item comes from the iterable
        inner = dict(bindings)
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            item = self._trace(clause.iter, at, inner, depth + 1)
            for name in _target_names(clause.target):
                inner[name] = item
            clause = clause.inner_for_in
        return self._trace(node.elt, at, inner, depth + 1)

    def _trace_symbol(self, node: cst.Name | cst.Attribute, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        if isinstance(node, cst.Name) and node.value in ("None", "True", "False"):
            return NONE
        if isinstance(node, cst.Attribute) and node.attr.value == "data":
            return self._trace(node.value, at, bindings, depth).cut_by(node)
        reduced = values_and_indices_source(node.value) if isinstance(node, cst.Attribute) else None
        if reduced is not None and isinstance(node, cst.Attribute) and node.attr.value == "indices":
            return self._trace(reduced, at, bindings, depth).cut_by(node)  # out.max(dim=1).indices
        if isinstance(node, cst.Attribute) and node.attr.value in NON_GRAD_ATTRIBUTES:
            return NONE
        key = dotted_name(node)
        if key is None:
            return self._trace(node.value, at, bindings, depth) if isinstance(node, cst.Attribute) else UNKNOWN
        if self.leaves.switched_on(key, at):
            return SOURCE  # Ex) copy = x.detach().clone(); copy.requires_grad_(True): a new leaf gradients reach
        if (key, at) in self._in_progress:
            self._cut_short = True
            return NONE  # a value carried round a loop: its other definitions decide
        self._in_progress.add((key, at))
        try:
            result = NONE
            definitions = self.origins.definitions(key, at)
            for definition in definitions:
                result = result | self._trace_definition(node, key, definition, at, bindings, depth)
            if any(_builds_list(definition, key) for definition in definitions):
                # Ex) log_probs = [] ... log_probs.append(dist.log_prob(a)): the list holds what was put in it
                for item, statement in self.appended(key, at):
                    result = result | self._trace(item, statement, bindings, depth + 1)
            return result
        finally:
            self._in_progress.discard((key, at))

    def appended(self, key: str, at: cst.CSTNode) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
        """What the scope of `at` puts into the list `key` (`key.append(v)`, `key.extend(vs)`, `key.insert(i, v)`),
        each with its statement."""
        context = self.collected.contexts.get(at)
        scope = context.scope if context is not None else None
        if scope is None:
            return []
        if scope not in self._appended:
            found: dict[str, list[tuple[cst.BaseExpression, cst.CSTNode]]] = {}
            for statement in self.collected.statements_in_scope(scope):
                call = statement.value if isinstance(statement, cst.Expr) else None
                if not isinstance(call, cst.Call) or not call.args or not isinstance(call.func, cst.Attribute):
                    continue
                holder = dotted_name(call.func.value)
                method = call.func.attr.value
                if holder is not None and method in LIST_FILLERS:
                    found.setdefault(holder, []).append((call.args[LIST_FILLERS[method]].value, statement))
            self._appended[scope] = found
        return [item for item in self._appended[scope].get(key, []) if item[0] is not None]

    def _trace_definition(
        self,
        node: cst.Name | cst.Attribute,
        key: str,
        definition: Definition,
        used_at: cst.CSTNode,
        bindings: Bindings,
        depth: int,
    ) -> Lineage:
        if definition.binding is Binding.OUTSIDE:
            if key in bindings:
                return bindings[key]
            passed = self._passed_by_callers(key, used_at, depth) if not bindings else None
            return passed if passed is not None else self._free(node, key, used_at, bindings, depth)
        context = self.collected.contexts.get(definition.node)
        if context is not None and context.no_grad:
            return NONE
        at = definition.node
        if definition.binding is Binding.UNPACK:
            return self._trace_unpacked(key, definition, bindings, depth)
        if definition.binding is Binding.LOOP:
            zipped = zipped_iterable(definition, key)
            if zipped is not None:
                # Ex) for log_prob, value in zip(log_probs, values): `value` is an item of `values`
                return self._trace_loop_item(zipped, at, bindings, depth)
            return self._trace_loop_item(definition.value, at, bindings, depth)
        value = self._trace(definition.value, at, bindings, depth + 1)
        if definition.binding is Binding.AUGMENT:
            value = value | self._trace(node, at, bindings, depth + 1)
        return value

    def _trace_loop_item(
        self, iterable: cst.BaseExpression, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage:
        source = iterable
        while isinstance(source, cst.Call) and isinstance(source.func, cst.Name) and source.args:
            source = source.args[0].value  # enumerate(loader), tqdm(loader), zip(loader, ...)
        name = last_name(source)
        if name is not None and is_data_name(name) and self.roles.role(source) is None:
            return NONE
        return self._trace(iterable, at, bindings, depth + 1)

    def _trace_unpacked(self, key: str, definition: Definition, bindings: Bindings, depth: int) -> Lineage:
        at, value = definition.node, definition.value
        index = unpacked_index(definition.node, key)
        if isinstance(value, (cst.Tuple, cst.List)) and index is not None and index < len(value.elements):
            return self._trace(value.elements[index].value, at, bindings, depth + 1)
        reduced = values_and_indices_source(value)
        if reduced is not None and index == 1:
            # Ex) _, predicted = torch.max(outputs, 1)
            return self._trace(reduced, at, bindings, depth + 1).cut_by(value)
        returned = self._trace_returned_element(value, index, at, bindings, depth) if index is not None else None
        return returned if returned is not None else self._trace(value, at, bindings, depth + 1)

    def _trace_returned_element(
        self, value: cst.BaseExpression, index: int, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage | None:
        """The lineage of element `index` of what a same-module helper returns, when each of its `return`s writes a
        tuple (`padded, lengths = upsample(feats)`): each element is what it was computed from, not the whole call."""
        if not isinstance(value, cst.Call) or value not in self.collected.contexts or depth >= MAX_DEPTH:
            return None
        helper = self.events.resolve_helper(value)
        if helper is None:
            return None
        returns = [s for s in self.collected.statements_in_scope(helper) if isinstance(s, cst.Return)]
        written = [r.value for r in returns if isinstance(r.value, cst.Tuple)]
        if (
            not returns
            or len(written) != len(returns)
            or any(
                len(t.elements) <= index or any(isinstance(e, cst.StarredElement) for e in t.elements) for t in written
            )
        ):
            return None
        inner = self.call_bindings(value, helper, at, bindings, depth + 1)
        result = NONE
        for statement, returned in zip(returns, written, strict=True):
            result = result | self._trace(returned.elements[index].value, statement, inner, depth + 1)
        return result

    def _passed_by_callers(self, key: str, at: cst.CSTNode, depth: int) -> Lineage | None:
        """A parameter of the function of `at`, as the module's calls of that function pass it: what each call's
        argument was computed from (`update(optimizer, log_probs, values)` after `values.append(value)` of a
        network's output). None where the module never calls the function, or the name is no parameter of it."""
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        if function is None or key not in _plain_parameters(function):
            return None
        sites = self.callers.call_sites(function)
        if not sites:
            return None
        result = NONE
        for site in sites:
            argument = arguments_of(function, site).get(key)
            statement = self.collected.statement_of.get(site)
            if argument is None or statement is None:
                continue  # the parameter's default: no history
            result = result | self._trace(argument, statement, {}, depth + 1)
        return result

    def _free(
        self, node: cst.Name | cst.Attribute, key: str, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage:
        """A name bound outside the scope: a parameter, a global, an attribute set elsewhere."""
        if isinstance(node, cst.Attribute):
            owner = self._trace(node.value, at, bindings, depth)
            if owner != UNKNOWN:
                return owner  # outputs.logits, batch.labels, args.alpha
        head = key.split(".", 1)[0]
        if head in self.roles.imports.aliases or _has_literal_default(self.collected.contexts[at].scope, key):
            return NONE
        role = self.roles.role(node)
        if role is Role.MODEL:
            return SOURCE  # a module with parameters, handed to a function
        if role is Role.LOSS_FN:
            return UNKNOWN  # `aux_loss` handed in is a loss value, and may carry history
        if role is not None or self.roles.role(cst.Name(head)) is Role.OTHER:
            return NONE  # optimizers, scalers, parsed arguments (`args.alpha`)
        if is_data_name(key.rsplit(".", 1)[-1]) and not self._inside_module(at):
            return NONE  # a batch handed to a training function; inside a module, `x` is an activation
        assigned = self.roles.values.get(key, [])
        if assigned and all(isinstance(value, (cst.BaseNumber, cst.BaseString)) for value in assigned):
            return NONE  # self.alpha = 0.5
        return UNKNOWN

    def _inside_module(self, at: cst.CSTNode) -> bool:
        """Whether `at` is in the `forward` of an `nn.Module` subclass, whose arguments are the network's activations
        (`module(x)` runs `forward(x)`), not batches."""
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        owner = context.class_def if context is not None else None
        return (
            function is not None
            and function.name.value == "forward"
            and owner is not None
            and self.roles.is_model_class(owner)
        )

    def _trace_subscript(self, node: cst.Subscript, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        reduced = values_and_indices_source(node.value)
        first = node.slice[0].slice if node.slice else None
        if reduced is not None and isinstance(first, cst.Index) and _is_one(first.value):
            # Ex) out.max(1)[1]: the indices of the maxima
            return self._trace(reduced, at, bindings, depth).cut_by(node)
        return self._trace(node.value, at, bindings, depth)

    def _trace_call(self, call: cst.Call, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        func = call.func
        arguments = [arg.value for arg in call.args]
        if isinstance(func, cst.Attribute) and not self._is_module_path(func.value):
            return self._trace_method(call, func, at, bindings, depth)
        qualified = self.roles.imports.resolve(func) or ""
        name = last_name(func) or ""
        if qualified.startswith("torch.") and not self.is_criterion_call(call):
            return self._trace_torch_function(call, name, arguments, at, bindings, depth)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None and depth < MAX_DEPTH:
            return self._trace_helper(call, helper, at, bindings, depth)
        if self.cut_elsewhere(call):
            return CUT_ELSEWHERE.cut_by(call)
        if self.is_criterion_call(call):
            return self._trace_criterion(call, at, bindings, depth)
        if self._is_model_call(func, at):
            return network_output(call)
        if isinstance(func, cst.Name) and name in STOPPING_BUILTINS:
            return self._union(arguments, at, bindings, depth).stopped()
        if isinstance(func, cst.Name) and name == "round" and func.value not in self.roles.imports.aliases:
            return self._union(arguments, at, bindings, depth).cut_by(call)  # round(out) calls torch.round
        result = self._union(arguments, at, bindings, depth)
        if isinstance(func, cst.Name) and not self._is_plain_function(func):
            return result | UNKNOWN  # a callable held in a variable may be a model
        return result

    def _trace_method(
        self, call: cst.Call, func: cst.Attribute, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage:
        method = func.attr.value
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None and depth < MAX_DEPTH:
            return self._trace_helper(call, helper, at, bindings, depth)
        if self.cut_elsewhere(call):
            return CUT_ELSEWHERE.cut_by(call)
        if self.roles.role(func.value) is Role.MODEL and method not in TENSOR_METHODS:
            return network_output(
                call
            )  # model.encode(x), discriminator.compute_loss(fake.detach(), 0): its own parameters
        if self.is_criterion_call(call):
            return self._trace_criterion(call, at, bindings, depth)
        if self._is_model_call(func, at):
            return network_output(call)  # model(x), self.encoder(x)
        if method == "requires_grad_" and not (call.args and last_name(call.args[0].value) == "False"):
            return SOURCE  # Ex) x.detach().clone().requires_grad_(): a new leaf, which gradients reach
        receiver = self._trace(func.value, at, bindings, depth)
        if method in LIKE_METHODS:
            return receiver  # x.type_as(out): only out's dtype and device
        if method in CUTTING_METHODS:
            return receiver.cut_by(call)
        if method in DETACHING_METHODS:
            return receiver.stopped()
        return receiver | self._union([arg.value for arg in call.args], at, bindings, depth)

    def _trace_torch_function(
        self,
        call: cst.Call,
        name: str,
        arguments: list[cst.BaseExpression],
        at: cst.CSTNode,
        bindings: Bindings,
        depth: int,
    ) -> Lineage:
        first = self._trace(arguments[0], at, bindings, depth) if arguments else NONE
        if name in CUTTING_FUNCTIONS:
            return first.cut_by(call)
        if name == "as_tensor" and first.live:
            return first  # as_tensor hands a tensor back as it is, history included
        if name in REWRAPPING:
            return first.cut_by(call) if first.grad else _leaf_or_none(call)
        if name == "Parameter":
            return SOURCE
        if name in NON_GRAD_TORCH:
            return _leaf_or_none(call)
        return self._union(arguments, at, bindings, depth)

    def _trace_criterion(self, call: cst.Call, at: cst.CSTNode, bindings: Bindings, depth: int) -> Lineage:
        predictions, targets = criterion_sides(call)
        result = self._union(predictions, at, bindings, depth)
        # A distance is the same both ways round: with its first side stopped on purpose (a VQ-VAE's
        # commitment loss, `mse_loss(quantized.detach(), z)`), the gradient flows through the second,
        # whatever it is called. A side cut by accident (`pred.round()`) names no side to train.
        symmetric = not result.live and bool(result.cuts) and all(map(_stops_gradient, result.cuts))
        symmetric = symmetric and self._is_distance(call)
        for target in targets:
            traced = self._trace(target, at, bindings, depth)
            result = result | (traced if symmetric else traced.as_target())
        return result

    def _is_distance(self, call: cst.Call) -> bool:
        """`F.mse_loss`, `F.l1_loss`, `nn.MSELoss()(a, b)`: a criterion symmetric in its two sides."""
        qualified = self.roles.imports.resolve(call.func) or ""
        if qualified.startswith("torch.nn.functional."):
            return qualified.rsplit(".", 1)[-1] in DISTANCES
        built = [last_name(constructor.func) for constructor in self.roles.constructors(call.func)]
        return bool(built) and all(name in DISTANCE_CLASSES for name in built)

    def call_bindings(
        self, call: cst.Call, helper: cst.FunctionDef, at: cst.CSTNode, bindings: Bindings | None = None, depth: int = 0
    ) -> dict[str, Lineage]:
        """The lineages of a helper's parameters at one call of it: what its arguments carry."""
        inner: dict[str, Lineage] = {}
        params = [*helper.params.posonly_params, *helper.params.params]
        if params and params[0].name.value in ("self", "cls") and isinstance(call.func, cst.Attribute):
            params = params[1:]
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        for param, value in zip(params, positional, strict=False):
            inner[param.name.value] = self._trace(value, at, bindings or {}, depth)
        for arg in call.args:
            if arg.keyword is not None:
                inner[arg.keyword.value] = self._trace(arg.value, at, bindings or {}, depth)
        return inner

    def _trace_helper(
        self, call: cst.Call, helper: cst.FunctionDef, at: cst.CSTNode, bindings: Bindings, depth: int
    ) -> Lineage:
        inner = self.call_bindings(call, helper, at, bindings, depth + 1)
        result = NONE
        for statement in self.collected.statements_in_scope(helper):
            if isinstance(statement, cst.Return) and statement.value is not None:
                result = result | self._trace(statement.value, statement, inner, depth + 1)
        return result

    def _is_plain_function(self, func: cst.Name) -> bool:
        """An imported or builtin function, or a class: its result depends on its arguments only."""
        name = func.value
        return name in self.roles.imports.aliases or hasattr(builtins, name) or name[:1].isupper()

    def _is_module_path(self, node: cst.BaseExpression) -> bool:
        # torch.nn.functional.relu(x), F.relu(x), np.mean(x): a function reached through imports
        key = dotted_name(node)
        return key is not None and key.split(".", 1)[0] in self.roles.imports.aliases

    def _is_model_call(self, func: cst.BaseExpression, at: cst.CSTNode) -> bool:
        callee = forward_receiver(func)
        if isinstance(callee, cst.Name) and callee.value == "self":
            context = self.collected.contexts.get(at)
            owner = context.class_def if context is not None else None
            return owner is not None and self.roles.is_model_class(owner)
        return self.roles.role(callee) is Role.MODEL


def _plain_parameters(function: cst.FunctionDef) -> set[str]:
    """The names of a function's parameters that a call binds one argument each (not `self`, `*args`)."""
    params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
    return {param.name.value for param in params} - {"self", "cls"}


def _loss_entry(value: cst.BaseExpression) -> cst.BaseExpression | None:
    # Ex) return loss  /  return {"loss": loss, "log": logs}  /  return (loss, outputs) if return_outputs else loss
    if isinstance(value, cst.IfExp) and isinstance(value.body, cst.Tuple) and value.body.elements:
        return value.orelse if dotted_name(value.body.elements[0].value) == dotted_name(value.orelse) else value
    if isinstance(value, cst.Dict):
        for element in value.elements:
            key = element.key if isinstance(element, cst.DictElement) else None
            if isinstance(key, cst.SimpleString) and key.evaluated_value == "loss":
                return element.value
        return None
    return None if isinstance(value, (cst.Name, cst.Attribute)) and last_name(value) == "None" else value


def _leaf_or_none(call: cst.Call) -> Lineage:
    # torch.tensor(1.0, requires_grad=True) is a leaf that is trained: a source of history.
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "requires_grad":
            return SOURCE if last_name(arg.value) == "True" else NONE
    return NONE


def is_data_name(name: str) -> bool:
    """Whether a name says it holds a batch of data or labels (`inputs`, `y_true`), not something produced."""
    return DATA_NAME.fullmatch(name) is not None and PRODUCED_NAME.match(name) is None


def _has_literal_default(scope: cst.CSTNode, name: str) -> bool:
    # def dice_loss(pred, target, eps=1e-6): a hyperparameter, not a tensor
    if not isinstance(scope, cst.FunctionDef):
        return False
    params = scope.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value == name and param.default is not None:
            default = param.default
            if isinstance(default, cst.Name):
                return default.value in ("None", "True", "False")
            return isinstance(default, (cst.BaseNumber, cst.BaseString, cst.UnaryOperation))
    return False


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _target_names(element.value)]
    key = dotted_name(target)
    return [key] if key is not None else []


# How a list is filled, and which argument is the item (`insert(i, v)`).
LIST_FILLERS = {"append": 0, "extend": 0, "insert": 1}
# What `enumerate` counts with: numbers, with no history.
COUNTER: cst.BaseExpression = cst.Integer("0")


def _builds_list(definition: Definition, key: str) -> bool:
    """`losses = []`, `losses = list()` or `log_probs, values = [], []`: a list the scope fills itself."""
    value = definition.value
    if definition.binding is Binding.UNPACK and isinstance(value, (cst.Tuple, cst.List)):
        index = unpacked_index(definition.node, key)
        if index is None or index >= len(value.elements):
            return False
        value = value.elements[index].value
    elif definition.binding is not Binding.ASSIGN:
        return False
    if isinstance(value, cst.List):
        return True
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "list"


def zipped_iterable(definition: Definition, key: str) -> cst.BaseExpression | None:
    """For `key` in the tuple target of `for a, b in zip(xs, ys)`, the iterable its items come from (`ys` for
    `b`); a number for the index of `for i, x in enumerate(xs)`; None for any other loop."""
    loop, iterable = definition.node, definition.value
    if not isinstance(loop, cst.For) or not isinstance(loop.target, (cst.Tuple, cst.List)):
        return None
    if not isinstance(iterable, cst.Call) or not isinstance(iterable.func, cst.Name):
        return None
    index = next((i for i, element in enumerate(loop.target.elements) if dotted_name(element.value) == key), None)
    arguments = [arg.value for arg in iterable.args if arg.keyword is None and not arg.star]
    if index is None or any(arg.star for arg in iterable.args):
        return None
    if iterable.func.value == "zip" and len(arguments) == len(loop.target.elements):
        return arguments[index]
    if iterable.func.value == "enumerate" and len(loop.target.elements) == 2 and arguments:
        return COUNTER if index == 0 else arguments[0]
    return None


def _is_one(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.value == "1"
