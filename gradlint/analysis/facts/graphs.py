"""The autograd graph behind a value: what it was computed from and what backward saved of it.

The value a name holds at a statement is the one assignment that reaches it (see
`origins`); where several may, nothing is assumed. A value requires grad when it carries
a graph (see `values`) or is computed from a leaf that requires grad (see `leaves`).
An operation saves a tensor for backward when its derivative needs it: `exp`,
`sigmoid`, `tanh`, `relu`, `softmax` save their output; `log`, `pow`, `sin`, a layer
call and a product with another tensor that requires grad save their input. Changing
a saved tensor in place makes backward raise. A view shares what it views (`h[0]`,
`h.t()`), a copy does not (`h[mask]`, `h[idx]` with a tensor index); a container (a
dict of outputs) is never saved itself. A name bound to another name (`p = y`) is the
same tensor, saved if that one is; an unnamed result (`torch.sigmoid(h)` handed straight
to an in-place layer) is saved when the operation that made it saves its output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise

import libcst as cst

from gradlint.analysis.facts.dtypes import DtypeKind, TensorDtypes
from gradlint.analysis.facts.leaves import Leaves, is_container, is_leaf_value, parameter_names
from gradlint.analysis.facts.mutations import inplace_layer
from gradlint.analysis.facts.origins import OUTSIDE, Binding, Definition, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.values import (
    DETACHING_METHODS,
    NON_GRAD_ATTRIBUTES,
    NON_GRAD_BUILTINS,
    NON_GRAD_TORCH,
    GradValues,
)
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name
from gradlint.analysis.syntax.refs import all_params, arguments_of
from gradlint.analysis.syntax.tree import children, descendants

# Checked against torch 2.13: changing the result in place, then backward, raises.
SAVES_OUTPUT = frozenset(
    {
        "exp", "exp_", "exp2", "expm1", "sigmoid", "sigmoid_", "tanh", "tanh_", "relu", "relu_", "softmax",
        "log_softmax", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "reciprocal", "reciprocal_", "norm", "prod", "tan",
        "cdist", "pdist", "logsumexp", "std", "softmin",
    }
)  # fmt: skip
# Checked against torch 2.13: changing the argument in place, then backward, raises.
SAVES_INPUT = frozenset(
    {
        "log", "log1p", "log2", "log10", "sin", "cos", "asin", "acos", "atan", "sinh", "cosh", "pow",
        "square", "abs", "clamp", "clip", "gelu", "silu", "elu", "selu", "celu", "leaky_relu", "softplus",
        "hardtanh", "hardsigmoid", "logsigmoid", "mish", "erf", "normalize", "layer_norm", "group_norm",
        "batch_norm", "linear", "conv1d", "conv2d", "conv3d", "norm", "prod", "cumprod", "gather",
    }
)  # fmt: skip
# Save their input as a full reduction (`y.max()`), only indices along a dimension (`y.max(1)`, `torch.min(y, dim=0)`).
EXTREMES = frozenset({"max", "min"})
# Saves an argument only when another argument requires grad (the product rule).
SAVES_INPUT_IF_OTHER = frozenset({"mul", "matmul", "mm", "bmm", "einsum", "outer", "dot"})
# Modules whose forward saves its output (as the functions above do), or neither output nor input.
OUTPUT_SAVING_MODULES = frozenset({"Sigmoid", "Tanh", "ReLU", "Softmax", "LogSoftmax"})
# ...and those that save their output only when built to work in place (`nn.LeakyReLU(0.2, inplace=True)`).
OUTPUT_SAVING_IN_PLACE = frozenset({"LeakyReLU", "ELU", "SELU", "CELU", "RReLU"})
NOTHING_SAVING_MODULES = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Identity", "Flatten", "Unflatten"})
# torch.nn layers that save their input for their own weight's gradient, whatever the input carries.
WEIGHT_INPUT_LAYERS = frozenset(
    {"Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}
)
# What reading a tensor's attribute or calling its method learns of its shape, type or place, not its values.
METADATA = frozenset(
    {"shape", "size", "dim", "ndim", "ndimension", "numel", "device", "dtype", "is_cuda", "layout"}
    | {"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
)
# Wrappers that return the module they are given (`nn.utils.weight_norm(conv)`).
MODULE_WRAPPERS = frozenset({"weight_norm", "spectral_norm"})
VIEWS = frozenset({"view", "reshape", "transpose", "permute", "squeeze", "unsqueeze", "flatten", "t", "expand"})
# Functions that return several views of their input (`a, b = h.chunk(2)`).
MULTI_VIEWS = frozenset({"chunk", "split", "tensor_split", "unbind", "hsplit", "vsplit", "dsplit"})
MAX_DEPTH = 8


@dataclass(frozen=True)
class View:
    """The tensor a view shares its storage with, and the call that split it into several views, if one did
    (`h.chunk(2)`: changing one of those in place raises at once while `h` requires grad)."""

    base: cst.BaseExpression
    split: cst.Call | None


class Graphs:
    """Answers what a value was computed from, whether it requires grad, and whether it was saved."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        values: GradValues,
        leaves: Leaves,
        origins: Origins,
        call_sites: Callable[[cst.FunctionDef], list[cst.Call]] = lambda function: [],
        saved_elsewhere: Callable[[str], bool] | None = None,
        dtypes: TensorDtypes | None = None,
    ) -> None:
        self.collected = collected
        self.dtypes = dtypes  # an integer or bool tensor never requires grad, whatever it was computed from
        # Whether the project class of another module a dotted name refers to returns a saved output from its
        # forward (`ModuleProgram.saves_output`); None without the whole program.
        self.saved_elsewhere = saved_elsewhere
        self._class_saves: dict[str, bool] = {}  # top-level classes of this module: whether forward returns one
        # The calls of this module that run a function (`callers.CallerGradMode.call_sites`).
        self.call_sites = call_sites
        self._passed: dict[tuple[str, cst.FunctionDef], bool] = {}  # parameters proven to be given a graph
        self._layers_in: dict[cst.CSTNode, list[tuple[int, cst.CSTNode, cst.Call]]] | None = None
        self.origins = origins
        self.roles = roles
        self.values = values
        self.leaves = leaves
        self._depth = 0

    def definition(self, key: str, at: cst.CSTNode) -> cst.Assign | cst.AnnAssign | None:
        """The one plain assignment of `key` that reaches statement `at`, if there is exactly one."""
        definitions = self.origins.definitions(key, at)
        if len(definitions) != 1:
            return None
        (definition,) = definitions
        if definition.binding is not Binding.ASSIGN or not isinstance(definition.node, (cst.Assign, cst.AnnAssign)):
            return None
        return definition.node

    def requires_grad(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """True when `expression`, just before statement `at`, is a tensor that autograd tracks."""
        if self.collected.contexts[at].no_grad or self._depth > MAX_DEPTH:
            return False
        if self.dtypes is not None and self.dtypes.dtype_of(expression, at) is DtypeKind.INTEGRAL:
            return False  # Ex) xy = xy.to(torch.int32): integer coordinates, whatever they were computed from
        if self.values.is_grad(expression, at):
            return True
        self._depth += 1
        try:
            return any(self._operand_requires_grad(operand, at) for operand in self.operands(expression))
        finally:
            self._depth -= 1

    def may_carry_graph(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """False only when `expression` provably has no graph behind it: constants, data, fresh leaves."""
        if self.collected.contexts[at].no_grad or is_leaf_value(expression):
            return False
        if self.requires_grad(expression, at):
            return True
        return any(isinstance(node, cst.Call) and self._may_compute_graph(node) for node in descendants(expression))

    def _may_compute_graph(self, call: cst.Call) -> bool:
        # Ex) self.trunk(x), encode(batch): an unknown callable may run a forward pass
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in DETACHING_METHODS:
            return False
        if isinstance(func, cst.Name) and func.value in NON_GRAD_BUILTINS:
            return False
        qualified = self.roles.imports.resolve(func) or ""
        return not (qualified.startswith("torch.") and last_name(func) in NON_GRAD_TORCH)

    def _operand_requires_grad(self, operand: cst.Name | cst.Attribute, at: cst.CSTNode) -> bool:
        if self.leaves.is_leaf(operand, at):
            return True
        key = dotted_name(operand)
        definition = self.definition(key, at) if key is not None else None
        if definition is None and isinstance(operand, cst.Name):
            return self._passed_requiring_grad(operand.value, at)
        return (
            definition is not None and definition.value is not None and self.requires_grad(definition.value, definition)
        )

    def _passed_requiring_grad(self, name: str, at: cst.CSTNode) -> bool:
        """Whether the parameter `name` of the function holding `at`, still as given, requires grad: the module calls
        the function, and every call passes it a value that requires grad there (`self._partial(d * self.w)`)."""
        function = self.collected.contexts[at].function
        if function is None or self.origins.definitions(name, at) != (OUTSIDE,) or name not in all_params(function):
            return False
        key = (name, function)
        if key not in self._passed:
            self._passed[key] = False  # asked again from inside its own calls (recursion): not proven
            sites = self.call_sites(function)
            passed = [(arguments_of(function, site).get(name), site) for site in sites]
            self._passed[key] = bool(passed) and all(
                value is not None
                and site in self.collected.statement_of
                and self.requires_grad(value, self.collected.statement_of[site])
                for value, site in passed
            )
        return self._passed[key]

    def operands(self, expression: cst.CSTNode) -> Iterator[cst.Name | cst.Attribute]:
        """The names and attributes whose values flow into `expression` (callees and detached parts excluded)."""
        if isinstance(expression, (cst.Name, cst.Attribute)):
            if isinstance(expression, cst.Attribute) and expression.attr.value in NON_GRAD_ATTRIBUTES:
                return
            if dotted_name(expression) is not None:
                yield expression
                return
        if isinstance(expression, cst.Call):
            yield from self._call_operands(expression)
            return
        if isinstance(expression, cst.Subscript):
            yield from self.operands(expression.value)
            return
        if isinstance(expression, (cst.Comparison, cst.Lambda, cst.BaseString)):
            return
        for child in children(expression):
            yield from self.operands(child)

    def _call_operands(self, call: cst.Call) -> Iterator[cst.Name | cst.Attribute]:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in DETACHING_METHODS:
            return
        qualified = self.roles.imports.resolve(func) or ""
        if qualified.startswith("torch.") and last_name(func) in NON_GRAD_TORCH:
            return
        if isinstance(func, cst.Attribute) and not self._is_namespace(func.value):
            yield from self.operands(func.value)  # the receiver of a method: out.mean()
        for arg in call.args:
            yield from self.operands(arg.value)

    def tensors_of(self, expression: cst.BaseExpression) -> Iterator[cst.Name | cst.Attribute]:
        """The named tensors `expression` is plain tensor arithmetic on: `out` in `out[0].sum() / n`.

        Calls of functions, layers and models (`criterion(model(x), y)`) are not followed.
        """
        if isinstance(expression, (cst.Name, cst.Attribute)) and dotted_name(expression) is not None:
            yield expression
        elif isinstance(expression, cst.Subscript):
            yield from self.tensors_of(expression.value)
        elif isinstance(expression, cst.UnaryOperation):
            yield from self.tensors_of(expression.expression)
        elif isinstance(expression, cst.BinaryOperation):
            yield from self.tensors_of(expression.left)
            yield from self.tensors_of(expression.right)
        elif isinstance(expression, (cst.List, cst.Tuple)):
            for element in expression.elements:
                yield from self.tensors_of(element.value)
        elif (
            isinstance(expression, cst.Call)
            and isinstance(expression.func, cst.Attribute)
            and not self._is_namespace(expression.func.value)
        ):
            yield from self.tensors_of(expression.func.value)  # a tensor method: out.sum()

    def _is_namespace(self, node: cst.BaseExpression) -> bool:
        # torch.exp(x), F.relu(x), self.fc(x), model(x): the callee's owner is no operand
        key = dotted_name(node)
        if key is None:
            return False
        head = key.split(".")[0]
        return head in self.roles.imports.aliases or head == "self" or self.roles.role(node) is Role.MODEL

    def sources(self, expression: cst.BaseExpression, at: cst.CSTNode) -> dict[str, cst.CSTNode | None]:
        """Every name `expression` is computed from, through earlier assignments, with its definition."""
        found: dict[str, cst.CSTNode | None] = {}
        pending = [(operand, at) for operand in self.operands(expression)]
        while pending:
            operand, where = pending.pop()
            key = dotted_name(operand)
            if key is None or key in found:
                continue
            definition = self.definition(key, where)
            found[key] = definition
            if definition is not None and definition.value is not None:
                pending.extend((inner, definition) for inner in self.operands(definition.value))
        return found

    def view_base(self, target: cst.BaseExpression, at: cst.CSTNode) -> View | None:
        """The tensor whose storage `target` shares at statement `at`, when `target` is a view of another one: `h`
        for `h[:, :4]`, `h.t()`, `top` bound from `h[:, :4]`, or `a` of `a, b = h.chunk(2)`; None otherwise."""
        node, statement, moved = target, at, False
        split: cst.Call | None = None
        for _ in range(MAX_DEPTH):
            inner = self._viewed(node)
            if inner is not None:
                node, moved = inner, True
                continue
            key = dotted_name(node)
            definitions = self.origins.definitions(key, statement) if key is not None else ()
            if len(definitions) > 1:
                return self._split_on_a_path(definitions)
            if len(definitions) != 1:
                break
            (definition,) = definitions
            value = definition.value
            if definition.binding is Binding.ASSIGN and self._viewed(value) is not None:
                node, statement = value, definition.node
            elif (
                definition.binding is Binding.UNPACK
                and isinstance(value, cst.Call)
                and (base := self._viewed(value, MULTI_VIEWS)) is not None
            ):
                node, statement, moved, split = base, definition.node, True, value
                break  # the views of a computed tensor (`self.to_qkv(x).chunk(3)`) share its storage too
            else:
                break
        return View(node, split) if moved and (dotted_name(node) is not None or split is not None) else None

    def _split_on_a_path(self, definitions: Iterable[Definition]) -> View | None:
        """The views of a split that one of several bindings reaching a name makes (`if self_attn: q, k, v =
        proj(x).split(d)` / `else: q = self.q_proj(x)`): on the path through that binding, changing the name in
        place changes one of them. Any other view is left to a single binding, which says which tensor it is."""
        if self._depth > MAX_DEPTH:
            return None
        self._depth += 1
        try:
            for definition in definitions:
                value = definition.value
                if definition.binding is Binding.UNPACK and isinstance(value, cst.Call):
                    base = self._viewed(value, MULTI_VIEWS)
                    if base is not None:
                        return View(base, value)
                elif definition.binding is Binding.ASSIGN and value is not None and self._viewed(value) is not None:
                    found = self.view_base(value, definition.node)
                    if found is not None and found.split is not None:
                        return found
            return None
        finally:
            self._depth -= 1

    def _viewed(self, node: cst.BaseExpression, names: frozenset[str] = VIEWS) -> cst.BaseExpression | None:
        """What `node` is a view of (`names`: the view functions to count): `h` for `h[0]`, `h.t()`, and for torch's
        function forms, `torch.transpose(h, 0, 1)` or `torch.chunk(h, 2)`, whose tensor is the first argument."""
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return _viewed(node) if names is VIEWS else None
        qualified = self.roles.imports.resolve(node.func) or ""
        if qualified.startswith("torch."):  # a function of torch's namespace, not a method of a tensor
            positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
            return positional[0] if qualified.rsplit(".", 1)[-1] in names and positional else None
        return node.func.value if node.func.attr.value in names else None

    def saved_for_backward(self, target: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """True when the tensor `target` names at statement `at` requires grad and an op saved it."""
        if isinstance(target, cst.Call):
            # Ex) self.drop(torch.sigmoid(h)) with an in-place dropout: the unnamed result is changed at once
            return self._returns_saved_output(target, at)
        key = dotted_name(target)
        definition = self._created_by(key, at) if key is not None else None
        if key is not None and self._saved_by_a_layer(key, definition, at):
            return True  # Ex) y = self.conv(x); x += y: the convolution kept `x` for its weight's gradient
        if key is None or definition is None or definition.value is None:
            return False
        value = definition.value
        if dotted_name(value) is not None and self._aliases_saved(value, definition):
            return True  # Ex) proxy = gates: another name for the same tensor, saved if that one was
        if is_container(value) or isinstance(value, cst.Tuple):
            return False
        if self._returns_saved_output(value, definition):
            return True
        if not self.requires_grad(value, definition):
            return False
        start, end = self.collected.order[definition], self.collected.order[at]
        if start > end:
            return False  # assigned later in a loop body: the value came round from the last iteration
        scope = self.collected.contexts[at].scope
        between = [
            s
            for s in self.collected.statements_in_scope(scope)
            if start < self.collected.order[s] < end and not self.collected.exclusive(s, at)
        ]
        return any(self._saves(node, key, statement) for statement in between for node in descendants(statement))

    def _saved_by_a_layer(self, key: str, definition: cst.CSTNode | None, at: cst.CSTNode) -> bool:
        """Whether, since `definition` made the tensor `key` (since the scope began, for a parameter of the
        function), a torch layer with weights (`nn.Conv1d`, `nn.Linear`, an `nn.Sequential` or `weight_norm` that
        starts with one) took it, or a view of it, as its input: the layer saves its input for its weight's gradient
        whether or not the input requires grad. The changing statement's own layer calls run first (`x +=
        self.proj(x)`)."""
        context = self.collected.contexts.get(at)
        if context is None:
            return False
        if definition is None and not (
            context.function is not None
            and key in parameter_names(context.function)
            and all(reaching.binding is Binding.OUTSIDE for reaching in self.origins.definitions(key, at))
        ):
            return False  # several bindings, a rebound parameter, or a name from outside: not known which tensor
        start = self.collected.order[definition] if definition is not None else -1
        end = self.collected.order[at]
        return any(
            start < place <= end
            and not self.collected.exclusive(statement, at)
            and any(_refers_to(arg.value, key) for arg in call.args if arg.keyword is None)
            for place, statement, call in self._layer_calls(context.scope)
        )

    def _layer_calls(self, scope: cst.CSTNode) -> list[tuple[int, cst.CSTNode, cst.Call]]:
        """(place, statement, call) for each call in `scope` of a torch layer with weights, found once per scope."""
        if self._layers_in is None:
            self._layers_in = {}
            for call in self.collected.calls:
                statement = self.collected.statement_of.get(call)
                context = self.collected.contexts.get(call)
                if statement is None or context is None or not call.args or not self._weight_layer(call.func, call):
                    continue
                place = self.collected.order[statement]
                self._layers_in.setdefault(context.scope, []).append((place, statement, call))
        return self._layers_in.get(scope, [])

    def _weight_layer(self, module: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether the module `module` names (at `at`) was built, wherever its class assigns it, as a torch layer
        with weights that saves its input, or as an `nn.Sequential` or a norm wrapper whose first layer is one
        (`self.pos_conv`, rebuilt around itself)."""
        key = dotted_name(module)
        if key is None or self.roles.role(module) is not Role.MODEL:
            return False
        built = self.built(key, at)
        return bool(built) and all(self._builds_weight_layer(value, key, built, 0) for value in built)

    def built(self, key: str, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """What `key` is assigned in the module; for an attribute of `self`, only what the class of `at`, or a class
        of this module it derives from, assigns: another class's `self.conv1` is another layer."""
        values = self.roles.values.get(key, [])
        context = self.collected.contexts.get(at)
        if not key.startswith("self.") or context is None or context.class_def is None:
            return values
        lineage = self.roles.lineage(context.class_def)
        return [
            value
            for value in values
            if (owner := self.collected.contexts.get(value)) is not None and owner.class_def in lineage
        ]

    def _builds_weight_layer(
        self, value: cst.BaseExpression, key: str, built: list[cst.BaseExpression], depth: int
    ) -> bool:
        if not isinstance(value, cst.Call):
            return False
        qualified = self.roles.imports.resolve(value.func) or ""
        name = qualified.rsplit(".", 1)[-1]
        if not qualified.startswith("torch.nn."):
            return False
        if name in WEIGHT_INPUT_LAYERS:
            return True
        positional = [arg.value for arg in value.args if arg.keyword is None and not arg.star]
        if name not in MODULE_WRAPPERS | {"Sequential"} or not positional or depth >= 3:
            return False
        first = positional[0]
        if isinstance(first, cst.Call):
            return self._builds_weight_layer(first, key, built, depth + 1)
        # Ex) self.pos_conv = nn.Sequential(self.pos_conv, SamePad(k), nn.GELU()): what it was built as before
        return dotted_name(first) == key and any(
            other is not value and self._builds_weight_layer(other, key, built, depth + 1) for other in built
        )

    def _created_by(self, key: str, at: cst.CSTNode) -> cst.Assign | cst.AnnAssign | None:
        """The one plain assignment that made the tensor `key` names at statement `at`. An in-place addition (`h +=
        d`) changes the same tensor, so one in a loop leaves the assignment before the loop the maker on every pass
        (`h = relu(...)` then `for ...: h += layer(h)`): the first pass checks what saved it since."""
        definitions = [d for d in self.origins.definitions(key, at) if d.binding is not Binding.AUGMENT]
        if len(definitions) != 1 or definitions[0].binding is not Binding.ASSIGN:
            return None
        node = definitions[0].node
        return node if isinstance(node, (cst.Assign, cst.AnnAssign)) else None

    def _aliases_saved(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether the tensor `value` names at `at` (where another name is bound to it) was saved already."""
        if self._depth > MAX_DEPTH:
            return False
        self._depth += 1
        try:
            return self.saved_for_backward(value, at)
        finally:
            self._depth -= 1

    def _returns_saved_output(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `value`, evaluated at statement `at`, is the output of an operation that saved it (`torch.exp(h)`,
        a module built as `nn.Sigmoid()`) and requires grad."""
        saving = _saves_output(value) or self._module_kind(value) == "output"
        return saving and self.requires_grad(value, at)

    def _saves(self, node: cst.CSTNode, key: str, statement: cst.CSTNode) -> bool:
        if isinstance(node, cst.BinaryOperation):
            return self._product_saves(node, key, statement)
        if not isinstance(node, cst.Call):
            return False
        name = last_name(node.func) or ""
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        arguments = [arg.value for arg in node.args]
        if name in EXTREMES:
            return self._extreme_saves(node, key, statement, receiver)
        if receiver is not None and _refers_to(receiver, key):
            if name in SAVES_INPUT_IF_OTHER:
                return any(self.requires_grad(argument, statement) for argument in arguments)
            return name in SAVES_INPUT or (name in SAVES_OUTPUT and name.endswith("_"))
        if not any(_refers_to(argument, key) for argument in arguments):
            return False
        if name in SAVES_INPUT or self._module_kind(node) == "input":
            return True
        others = [argument for argument in arguments if not _refers_to(argument, key)]
        return name in SAVES_INPUT_IF_OTHER and any(self.requires_grad(other, statement) for other in others)

    def sequential_overwrites(self) -> list[tuple[cst.Call, cst.Call]]:
        """(layer, the layer before it) for each layer built in place inside an `nn.Sequential(...)` of the module
        right after a layer whose forward saves its output: `nn.Sequential(..., nn.ReLU(inplace=True),
        nn.Dropout(inplace=True))` overwrites what ReLU saved, and the first backward through it raises."""
        found = []
        for call in self.collected.calls:
            if (self.roles.imports.resolve(call.func) or "") != "torch.nn.Sequential":
                continue
            layers = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
            for previous, layer in pairwise(layers):
                if (
                    isinstance(previous, cst.Call)
                    and isinstance(layer, cst.Call)
                    and self._saves_its_output(previous)
                    and inplace_layer(layer, self.roles)
                ):
                    found.append((layer, previous))
        return found

    def _saves_its_output(self, layer: cst.Call) -> bool:
        qualified = self.roles.imports.resolve(layer.func) or ""
        name = qualified.rsplit(".", 1)[-1]
        if not qualified.startswith("torch.nn."):
            return False
        return name in OUTPUT_SAVING_MODULES or (name in OUTPUT_SAVING_IN_PLACE and inplace_layer(layer, self.roles))

    def _extreme_saves(
        self, call: cst.Call, key: str, statement: cst.CSTNode, receiver: cst.BaseExpression | None
    ) -> bool:
        """Whether `max`/`min` saves `key`: as a full reduction it does; along a dimension (`y.max(1)`, `torch.max(y,
        dim=-1)`) it saves only the indices; of two tensors (`torch.max(a, b)`) it saves both, where the other is
        proven a tensor (a name that may hold a dimension proves nothing)."""
        if any(arg.keyword is not None and arg.keyword.value == "dim" for arg in call.args):
            return False
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if receiver is not None and _refers_to(receiver, key):
            others = positional
        elif any(_refers_to(argument, key) for argument in positional):
            others = [argument for argument in positional if not _refers_to(argument, key)]
        else:
            return False
        if not others:
            return True
        return not any(_is_integer(other) for other in others) and any(
            self.requires_grad(other, statement) for other in others
        )

    def _module_kind(self, value: cst.BaseExpression) -> str | None:
        """What a call of a module saves: "output" (nn.Sigmoid, a project class whose forward returns a saved
        output), "input" (nn.Linear, another of torch's layers, a class of the project), or None: a module that
        nothing in the module is seen building (a constructor argument, a factory, a configuration's
        `instantiate(...)`) may be anything, even something that returns the dict it is given."""
        if not isinstance(value, cst.Call) or self.roles.role(value.func) is not Role.MODEL:
            return None
        key = dotted_name(value.func)
        built = [v for v in self.built(key, value) if isinstance(v, cst.Call)] if key else []
        classes = {_final_layer(v) for v in built}
        if classes and classes <= OUTPUT_SAVING_MODULES:
            return "output"
        if built and all(self._project_class_saves(v) for v in built):
            return "output"  # Ex) self.cbr = ConvBNReLU(...), whose forward returns its ReLU's saved output
        if classes and classes <= NOTHING_SAVING_MODULES:
            return None  # Ex) self.drop = nn.Dropout(0.1): saves a mask, not its input
        return "input" if built and all(self._builds_known_module(v) for v in built) else None

    def _builds_known_module(self, built: cst.Call) -> bool:
        """Whether `built` constructs one of torch's layers or a class of the project (of this module, or of another
        through the program), whose forward is a module's: not a factory or a configuration's object."""
        if (self.roles.imports.resolve(built.func) or "").startswith("torch.nn."):
            return True
        name = dotted_name(built.func)
        if name is None:
            return False
        if "." not in name and name in self.roles.classes and self.roles.imports.resolve(built.func) in (None, name):
            return not self._reads_only_metadata(self.roles.classes[name])
        return self.roles.project_bases is not None and bool(self.roles.project_bases(name))

    def _reads_only_metadata(self, owner: cst.ClassDef) -> bool:
        """Whether the `forward` of `owner` reads its input only for what it is, not what it holds (`x.shape`,
        `x.size(1)`, `x.new_empty(...)`, `len(x)`): a positional encoding sized from its input saves nothing of it."""
        forward = _forward_of(owner)
        params = forward.params.params if forward is not None else ()
        if forward is None or len(params) < 2:
            return False
        name = params[1].name.value
        uses = [node for node in descendants(forward.body) if isinstance(node, cst.Name) and node.value == name]
        metadata = [
            node
            for node in descendants(forward.body)
            if (isinstance(node, cst.Attribute) and _names(node.value, name) and node.attr.value in METADATA)
            or (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Name)
                and node.func.value == "len"
                and len(node.args) == 1
                and _names(node.args[0].value, name)
            )
        ]
        return bool(uses) and len(uses) == len(metadata)

    def saved_output_classes(self) -> frozenset[str]:
        """The top-level classes of the module whose `forward` returns, on every path, a tensor an operation saved
        for backward (its last op is a ReLU, a sigmoid, an `nn.Sequential` that ends in one, or another such
        class): a caller that changes their output in place breaks the backward through them."""
        return frozenset(
            node.name.value
            for node in self.collected.module.body
            if isinstance(node, cst.ClassDef) and self._class_saves_output(node.name.value)
        )

    def _project_class_saves(self, built: cst.Call) -> bool:
        """Whether `built` constructs a project class whose forward returns a saved output: a class of this module
        (by its name), or of another module of the project (through the program)."""
        name = dotted_name(built.func)
        if name is None:
            return False
        if (
            "." not in name
            and self.roles.imports.resolve(built.func) in (None, name)
            and self._class_saves_output(name)
        ):
            return True
        return self.saved_elsewhere is not None and self.saved_elsewhere(name)

    def _class_saves_output(self, name: str) -> bool:
        if name not in self._class_saves:
            self._class_saves[name] = False  # asked again while deciding (a forward that runs its own class)
            self._class_saves[name] = self._forward_returns_saved(name)
        return self._class_saves[name]

    def _forward_returns_saved(self, name: str) -> bool:
        owner = next(
            (node for node in self.collected.module.body if isinstance(node, cst.ClassDef) and node.name.value == name),
            None,
        )
        if owner is None or not self.roles.is_model_class(owner):
            return False
        forward = _forward_of(owner)
        if forward is None:
            return False
        returns = [s for s in self.collected.statements_in_scope(forward) if isinstance(s, cst.Return)]
        return bool(returns) and all(
            statement.value is not None and self.saved_for_backward(statement.value, statement) for statement in returns
        )

    def _product_saves(self, node: cst.BinaryOperation, key: str, statement: cst.CSTNode) -> bool:
        # Ex) z = w * h saves h for w's gradient; h ** 2 and x / h save h whatever the other side is
        left, right = _refers_to(node.left, key), _refers_to(node.right, key)
        if not (left or right):
            return False
        operator = node.operator
        if isinstance(operator, cst.Power) or (isinstance(operator, cst.Divide) and right):
            return True
        if isinstance(operator, (cst.Multiply, cst.MatrixMultiply, cst.Divide)):
            return self.requires_grad(node.right if left else node.left, statement)
        return False


def _is_integer(node: cst.BaseExpression) -> bool:
    """An integer literal, negative too (`-1`): a dimension."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _final_layer(built: cst.Call) -> str | None:
    """The class of the layer whose output a module built by `built` returns: the module's own class, or for an
    `nn.Sequential` its last layer's (`nn.Sequential(conv, nn.BatchNorm2d(c), nn.ReLU())` returns a ReLU's output)."""
    layers = [arg.value for arg in built.args if arg.keyword is None and not arg.star]
    if last_name(built.func) == "Sequential" and layers:
        last = layers[-1]
        return _final_layer(last) if isinstance(last, cst.Call) else None
    return last_name(built.func)


def _saves_output(value: cst.BaseExpression) -> bool:
    while isinstance(value, (cst.Call, cst.Subscript)):
        if isinstance(value, cst.Subscript):
            value = value.value
            continue
        name = last_name(value.func) or ""
        if _of_self(value.func):
            return False  # Ex) self.norm(x): a submodule or a method, judged by what built it, never by its name
        if name in SAVES_OUTPUT:
            return not any(arg.keyword is not None and arg.keyword.value == "inplace" for arg in value.args)
        if name not in VIEWS or not isinstance(value.func, cst.Attribute):
            return False
        value = value.func.value  # a view of a saved output shares its storage
    return False


def _viewed(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """What `node` is a view of: `h` for `h[0]`, `h[:, 1:]`, `h.view(-1)`, `h.t()`; None for anything else."""
    if isinstance(node, cst.Subscript) and _is_view_index(node):
        return node.value
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in VIEWS:
        return node.func.value
    return None


def _of_self(func: cst.BaseExpression) -> bool:
    """Whether a call's function is an attribute of `self` (`self.norm`): no tensor operation, whatever its name."""
    return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"


def _is_view_index(node: cst.Subscript) -> bool:
    """`h[0]`, `h[:, 1:]`, `h[..., None]`: basic indexing gives a view; a tensor or mask index (`h[mask]`) copies."""
    for element in node.slice:
        index = element.slice
        if not isinstance(index, cst.Index):
            continue  # a slice
        value = index.value
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
            value = value.expression
        if not (
            isinstance(value, (cst.Integer, cst.Ellipsis)) or (isinstance(value, cst.Name) and value.value == "None")
        ):
            return False
    return True


def _refers_to(node: cst.BaseExpression, key: str) -> bool:
    # The tensor itself or a view of it: h, h[0], h.view(-1), h.t() (not a copy: h[mask])
    viewed: cst.BaseExpression | None = node
    while viewed is not None:
        if dotted_name(viewed) == key:
            return True
        viewed = _viewed(viewed)
    return False


def _names(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _forward_of(owner: cst.ClassDef) -> cst.FunctionDef | None:
    """The `forward` the class itself defines."""
    return next((f for f in owner.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "forward"), None)
