"""Gradient events (backward, step, clear, clip, unscale) and the training steps they form.

Events are gathered per scope in evaluation order. A call to a function or method of
the same module is replaced by that function's own events, so a `zero_grad()` inside
`self._step(batch)` counts for the loop that calls it. Events a helper runs only when
an optional argument is given (`if opt is not None: loss.backward()`) are left out of
the calls that do not give it: `loss_batch(model, loss_fn, xb, yb)` evaluates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import libcst as cst

from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.syntax.collect import Collected, Context, Loop, Scope
from gradlint.analysis.syntax.names import ImportMap, dotted_name, is_true, last_name
from gradlint.analysis.syntax.refs import arguments_of, call_positional_params, stored_parameters
from gradlint.analysis.syntax.tree import block_holding, descendants

MAX_INLINE_DEPTH = 4
JUMPS = (cst.Return, cst.Raise)
# opt.zero_grad(), and helpers of other libraries named for it: pyro's zero_grads(params).
CLEARING_NAMES = frozenset({"zero_grad", "zero_grads", "zero_gradients", "clear_grad", "clear_grads"})
# torch.nn.utils and Accelerate spell it clip_grad_*, Lightning and Fabric clip_gradients.
CLIP_FUNCTIONS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients"})
# In-place tensor methods that apply an update: `p.sub_(lr * p.grad)`, `p.data.add_(p.grad, alpha=-lr)`.
UPDATING_METHODS = frozenset({"sub_", "add_", "copy_", "addcdiv_", "addcmul_", "lerp_"})
# What `torch.Tensor.backward` takes, in its order.
TENSOR_BACKWARD_PARAMETERS = ("gradient", "retain_graph", "create_graph", "inputs")
# In-place methods that replace a tensor's values whatever they were: `p.grad.copy_(g)` sets a gradient.
OVERWRITING = frozenset({"fill_", "copy_", "set_"})


class Kind(Enum):
    """What a gradient event does."""

    BACKWARD = "backward"
    AUTOGRAD_GRAD = "autograd.grad"
    STEP = "step"
    CLEAR = "clear"
    CLIP = "clip"
    UNSCALE = "unscale"
    SCALE = "scale"
    SET_GRAD = "set grad"  # `p.grad = g`, `p.grad.copy_(g)`: the gradient a step applies is what was set


@dataclass(frozen=True)
class Event:
    """One gradient event.

    `node` is the call or statement itself; `site` is where it happens in the scope
    that was analysed (the helper call when the event comes from a helper). `value` is
    the loss of a backward, the optimizer a step/clear/unscale acts on, or the tensor whose gradient a
    SET_GRAD writes. An event of a
    function in another module of the project has the call as `node` and `site`, and
    that function's name as `via`.
    """

    kind: Kind
    node: cst.CSTNode
    site: cst.CSTNode
    loops: tuple[Loop, ...]
    ifs: tuple[cst.CSTNode, ...]
    no_grad: bool
    value: cst.BaseExpression | None = None
    via_scaler: bool = False
    retain_graph: bool = False
    via: str | None = None  # the project function (in another module) the event happens in
    repeats: bool = False  # it runs in a loop of that function
    by_hand: bool = False  # a STEP that updates a tensor in place from its own gradient, not `optimizer.step()`
    arms: tuple[str, ...] = ()  # for an event of another module: the branches it runs in there (`Effect.arms`)

    @property
    def direct(self) -> bool:
        """Whether the event is written where it happens, not reached through a call."""
        return self.node is self.site and self.via is None

    @property
    def target(self) -> str | None:
        """The dotted name of `value`, if it is a plain name."""
        return dotted_name(self.value) if self.value is not None else None


@dataclass(frozen=True)
class TrainingStep:
    """A loop or function that backpropagates and steps an optimizer: one training step."""

    node: Loop | cst.FunctionDef
    scope: Scope
    events: tuple[Event, ...]

    def of_kind(self, *kinds: Kind) -> list[Event]:
        """The events of the given kinds, in order."""
        return [event for event in self.events if event.kind in kinds]


def straight_run(step: TrainingStep, collected: Collected) -> list[Event] | None:
    """The backwards, steps and clears of `step`, when each runs every time the step does: None when one sits under
    an `if` of the step's own, or in one arm of a function of another module (`Event.arms`)."""
    events = step.of_kind(Kind.BACKWARD, Kind.STEP, Kind.CLEAR)
    base = 0 if isinstance(step.node, cst.FunctionDef) else len(collected.contexts[step.node].ifs)
    if any(event.ifs[base:] or event.arms for event in events):
        return None
    return events


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


# The names under which backward-like calls take their first argument by keyword:
# torch.autograd.backward(tensors=), autograd.grad(outputs=), scaler.scale(outputs=),
# accelerator/DeepSpeed/manual_backward(loss=), fabric.backward(tensor=).
FIRST_ARGUMENT_KEYWORDS = ("tensors", "outputs", "loss", "tensor")


def _clears(value: cst.BaseExpression) -> bool:
    """Whether a value assigned to `.grad` clears it: None, or zeros (`p.grad = Variable(g.new().zero_())` too)."""
    if isinstance(value, cst.Call) and last_name(value.func) == "Variable" and value.args:
        value = value.args[0].value  # the pre-0.4 wrapper
    if isinstance(value, cst.Name) and value.value == "None":
        return True
    return last_name(value.func if isinstance(value, cst.Call) else value) in ("zeros_like", "zeros", "zero_")


