"""Shape facts: whether a tensor expression is reduced to a scalar, clearly is not, or unknown.

`backward()` without a `gradient` needs a one-element tensor. The facts come from how a
value was made: `.mean()`/`.sum()` without a dim reduce to a scalar; a criterion built
with `reduction="none"` (or `F.mse_loss(..., reduction="none")`) returns one loss per
element; a model built from `torch.nn` layers, or a module of this file whose `forward`
returns such a layer's output, returns a batch; element-wise functions and arithmetic
keep the shape of their tensor operands. Everything else is unknown, and rules stay quiet.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

import libcst as cst

from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.facts.roles import WRAPPERS, Role, Roles, constructor_of
from gradlint.analysis.facts.steps import EventIndex
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name

MAX_DEPTH = 8

REDUCTIONS = frozenset({"mean", "sum", "prod", "norm", "std", "var", "max", "min", "amax", "amin", "nansum", "nanmean"})
ELEMENTWISE = frozenset(
    {
        "abs", "neg", "exp", "log", "log1p", "sqrt", "rsqrt", "pow", "square", "sigmoid", "tanh", "relu", "gelu",
        "silu", "elu", "leaky_relu", "softplus", "softmax", "log_softmax", "dropout", "clamp", "clip", "mul", "add",
        "sub", "div", "float", "double", "half", "bfloat16", "to", "cuda", "cpu", "contiguous", "clone",
        "normalize", "logsigmoid", "erf", "sin", "cos", "reciprocal", "masked_fill", "where",
    }
)  # fmt: skip
# torch.nn.functional losses: their `reduction` keyword decides the shape of the result.
FUNCTIONAL_LOSSES = frozenset({"cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"})
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.Power, cst.FloorDivide, cst.Modulo)
MODEL_LIBRARIES = ("torch.nn.", "nn.", "torchvision.models.", "timm.")
# Modules that return tuples or reshape in ways the source does not show.
# Modules whose output shape depends on more than their construction; wrappers return what they wrap.
SHAPE_UNCLEAR_MODULES = frozenset(
    {"LSTM", "GRU", "RNN", "MultiheadAttention", "Flatten", "Unflatten", "ModuleList", "FullyShardedDataParallel"}
    | WRAPPERS
)
ELEMENTWISE_MODULES = frozenset(
    {
        "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Dropout", "LeakyReLU", "ELU",
        "Identity", "Softplus", "Mish", "Hardtanh", "ReLU6", "PReLU", "BatchNorm1d", "LayerNorm",
    }
)  # fmt: skip
ONE_OUTPUT_KEYWORDS = frozenset({"out_features", "num_classes", "out_channels", "output_size"})


class Shape(Enum):
    """What is known about the number of elements of a tensor expression."""

    SCALAR = "scalar"
    NON_SCALAR = "non-scalar"
    UNKNOWN = "unknown"


def combine(shapes: Iterable[Shape]) -> Shape:
    """The shape of an element-wise result: broadcasting never reduces a batch."""
    found = set(shapes)
    if Shape.NON_SCALAR in found:
        return Shape.NON_SCALAR
    return Shape.SCALAR if found == {Shape.SCALAR} else Shape.UNKNOWN


def agree(shapes: Iterable[Shape]) -> Shape:
    """The shape every alternative has, or UNKNOWN when they differ."""
    found = set(shapes)
    return found.pop() if len(found) == 1 else Shape.UNKNOWN


class Shapes:
    """Answers whether an expression is a scalar at a statement, from how its value was made."""

    def __init__(self, collected: Collected, roles: Roles, events: EventIndex, origins: Origins) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins
        self._methods = {(owner, function.name.value): function for function, owner in collected.owners.items()}
        self._returns: dict[cst.FunctionDef, Shape] = {}

    def shape(self, expression: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> Shape:
        """The shape of `expression` evaluated just before statement `at`."""
        if depth > MAX_DEPTH:
            return Shape.UNKNOWN
        if isinstance(expression, (cst.Integer, cst.Float)):
            return Shape.SCALAR
        if isinstance(expression, (cst.Name, cst.Attribute)):
            return self._shape_of_name(expression, at, depth)
        if isinstance(expression, cst.Call):
            return self._shape_of_call(expression, at, depth)
        if isinstance(expression, cst.BinaryOperation) and isinstance(expression.operator, ARITHMETIC):
            return combine(self.shape(side, at, depth + 1) for side in (expression.left, expression.right))
        if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Minus):
            return self.shape(expression.expression, at, depth + 1)
        return Shape.UNKNOWN

    def _shape_of_name(self, node: cst.Name | cst.Attribute, at: cst.CSTNode, depth: int) -> Shape:
        key = dotted_name(node)
        if key is None:
            return Shape.UNKNOWN
        shapes = []
        for definition in self.origins.definitions(key, at):
            if definition.binding is Binding.ASSIGN:
                shapes.append(self.shape(definition.value, definition.node, depth + 1))
            elif definition.binding is Binding.AUGMENT:
                before = self.shape(node, definition.node, depth + 1)
                shapes.append(combine([before, self.shape(definition.value, definition.node, depth + 1)]))
            else:
                return Shape.UNKNOWN
        return agree(shapes)

    def _shape_of_call(self, call: cst.Call, at: cst.CSTNode, depth: int) -> Shape:
        func = call.func
        name = last_name(func) or ""
        qualified = self.roles.imports.resolve(func) or ""
        if isinstance(func, cst.Attribute) and not qualified.startswith("torch."):
            return self._shape_of_method(call, func, at, depth)
        if qualified.startswith("torch."):
            return self._shape_of_torch_function(call, name, at, depth)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            return self.returned_shape(helper)
        return self._shape_of_module_call(func, at)

    def _shape_of_method(self, call: cst.Call, func: cst.Attribute, at: cst.CSTNode, depth: int) -> Shape:
        # Ex) out.mean()  /  per_sample.sum(dim=1)  /  logits.float()  /  model.forward(x)
        method = func.attr.value
        if method in REDUCTIONS:
            return Shape.SCALAR if not call.args else Shape.UNKNOWN
        if method in ELEMENTWISE:
            return self.shape(func.value, at, depth + 1)
        if method == "forward":
            return self._shape_of_module_call(func.value, at)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            return self.returned_shape(helper)
        return self._shape_of_module_call(func, at)

    def _shape_of_torch_function(self, call: cst.Call, name: str, at: cst.CSTNode, depth: int) -> Shape:
        # Ex) torch.mean(x)  /  F.mse_loss(pred, y, reduction="none")  /  torch.sigmoid(logits)
        positional = [arg.value for arg in call.args if arg.keyword is None]
        if name in REDUCTIONS:
            return Shape.SCALAR if len(call.args) == 1 and positional else Shape.UNKNOWN
        if name.endswith("_loss") or name in FUNCTIONAL_LOSSES:
            return Shape.NON_SCALAR if _reduces_nothing(call) else Shape.SCALAR
        if name in ELEMENTWISE and positional:
            return self.shape(positional[0], at, depth + 1)
        return Shape.UNKNOWN

    def _shape_of_module_call(self, callee: cst.BaseExpression, at: cst.CSTNode) -> Shape:
        # Ex) criterion(out, y) with criterion = nn.L1Loss(reduction="none")  /  model(x), self.head(h)
        if isinstance(callee, cst.Name) and callee.value == "self":
            return Shape.UNKNOWN
        role = self.roles.role(callee)
        if role not in (Role.LOSS_FN, Role.MODEL):
            return Shape.UNKNOWN
        constructors = self._constructors(callee, at)
        if not constructors:
            return Shape.UNKNOWN
        return agree(self._shape_of_constructed(constructor, role) for constructor in constructors)

    def _constructors(self, callee: cst.BaseExpression, at: cst.CSTNode) -> list[cst.Call | None]:
        """What built the callee: its assignments that reach `at`, else any in the module (`self.fc`)."""
        key = dotted_name(callee)
        definitions = self.origins.definitions(key, at) if key else frozenset()
        if definitions and all(definition.binding is Binding.ASSIGN for definition in definitions):
            return [constructor_of(definition.value) for definition in definitions]
        return list(self.roles.constructors(callee))

    def _shape_of_constructed(self, constructor: cst.Call | None, role: Role) -> Shape:
        if constructor is None:
            return Shape.UNKNOWN
        # What built it decides, not the role: `criterion: nn.Module` may hold an nn.CrossEntropyLoss.
        if (last_name(constructor.func) or "").endswith("Loss"):
            return Shape.NON_SCALAR if _reduces_nothing(constructor) else Shape.SCALAR
        if role is Role.LOSS_FN:
            return Shape.UNKNOWN
        qualified = self.roles.imports.resolve(constructor.func) or ""
        if qualified in self.roles.redefined:
            return Shape.UNKNOWN
        cls = self.roles.classes.get(qualified)
        if cls is not None:
            forward = self._methods.get((cls, "forward"))
            return self.returned_shape(forward) if forward is not None else Shape.UNKNOWN
        return self._shape_of_library_model(constructor, qualified)

    def _shape_of_library_model(self, constructor: cst.Call, qualified: str) -> Shape:
        # Ex) nn.Linear(64, 10)  /  nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        name = qualified.rsplit(".", 1)[-1]
        if not qualified.startswith(MODEL_LIBRARIES) or not name[:1].isupper() or name in SHAPE_UNCLEAR_MODULES:
            return Shape.UNKNOWN
        if name == "Sequential":
            layers = [arg.value for arg in constructor.args if arg.keyword is None and isinstance(arg.value, cst.Call)]
            shaping = [layer for layer in layers if last_name(layer.func) not in ELEMENTWISE_MODULES]
            if not shaping or len(layers) < len(constructor.args):
                return Shape.UNKNOWN  # empty, or built from a list or variables
            return self._shape_of_library_model(shaping[-1], self.roles.imports.resolve(shaping[-1].func) or "")
        # One output unit gives one element for an unbatched input (a single RL state).
        return Shape.UNKNOWN if _one_output(constructor) else Shape.NON_SCALAR

    def returned_shape(self, function: cst.FunctionDef) -> Shape:
        """The shape every `return` of a same-module function agrees on."""
        if function not in self._returns:
            self._returns[function] = Shape.UNKNOWN  # recursion guard
            returns = [
                statement
                for statement in self.collected.statements_in_scope(function)
                if isinstance(statement, cst.Return)
            ]
            shapes = [self.shape(r.value, r) if r.value is not None else Shape.UNKNOWN for r in returns]
            self._returns[function] = agree(shapes) if shapes else Shape.UNKNOWN
        return self._returns[function]


def _one_output(constructor: cst.Call) -> bool:
    """`nn.Linear(64, 1)`, `resnet18(num_classes=1)`: a single output unit."""
    positional = [arg.value for arg in constructor.args if arg.keyword is None]
    keywords = {arg.keyword.value: arg.value for arg in constructor.args if arg.keyword is not None}
    candidates = [value for key, value in keywords.items() if key in ONE_OUTPUT_KEYWORDS]
    if last_name(constructor.func) in ("Linear", "LazyLinear", "Bilinear") and positional:
        candidates.append(positional[-1])
    return any(isinstance(value, cst.Integer) and value.value == "1" for value in candidates)


def _reduces_nothing(call: cst.Call) -> bool:
    # reduction="none", or the legacy reduce=False
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "reduction" and isinstance(arg.value, cst.SimpleString):
            return arg.value.evaluated_value == "none"
        if keyword == "reduce" and isinstance(arg.value, cst.Name):
            return arg.value.value == "False"
    return False
