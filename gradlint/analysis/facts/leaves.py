"""Which names hold leaf tensors that require grad: parameters and tensors made to require grad.

A leaf is what `backward()` writes `.grad` into: an `nn.Parameter`, a tensor created
with `requires_grad=True` or switched on with `requires_grad_()`, each element of
`model.parameters()` (unless the module was frozen), and `model.fc.weight`. Facts
are flow-sensitive within a scope: `w = torch.empty(3); w.uniform_(); w.requires_grad_()`
makes `w` a leaf only from its last statement on. Iterables of leaves (parameter lists,
`group["params"]`) are tracked too, through loops, `zip`, `enumerate` and helper calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name

PARAMETER_CONSTRUCTORS = frozenset({"Parameter", "UninitializedParameter"})
PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters"})
ITERABLE_WRAPPERS = frozenset({"list", "tuple", "chain", "filter", "sorted", "reversed", "iter"})
MODULE_PARAMETER_NAMES = frozenset({"weight", "bias", "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"})
MAX_DEPTH = 6
# Answers for a parameter are kept when asked this near the top (deeper ones may be cut short by MAX_DEPTH).
CACHED_DEPTH = 2


class Held(Enum):
    """What a name holds, as far as leaves are concerned."""

    LEAF = "a leaf tensor that requires grad"
    LEAVES = "an iterable of such leaves"
    OTHER = "anything else"


Binding = tuple[int, "Held | _Pending"]


class Leaves:
    """Answers whether an expression is a leaf that requires grad at a given statement."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        callers: CallerGradMode,
        binds_other: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.callers = callers
        # Whether a project class (by its dotted name here) binds `self.<attribute>` to something not a Parameter.
        self.binds_other = binds_other
        self._bindings: dict[tuple[Scope, str], list[Binding]] | None = None
        self._frozen: set[str] = set()
        self._depth = 0
        self._parameters: dict[tuple[str, cst.FunctionDef], Held] = {}
        self._resolving: set[tuple[str, cst.FunctionDef]] = set()
        self._switched: set[tuple[Scope, str, int]] = set()  # where a statement switched a name's grad on

    def switched_on(self, key: str, at: cst.CSTNode) -> bool:
        """True when the last statement of `at`'s scope before `at` that bound `key` switched its grad on
        (`copy.requires_grad_(True)` after `copy = x.detach().clone()`): from there it is a new leaf."""
        context = self.collected.contexts.get(at)
        if context is None:
            return False
        order = self.collected.order.get(at, 0)
        local = [binding for binding in self.bindings().get((context.scope, key), []) if binding[0] < order]
        return bool(local) and (context.scope, key, local[-1][0]) in self._switched

    def is_leaf(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """True when `expression`, just before statement `at`, is a leaf that requires grad."""
        return self.held(expression, at) is Held.LEAF

    def held(self, expression: cst.BaseExpression, at: cst.CSTNode) -> Held:
        """What `expression` holds just before statement (or call, or loop) `at`."""
        if self._depth > MAX_DEPTH:
            return Held.OTHER
        self._depth += 1
        try:
            return self._held(expression, at)
        finally:
            self._depth -= 1

    def _held(self, expression: cst.BaseExpression, at: cst.CSTNode) -> Held:
        if isinstance(expression, (cst.Name, cst.Attribute)):
            return self._held_by_symbol(expression, at)
        if isinstance(expression, cst.Call):
            return self._held_by_call(expression, at)
        if isinstance(expression, (cst.List, cst.Tuple, cst.Set)):
            elements = [self.held(element.value, at) for element in expression.elements]
            return Held.LEAVES if Held.LEAF in elements or Held.LEAVES in elements else Held.OTHER
        if isinstance(expression, (cst.ListComp, cst.GeneratorExp)):
            return self._held_by_comprehension(expression, at)
        if isinstance(expression, cst.Subscript):
            return self._held_by_subscript(expression, at)
        if isinstance(expression, cst.BinaryOperation) and isinstance(expression.operator, cst.Add):
            sides = (self.held(expression.left, at), self.held(expression.right, at))
            return Held.LEAVES if Held.LEAVES in sides else Held.OTHER
        return Held.OTHER

    def _held_by_symbol(self, expression: cst.Name | cst.Attribute, at: cst.CSTNode) -> Held:
        key = dotted_name(expression)
        if key is None:
            return Held.OTHER
        bindings = self.bindings()
        context = self.collected.contexts.get(at)
        if context is None:
            return Held.OTHER  # Ex) a call in a class header or decorator: no statement context
        scope = context.scope
        order = self.collected.order.get(at, 0)
        local = [binding for binding in bindings.get((scope, key), []) if binding[0] < order]
        if local:
            return self._resolve(local[-1][1])
        if isinstance(scope, cst.FunctionDef) and key in parameter_names(scope):
            return self._held_by_parameter(key, scope)
        if (scope, key) in bindings and "." not in key:
            return Held.OTHER  # bound later in this scope only: a local not yet assigned
        return self._held_outside(expression, key, scope)

    def _held_outside(self, expression: cst.Name | cst.Attribute, key: str, scope: Scope) -> Held:
        module_bindings = self.bindings().get((self.collected.module, key), [])
        if module_bindings and scope is not self.collected.module:
            return self._resolve(module_bindings[-1][1])
        if key.startswith("self.") and isinstance(scope, cst.FunctionDef):
            held = self._held_by_attribute_of_self(key, scope)
            if held is not Held.OTHER:
                return held  # else it may still be a layer's own parameter: self.conv.bias
        if isinstance(expression, cst.Attribute) and expression.attr.value in MODULE_PARAMETER_NAMES:
            owner: cst.BaseExpression = expression.value
            while isinstance(owner, cst.Attribute) and self.roles.role(owner) is not Role.MODEL:
                owner = owner.value  # model.emb.weight: a layer of a model
            if (
                self.roles.role(owner) is Role.MODEL
                and not self._is_frozen(expression.value)
                and not self._holds_its_own(expression.value, expression.attr.value)
            ):
                return Held.LEAF  # model.fc.weight
        return Held.OTHER

    def _holds_its_own(self, module: cst.BaseExpression, attribute: str) -> bool:
        """Whether a class that `module` was built from binds `self.<attribute>` to something other than a Parameter
        (tltorch's `TRL` sets `self.weight = FactorizedTensor.new(...)`): what `module.weight` holds is then that."""
        if self.binds_other is None:
            return False
        return any(
            (built := dotted_name(call.func)) is not None and self.binds_other(built, attribute)
            for call in self.roles.constructors(module)
        )

    def _held_by_attribute_of_self(self, key: str, scope: cst.FunctionDef) -> Held:
        # An attribute that some method sets to a dict or list (`self.masks = {}` for one
        # case, a Parameter for another) holds something unknown here.
        owner = self.collected.owners.get(scope)
        bound = [
            binding
            for method, cls in self.collected.owners.items()
            if cls is owner
            for _, binding in self.bindings().get((method, key), [])
        ]
        if any(isinstance(binding, _Pending) and is_container(binding.value) for binding in bound):
            return Held.OTHER
        for method, cls in self.collected.owners.items():
            if cls is owner and method is not scope:
                for _, binding in self.bindings().get((method, key), []):
                    held = self._resolve(binding)
                    if held is not Held.OTHER:
                        return held
        return Held.OTHER

    def _held_by_parameter(self, name: str, function: cst.FunctionDef) -> Held:
        """What the parameter `name` of `function` holds, from what the module's calls pass it. A function that
        passes its parameter on to itself (a recursive walk handing down `tables`) is asked once per parameter:
        the call inside it adds nothing, and following it again and again grows exponentially with the calls."""
        key = (name, function)
        if key in self._parameters:
            return self._parameters[key]
        if key in self._resolving:
            return Held.OTHER
        self._resolving.add(key)
        try:
            held = self._passed_to_parameter(name, function)
        finally:
            self._resolving.discard(key)
        if self._depth <= CACHED_DEPTH:
            self._parameters[key] = held  # deeper, the depth limit may have cut the answer short
        return held

    def _passed_to_parameter(self, name: str, function: cst.FunctionDef) -> Held:
        # Ex) def sgd(params, lr): ...  called as sgd(model.parameters(), 0.1)
        index = next((i for i, param in enumerate(function.params.params) if param.name.value == name), None)
        if index is None:
            return Held.OTHER
        if function in self.collected.owners:
            index -= 1  # `self` is not passed at a method's call site
        for site in self.callers.call_sites(function):
            given = argument(site, index, name)
            if given is not None:
                held = self.held(given, site)
                if held is not Held.OTHER:
                    return held
        return Held.OTHER

    def _resolve(self, bound: Held | _Pending) -> Held:
        if isinstance(bound, Held):
            return bound
        held = self.held(bound.value, bound.at)
        if bound.element:
            return Held.LEAF if held is Held.LEAVES else Held.OTHER
        return held

    def _held_by_call(self, call: cst.Call, at: cst.CSTNode) -> Held:
        name = last_name(call.func)
        if name in PARAMETER_ITERATORS and isinstance(call.func, cst.Attribute):
            return Held.OTHER if self._is_frozen(call.func.value) else Held.LEAVES
        if name in ITERABLE_WRAPPERS:
            held = [self.held(arg.value, at) for arg in call.args]
            return Held.LEAVES if Held.LEAVES in held else Held.OTHER
        if makes_leaf(call):
            return Held.LEAF
        return self._returned_by_helper(call)

    def _returned_by_helper(self, call: cst.Call) -> Held:
        """A leaf when the same-module function `call` runs returns one from every `return`
        (`def load_image(path): ...; return Variable(x, requires_grad=True)`)."""
        helper = self.callers.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is None:
            return Held.OTHER
        returns = [s for s in self.collected.statements_in_scope(helper) if isinstance(s, cst.Return)]
        if returns and all(r.value is not None and self.held(r.value, r) is Held.LEAF for r in returns):
            return Held.LEAF
        return Held.OTHER

    def _held_by_comprehension(self, expression: cst.ListComp | cst.GeneratorExp, at: cst.CSTNode) -> Held:
        # Ex) [p for p in model.parameters() if p.requires_grad]
        loop = expression.for_in
        same = dotted_name(expression.elt) is not None and dotted_name(expression.elt) == dotted_name(loop.target)
        return Held.LEAVES if same and self.held(loop.iter, at) is Held.LEAVES else Held.OTHER

    def _held_by_subscript(self, expression: cst.Subscript, at: cst.CSTNode) -> Held:
        # Ex) group["params"] for group in optimizer.param_groups
        index = expression.slice[0].slice if len(expression.slice) == 1 else None
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return Held.LEAVES if index.value.evaluated_value == "params" else Held.OTHER
        return Held.LEAF if self.held(expression.value, at) is Held.LEAVES else Held.OTHER

    def bindings(self) -> dict[tuple[Scope, str], list[Binding]]:
        """Every binding of a name to a leaf, to leaves, or to something else, per scope in order."""
        if self._bindings is None:
            self._bindings = {}
            self._frozen = self._frozen_modules()
            for statement in self.collected.statements:
                self._bind_statement(statement)
            for loop in self.collected.loops:
                if isinstance(loop, cst.For):
                    self._bind_loop_target(loop.target, loop.iter, loop)
            for found in self._bindings.values():
                found.sort(key=lambda binding: binding[0])
        return self._bindings

    def _bind(self, key: str | None, held: Held | _Pending, at: cst.CSTNode) -> None:
        if key is not None and self._bindings is not None:
            scope = self.collected.contexts[at].scope
            self._bindings.setdefault((scope, key), []).append((self.collected.order[at], held))

    def _bind_statement(self, statement: cst.BaseSmallStatement) -> None:
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                self._bind_target(target.target, statement.value, statement)
        elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
            self._bind_target(statement.target, statement.value, statement)
        elif isinstance(statement, cst.Expr):
            for receiver, on in _switches(statement):
                key = dotted_name(receiver)
                self._bind(key, Held.LEAF if on else Held.OTHER, statement)
                if on and key is not None:
                    self._switched.add((self.collected.contexts[statement].scope, key, self.collected.order[statement]))

    def _bind_target(self, target: cst.BaseExpression, value: cst.BaseExpression, at: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            for index, element in enumerate(target.elements):
                same_length = values is not None and len(values) == len(target.elements)
                source = values[index].value if values is not None and same_length else None
                held = self._held_when_bound(source, at) if source is not None else Held.OTHER
                self._bind(dotted_name(element.value), held, at)
            return
        if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad":
            # Ex) w.requires_grad = True
            self._bind(dotted_name(target.value), Held.LEAF if _is_name(value, "True") else Held.OTHER, at)
            return
        self._bind(dotted_name(target), self._held_when_bound(value, at), at)

    def _held_when_bound(self, value: cst.BaseExpression, at: cst.CSTNode) -> Held | _Pending:
        # Bindings are recorded before any query: an alias (`fast = w`) is resolved lazily.
        if isinstance(value, (cst.Name, cst.Attribute)):
            return _Pending(value, at, element=False)
        if is_leaf_value(value):
            return Held.LEAF
        if isinstance(value, cst.Call) and last_name(value.func) in PARAMETER_ITERATORS | ITERABLE_WRAPPERS:
            return _Pending(value, at, element=False)
        if isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.BinaryOperation)):
            return _Pending(value, at, element=False)
        if is_container(value):
            return _Pending(value, at, element=False)  # holds no leaf itself; kept to be recognised
        if isinstance(value, cst.Call) and value in self.collected.contexts:
            return _Pending(value, at, element=False)  # Ex) image = load_image(path): what the helper returns
        return Held.OTHER

    def _bind_loop_target(self, target: cst.BaseExpression, iterable: cst.BaseExpression, loop: cst.For) -> None:
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(iterable, cst.Call):
            name = last_name(iterable.func)
            elements = [element.value for element in target.elements]
            if name == "zip":
                for element, arg in zip(elements, iterable.args, strict=False):
                    self._bind(dotted_name(element), _Pending(arg.value, loop, element=True), loop)
                return
            if name in ("enumerate", "named_parameters") and len(elements) == 2:
                source = iterable.args[0].value if name == "enumerate" and iterable.args else iterable
                self._bind(dotted_name(elements[1]), _Pending(source, loop, element=True), loop)
                return
        self._bind(dotted_name(target), _Pending(iterable, loop, element=True), loop)

    def is_frozen(self, module: cst.BaseExpression) -> bool:
        """True for a module whose parameters are switched off (`requires_grad_(False)`, `p.requires_grad = False`)."""
        return self._is_frozen(module)

    def _is_frozen(self, module: cst.BaseExpression) -> bool:
        self.bindings()
        return dotted_name(module) in self._frozen

    def _frozen_modules(self) -> set[str]:
        # Ex) ema.requires_grad_(False)  /  for p in teacher.parameters(): p.requires_grad = False
        frozen: set[str] = set()
        for statement in self.collected.statements:
            switches = _switches(statement) if isinstance(statement, cst.Expr) else []
            if isinstance(statement, cst.Assign) and isinstance(statement.targets[0].target, cst.Attribute):
                target = statement.targets[0].target
                if target.attr.value == "requires_grad" and _is_name(statement.value, "False"):
                    switches = [(target.value, False)]
            for receiver, on in switches:
                if on:
                    continue
                frozen.add(dotted_name(receiver) or "")
                loops = self.collected.contexts[statement].loops
                if loops and isinstance(loops[-1], cst.For) and dotted_name(loops[-1].target) == dotted_name(receiver):
                    iterable = loops[-1].iter
                    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute):
                        frozen.add(dotted_name(iterable.func.value) or "")
        return frozen


