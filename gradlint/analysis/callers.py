"""Whether code runs without autograd once the callers of its function are taken into account.

A statement outside `torch.no_grad()` may still run without grad: its function (a
hand-written optimizer's `update`, an EMA helper) is only ever called from inside a
`no_grad` block of the same module. A `step` method whose callers cannot be seen is
a hand-written optimizer's step, which its caller runs under `no_grad` as torch's own
optimizers do.
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.collect import Collected, GradMode
from gradlint.analysis.steps import EventIndex

UNSEEN_CALLER_NO_GRAD_METHODS = frozenset({"step"})


class CallerGradMode:
    """Answers whether a statement runs with autograd disabled, through its callers too."""

    def __init__(self, collected: Collected, events: EventIndex) -> None:
        self.collected = collected
        self.events = events
        self._call_sites: dict[cst.FunctionDef, list[cst.Call]] | None = None
        self._without_grad: dict[cst.FunctionDef, bool] = {}

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this module that run `function` (directly or passed by name)."""
        if self._call_sites is None:
            self._call_sites = self._index_call_sites()
        return self._call_sites.get(function, [])

    def _index_call_sites(self) -> dict[cst.FunctionDef, list[cst.Call]]:
        sites: dict[cst.FunctionDef, list[cst.Call]] = {}
        for call in self.collected.calls:
            helper = self.events.resolve_helper(call)
            if helper is not None:
                sites.setdefault(helper, []).append(call)
        return sites

    def without_grad(self, node: cst.CSTNode) -> bool:
        """True when the call or statement `node` never runs with autograd recording."""
        context = self.collected.contexts[node]
        if context.grad_mode is not GradMode.ENABLED:
            # Ex) with torch.set_grad_enabled(is_train): the mode is unknown, so assume no grad.
            return True
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
            result = function in self.collected.owners and function.name.value in UNSEEN_CALLER_NO_GRAD_METHODS
        self._without_grad[function] = result
        return result
