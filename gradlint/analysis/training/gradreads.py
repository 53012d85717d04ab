"""Reads of `.grad` that use its value, and whether a backward pass can have filled it by then.

A leaf's `.grad` is None until the first backward pass that reaches it; a non-leaf's
stays None unless `retain_grad()` was called on it. A read that only names the
attribute (`print(p.grad)`, `g = p.grad`, `p.grad is None`) survives a None; a read
that uses the value (`p.grad.zero_()`, `p.grad.data`, `p.grad[0]`, `p.grad * lr`,
`p.grad += g`) raises on one. Reads are found in simple statements; whether a
backward ran before one is decided from the events of its scope (helpers inlined, other
modules' functions through the whole-program model) and, for a function, its callers
in this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import libcst as cst

from gradlint.analysis.facts.frameworks import runs_after_backward
from gradlint.analysis.facts.leaves import Held, Leaves, is_leaf_value
from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import Event, EventIndex, Kind
from gradlint.analysis.project.program import Callee
from gradlint.analysis.project.summaries import GRAD_READ, Effect
from gradlint.analysis.syntax.collect import Collected, Context, Scope
from gradlint.analysis.syntax.names import dotted_name
from gradlint.analysis.syntax.tree import children, descendants


class ModuleAnalysis(Protocol):
    """What the `.grad` reads ask of the module's analysis (`gradlint.analysis.ModuleAnalysis` gives it): the
    layer below is named by what it is used for, so that this module never imports its package's `__init__`."""

    collected: Collected
    roles: Roles
    events: EventIndex

    @property
    def origins(self) -> Origins: ...

    @property
    def leaves(self) -> Leaves: ...

    @property
    def outside_calls(self) -> list[tuple[cst.Call, Callee, list[tuple[Effect, cst.BaseExpression | None]]]]: ...

    def holds_parameters(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool: ...

    def context(self, node: cst.CSTNode) -> Context: ...

    def code(self, node: cst.CSTNode, limit: int = 40) -> str: ...

    def is_grad(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool: ...


MAX_DEPTH = 3
# Attributes and methods only a tensor has: `args.grad.clip` is a setting, `p.grad.data` a tensor.
TENSOR_ATTRIBUTES = frozenset(
    {
        "data", "zero_", "norm", "clone", "detach", "abs", "add_", "sub_", "mul_", "div_", "copy_", "fill_",
        "clamp_", "sum", "mean", "pow", "sign", "view", "reshape", "flatten", "cpu", "numpy", "item", "std",
        "masked_fill_", "nan_to_num_", "shape", "size", "dim", "numel", "float", "to", "max", "min", "square",
    }
)  # fmt: skip
# Methods whose result is a new tensor computed from the receiver.
TENSOR_OPERATIONS = frozenset(
    {
        "mm", "matmul", "bmm", "add", "sub", "mul", "div", "pow", "exp", "log", "clamp", "relu", "sigmoid", "tanh",
        "softmax", "log_softmax", "sum", "mean", "gather", "view", "reshape", "squeeze", "unsqueeze", "permute",
    }
)  # fmt: skip
# Methods of a model that hand back its own leaves rather than compute from an input.
MODEL_ACCESSORS = frozenset({"parameters", "named_parameters", "get_parameter", "state_dict", "get_input_embeddings"})


@dataclass(frozen=True)
class GradRead:
    """A use of `receiver.grad`'s value, in the simple statement `statement`."""

    node: cst.Attribute  # the `receiver.grad` attribute
    receiver: cst.BaseExpression
    key: str  # how the receiver is spelled: `p`, `self.w1`, `params[0]`
    statement: cst.BaseSmallStatement
    used_as: str  # the attribute read from it (`zero_`), or "" for indexing and arithmetic


@dataclass(frozen=True)
class OutsideRead:
    """A call of another module's function that uses the `.grad` of parameters this module passes it."""

    call: cst.Call
    value: cst.BaseExpression  # what the call passes: a parameter, an iterable of them, or a model
    via: str  # the function called, `module.qualname`


class GradReads:
    """Uses of `.grad` values, with the facts that decide whether the value can be None there."""

    def __init__(self, analysis: ModuleAnalysis) -> None:
        self.analysis = analysis
        self._checked: dict[Scope, frozenset[str]] = {}
        self._assigned: dict[Scope, dict[str, int]] = {}

    @cached_property
    def reads(self) -> list[GradRead]:
        """Every use of a `.grad` value in the module, in source order."""
        found: list[GradRead] = []
        collected = self.analysis.collected
        for statement in collected.statements:
            if statement in collected.grad_statements:  # only these can use a `.grad` value
                found.extend(_reads_in(statement, self.analysis))
        return found

    @cached_property
    def outside(self) -> list[OutsideRead]:
        """Calls of another module's function that uses the `.grad` of the parameters it is given before it runs a
        backward pass of its own (`reset_gradients(model)` doing `p.grad.zero_()`), from the whole-program model."""
        found = []
        for call, callee, effects in self.analysis.outside_calls:
            for effect, value in effects:
                if effect.kind == Kind.BACKWARD.value:
                    break  # what it reads after its own backward is filled
                if effect.kind == GRAD_READ and value is not None and self.analysis.holds_parameters(value, call):
                    found.append(OutsideRead(call, value, callee.origin))
                    break
        return found

    def is_tensor(self, read: GradRead) -> bool:
        """Whether the receiver is a tensor: a leaf, a graph value, or used through a tensor-only attribute."""
        if read.used_as in TENSOR_ATTRIBUTES:
            return True
        at = read.statement
        return self.analysis.leaves.held(read.receiver, at) is Held.LEAF or self.analysis.is_grad(read.receiver, at)

    def may_be_none_checked(self, read: GradRead) -> bool:
        """Whether the scope tests the gradient (`p.grad is None`), gave it a value before (`p.grad = ...`), or
        catches the error a None raises (`try: ... except AttributeError:`)."""
        analysis = self.analysis
        if read.statement in self._caught:
            return True
        scope = analysis.context(read.statement).scope
        if scope not in self._checked:
            self._checked[scope] = frozenset(_compared_keys(scope, analysis))
        if read.key in self._checked[scope]:
            return True
        if scope not in self._assigned:
            self._assigned[scope] = self._first_assignments(scope)
        first = self._assigned[scope].get(read.key)
        return first is not None and first < analysis.collected.order[read.statement]

    def _first_assignments(self, scope: Scope) -> dict[str, int]:
        """Where the scope first sets each receiver's `.grad` (`p.grad = None`), by statement order."""
        found: dict[str, int] = {}
        for statement in self.analysis.collected.statements_in_scope(scope):
            for key in _assigned_keys(statement, self.analysis):
                found.setdefault(key, self.analysis.collected.order[statement])
        return found

    @cached_property
    def _caught(self) -> frozenset[cst.CSTNode]:
        """The simple statements in the body of a `try` that catches AttributeError or TypeError."""
        found: set[cst.CSTNode] = set()
        for node in self.analysis.collected.contexts:  # every statement
            if isinstance(node, cst.Try) and any(_catches_none_errors(handler) for handler in node.handlers):
                found.update(inner for inner in descendants(node.body) if isinstance(inner, cst.BaseSmallStatement))
        return frozenset(found)

    def backward_before(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """Whether a backward pass may have run before `node`: earlier in its scope, or before a call of its scope."""
        analysis = self.analysis
        scope = analysis.context(node).scope
        order = analysis.collected.order[node]
        if any(e.kind is Kind.BACKWARD and analysis.collected.order[e.site] < order for e in self._events(scope)):
            return True
        if not isinstance(scope, cst.FunctionDef):
            return False
        if runs_after_backward(analysis.collected, scope) or depth >= MAX_DEPTH:
            return True
        return any(self.backward_before(site, depth + 1) for site in self.call_sites(scope))

    def backward_after(self, node: cst.CSTNode) -> Event | None:
        """The first backward pass of `node`'s scope after it that runs whenever `node` does."""
        analysis = self.analysis
        collected = analysis.collected
        ifs = set(analysis.context(node).ifs)
        for event in self._events(analysis.context(node).scope):
            if event.kind is not Kind.BACKWARD or collected.order[event.site] < collected.order[node]:
                continue
            if ifs <= set(event.ifs) and not collected.exclusive(node, event.site):
                return event
        return None

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this module that run `function`: by name, on `self`, or on an instance of its class."""
        return self._call_sites.get(function, [])

    @cached_property
    def _call_sites(self) -> dict[cst.FunctionDef, list[cst.Call]]:
        events = self.analysis.events
        sites: dict[cst.FunctionDef, list[cst.Call]] = {}
        for call in self.analysis.collected.calls:
            function = events.resolve_helper(call) or events.resolve_instance_method(call)
            if function is not None:
                sites.setdefault(function, []).append(call)
        return sites

    def runs_backward(self, function: cst.FunctionDef) -> bool:
        """Whether `function` runs a backward pass itself or through what it calls."""
        return any(event.kind is Kind.BACKWARD for event in self._events(function))

    def is_non_leaf(self, read: GradRead) -> cst.CSTNode | None:
        """The statement that made the receiver a non-leaf carrying a graph, when every value it holds is one."""
        analysis = self.analysis
        key = dotted_name(read.receiver)
        if key is None or analysis.leaves.held(read.receiver, read.statement) is not Held.OTHER:
            return None
        definitions = analysis.origins.definitions(key, read.statement)
        if not definitions or self._retained(key):
            return None
        scope = analysis.context(read.statement).scope
        for definition in definitions:
            if (
                definition.binding is not Binding.ASSIGN
                or analysis.context(definition.node).scope is not scope
                or is_leaf_value(definition.value)
                or not self._made_by_op(definition.value, definition.node)
            ):
                return None
        return max((definition.node for definition in definitions), key=analysis.collected.order.__getitem__)

    def _made_by_op(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `value` is a new tensor computed by an operation: a graph value, arithmetic, a layer's output."""
        if isinstance(value, cst.BinaryOperation) or self.analysis.is_grad(value, at):
            return True
        if not isinstance(value, cst.Call):
            return False
        roles = self.analysis.roles
        if roles.role(value.func) is Role.MODEL:
            return True  # model(x), self.encoder(x)
        func = value.func
        if not isinstance(func, cst.Attribute):
            return False
        if func.attr.value in TENSOR_OPERATIONS:
            return True  # x.mm(w1), h.clamp(min=0)
        return roles.role(func.value) is Role.MODEL and func.attr.value not in MODEL_ACCESSORS

    def _retained(self, key: str) -> bool:
        # Any `key.retain_grad()` or `key.requires_grad_()` in the module: a late one is GL015's.
        return key in self._switched_keys

    @cached_property
    def _switched_keys(self) -> frozenset[str]:
        found: set[str] = set()
        for call in self.analysis.collected.calls:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("retain_grad", "requires_grad_"):
                found.add(dotted_name(func.value) or "")
        return frozenset(found)

    def _events(self, scope: Scope) -> tuple[Event, ...]:
        return self.analysis.events.scope_events(scope)


def _reads_in(statement: cst.BaseSmallStatement, analysis: ModuleAnalysis) -> Iterator[GradRead]:
    if isinstance(statement, cst.AugAssign) and _is_grad(statement.target):
        target = statement.target
        assert isinstance(target, cst.Attribute)
        yield _read(target, statement, "", analysis)
    for parent, child in _edges(statement):
        used_as = _use(parent, child)
        if used_as is not None and isinstance(child, cst.Attribute):
            yield _read(child, statement, used_as, analysis)


def _read(node: cst.Attribute, statement: cst.BaseSmallStatement, used_as: str, analysis: ModuleAnalysis) -> GradRead:
    return GradRead(node, node.value, dotted_name(node.value) or analysis.code(node.value), statement, used_as)


def _use(parent: cst.CSTNode, child: cst.CSTNode) -> str | None:
    """How `parent` uses the value of `child` when `child` is a `.grad` attribute: its attribute, "" or None."""
    if not _is_grad(child):
        return None
    if isinstance(parent, cst.Attribute) and parent.value is child:
        return parent.attr.value
    if isinstance(parent, cst.Subscript) and parent.value is child:
        return ""
    if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
        return ""
    return None


def _edges(node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
    """Every (parent, child) pair under `node`, not entering nested functions, classes or lambdas."""
    # Iterative: a long chain of `a + b + ...` nests deeper than Python's recursion limit.
    pending = [node]
    while pending:
        parent = pending.pop()
        for child in reversed(children(parent)):
            if not isinstance(child, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
                yield parent, child
                pending.append(child)


def _is_grad(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and node.attr.value == "grad"


def _compared_keys(scope: Scope, analysis: ModuleAnalysis) -> Iterator[str]:
    """The receivers whose `.grad` the scope compares (`is None`, `is not None`)."""
    body: cst.CSTNode = scope.body if isinstance(scope, cst.FunctionDef) else scope
    for parent, child in _edges(body):
        if (
            isinstance(child, cst.Attribute)
            and _is_grad(child)
            and isinstance(parent, (cst.Comparison, cst.ComparisonTarget))
        ):
            yield dotted_name(child.value) or analysis.code(child.value)


def _assigned_keys(statement: cst.BaseSmallStatement, analysis: ModuleAnalysis) -> set[str]:
    """The receivers whose `.grad` the statement sets: `p.grad = None`, `p.grad = torch.zeros_like(p)`."""
    if isinstance(statement, cst.Assign):
        targets = [target.target for target in statement.targets]
    elif isinstance(statement, cst.AnnAssign):
        targets = [statement.target]
    else:
        return set()
    return {
        dotted_name(target.value) or analysis.code(target.value)
        for target in targets
        if isinstance(target, cst.Attribute) and _is_grad(target)
    }


def _catches_none_errors(handler: cst.ExceptHandler) -> bool:
    # Ex) except AttributeError:  /  except (AttributeError, TypeError):  /  except Exception:  /  except:
    if handler.type is None:
        return True
    names = (
        {dotted_name(element.value) for element in handler.type.elements}
        if isinstance(handler.type, cst.Tuple)
        else {dotted_name(handler.type)}
    )
    return bool(names & {"AttributeError", "TypeError", "Exception", "BaseException"})
