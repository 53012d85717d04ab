"""Which calls run a model's forward pass, as opposed to building or fetching a module.

A forward call is a call of something that holds a model (`model(x)`,
`self.encoder(x)`, `model.forward(x)`, `self(x)` inside an `nn.Module`). Calls that
build a module (`Net().to(device)`, `nn.Linear(4, 2)`) or fetch one
(`accelerator.unwrap_model(model)`, `AutoModel.from_pretrained(...)`) are not, even
when the name guess in `roles` calls them models.
"""

from __future__ import annotations

import re

import libcst as cst

from gradlint.analysis.facts.roles import MODULE_PASSTHROUGH, Role, Roles
from gradlint.analysis.facts.steps import EventIndex
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name

ACCESSOR = re.compile(r"_*(from|get|unwrap|build|load|create|make|init|wrap|prepare|setup|copy|deepcopy)_\w+")


def constructs(call: cst.Call, roles: Roles) -> bool:
    """True for `Net()`, `nn.Linear(4, 2)`, `Net().to(device)`: a class called, maybe moved. A capital
    letter only breaks the tie: a callee proven to hold a module (`self.G = Generator()`, then `self.G(z)`),
    or one that every assignment binds to what a call returned (`self.G = nn.DataParallel(net.Generator(c))`),
    is run, not built."""
    base: cst.BaseExpression = call
    while (
        isinstance(base, cst.Call)
        and isinstance(base.func, cst.Attribute)
        and base.func.attr.value in MODULE_PASSTHROUGH
    ):
        base = base.func.value
    if not isinstance(base, cst.Call):
        return False
    name = last_name(base.func)
    if name is None or not name[:1].isupper() or roles.proven_role(base.func) is Role.MODEL:
        return False
    # Ex) self.G = Generator(config), then self.G(z): what every assignment gave it is an object a call made, so
    # calling it runs that object; a class is bound by name (`block = Bottleneck`), not by a call.
    key = dotted_name(base.func)
    values = roles.values_of(key) if key is not None else []
    return not values or not all(isinstance(value, cst.Call) for value in values)


def fetches_module(call: cst.Call) -> bool:
    """True for accessors that hand back a module rather than run it: `unwrap_model(m)`."""
    name = last_name(call.func)
    return name is not None and ACCESSOR.fullmatch(name) is not None


class ForwardCalls:
    """Answers whether a call runs a model's forward pass."""

    def __init__(self, collected: Collected, roles: Roles, events: EventIndex) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events

    def is_forward(self, call: cst.Call) -> bool:
        """True for `model(x)`, `self.encoder(x)`, `model.forward(x)`, `self(x)` in a module class."""
        if constructs(call, self.roles) or fetches_module(call):
            return False
        if call in self.collected.contexts and (
            self.events.resolve_helper(call) is not None or self.events.runs_project_function(call)
        ):
            # A function of the project (`_make_encoder(...)`, a method a base class in another module
            # defines: `self._auto_save_model_if_necessary()`), not a module's forward, whatever its name.
            return False
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        if isinstance(func, cst.Name) and func.value == "self":
            context = self.collected.contexts.get(call)
            owner = context.class_def if context is not None else None
            return owner is not None and self.roles.is_model_class(owner)
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return False
        return self.roles.runs_model(func, call)
