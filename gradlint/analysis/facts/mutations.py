"""In-place operations on tensors, and the manual parameter updates among them.

An in-place operation is a method ending in `_` (`x.add_(1)`, chained
`buf.mul_(m).add_(g)`), an augmented assignment (`x += 1`, which `torch.Tensor`
implements in place) or an item assignment (`x[0] = 5`; `out["logits"] = y` stores into a
dict and is none). A manual update changes a
leaf that requires grad using a gradient (`p -= lr * p.grad`, `p.add_(g, alpha=-lr)`
with `g` from `torch.autograd.grad`), or rebinds it (`w = w - lr * w.grad`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from gradlint.analysis.facts.leaves import Leaves
from gradlint.analysis.facts.roles import Roles
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import ImportMap, dotted_name, last_name, names_in
from gradlint.analysis.syntax.tree import children

# Methods ending in `_` that change flags or storage sharing, not a tensor's values.
NOT_INPLACE = frozenset({"requires_grad_", "share_memory_", "retain_grad_", "detach_", "record_stream_", "pin_memory_"})
# torch.nn modules that write their result into their input when built with `inplace=True`, with the
# place of `inplace` among their positional arguments (checked against torch 2.13's signatures).
INPLACE_MODULES = {
    "ReLU": 0, "ReLU6": 0, "SELU": 0, "SiLU": 0, "Mish": 0, "Hardswish": 0, "Hardsigmoid": 0, "LeakyReLU": 1,
    "ELU": 1, "CELU": 1, "Dropout": 1, "Dropout1d": 1, "Dropout2d": 1, "Dropout3d": 1, "AlphaDropout": 1,
    "FeatureAlphaDropout": 1, "Hardtanh": 2, "Threshold": 2, "RReLU": 2,
}  # fmt: skip
# Their torch.nn.functional counterparts, with the place of `inplace` after the input.
INPLACE_FUNCTIONS = {
    "relu": 1, "relu6": 1, "selu": 1, "silu": 1, "mish": 1, "hardswish": 1, "hardsigmoid": 1, "leaky_relu": 2,
    "elu": 2, "celu": 2, "hardtanh": 3, "threshold": 3, "rrelu": 4, "dropout": 3, "dropout1d": 3, "dropout2d": 3,
    "dropout3d": 3, "alpha_dropout": 3, "feature_alpha_dropout": 3,
}  # fmt: skip
# Calls whose result is a fresh leaf again: `w = (w - lr * w.grad).detach().requires_grad_()`.
RELEAFING = frozenset({"detach", "detach_", "requires_grad_", "Parameter", "tensor"})


@dataclass(frozen=True)
class InPlace:
    """One in-place operation: `node` is reported, `target` is the tensor it modifies."""

    node: cst.CSTNode
    target: cst.BaseExpression
    statement: cst.BaseSmallStatement
    operands: tuple[cst.BaseExpression, ...]


def is_inplace_method(func: cst.BaseExpression) -> bool:
    """True for `x.add_`, `x.zero_`: a tensor method that overwrites its receiver."""
    if not isinstance(func, cst.Attribute):
        return False
    name = func.attr.value
    return name.endswith("_") and not name.startswith("_") and name not in NOT_INPLACE


def inplace_operations(collected: Collected, roles: Roles) -> list[InPlace]:
    """Every in-place operation of the module, in source order.

    A call of a torch layer built with `inplace=True` (`self.act(h)` with
    `self.act = nn.ReLU(inplace=True)`, or an `nn.Sequential` that starts with one), and
    an in-place torch function (`F.relu(h, inplace=True)`, `torch.relu_(h)`), change
    their first argument."""
    chained = {
        call.func.value
        for call in collected.calls
        if is_inplace_method(call.func) and isinstance(call.func, cst.Attribute)
    }
    found: list[tuple[int, InPlace]] = []
    for call in collected.calls:
        statement = collected.statement_of.get(call)
        if call in chained or not is_inplace_method(call.func) or not isinstance(statement, cst.BaseSmallStatement):
            continue
        target, operands = _unchain(call)
        found.append((collected.order[call], InPlace(call, target, statement, operands)))
    for statement in collected.statements:
        operation = _statement_operation(statement)
        if operation is not None:
            found.append((collected.order[statement], operation))
    for call in collected.calls:
        statement = collected.statement_of.get(call)
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if first is not None and isinstance(statement, cst.BaseSmallStatement) and _writes_input(call, roles):
            found.append((collected.order[call], InPlace(call, first, statement, ())))
    found.sort(key=lambda item: item[0])
    return [operation for _, operation in found]


def _writes_input(call: cst.Call, roles: Roles) -> bool:
    """Whether `call` writes its result into its first argument: an in-place torch function, or a layer built
    with `inplace=True` (the first layer of an `nn.Sequential` included), wherever every construction shows it."""
    qualified = roles.imports.resolve(call.func) or ""
    name = qualified.rsplit(".", 1)[-1]
    if qualified.startswith("torch.nn.functional.") or (qualified.count(".") == 1 and qualified.startswith("torch.")):
        if name.endswith("_") and not name.startswith("_") and name not in NOT_INPLACE:
            return True  # torch.relu_(h), F.leaky_relu_(h, 0.2)
        return name in INPLACE_FUNCTIONS and _passes_inplace(call, INPLACE_FUNCTIONS[name])
    if not isinstance(call.func, (cst.Name, cst.Attribute)):
        return False
    built = roles.constructors(call.func)
    return bool(built) and all(inplace_layer(constructor, roles) for constructor in built)


def inplace_layer(constructor: cst.Call, roles: Roles) -> bool:
    """`nn.ReLU(inplace=True)`, `nn.LeakyReLU(0.2, True)`, or `nn.Sequential(nn.ReLU(inplace=True), ...)`."""
    qualified = roles.imports.resolve(constructor.func) or ""
    if not qualified.startswith("torch.nn."):
        return False
    name = qualified.rsplit(".", 1)[-1]
    if name == "Sequential":
        first = constructor.args[0] if constructor.args else None
        return (
            first is not None
            and first.keyword is None
            and not first.star
            and isinstance(first.value, cst.Call)
            and inplace_layer(first.value, roles)
        )
    return name in INPLACE_MODULES and _passes_inplace(constructor, INPLACE_MODULES[name])


def _passes_inplace(call: cst.Call, position: int) -> bool:
    """Whether `call` passes `inplace=True`, by keyword or at its place among the positional arguments."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    keyword = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    value = keyword.get("inplace", positional[position] if len(positional) > position else None)
    return isinstance(value, cst.Name) and value.value == "True"