@dataclass(frozen=True)
class _Pending:
    """A binding resolved when first queried, so that bindings may refer to one another."""

    value: cst.BaseExpression
    at: cst.CSTNode
    element: bool  # the element a `for` loop takes from the iterable `value`


def makes_leaf(value: cst.BaseExpression) -> bool:
    """True for `nn.Parameter(...)` and torch constructors called with `requires_grad=True`."""
    if not isinstance(value, cst.Call):
        return False
    if last_name(value.func) in PARAMETER_CONSTRUCTORS:
        return not any(
            arg.keyword is not None and arg.keyword.value == "requires_grad" and _is_name(arg.value, "False")
            for arg in value.args
        )
    return any(
        arg.keyword is not None and arg.keyword.value == "requires_grad" and _is_name(arg.value, "True")
        for arg in value.args
    )


def is_leaf_value(value: cst.BaseExpression) -> bool:
    """True for an expression that creates a leaf requiring grad: `nn.Parameter(t)`, `x.detach().requires_grad_()`."""
    switched = _requires_grad_switch(value) if isinstance(value, cst.Call) else None
    return makes_leaf(value) or (switched is not None and switched[1])


def _switches(statement: cst.Expr) -> list[tuple[cst.BaseExpression, bool]]:
    """(receiver, on) for each switch an expression statement makes: one call, or a tuple of them
    (`x_adv.detach_(), loss.detach_()`)."""
    calls = (
        [element.value for element in statement.value.elements]
        if isinstance(statement.value, cst.Tuple)
        else [statement.value]
    )
    return [switched for call in calls if (switched := _requires_grad_switch(call)) is not None]


