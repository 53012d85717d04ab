"""The grad mode code runs in, once the callers of its function are counted.

A statement outside `torch.no_grad()` still runs without grad when its function (a
hand-written optimizer's `step`, an EMA helper, a weight-conversion utility) is called
from inside a `no_grad` block, possibly in another module. Two questions, for the two
directions a rule can err in: does it surely run without grad (every call site of this
module is in `no_grad`; a `step` method whose callers are unseen is an optimizer's),
and does it surely run with grad (module-level code, a function that backpropagates
itself, a constructor or `forward`, or a call site of this module that records)?
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.frameworks import hook_methods
from gradlint.analysis.facts.steps import EventIndex, Kind
from gradlint.analysis.syntax.collect import Collected, GradMode, Scope
from gradlint.analysis.syntax.names import last_name

# Methods PyTorch code runs with grad enabled: building a module, its forward pass.
# Methods torch runs with autograd as their caller has it: a module's constructor and its forward.
RECORDING_METHODS = frozenset({"__init__", "forward"})
# A hand-written optimizer's step is run under no_grad by its caller, as torch.optim's is.
UNSEEN_CALLER_NO_GRAD_METHODS = frozenset({"step"})


class CallerGradMode:
    """Answers whether a statement surely runs with autograd recording, through its callers too."""

    def __init__(self, collected: Collected, events: EventIndex) -> None:
        self.collected = collected
        self.events = events
        self._call_sites: dict[cst.FunctionDef, list[cst.Call]] | None = None
        self._recording: dict[cst.FunctionDef, bool] = {}
        self._without_grad: dict[cst.FunctionDef, bool] = {}
        self._switched_off_scopes: set[Scope] | None = None
        # Hooks a framework runs with autograd recording, to backpropagate what they compute (training_step).
        self._recording_hooks = frozenset(hook_methods(collected, "backpropagated"))

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this module that run `function`."""
        if self._call_sites is None:
            self._call_sites = self._index_call_sites()
        return self._call_sites.get(function, [])

    def _index_call_sites(self) -> dict[cst.FunctionDef, list[cst.Call]]:
        sites: dict[cst.FunctionDef, list[cst.Call]] = {}
        for call in self.collected.calls:
            helper = self.events.resolve_helper(call) or self.events.resolve_instance_method(call)
            if helper is not None:
                sites.setdefault(helper, []).append(call)
        return sites

    def with_grad(self, node: cst.CSTNode) -> bool:
        """True when the call or statement `node` surely runs with autograd recording."""
        context = self.collected.contexts[node]
        if context.grad_mode is not GradMode.ENABLED:
            return False  # no_grad, or set_grad_enabled(is_train) whose mode is unknown
        switched_off = self.switched_off()
        if self.collected.module in switched_off or context.scope in switched_off:
            return False
        function = context.function
        return function is None or self._function_records(function)

    def switched_off(self) -> set[Scope]:
        """The scopes that turn autograd off by a plain statement, `torch.set_grad_enabled(False)`: it stays off
        until switched back, so nothing after it in the scope surely records."""
        if self._switched_off_scopes is None:
            self._switched_off_scopes = {
                self.collected.contexts[statement].scope
                for statement in self.collected.statements
                if isinstance(statement, cst.Expr) and _switches_grad_off(statement.value)
            }
        return self._switched_off_scopes

    def _function_records(self, function: cst.FunctionDef) -> bool:
        if function in self._recording:
            return self._recording[function]
        self._recording[function] = False  # recursion guard
        backpropagates = any(
            event.kind in (Kind.BACKWARD, Kind.AUTOGRAD_GRAD) for event in self.events.scope_events(function)
        )
        result = (
            backpropagates
            or (function in self.collected.owners and function.name.value in RECORDING_METHODS)
            or function in self._recording_hooks
            or any(self.with_grad(site) for site in self.call_sites(function))
        )
        self._recording[function] = result
        return result

    def without_grad(self, node: cst.CSTNode) -> bool:
        """True when the call or statement `node` never runs with autograd recording."""
        context = self.collected.contexts[node]
        if context.grad_mode is not GradMode.ENABLED:
            return True  # Ex) with torch.set_grad_enabled(is_train): unknown, so assume no grad
        function = context.function
        return function is not None and self._function_without_grad(function)

    def _function_without_grad(self, function: cst.FunctionDef) -> bool:
        if function in self._without_grad:
            return self._without_grad[function]
        self._without_grad[function] = False  # recursion guard
        sites = self.call_sites(function)
        if sites:
            result = all(self.without_grad(site) for site in sites)
        else:
            result = (
                function in self.collected.owners and function.name.value in UNSEEN_CALLER_NO_GRAD_METHODS
            ) or self.unseen_callers_without_grad(function)
        self._without_grad[function] = result
        return result

    def unseen_callers_without_grad(self, function: cst.FunctionDef) -> bool:
        """Whether `function`, which nothing in its module calls, is called only with autograd off where it is
        called: by its class's hierarchy (`hierarchy_without_grad`), or by the other files of the run (an
        `evaluate` that the training script of another module runs inside `with torch.no_grad():`)."""
        if self.hierarchy_without_grad(function):
            return True
        program = self.events.program
        qualname = self.qualname(function)
        return program is not None and qualname is not None and program.callers_without_grad(qualname)

    def qualname(self, function: cst.FunctionDef) -> str | None:
        """`f` or `Class.method` for a function of the module's top level or a method of one of its classes; None
        for a nested one."""
        owner = self.collected.owners.get(function)
        outer = owner if owner is not None else function
        if self.collected.contexts[outer].scope is not self.collected.module:
            return None
        return f"{owner.name.value}.{function.name.value}" if owner is not None else function.name.value

    def hierarchy_without_grad(self, function: cst.FunctionDef) -> bool:
        """Whether `function`, a method, is called by its class or the project classes it derives from (in other
        modules too) only with autograd off: a base class's `@torch.no_grad()` `__call__` that runs
        `self.predict(...)`, a pipeline that runs `self.forward(...)` inside `with torch.no_grad():`."""
        owner = self.collected.owners.get(function)
        program = self.events.program
        return (
            owner is not None
            and program is not None
            and program.method_without_grad(owner.name.value, function.name.value)
        )


def _switches_grad_off(value: cst.BaseExpression) -> bool:
    if not (isinstance(value, cst.Call) and last_name(value.func) == "set_grad_enabled" and value.args):
        return False
    argument = value.args[0].value
    return not (isinstance(argument, cst.Name) and argument.value == "True")
