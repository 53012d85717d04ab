"""Values provably computed while autograd was off, so they can never have a `grad_fn`.

A value has no history when the statement that computed it ran under `torch.no_grad()`
or `inference_mode()` (a `with` block or a decorated function), when it comes from a
same-module helper decorated that way, or when it is computed with grad enabled but
only from such values and plain data (batches from a loop, literals). Computing means
more than naming: `loss = outputs.loss` inside `no_grad` only renames a value made
elsewhere, so the name's own origin decides.
"""

from __future__ import annotations

from enum import Enum

import libcst as cst

from gradlint.analysis.facts.origins import OUTSIDE, Binding, Definition, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import EventIndex
from gradlint.analysis.syntax.collect import Collected, GradMode, grad_mode_of
from gradlint.analysis.syntax.names import dotted_name, last_name

MAX_DEPTH = 8
# Calls that move or reshape a batch without giving it history.
DATA_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "long", "double", "half", "view", "reshape", "unsqueeze", "squeeze", "type"}
)

# Parameters that hold a batch or its parts (Lightning's `training_step(self, batch, batch_idx)`).
DATA_PARAMETERS = frozenset(
    {"batch", "batch_idx", "inputs", "targets", "target", "labels", "label", "images", "data", "sample", "samples"}
)


class Operand(Enum):
    """What an input of a computation is known to be."""

    NO_GRAD = "computed with autograd off"
    DATA = "a batch or a constant"
    UNKNOWN = "unknown"


class NoGradValues:
    """Answers whether an expression's value was computed without autograd recording it."""

    def __init__(self, collected: Collected, roles: Roles, events: EventIndex, origins: Origins) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins

    def computed_without_grad(self, expression: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
        """True when `expression`, evaluated just before statement `at`, provably has no graph."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expression, (cst.Name, cst.Attribute)):
            key = dotted_name(expression)
            definitions = self.origins.definitions(key, at) if key else frozenset()
            return bool(definitions) and all(self._defined_without_grad(d, depth + 1) for d in definitions)
        context = self.collected.contexts.get(at)
        if context is not None and context.no_grad:
            return True  # a computation (not a mere name) made with autograd off
        return self._derived_without_grad(expression, at, depth + 1)

    def _defined_without_grad(self, definition: Definition, depth: int) -> bool:
        if definition.binding is not Binding.ASSIGN:
            return False  # unpacked, augmented, looped over or from outside: not known
        return self.computed_without_grad(definition.value, definition.node, depth)

    def _derived_without_grad(self, expression: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        # Ex) loss = criterion(out, y) where `out` came from a no_grad block and `y` from the loader
        if isinstance(expression, cst.Call) and self._runs_without_grad(expression):
            return True
        operands = self._operands(expression)
        if operands is None:
            return False
        kinds = [self._operand(operand, at, depth) for operand in operands]
        return Operand.NO_GRAD in kinds and Operand.UNKNOWN not in kinds

    def _operand(self, operand: cst.BaseExpression, at: cst.CSTNode, depth: int) -> Operand:
        if self.computed_without_grad(operand, at, depth):
            return Operand.NO_GRAD
        return Operand.DATA if self._is_data(operand, at, depth) else Operand.UNKNOWN

    def _runs_without_grad(self, call: cst.Call) -> bool:
        # A same-module helper decorated with @torch.no_grad() returns values without history.
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        return helper is not None and any(
            grad_mode_of(decorator.decorator, self.collected.disabling) is GradMode.DISABLED
            for decorator in helper.decorators
        )

    def _is_pure(self, expression: cst.BaseExpression) -> bool:
        """Whether a call's result has history only through its inputs (no parameters of its own)."""
        if not isinstance(expression, cst.Call):
            return isinstance(expression, (cst.BinaryOperation, cst.UnaryOperation))
        func = expression.func
        if (self.roles.imports.resolve(func) or "").startswith("torch."):
            return True
        if isinstance(func, cst.Attribute) and self.roles.role(func.value) is None:
            return True  # a tensor method: out.mean(), diff.pow(2)
        return self.roles.role(func) is Role.LOSS_FN and all(
            (last_name(constructor.func) or "").endswith("Loss") for constructor in self.roles.constructors(func)
        )

    def _operands(self, expression: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        """The tensor inputs of a pure computation, or None when it is not one."""
        if not self._is_pure(expression):
            return None
        if isinstance(expression, cst.BinaryOperation):
            return [expression.left, expression.right]
        if isinstance(expression, cst.UnaryOperation):
            return [expression.expression]
        if not isinstance(expression, cst.Call):
            return None
        arguments = [arg.value for arg in expression.args if arg.keyword is None]
        func = expression.func
        if isinstance(func, cst.Attribute) and not (self.roles.imports.resolve(func) or "").startswith("torch."):
            return [func.value, *arguments]  # a tensor method: its receiver is an input too
        return arguments

    def _is_data(self, expression: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        """Whether `expression` is a batch or constant, with no autograd history of its own."""
        if isinstance(expression, (cst.Integer, cst.Float, cst.SimpleString)):
            return True
        if depth > MAX_DEPTH:
            return False
        if isinstance(expression, cst.Subscript):
            return self._is_data(expression.value, at, depth + 1)
        if isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute):
            return expression.func.attr.value in DATA_METHODS and self._is_data(expression.func.value, at, depth + 1)
        key = dotted_name(expression)
        definitions = self.origins.definitions(key, at) if key else frozenset()
        if OUTSIDE in definitions and not self._is_data_parameter(key, at):
            return False
        return bool(definitions) and all(d is OUTSIDE or self._defines_data(d, depth + 1) for d in definitions)

    def _is_data_parameter(self, key: str | None, at: cst.CSTNode) -> bool:
        """A parameter that holds data: named so (`batch`, `targets`) or defaulting to a literal (`t=4.0`)."""
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        if function is None:
            return False
        params = (*function.params.params, *function.params.kwonly_params)
        return any(
            param.name.value == key
            and (key in DATA_PARAMETERS or isinstance(param.default, (cst.Integer, cst.Float, cst.SimpleString)))
            for param in params
        )

    def _defines_data(self, definition: Definition, depth: int) -> bool:
        if definition.binding is Binding.LOOP:
            # Ex) for x, y in loader: the items of a loader, not of a list of outputs
            iterated = definition.value
            return isinstance(iterated, (cst.Name, cst.Attribute, cst.Call)) and not self._is_output_list(iterated)
        if definition.binding in (Binding.ASSIGN, Binding.UNPACK):
            return self._is_data(definition.value, definition.node, depth)
        return False

    def _is_output_list(self, iterated: cst.BaseExpression) -> bool:
        name = last_name(iterated.func if isinstance(iterated, cst.Call) else iterated) or ""
        return self.roles.role(iterated) in (Role.MODEL, Role.LOSS_FN) or any(
            word in name.lower() for word in ("out", "pred", "logit", "loss", "param")
        )