def _requires_grad_switch(call: cst.BaseExpression) -> tuple[cst.BaseExpression, bool] | None:
    """(receiver, on) for `x.requires_grad_()` / `x.requires_grad_(False)` / `x.detach_()`."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
        return None
    if call.func.attr.value == "detach_":
        return call.func.value, False  # a leaf detached in place no longer requires grad
    if call.func.attr.value != "requires_grad_":
        return None
    on = not call.args or not _is_name(call.args[0].value, "False")
    return call.func.value, on


def parameter_names(function: cst.FunctionDef) -> set[str]:
    """The names of a function's parameters, without `*args` and `**kwargs`."""
    params = function.params
    return {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}


def argument(call: cst.Call, index: int, name: str) -> cst.BaseExpression | None:
    """What `call` passes as the parameter `name`, by keyword or at position `index` (None: not passed)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    return positional[index] if 0 <= index < len(positional) else None


def _is_name(node: cst.BaseExpression, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


CONTAINERS = frozenset({"dict", "list", "set", "tuple", "defaultdict", "OrderedDict"})


def is_container(value: cst.BaseExpression) -> bool:
    """A dict, list or set written out or built by its constructor: it holds tensors, it is none."""
    if isinstance(value, (cst.Dict, cst.DictComp, cst.List, cst.ListComp, cst.Set, cst.SetComp)):
        return True
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in CONTAINERS


def parameters_holder(tensor: cst.BaseExpression, loops: tuple[object, ...]) -> cst.BaseExpression | None:
    """What a loop variable holding a parameter takes it from: `model` for `p` in `for p in
    model.parameters()` (or `for name, p in model.named_parameters()`), `params` for `for p in list(params)`;
    None when `tensor` is no variable of the enclosing `loops` (innermost last)."""
    if not isinstance(tensor, cst.Name):
        return None
    for loop in reversed(loops):
        if isinstance(loop, cst.For) and tensor.value in loop_item_names(loop.target):
            return iterated_holder(loop.iter)
    return None


def iterated_holder(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """What an iterable of tensors takes them from: `model` for `model.parameters()` (or `named_parameters()`),
    `params` for `list(params)`; the iterable itself otherwise."""
    while isinstance(iterable, cst.Call) and iterable.args and last_name(iterable.func) in ITERABLE_WRAPPERS:
        iterable = iterable.args[0].value
    func = iterable.func if isinstance(iterable, cst.Call) else None
    if isinstance(func, cst.Attribute) and func.attr.value in PARAMETER_ITERATORS:
        return func.value
    return iterable


def loop_item_names(target: cst.BaseExpression) -> set[str]:
    """The names a loop binds to an item: `p`, or the last of `name, p` (`named_parameters()`)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple) and target.elements and isinstance(target.elements[-1].value, cst.Name):
        return {target.elements[-1].value.value}
    return set()