def _unchain(call: cst.Call) -> tuple[cst.BaseExpression, tuple[cst.BaseExpression, ...]]:
    # Ex) buf.mul_(momentum).add_(grad) modifies `buf`, writing `momentum` and `grad` into it
    operands: list[cst.BaseExpression] = []
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and is_inplace_method(node.func) and isinstance(node.func, cst.Attribute):
        operands.extend(arg.value for arg in node.args)
        node = node.func.value
    return node, tuple(operands)


def _statement_operation(statement: cst.BaseSmallStatement) -> InPlace | None:
    if isinstance(statement, cst.AugAssign):
        return InPlace(statement, _base(statement.target), statement, (statement.value,))
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        target = statement.targets[0].target
        if isinstance(target, cst.Subscript) and not _is_keyed(target):
            return InPlace(statement, _base(target), statement, (statement.value,))
    return None


def _is_keyed(target: cst.Subscript) -> bool:
    """`outputs["logits"] = ...`: a string key stores into a dict; no tensor is indexed by one."""
    return any(
        isinstance(element.slice, cst.Index)
        and isinstance(element.slice.value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))
        for element in target.slice
    )


def _base(target: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(target, cst.Subscript):
        target = target.value
    return target


@dataclass(frozen=True)
class ManualUpdate:
    """A leaf that requires grad changed from a gradient, in place or by rebinding its name."""

    node: cst.CSTNode
    target: cst.BaseExpression
    statement: cst.BaseSmallStatement
    rebinding: bool


class Mutations:
    """The module's in-place operations and manual updates, computed once."""

    def __init__(self, collected: Collected, leaves: Leaves, roles: Roles) -> None:
        self.collected = collected
        self.leaves = leaves
        self.gradients = GradientValues(collected)
        self.operations = inplace_operations(collected, roles)
        self.updates = [*self._inplace_updates(), *self._rebinding_updates()]
        self._update_nodes = {update.node for update in self.updates}

    def is_update(self, operation: InPlace) -> bool:
        """True when an in-place operation is a manual update from a gradient."""
        return operation.node in self._update_nodes

    def _inplace_updates(self) -> list[ManualUpdate]:
        return [
            ManualUpdate(operation.node, operation.target, operation.statement, rebinding=False)
            for operation in self.operations
            if self.leaves.is_leaf(operation.target, operation.statement)
            and any(self.gradients.is_gradient(operand, operation.statement) for operand in operation.operands)
        ]

    def _rebinding_updates(self) -> list[ManualUpdate]:
        # Ex) w = w - lr * w.grad  /  self.weight = self.weight - lr * self.weight.grad
        updates = []
        for statement in self.collected.statements:
            if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
                continue
            target = statement.targets[0].target
            key = dotted_name(target)
            if key is None or not self.leaves.is_leaf(target, statement) or _releafs(statement.value):
                continue
            read = set(names_in(statement.value))
            if key in read and f"{key}.grad" in read and not self._made_leaf_again(statement, key):
                updates.append(ManualUpdate(statement, target, statement, rebinding=True))
        return updates

    def _made_leaf_again(self, update: cst.Assign, key: str) -> bool:
        """Whether the loop around `update` makes `key` a leaf again before its next pass: another assignment of a
        value not read from it (`x = (x - x_orig).clamp(-e, e).detach() + x_orig` reads `x` only through a
        detached name) or `key.requires_grad_()`, as an attack's perturbation loop does."""
        loops = self.collected.contexts[update].loops
        if not loops:
            return False
        for statement in self.collected.statements_in_loop(loops[-1]):
            if statement is update:
                continue
            if isinstance(statement, cst.Assign) and any(dotted_name(t.target) == key for t in statement.targets):
                if key not in set(names_in(statement.value)):
                    return True
            elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
                func = statement.value.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "requires_grad_"
                    and dotted_name(func.value) == key
                ):
                    return True
        return False