def _first_arg(call: cst.Call) -> cst.BaseExpression | None:
    """The first positional argument of `call`, or the one passed by its usual keyword."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if positional:
        return positional[0]
    for name in FIRST_ARGUMENT_KEYWORDS:
        value = _keyword(call, name)
        if value is not None:
            return value
    return None


class Returned(Protocol):
    """What a project function of another module returns, as its summary says (`project.summaries`)."""

    @property
    def returns_grad(self) -> bool:
        """Always a graph-carrying value."""

    @property
    def returns_grad_if_args(self) -> bool:
        """A graph-carrying value when an argument carries a graph."""

    @property
    def elements(self) -> tuple[tuple[bool, bool], ...] | None:
        """(always, if arguments do) per element of a returned tuple."""


class Project(Protocol):
    """What the events of one module need of the whole program: the model of the layer above
    (`project.program.ModuleProgram`) is handed in, so this layer never imports it."""

    def returns(self, call: cst.Call, context: Context, events: EventIndex) -> Returned | None: ...

    def returns_cut(self, call: cst.Call, context: Context, events: EventIndex) -> bool: ...

    def defines(self, call: cst.Call, context: Context, events: EventIndex) -> bool: ...

    def call_events(
        self, call: cst.Call, context: Context, events: EventIndex, view: cst.Call | None = None
    ) -> list[Event] | None: ...

    def parameterless(self, dotted: str, imports: ImportMap) -> bool: ...

    def method_without_grad(self, cls: str, method: str) -> bool: ...

    def callers_without_grad(self, qualname: str) -> bool: ...

    def runs_without_grad(self, dotted: str, method: str, imports: ImportMap) -> bool: ...

    def stored_argument(
        self, construction: cst.Call, attribute: str, imports: ImportMap
    ) -> cst.BaseExpression | None: ...


@dataclass(frozen=True)
class SetByMethod:
    """An attribute of `self` set by a method of the same object: the caller's statement and call, the method,
    and the method's assignment."""

    statement: cst.CSTNode
    call: cst.Call
    method: cst.FunctionDef
    assignment: cst.Assign


