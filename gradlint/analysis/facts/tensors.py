"""Which expressions are proven torch tensors, and proven one-element ones: the facts fixes rely on.

A rule may report on a likely fact (a name that looks like a loss carries a graph); a
fix must never guess, since `.detach()` on an int raises. An expression is a proven
tensor only when the source shows it:

- a torch function that returns one tensor (`torch.stack`, `F.cross_entropy`), not one
  that returns a tuple, a bool or a number (`torch.chunk`, `torch.is_tensor`);
- a method of a proven tensor that returns a tensor (`out.mean()`), an attribute such as
  `.data` or `.T` of one, an index into one, and arithmetic with one;
- the output of a loss built from a `torch.nn` `*Loss` class or of a `torch.nn` layer
  that returns one tensor, or of a module class of this file whose `forward` returns one;
- what a same-module function returns when each of its returns is a proven tensor;
- a name every reaching definition of which is one of the above;
- a name that `.backward()` is called on (directly or through `scaler.scale(name)`) with
  the same definitions reaching both places: backward would have raised otherwise. Such a
  backward without a `gradient` argument also proves the value has one element.

Everything else (a role guessed from a name, a parameter, a value from another module or
unpacked from a tuple) is unproven.
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.origins import Binding, Definition, Origins
from gradlint.analysis.facts.roles import Role, Roles, constructor_of
from gradlint.analysis.facts.shapes import Shape, Shapes
from gradlint.analysis.facts.steps import EventIndex, Kind
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name

MAX_DEPTH = 8
TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")
# torch functions of those namespaces that return something other than one tensor.
NOT_ONE_TENSOR = frozenset(
    {
        "is_tensor", "is_storage", "is_floating_point", "is_complex", "is_nonzero", "is_grad_enabled", "numel",
        "no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "manual_seed", "seed", "initial_seed",
        "device", "equal", "allclose", "save", "load", "compile", "get_default_dtype", "set_default_dtype",
        "set_printoptions", "use_deterministic_algorithms", "broadcast_shapes", "chunk", "split", "tensor_split",
        "hsplit", "vsplit", "dsplit", "unbind", "meshgrid", "broadcast_tensors", "sort", "topk", "kthvalue",
        "mode", "svd", "qr", "slogdet", "lu", "eig", "eigh", "histogram", "aminmax", "frexp", "std_mean",
        "var_mean", "lobpcg", "unique_consecutive", "grad", "backward", "vmap", "jacobian", "hessian",
    }
)  # fmt: skip
# Return a tuple when given a dimension: one tensor only with a single argument.
TUPLE_WITH_DIM = frozenset({"max", "min", "median", "nanmedian", "unique", "where", "nonzero"})
# Tensor methods whose result is not one tensor.
NOT_TENSOR_METHODS = frozenset(
    {
        "item", "tolist", "numpy", "size", "dim", "numel", "nelement", "data_ptr", "element_size", "stride",
        "get_device", "storage", "untyped_storage", "storage_offset", "backward", "register_hook", "retain_grad",
        "equal", "allclose", "type", "chunk", "split", "tensor_split", "unbind", "sort", "topk", "kthvalue",
        "mode", "aminmax", "__len__", "__repr__", "__str__", "__format__", "apply_", "map_",
    }
)  # fmt: skip
TENSOR_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH", "real", "imag"})
TENSOR_OPERATORS = (
    cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power, cst.MatrixMultiply,
)  # fmt: skip
# torch.nn layers that return a tuple or a structure rather than one tensor.
STRUCTURED_LAYERS = frozenset(
    {"LSTM", "GRU", "RNN", "LSTMCell", "MultiheadAttention", "ModuleList", "ModuleDict", "ParameterList"}
)


class TensorProofs:
    """Answers whether an expression is proven to be a tensor, or a one-element tensor, at a statement."""

    def __init__(
        self, collected: Collected, roles: Roles, events: EventIndex, origins: Origins, shapes: Shapes
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins
        self.shapes = shapes
        self._methods = {(owner, function.name.value): function for function, owner in collected.owners.items()}
        self._returns: dict[cst.FunctionDef, bool] = {}
        self._receivers: dict[Scope, list[tuple[str, cst.CSTNode, bool]]] = {}

    def is_tensor(self, expression: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
        """Whether `expression`, evaluated just before statement `at`, is surely one torch tensor."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expression, (cst.Name, cst.Attribute)) and dotted_name(expression) is not None:
            return self._is_tensor_name(expression, at, depth)
        if isinstance(expression, cst.Attribute):
            return expression.attr.value in TENSOR_ATTRIBUTES and self.is_tensor(expression.value, at, depth + 1)
        if isinstance(expression, cst.Subscript):
            return self.is_tensor(expression.value, at, depth + 1)
        if isinstance(expression, cst.Call):
            return self._is_tensor_call(expression, at, depth)
        if isinstance(expression, cst.BinaryOperation) and isinstance(expression.operator, TENSOR_OPERATORS):
            return any(self.is_tensor(side, at, depth + 1) for side in (expression.left, expression.right))
        if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, (cst.Minus, cst.Plus)):
            return self.is_tensor(expression.expression, at, depth + 1)
        return False

    def is_scalar_tensor(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `expression` is surely a tensor of one element, so `.item()` returns its value."""
        if not self.is_tensor(expression, at):
            return False
        key = dotted_name(expression)
        if key is not None and any(scalar for _, _, scalar in self._receivers_matching(key, at)):
            return True
        return self.shapes.shape(expression, at) is Shape.SCALAR

    def _is_tensor_name(self, node: cst.Name | cst.Attribute, at: cst.CSTNode, depth: int) -> bool:
        key = dotted_name(node)
        assert key is not None
        if self._receivers_matching(key, at):
            return True
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in TENSOR_ATTRIBUTES
            and self.is_tensor(node.value, at, depth + 1)
        ):
            return True
        definitions = self.origins.definitions(key, at)
        return bool(definitions) and all(self._defines_tensor(node, d, depth) for d in definitions)

    def _defines_tensor(self, node: cst.BaseExpression, definition: Definition, depth: int) -> bool:
        if definition.binding is Binding.ASSIGN:
            return self.is_tensor(definition.value, definition.node, depth + 1)
        if definition.binding is Binding.AUGMENT:
            # x += t makes a tensor of a number; a tensor stays one whatever is added
            added = self.is_tensor(definition.value, definition.node, depth + 1)
            return added or self.is_tensor(node, definition.node, depth + 1)
        return False

    def _receivers_matching(self, key: str, at: cst.CSTNode) -> list[tuple[str, cst.CSTNode, bool]]:
        """The backward calls on `key` whose value is the one `key` holds at `at`."""
        scope = self.origins.scope_of(at)
        here = self.origins.definitions(key, at)
        return [
            receiver
            for receiver in self._backward_receivers(scope)
            if receiver[0] == key and self.origins.definitions(key, receiver[1]) == here
        ]

    def _backward_receivers(self, scope: Scope) -> list[tuple[str, cst.CSTNode, bool]]:
        """(name, statement, one element) for each `name.backward(...)` written in `scope`."""
        if scope not in self._receivers:
            found = []
            for event in self.events.scope_events(scope):
                if event.kind is not Kind.BACKWARD or not event.direct:
                    continue
                call = event.node
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                    continue
                key = dotted_name(event.value) if event.value is not None else None
                if key is None or call.func.attr.value != "backward" or _receiver_key(call) != key:
                    continue
                found.append((key, self.collected.statement_of[call], not _has_gradient_argument(call)))
            self._receivers[scope] = found
        return self._receivers[scope]

    def _is_tensor_call(self, call: cst.Call, at: cst.CSTNode, depth: int) -> bool:
        func = call.func
        qualified = self.roles.imports.resolve(func) or ""
        namespace, _, name = qualified.rpartition(".")
        if namespace in TORCH_NAMESPACES and name[:1].islower():
            return _returns_one_tensor(name, call, method=False)
        if isinstance(func, cst.Attribute) and self.is_tensor(func.value, at, depth + 1):
            attribute = func.attr.value
            return attribute not in NOT_TENSOR_METHODS and _returns_one_tensor(attribute, call, method=True)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            return self.returns_tensor(helper)
        return self._is_module_output(func, at)

    def _is_module_output(self, callee: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """`criterion(out, y)` with `criterion = nn.CrossEntropyLoss()`, `layer(x)` with `layer = nn.Linear(...)`."""
        if self.roles.proven_role(callee) not in (Role.MODEL, Role.LOSS_FN):
            return False
        key = dotted_name(callee)
        definitions = self.origins.definitions(key, at) if key else frozenset()
        if definitions and all(d.binding is Binding.ASSIGN for d in definitions):
            constructors = [constructor_of(d.value) for d in definitions]
        else:
            constructors = [*self.roles.constructors(callee)]
        return bool(constructors) and all(self._builds_tensor_module(c) for c in constructors)

    def _builds_tensor_module(self, constructor: cst.Call | None) -> bool:
        if constructor is None:
            return False
        qualified = self.roles.imports.resolve(constructor.func) or ""
        cls = self.roles.classes.get(qualified)
        if cls is not None:
            forward = self._methods.get((cls, "forward"))
            return forward is not None and self.returns_tensor(forward)
        name = qualified.rsplit(".", 1)[-1]
        if not qualified.startswith("torch.nn.") or not name[:1].isupper() or name in STRUCTURED_LAYERS:
            return False
        if name == "Sequential":
            layers = [arg.value for arg in constructor.args]
            return bool(layers) and all(
                isinstance(layer, cst.Call) and self._builds_tensor_module(layer) for layer in layers
            )
        return True

    def returns_tensor(self, function: cst.FunctionDef) -> bool:
        """Whether every `return` of a same-module function returns a proven tensor."""
        if function not in self._returns:
            self._returns[function] = False  # recursion guard
            returns = [s for s in self.collected.statements_in_scope(function) if isinstance(s, cst.Return)]
            proven = bool(returns) and all(r.value is not None and self.is_tensor(r.value, r) for r in returns)
            self._returns[function] = proven
        return self._returns[function]


def _returns_one_tensor(name: str, call: cst.Call, method: bool) -> bool:
    if name in NOT_ONE_TENSOR:
        return False
    if name == "where":  # torch.where(c, a, b) and a.where(c, b); torch.where(c) is a tuple
        return len(call.args) == (2 if method else 3)
    if name in TUPLE_WITH_DIM:
        # torch.max(x) and x.max() are tensors; torch.max(x, 1) and x.max(dim=1) are (values, indices)
        return len(call.args) == (0 if method else 1)
    return True


def _receiver_key(call: cst.Call) -> str | None:
    # loss.backward()  /  scaler.scale(loss).backward()
    assert isinstance(call.func, cst.Attribute)
    receiver = call.func.value
    if isinstance(receiver, cst.Call) and last_name(receiver.func) == "scale" and len(receiver.args) == 1:
        receiver = receiver.args[0].value
    return dotted_name(receiver)


def _has_gradient_argument(call: cst.Call) -> bool:
    # Tensor.backward(gradient=None, retain_graph=None, create_graph=False, inputs=None)
    return any(arg.keyword is None or arg.keyword.value == "gradient" for arg in call.args)