def _releafs(value: cst.BaseExpression) -> bool:
    while isinstance(value, cst.Call):
        if last_name(value.func) in RELEAFING:
            return True
        value = value.func.value if isinstance(value.func, cst.Attribute) else value.func
    return False


class GradientValues:
    """Which expressions hold gradients: `.grad` reads, `torch.autograd.grad` results, names bound to them."""

    def __init__(self, collected: Collected) -> None:
        self.collected = collected
        self.imports: ImportMap = collected.imports
        self._names: dict[Scope, set[str]] = {}

    def is_gradient(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """True when `expression` reads a gradient (in the scope of statement `at`)."""
        scope = self.collected.contexts[at].scope
        return self._reads_gradient(expression, self._gradient_names(scope))

    def _reads_gradient(self, expression: cst.CSTNode, names: set[str]) -> bool:
        if isinstance(expression, (cst.Comparison, cst.CompIf)):
            return False  # Ex) [p for p in params if p.grad is not None] holds parameters
        if isinstance(expression, cst.Attribute) and expression.attr.value == "grad":
            return True
        if isinstance(expression, cst.Call) and (self.imports.resolve(expression.func) or "").endswith("autograd.grad"):
            return True
        key = dotted_name(expression) if isinstance(expression, (cst.Name, cst.Attribute)) else None
        if key is not None and key in names:
            return True
        return any(self._reads_gradient(child, names) for child in children(expression))

    def _gradient_names(self, scope: Scope) -> set[str]:
        if scope in self._names:
            return self._names[scope]
        names: set[str] = set()
        self._names[scope] = names
        changed = True
        while changed:
            before = len(names)
            for statement in self.collected.statements_in_scope(scope):
                if isinstance(statement, cst.Assign) and self._reads_gradient(statement.value, names):
                    for target in statement.targets:
                        names.update(names_in(target.target))
            for loop in self.collected.loops:
                if isinstance(loop, cst.For) and self.collected.contexts[loop].scope is scope:
                    names.update(self._gradient_loop_targets(loop, names))
            changed = len(names) > before
        return names

    def _gradient_loop_targets(self, loop: cst.For, names: set[str]) -> set[str]:
        # Ex) for p, g in zip(params, grads)  /  for g in grads
        iterable, target = loop.iter, loop.target
        if isinstance(iterable, cst.Call) and last_name(iterable.func) == "zip" and isinstance(target, cst.Tuple):
            pairs = zip(target.elements, iterable.args, strict=False)
            return {
                key
                for element, arg in pairs
                if self._reads_gradient(arg.value, names) and (key := dotted_name(element.value)) is not None
            }
        if isinstance(target, cst.Name) and self._reads_gradient(iterable, names):
            return {target.value}
        return set()