class EventIndex:
    """Classifies calls into events and gathers them per scope, loop and training step."""

    def __init__(self, collected: Collected, roles: Roles, program: Project | None = None) -> None:
        self.collected = collected
        self.roles = roles
        self.program = program
        self._origins: Origins | None = None
        self._gradient_scopes: dict[Scope, bool] = {}
        self.imports: ImportMap = collected.imports
        self.functions = collected.functions
        self._scope_items = self._group_by_scope()
        self._scope_events: dict[Scope, tuple[Event, ...]] = {}
        self._in_progress: set[Scope] = set()
        self._truncated = 0  # how many times inlining stopped at MAX_INLINE_DEPTH
        self.called: set[cst.FunctionDef] = set()
        self._top_functions = {
            function.name.value: function
            for function, scope in collected.def_scopes.items()
            if isinstance(scope, cst.Module) and function not in collected.owners  # a method is not a bare name
        }
        self._methods = self._index_methods()
        self._nested: dict[tuple[cst.FunctionDef, str], cst.FunctionDef] = {}
        self._views: dict[cst.Call, cst.Call] = {}
        self._classes: dict[str, set[str]] = {}  # possible_classes, by receiver name
        self._only_class: dict[str, str | None] = {}  # the one class every binding of a name builds
        for function in reversed(self.functions):  # the first definition of a name wins
            scope = collected.def_scopes[function]
            if isinstance(scope, cst.FunctionDef):
                self._nested[(scope, function.name.value)] = function

    def _group_by_scope(self) -> dict[Scope, list[cst.CSTNode]]:
        grouped: dict[Scope, list[cst.CSTNode]] = {}
        items: list[cst.CSTNode] = [*self.collected.calls, *self.collected.statements]
        items.sort(key=self.collected.order.__getitem__)
        for item in items:
            grouped.setdefault(self.collected.contexts[item].scope, []).append(item)
        return grouped

    def _index_methods(self) -> dict[tuple[cst.ClassDef, str], cst.FunctionDef]:
        return {(owner, function.name.value): function for function, owner in self.collected.owners.items()}

    def context(self, node: cst.CSTNode) -> Context:
        """The Context recorded for a call or statement."""
        return self.collected.contexts[node]

    def resolve_helper(self, call: cst.Call) -> cst.FunctionDef | None:
        """The same-module function or method a call runs, if it can be known."""
        return self._resolve_callee(call.func, self.context(call))

    def resolve_view(self, view: cst.Call, call: cst.Call) -> cst.FunctionDef | None:
        """The same-module function or method that `call` runs, as its `call_view` writes it."""
        return self._resolve_callee(view.func, self.context(call))

    def resolve_instance_method(self, call: cst.Call, at: cst.Call | None = None) -> cst.FunctionDef | None:
        """The method of a same-module class that `obj.method(...)` runs, when `obj` is built from that class.

        `at`: the call as written, when `call` is its view (`call_view`)."""
        name = self.instance_class(call, at)
        owner = self.roles.classes.get(name or "")
        if owner is None or name in self.roles.redefined or not isinstance(call.func, cst.Attribute):
            return None
        return self.method_of(owner, call.func.attr.value)

    @property
    def origins(self) -> Origins:
        """Which assignments of a name reach a statement (shared with the rest of the analysis)."""
        if self._origins is None:
            self._origins = Origins(self.collected)
        return self._origins

    def class_of(self, key: str) -> cst.ClassDef | None:
        """The class of this module that every binding of `key` builds (`model = RN(...)`), if it is one."""
        name = _one_class(self.roles.values.get(key, []))
        if name is None or name in self.roles.redefined:
            return None
        return self.roles.classes.get(name)

    def instance_class(self, call: cst.Call, at: cst.Call | None = None) -> str | None:
        """The dotted name of the class `obj` was built from in `obj.method(...)`, when it is one class.

        The assignments of `obj` that reach the call (`at`, when `call` is its view) decide; an attribute
        bound in another method (`self.weighting`) is judged by every assignment of it in the module.
        """
        func = call.func
        if not isinstance(func, cst.Attribute):
            return None
        key = dotted_name(func.value)
        if key is None or not self.possible_classes(call):
            return None  # never built by a call of a named class in this module: nothing to look up
        if key not in self._only_class:  # by name, like `possible_classes`
            self._only_class[key] = _one_class(self.roles.values.get(key, []))
        if self._only_class[key] is not None:
            return self._only_class[key]  # every binding builds that class: so does any that reaches the call
        built = self._reaching_values(key, at or call)
        return _one_class(built) if built is not None else None

    def call_view(self, call: cst.Call) -> cst.Call:
        """What `call` runs, written out, when its callee is a name bound to a partial application or a method:
        `step(batch)` after `step = functools.partial(train_step, model, opt)` is `train_step(model, opt, batch)`;
        after `step = trainer.train_step`, it is `trainer.train_step(batch)`. Else `call` itself."""
        func = call.func
        if not isinstance(func, cst.Name) or func.value not in self.roles.values:
            return call
        if call not in self._views:
            reaching = self._reaching_values(func.value, call)
            value = reaching[0] if reaching is not None and len(reaching) == 1 else None
            self._views[call] = call
            if isinstance(value, (cst.Name, cst.Attribute)) and dotted_name(value) is not None:
                self._views[call] = call.with_changes(func=value)
            elif isinstance(value, cst.Call) and self._is_partial(value):
                self._views[call] = _applied(value, call)
        return self._views[call]

    def _is_partial(self, call: cst.Call) -> bool:
        return self.imports.resolve(call.func) == "functools.partial"

    def possible_classes(self, call: cst.Call) -> set[str]:
        """Every class `obj` is built from anywhere in the module, for `obj.method(...)` (an over-approximation)."""
        func = call.func
        key = dotted_name(func.value) if isinstance(func, cst.Attribute) else None
        if key is None:
            return set()
        if key not in self._classes:  # by name: a module may bind `model` in every one of 200 functions
            built = self.roles.values.get(key, [])
            self._classes[key] = {
                name for value in built if isinstance(value, cst.Call) and (name := dotted_name(value.func))
            }
        return set(self._classes[key])

    def _reaching_values(self, key: str, call: cst.Call) -> list[cst.BaseExpression] | None:
        statement = self.collected.statement_of.get(call)
        if statement is None:
            return None
        definitions = self.origins.definitions(key, statement)
        if not definitions or any(definition.binding is not Binding.ASSIGN for definition in definitions):
            return None
        return [definition.value for definition in definitions]

    def set_by_method(self, key: str, at: cst.CSTNode) -> SetByMethod | None:
        """Where `self.x`, which `at`'s scope does not assign on its way to `at`, was set last: by a method of the
        same object that the scope calls before `at` and that assigns it in its body's straight line
        (`self.compute_losses()` running `self.loss_G = criterion(...)`). None where nothing shows it."""
        if not key.startswith("self.") or any(
            d.binding is not Binding.OUTSIDE for d in self.origins.definitions(key, at)
        ):
            return None
        context = self.collected.contexts.get(at)
        if context is None or context.function is None:
            return None
        order = self.collected.order
        found: SetByMethod | None = None
        for call in self.collected.calls_in_scope(context.scope):
            if order[call] >= order[at] or not isinstance(call.func, cst.Attribute):
                continue
            if dotted_name(call.func.value) != "self" or (found is not None and order[call] < order[found.call]):
                continue
            method = self.resolve_helper(call)
            assigned = _straight_assignment(self.collected, method, key) if method is not None else None
            if method is not None and assigned is not None:
                found = SetByMethod(self.collected.statement_of[call], call, method, assigned)
        return found

    def holds_deep_copy(self, key: str, at: cst.CSTNode) -> bool:
        """Whether every assignment of `key` that reaches `at` is a deep copy (`model = copy.deepcopy(model)`): a new
        object, so what is done to it never reaches the object it was copied from."""
        statement = self.collected.statement_of.get(at, at) if isinstance(at, cst.Call) else at
        definitions = self.origins.definitions(key, statement)
        return bool(definitions) and all(
            definition.binding is Binding.ASSIGN
            and isinstance(definition.value, cst.Call)
            and (self.imports.resolve(definition.value.func) or "") == "copy.deepcopy"
            for definition in definitions
        )

    def constructed_with(self, value: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The caller's own name for what `obj.attr` holds, when the one call that builds `obj` passes it to a
        constructor that stores it as `attr` (`refs.stored_parameters`, from the class's summary when the class is
        another module's), in the terms of the scope of `at`: `model` for `evaluator.model` after `evaluator =
        Evaluator(model)`; `self.model` where `__init__` built `self.evaluator = Evaluator(model)` and set
        `self.model = model`. None where the code does not show it."""
        if not isinstance(value, cst.Attribute) or (owner := dotted_name(value.value)) is None:
            return None
        built = self.roles.values.get(owner, [])
        if len(built) != 1 or not isinstance(built[0], cst.Call) or built[0] not in self.collected.contexts:
            return None
        passed = self._stored_argument(built[0], value.attr.value)
        return self._named_at(passed, built[0], at) if passed is not None else None

    def _stored_argument(self, construction: cst.Call, attribute: str) -> cst.BaseExpression | None:
        """What `construction` passes for the constructor parameter its class stores as `attribute`."""
        name = dotted_name(construction.func)
        if name is None or any(arg.star for arg in construction.args):
            return None
        owner = self.roles.classes.get(name)
        if owner is None:  # a class of another module: its summary says what its `__init__` stores
            return self.program.stored_argument(construction, attribute, self.roles.imports) if self.program else None
        init = self.method_of(owner, "__init__") if name not in self.roles.redefined else None
        param = {attr: param for param, attr in stored_parameters(init)}.get(attribute) if init is not None else None
        if init is None or param is None:
            return None
        return arguments_of(init, construction, constructor=True).get(param)

    def _named_at(
        self, passed: cst.BaseExpression, construction: cst.Call, at: cst.CSTNode
    ) -> cst.BaseExpression | None:
        """`passed`, an argument of `construction`, named in the scope of `at`: itself in the same scope or, passed
        in a constructor that stores it too, that attribute of `self` in another method of the same class."""
        key = dotted_name(passed)
        built_in, used_in = self.context(construction).scope, self.context(at).scope
        if key is None:
            return None
        if built_in is used_in:
            return passed
        built_class = self.collected.owners.get(built_in) if isinstance(built_in, cst.FunctionDef) else None
        used_class = self.collected.owners.get(used_in) if isinstance(used_in, cst.FunctionDef) else None
        if built_class is None or built_class is not used_class:
            return None
        if key.split(".", 1)[0] == "self":
            return passed
        assert isinstance(built_in, cst.FunctionDef)
        stored = dict(stored_parameters(built_in)) if built_in.name.value == "__init__" else {}
        return cst.Attribute(cst.Name("self"), cst.Name(stored[key])) if key in stored else None

    def method_of(
        self, owner: cst.ClassDef, name: str, seen: frozenset[cst.ClassDef] = frozenset()
    ) -> cst.FunctionDef | None:
        """The method `name` of a class of this module, looked up through its bases of this module."""
        found = self._methods.get((owner, name))
        if found is not None or owner in seen:
            return found
        for base in owner.bases:
            base_name = dotted_name(base.value)
            base_class = self.roles.classes.get(base_name or "")
            if base_class is not None and base_name not in self.roles.redefined:
                found = self.method_of(base_class, name, seen | {owner})
                if found is not None:
                    return found
        return None

    def worth_following(self, context: Context) -> bool:
        """Whether a call here may matter to a rule through another module's effects: it runs in a loop, in
        no_grad, or in a scope with gradient events of its own (a step whose backward or step is in a helper)."""
        if context.loops or context.no_grad:
            return True
        scope = context.scope
        if scope not in self._gradient_scopes:
            self._gradient_scopes[scope] = any(self.classify(item) is not None for item in self.items_of(scope))
        return self._gradient_scopes[scope]

    def _on_instance(self, call: cst.Call) -> bool:
        """Whether `call` is a method call on an instance of a class the module shows (`weighting.backward(loss)`).

        `self.manual_backward(loss)`, `self.zero_grad()` and an optimizer's `step()` keep the meaning
        their names give them, even where the project defines them (linting Lightning or PyTorch itself).
        """
        func = call.func
        if not isinstance(func, cst.Attribute) or self.instance_class(call) is None:
            return False
        return self.roles.role(func.value) not in (Role.OPTIMIZER, Role.SCALER)  # `opt.step()` is a step

    def runs_project_function(self, call: cst.Call) -> bool:
        """Whether `call` runs a function another module of the project defines (a method of a base class there
        included), summarized or not."""
        return (
            self.program is not None
            and call in self.collected.contexts
            and self.program.defines(call, self.context(call), self)
        )

    def outside(self, call: cst.Call) -> Returned | None:
        """The summary of the function in another module of the project that `call` runs, if known."""
        if self.program is None or call not in self.collected.contexts or not self.worth_following(self.context(call)):
            return None
        return self.program.returns(call, self.context(call), self)

    def items_of(self, scope: Scope) -> list[cst.CSTNode]:
        """The calls and simple statements written in `scope` itself, in evaluation order."""
        return self._scope_items.get(scope, [])

    def step_closure(self, call: cst.Call) -> cst.FunctionDef | cst.Lambda | None:
        """What a `step(closure)` call hands the optimizer to run (LBFGS needs one): a lambda, or the function
        of this module its argument names; None for a step given no function."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and call.args):
            return None
        handed = call.args[0].value
        if isinstance(handed, cst.Lambda):
            return handed
        if not isinstance(handed, cst.Name) or call not in self.collected.contexts:
            return None
        return self.resolve_name(handed, self.context(call))

    def resolve_name(self, name: cst.Name, context: Context) -> cst.FunctionDef | None:
        """The function of this module a bare name refers to at `context`."""
        return self._resolve_callee(name, context)

    def _resolve_callee(self, func: cst.BaseExpression, context: Context) -> cst.FunctionDef | None:
        if isinstance(func, cst.Name):
            nested = self._nested_function(func.value, context.scope)
            return nested or self._top_functions.get(func.value)
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value in ("self", "cls")
            and context.class_def is not None
        ):
            found = self.method_of(context.class_def, func.attr.value)
            return found if found is not None else self._implemented_below(context.class_def, func.attr.value)
        return None

    def _implemented_below(self, owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        """The method `name` that a base class calls on `self` without defining it (`def train(self):
        return self._train()`), when exactly one class of the module that derives from it implements it."""
        found = {
            method
            for other in self.collected.classes
            if other is not owner
            and self._derives_from(other, owner, frozenset())
            and (method := self.method_of(other, name)) is not None
        }
        return found.pop() if len(found) == 1 else None

    def _derives_from(self, cls: cst.ClassDef, base: cst.ClassDef, seen: frozenset[cst.ClassDef]) -> bool:
        """Whether `cls` derives from `base` through classes of this module."""
        for written in cls.bases:
            name = dotted_name(written.value)
            parent = self.roles.classes.get(name or "")
            if parent is None or name in self.roles.redefined or parent in seen:
                continue
            if parent is base or self._derives_from(parent, base, seen | {cls}):
                return True
        return False

    def _nested_function(self, name: str, scope: Scope) -> cst.FunctionDef | None:
        return self._nested.get((scope, name)) if isinstance(scope, cst.FunctionDef) else None

    def classify(self, node: cst.CSTNode) -> tuple[Kind, cst.BaseExpression | None, bool, bool] | None:
        """(kind, value, via_scaler, retain_graph) for an event node, or None for other nodes.

        A tensor updated in place from its own gradient (`w -= lr * w.grad`, `p.data.add_(p.grad, alpha=-lr)`)
        is stepped as an optimizer steps it: a STEP whose value is the tensor.
        """
        if isinstance(node, cst.AugAssign):
            updated = _updated_from_own_gradient(node.target, node.value)
            return (Kind.STEP, updated, False, False) if updated is not None else None
        if isinstance(node, cst.Assign):
            # `w = w - lr * w.grad` is no step: it binds a new tensor, whose gradient starts empty (GL003's concern).
            return self._classify_grad_assignment(node)
        if not isinstance(node, cst.Call):
            return None
        name = last_name(node.func)
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        if name in ("backward", "manual_backward"):
            return self._classify_backward(node, receiver)
        if name == "grad" and (self.imports.resolve(node.func) or "").endswith("autograd.grad"):
            return Kind.AUTOGRAD_GRAD, _first_arg(node), False, is_true(_keyword(node, "retain_graph"))
        if receiver is None and name in CLEARING_NAMES:
            return Kind.CLEAR, None, False, False  # Ex) from pyro.infer.util import zero_grads
        if receiver is None and name not in CLIP_FUNCTIONS:
            # Ex) from torch.nn.utils import clip_grad_norm_ as clip_norm
            imported = (self.imports.resolve(node.func) or "").rsplit(".", 1)[-1]
            return (Kind.CLIP, None, False, False) if imported in CLIP_FUNCTIONS else None
        return self._classify_method(node, name, receiver)

    def _classify_backward(
        self, call: cst.Call, receiver: cst.BaseExpression | None
    ) -> tuple[Kind, cst.BaseExpression | None, bool, bool] | None:
        resolved = self.imports.resolve(call.func) or ""
        if resolved.startswith("torch.distributed.autograd"):
            return None  # gradients live in a distributed autograd context, no clearing needed
        retain = is_true(_keyword(call, "retain_graph"))
        is_function = resolved.endswith("autograd.backward") or receiver is None
        # An optimizer wrapper's `backward(loss)` (ColossalAI's, apex's, DeepSpeed's): torch's optimizers have
        # none, and a tensor is no optimizer, so what it backpropagates is its argument.
        optimizer = (
            receiver is not None and _first_arg(call) is not None and self.roles.role(receiver) is Role.OPTIMIZER
        )
        if is_function or last_name(call.func) == "manual_backward" or _is_wrapper(receiver, call) or optimizer:
            return Kind.BACKWARD, _first_arg(call), False, retain
        if isinstance(receiver, cst.Call) and last_name(receiver.func) == "scale":
            scaled = _first_arg(receiver)
            if scaled is not None:
                return Kind.BACKWARD, scaled, True, retain
        if not self._tensor_backward(call):
            return None  # Ex) y_hat = hmm.backward(X, priors=priors): an HMM's backward algorithm, not autograd's
        return Kind.BACKWARD, receiver, False, retain

    def _tensor_backward(self, call: cst.Call) -> bool:
        """Whether `x.backward(...)` may be `torch.Tensor.backward`: it takes only that method's parameters, and
        returns None, so a result bound to a name shows another method of the same name."""
        if any(arg.keyword is not None and arg.keyword.value not in TENSOR_BACKWARD_PARAMETERS for arg in call.args):
            return False
        if len([arg for arg in call.args if arg.keyword is None]) > len(TENSOR_BACKWARD_PARAMETERS):
            return False
        statement = self.collected.statement_of.get(call)
        return not (isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is call)

    def _classify_method(
        self, call: cst.Call, name: str | None, receiver: cst.BaseExpression | None
    ) -> tuple[Kind, cst.BaseExpression | None, bool, bool] | None:
        if name in CLIP_FUNCTIONS:
            return Kind.CLIP, receiver, False, False
        if receiver is None:
            return None
        if name in CLEARING_NAMES:
            return Kind.CLEAR, receiver, False, False
        if name == "zero_" and last_name(_strip_data(receiver)) == "grad":
            return Kind.CLEAR, None, False, False
        stripped = _strip_data(receiver)
        if name in OVERWRITING and isinstance(stripped, cst.Attribute) and stripped.attr.value == "grad":
            return Kind.SET_GRAD, stripped.value, False, False
        if name in UPDATING_METHODS and (updated := _updated_from_own_gradient(receiver, call)) is not None:
            return Kind.STEP, updated, False, False
        if name == "step":
            if self.roles.is_optimizer(receiver):
                return Kind.STEP, receiver, False, False
            if self.roles.is_scaler(receiver) and call.args:
                return Kind.STEP, call.args[0].value, True, False
            return None
        if name == "unscale_" and call.args:
            return Kind.UNSCALE, call.args[0].value, True, False
        if name == "scale" and self.roles.is_scaler(receiver):
            return Kind.SCALE, _first_arg(call), True, False
        return None

    def _classify_grad_assignment(self, node: cst.Assign) -> tuple[Kind, cst.BaseExpression | None, bool, bool] | None:
        """A clear (`p.grad = None`, `p.grad = torch.zeros_like(p)`), or a gradient set from elsewhere (`p.grad =
        saved[i]`, a gradient computed by `autograd.grad`): not `p.grad = p.grad + noise`, which keeps what the
        backward put there."""
        for target in node.targets:
            gradient = _strip_data(target.target)  # `p.grad.data = g` sets it too
            if not isinstance(gradient, cst.Attribute) or gradient.attr.value != "grad":
                continue
            if _clears(node.value) and gradient is target.target:
                if not self._copied_otherwise(node, dotted_name(gradient)):
                    return Kind.CLEAR, None, False, False
            elif not any(
                isinstance(operand, cst.Attribute) and operand.attr.value == "grad"
                for operand in (node.value, *descendants(node.value))
            ):
                return Kind.SET_GRAD, gradient.value, False, False
        return None

    def _copied_otherwise(self, node: cst.Assign, key: str | None) -> bool:
        """Whether the `if` around a `p.grad = None` gives `p.grad` a value on its other path: a copy of another
        tensor's gradient state (`if src.grad is None: p.grad = None else: p.grad = src.grad.clone()`), no clear."""
        context = self.collected.contexts.get(node)
        ifs = context.ifs if context is not None else ()
        branch = next((outer for outer in reversed(ifs) if isinstance(outer, cst.If)), None)
        if branch is None or key is None:
            return False
        return any(
            isinstance(other, cst.Assign)
            and other is not node
            and not _clears(other.value)
            and any(dotted_name(target.target) == key for target in other.targets)
            for other in descendants(branch)
        )

    def scope_events(self, scope: Scope, depth: int = 0) -> tuple[Event, ...]:
        """Every event of a scope in order, with same-module helpers inlined."""
        if scope in self._scope_events:
            return self._scope_events[scope]
        if depth > MAX_INLINE_DEPTH:
            self._truncated += 1
            return ()
        if scope in self._in_progress:
            return ()
        self._in_progress.add(scope)
        truncated = self._truncated
        events: list[Event] = []
        for item in self._scope_items.get(scope, []):
            events.extend(self._events_at(item, depth))
        self._in_progress.discard(scope)
        result = tuple(events)
        if self._truncated == truncated:
            # A scope first reached deep in a chain of calls (main -> run -> fit -> step) misses what lies past
            # the depth limit there; it is kept only when complete, and computed again from nearer.
            self._scope_events[scope] = result
        return result

    def _events_at(self, item: cst.CSTNode, depth: int) -> list[Event]:
        context = self.context(item)
        events: list[Event] = []
        if isinstance(item, cst.Call):
            # A function passed by name (an LBFGS closure) runs as part of the call; one given to
            # `functools.partial` runs where the partial is called (`call_view`).
            for arg in () if self._is_partial(item) else item.args:
                passed = self._resolve_callee(arg.value, context) if isinstance(arg.value, cst.Name) else None
                if passed is not None:
                    self.called.add(passed)
                    events.extend(self._inline(passed, item, context, depth))
            view = self.call_view(item)
            helper = self.resolve_view(view, item) or self.resolve_instance_method(view, item)
            if helper is not None:
                # A same-module `backward()`/`step()` wrapper counts through its body only.
                self.called.add(helper)
                return [*events, *self._inline(helper, item, context, depth, view)]
            if (
                self.program is not None
                and (self.classify(item) is None or self._on_instance(item))
                and self.worth_following(context)
            ):
                # A known call (`loss.backward()`, `torch.autograd.grad`) is what it says, even in the
                # project that defines it; a method of the project's own class is what its body does.
                outside = self.program.call_events(item, context, self, view)
                if outside is not None:
                    return [*events, *outside]
        classified = self.classify(item)
        if classified is not None:
            kind, value, via_scaler, retain = classified
            by_hand = kind is Kind.STEP and updates_by_hand(item)
            events.append(
                Event(
                    kind,
                    item,
                    item,
                    context.loops,
                    context.ifs,
                    context.no_grad,
                    value,
                    via_scaler,
                    retain,
                    by_hand=by_hand,
                )
            )
        return events

    def _inline(
        self, helper: cst.FunctionDef, site: cst.CSTNode, context: Context, depth: int, view: cst.Call | None = None
    ) -> list[Event]:
        """The helper's events at `site`, its parameters bound to what the call (as `view` writes it) passes."""
        given = view or site
        off = switched_off_at(helper, given) if isinstance(given, cst.Call) else {}
        exits = self.exits_without(helper, off)
        return [
            Event(
                event.kind,
                event.node,
                site,
                context.loops + event.loops,
                context.ifs + event.ifs,
                context.no_grad or event.no_grad,
                rebound(event.value, helper, given),
                event.via_scaler,
                event.retain_graph,
                event.via,
                event.repeats,
                event.by_hand,
                event.arms,  # the branches of another module's function stay apart through this helper
            )
            for event in self.scope_events(helper, depth + 1)
            if not (
                off and self.context(event.node).scope is helper and self.needs_any(event.node, event.ifs, off, exits)
            )
        ]

    def exits_without(self, helper: cst.FunctionDef, off: Mapping[str, bool | Given]) -> list[int]:
        """Where `helper` returns early for a switched-off parameter (`if opt is None: return`)."""
        if not off or not isinstance(helper.body, cst.IndentedBlock):
            return []
        exits = []
        for statement in helper.body.body:
            if not isinstance(statement, cst.If) or statement.orelse is not None:
                continue
            last = statement.body.body[-1] if statement.body.body else None
            if isinstance(last, cst.SimpleStatementLine):
                last = last.body[-1]
            if runs_when_off(statement.test, off) is True and isinstance(last, JUMPS):
                exits.append(self.collected.order[last])
        return exits

    def needs_any(
        self, node: cst.CSTNode, ifs: tuple[cst.CSTNode, ...], off: Mapping[str, bool | Given], exits: list[int]
    ) -> bool:
        """Whether `node`, inside `ifs`, runs only when one of the switched-`off` parameters is given."""
        if any(self.collected.order[node] > exit_order for exit_order in exits):
            return True
        for branch in ifs:
            if not isinstance(branch, cst.If):
                continue
            runs = runs_when_off(branch.test, off)
            if runs is not None and self.collected.in_body(branch, node) != runs:
                return True
        return False

    def call_toward(self, scope: Scope, node: cst.CSTNode) -> cst.CSTNode | None:
        """`node` if it is written in `scope`, else the call in `scope` of the helper that runs it."""
        if self.context(node).scope is scope:
            return node
        for item in self._scope_items.get(scope, []):
            if isinstance(item, cst.Call) and any(event.node is node for event in self._events_at(item, 0)):
                return item
        return None

    def region_events(self, region: Loop | cst.FunctionDef) -> tuple[Event, ...]:
        """The events of a loop or function, helpers inlined."""
        if isinstance(region, cst.FunctionDef):
            return self.scope_events(region)
        return tuple(event for event in self.scope_events(self.context(region).scope) if region in event.loops)

    def training_steps(self) -> list[TrainingStep]:
        """Innermost loops and root functions that both backpropagate and step."""
        scopes: list[Scope] = [self.collected.module, *self.functions]
        all_events = {scope: self.scope_events(scope) for scope in scopes}
        loop_events: dict[Loop, tuple[Event, ...]] = {}
        for scope, events in all_events.items():
            for loop in self.collected.loops:
                if self.context(loop).scope is scope:
                    loop_events[loop] = tuple(event for event in events if loop in event.loops)
        qualifying = {loop for loop, events in loop_events.items() if _backprops_and_steps(events)}
        steps = []
        for loop in self.collected.loops:
            if loop in qualifying and not any(
                inner in qualifying
                for event in loop_events[loop]
                for inner in event.loops[event.loops.index(loop) + 1 :]
            ):
                steps.append(TrainingStep(loop, self.context(loop).scope, loop_events[loop]))
        steps += [step for step in self.step_functions() if step.node not in self.called]
        steps.sort(key=lambda step: self.collected.order[step.node])
        return steps

    def step_functions(self) -> list[TrainingStep]:
        """Functions whose own straight line (outside their loops) backpropagates and steps: one training step per
        call, called from a loop of this module (`gan.optimize_parameters()`) or not."""
        steps = []
        for function in self.functions:
            events = self.scope_events(function)
            loose = tuple(event for event in events if not event.loops and not event.repeats)
            if _backprops_and_steps(loose):
                steps.append(TrainingStep(function, function, events))
        return steps


def ends_loop(loop: Loop, statement: cst.CSTNode) -> bool:
    """Whether the loop never runs again once `statement` (a simple statement in it) has run: the lines after it in
    its block `break`, `return`, or set the flag a `while not flag:` loop tests (`stop_accumulating = True`)."""
    flag = (
        loop.test.expression.value
        if isinstance(loop, cst.While)
        and isinstance(loop.test, cst.UnaryOperation)
        and isinstance(loop.test.operator, cst.Not)
        and isinstance(loop.test.expression, cst.Name)
        else None
    )
    block = block_holding(loop, statement, into_loops=False)
    if block is None:
        return False
    at = next(i for i, line in enumerate(block) if isinstance(line, cst.SimpleStatementLine) and statement in line.body)
    for line in block[at:]:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, (cst.Break, cst.Return)):
                return True
            if isinstance(small, (cst.Continue, cst.Raise)):
                return False
            if (
                flag is not None
                and isinstance(small, cst.Assign)
                and any(isinstance(t.target, cst.Name) and t.target.value == flag for t in small.targets)
                and isinstance(small.value, cst.Name)
                and small.value.value == "True"
            ):
                return True
    return False


def rebound(value: cst.BaseExpression | None, helper: cst.FunctionDef, site: cst.CSTNode) -> cst.BaseExpression | None:
    """A helper's event value in the caller's terms: `def update(optimizer)` called as `update(opt_d)` steps `opt_d`.

    Only a parameter given a plain name or attribute is rebound (or an item of a spread one, `args[1]`, that a
    wrapper passes on); anything else keeps the helper's expression.
    """
    if value is None or not isinstance(site, cst.Call):
        return value
    dotted = dotted_name(value)
    if dotted is None:
        given = _spread_arguments(helper, site).get(_spread_key(value) or "")
        return given if given is not None and _passable(given) else value
    head, *rest = dotted.split(".")
    func = site.func
    if head in ("self", "cls"):  # `pi.train_net()` runs `self.optimizer.step()` on `pi.optimizer`
        on_self = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == head
        given = func.value if isinstance(func, cst.Attribute) and not on_self else None
    else:
        given = arguments_of(helper, site).get(head)
    if given is None or not _passable(given):
        return value
    for name in rest:
        given = cst.Attribute(value=given, attr=cst.Name(name))
    return given


def _straight_assignment(collected: Collected, function: cst.FunctionDef, key: str) -> cst.Assign | None:
    """The last assignment of `key` in `function`'s straight line (under no `if` and in no loop)."""
    found = None
    for statement in collected.statements_in_scope(function):
        context = collected.contexts[statement]
        straight = not context.ifs and not context.loops
        if (
            straight
            and isinstance(statement, cst.Assign)
            and any(dotted_name(t.target) == key for t in statement.targets)
        ):
            found = statement
    return found


def _passable(value: cst.BaseExpression) -> bool:
    """A name, an attribute path, or an item of a spread parameter (`args[0]`): what rebinding carries."""
    return dotted_name(value) is not None or _spread_key(value) is not None


def _spread_key(value: cst.BaseExpression) -> str | None:
    """`args[0]` or `kwargs["opt"]` as the key `_spread_arguments` uses, for an item of a name."""
    if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) and len(value.slice) == 1):
        return None
    index = value.slice[0].slice
    if not isinstance(index, cst.Index) or not isinstance(index.value, (cst.Integer, cst.SimpleString)):
        return None
    item = index.value.value if isinstance(index.value, cst.Integer) else index.value.evaluated_value
    return f"{value.value.value}[{item}]" if isinstance(item, str) else None


def _spread_arguments(helper: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """What `call` passes to the helper's `*args` and `**kwargs`, as `args[0]`, `kwargs[opt]`, ..."""
    found: dict[str, cst.BaseExpression] = {}
    params = helper.params
    if isinstance(params.star_arg, cst.Param):
        extra = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        for index, value in enumerate(extra[len(call_positional_params(helper, call)) :]):
            found[f"{params.star_arg.name.value}[{index}]"] = value
    if isinstance(params.star_kwarg, cst.Param):
        named = {param.name.value for param in (*call_positional_params(helper, call), *params.kwonly_params)}
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value not in named:
                found[f"{params.star_kwarg.name.value}[{arg.keyword.value}]"] = arg.value
    return found


def _applied(partial: cst.Call, call: cst.Call) -> cst.Call:
    """`call` of what `functools.partial(f, *given, **keywords)` returns, as the call of `f` it makes."""
    if not partial.args or partial.args[0].keyword is not None or partial.args[0].star:
        return call
    given = partial.args[1:]
    named = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    positional = [arg for arg in (*given, *call.args) if arg.keyword is None and arg.star != "**"]
    keywords = [arg for arg in (*given, *call.args) if arg.keyword is not None or arg.star == "**"]
    keywords = [arg for arg in keywords if arg in call.args or arg.keyword is None or arg.keyword.value not in named]
    try:
        return cst.Call(func=partial.args[0].value, args=[*positional, *keywords])
    except cst.CSTValidationError:
        return call  # Ex) a keyword before a spread in the partial: Python's own order rules


def switched_off_at(helper: cst.FunctionDef, call: cst.Call) -> dict[str, bool | Given]:
    """Parameters of `helper` that are None or False at `call` (name -> whether the value is None), or a
    string, number or `True` literal (`Given`).

    A parameter is switched off when `call` omits it and its default is `None` or `False`,
    or passes the literal `None` or `False` for it; a literal given or defaulted the same way
    decides tests such as `if mode == "train":`.
    """
    if any(arg.star for arg in call.args):
        return {}  # *args or **kwargs: anything may be passed
    positional = call_positional_params(helper, call)
    given = arguments_of(helper, call)
    off: dict[str, bool | Given] = {}
    for param in [*positional, *helper.params.kwonly_params]:
        value = given.get(param.name.value, param.default)
        if isinstance(value, cst.Name) and value.value in ("None", "False"):
            off[param.name.value] = value.value == "None"
        elif isinstance(value, cst.Name) and value.value == "True":
            off[param.name.value] = Given(True)  # decides `if not training:` as a string decides `if mode == "x":`
        elif isinstance(value, (cst.SimpleString, cst.Integer)):
            literal = _literal(value)
            if literal is not None:
                off[param.name.value] = Given(literal)
    return off


@dataclass(frozen=True)
class Given:
    """A string, integer or `True` literal a call passes for a parameter (`run_epoch(loader, "val")`)."""

    value: str | int


def _literal(node: cst.BaseExpression) -> str | int | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    return None


def _decide_literal(test: cst.Comparison, given: Given) -> bool | None:
    """Whether `p == "x"`, `p != "x"`, `p in ("x", "y")` or `p not in (...)` holds for the literal `given`."""
    if len(test.comparisons) != 1:
        return None
    operator, comparator = test.comparisons[0].operator, test.comparisons[0].comparator
    if isinstance(comparator, (cst.Tuple, cst.List, cst.Set)):
        options = [_literal(element.value) for element in comparator.elements]
    else:
        options = [_literal(comparator)]
    if None in options:
        return None
    if isinstance(operator, (cst.Equal, cst.In)):
        return given.value in options
    if isinstance(operator, (cst.NotEqual, cst.NotIn)):
        return given.value not in options
    return None


def runs_when_off(test: cst.BaseExpression, off: Mapping[str, bool | Given]) -> bool | None:
    """Whether the body of `if test` runs when the parameters `off` are switched off (None: not decided).

    `if p` and `if not p` are decided for None and False (and for a literal, by its truth);
    `if p is None` and `if p is not None` only for None (False is not None); `p == "x"`,
    `p != "x"`, `p in (...)` for a literal. `a and b` does not run when either side does not;
    `a or b` runs when either side does.
    """
    if isinstance(test, cst.BooleanOperation):
        sides = (runs_when_off(test.left, off), runs_when_off(test.right, off))
        decisive = not isinstance(test.operator, cst.And)
        if decisive in sides:
            return decisive
        return sides[0] if sides[0] is not None and sides[0] == sides[1] else None
    if isinstance(test, cst.Name) and test.value in off:
        known = off[test.value]
        return bool(known.value) if isinstance(known, Given) else False
    if (
        isinstance(test, cst.UnaryOperation)
        and isinstance(test.operator, cst.Not)
        and isinstance(test.expression, cst.Name)
        and test.expression.value in off
    ):
        known = off[test.expression.value]
        return not known.value if isinstance(known, Given) else True
    if not isinstance(test, cst.Comparison) or not isinstance(test.left, cst.Name):
        return None
    compared = off.get(test.left.value)
    if isinstance(compared, Given):
        return _decide_literal(test, compared)
    if (
        compared is True
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        operator = test.comparisons[0].operator
        if isinstance(operator, cst.IsNot):
            return False
        if isinstance(operator, cst.Is):
            return True
    return None


def _backprops_and_steps(events: tuple[Event, ...]) -> bool:
    kinds = {event.kind for event in events}
    return Kind.BACKWARD in kinds and Kind.STEP in kinds


def updates_by_hand(node: cst.CSTNode) -> bool:
    """Whether a node `classify` finds a STEP is a tensor updated in place from its own gradient (`w -= lr *
    w.grad`, `p.data.add_(p.grad, alpha=-lr)`), not an optimizer's or a scaler's `step()`."""
    return isinstance(node, cst.AugAssign) or (isinstance(node, cst.Call) and last_name(node.func) in UPDATING_METHODS)


def _updated_from_own_gradient(target: cst.BaseExpression, change: cst.CSTNode) -> cst.BaseExpression | None:
    """The tensor `target` names (seen through `.data`) when `change` reads that tensor's own gradient
    (`.grad`, `.grad.data`): a gradient step on it. Not a change of the gradient itself (`p.grad.add_(p)`)."""
    updated = _strip_data(target)
    key = dotted_name(updated)
    if key is None or last_name(updated) == "grad":
        return None
    own_gradient = (
        node
        for node in descendants(change)
        if isinstance(node, cst.Attribute) and node.attr.value == "grad" and dotted_name(_strip_data(node.value)) == key
    )
    return updated if next(own_gradient, None) is not None else None


def _strip_data(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return node


def _one_class(built: Sequence[cst.BaseExpression]) -> str | None:
    """The class every value of `built` is an instance of (`Trainer(...)`), when they agree on one. A `None`
    binding (`self.updater = None` until `setup()` builds it) does not count: a method called on the object
    runs only where it is not None."""
    classes = {
        dotted_name(value.func) if isinstance(value, cst.Call) else None
        for value in built
        if not (isinstance(value, cst.Name) and value.value == "None")
    }
    if len(classes) != 1 or None in classes:
        return None  # `obj` holds instances of one class wherever it is bound
    (name,) = classes
    return name


def _is_wrapper(receiver: cst.BaseExpression | None, call: cst.Call) -> bool:
    """Whether `receiver.backward(...)` backpropagates its argument rather than `receiver` itself."""
    # accelerator.backward(loss), fabric.backward(loss), engine.backward(loss), amp handles
    if receiver is None:
        return False
    name = last_name(receiver) or ""
    if name in ("accelerator", "fabric", "engine", "model_engine"):
        return True
    # weighting.backward(losses), self.balancer.backward(loss): a helper object given the loss.
    # A tensor's own `backward(gradient)` is given a gradient, not a loss.
    first = _first_arg(call)
    given = (last_name(first) or "") if first is not None else ""
    return "loss" in given.lower() and "loss" not in name.lower()
