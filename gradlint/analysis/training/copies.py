"""Tensors used as parameters that are copies of a leaf, not the leaf: `torch.randn(3, requires_grad=True).cuda()`.

When autograd records, `.cuda()`, `.to(device)`, `.double()`, `.type(dtype)`, a view
(`.view`, `.reshape`, indexing), a clone or arithmetic (`w * 0.01`) applied to a leaf
that requires grad return a new tensor whose history leads back to the leaf: a non-leaf.
A *use as a parameter* is where such a copy is handed to an optimizer (`Adam([w])`,
param groups, a list the parameters were appended to, a helper of this module or of
another one that builds the optimizer), updated by hand from its own `.grad`
(`w -= lr * w.grad`), which stays None on a non-leaf, or kept on a module proven an
`nn.Module` (`self.w = nn.Parameter(t).to(device)`): a module registers only Parameters,
so its `parameters()`, what an optimizer of the model trains, leave the copy out.

Values are followed through assignments (reaching definitions), aliases, lists,
`append`, and same-module helpers that return the copy or build the optimizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.leaves import Held, Leaves, argument, is_leaf_value, makes_leaf, parameter_names
from gradlint.analysis.facts.origins import Binding, Definition, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import EventIndex
from gradlint.analysis.project.program import ModuleProgram
from gradlint.analysis.project.summaries import BUILDS_OPTIMIZER
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in

# Methods that return a new tensor, with history, from a tensor that requires grad.
DEVICE_MOVES = frozenset({"cuda", "to", "type"})
DTYPE_CASTS = {"double": ("float64", "double"), "half": ("float16", "half"), "bfloat16": ("bfloat16",)}
COPYING_METHODS = frozenset(
    {
        "view", "reshape", "view_as", "reshape_as", "expand", "expand_as", "squeeze", "unsqueeze", "flatten",
        "t", "transpose", "permute", "clone", "mul", "div", "add", "sub", "neg", "pow", "exp", "log", "abs",
        "sqrt", "sigmoid", "tanh", "softmax", "log_softmax", "narrow", "select", "repeat",
    }
)  # fmt: skip
# Arguments of `.to(...)` / `.type(...)` that leave a tensor made with the defaults where it is.
NO_OP_TARGETS = frozenset({"cpu", "float32", "float", "FloatTensor", "torch.FloatTensor"})
TARGET_KEYWORDS = frozenset({"device", "dtype", "other"})  # not non_blocking=, copy=, memory_format=
APPENDING = frozenset({"append", "extend", "insert"})
# Values that hold parameters written out: `[w, b]`, `[{"params": [w]}]`, `[s.cuda() for s in scales]`.
CONTAINERS = (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.GeneratorExp)


@dataclass(frozen=True)
class LeafCopy:
    """A copy of a leaf: the expression that makes it, and the statement it sits in."""

    node: cst.BaseExpression
    statement: cst.CSTNode
    maker: cst.Call | None  # the call that made the leaf inline (`torch.randn(..., requires_grad=True)`), if seen


@dataclass(frozen=True)
class CopyUse:
    """A place where a leaf's copy is used as a parameter: an optimizer built on it, a manual update."""

    copy: LeafCopy
    node: cst.CSTNode
    optimizer: bool  # False: updated by hand from its own `.grad`, or kept on a module (`module`)
    module: bool = False  # kept as an attribute of an nn.Module, which registers only Parameters


class LeafCopies:
    """Finds copies of leaves that are optimized as if they were the leaf."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        events: EventIndex,
        leaves: Leaves,
        callers: CallerGradMode,
        program: ModuleProgram | None,
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins: Origins = events.origins
        self.leaves = leaves
        self.callers = callers
        self.program = program

    @cached_property
    def uses(self) -> list[CopyUse]:
        """Every use of a leaf's copy as a parameter, in source order of the sinks."""
        found: list[CopyUse] = []
        for call in self.collected.calls:
            at = self.collected.statement_of[call]
            for params in self._params_given(call):
                for tensor, where in self._tensors_in(params, at, set()):
                    found.extend(CopyUse(copy, call, True) for copy in self.copies_of(tensor, where, set()))
        for statement in self.collected.statements:
            updated = _updated_from_own_grad(statement)
            if updated is not None:
                found.extend(CopyUse(copy, statement, False) for copy in self.copies_of(updated, statement, set()))
            elif (kept := self._kept_on_a_module(statement)) is not None:
                # Ex) self.w = nn.Parameter(torch.randn(n)).to(self.device): made inline, so meant to be trained
                copy = self._made_copy(kept.value, kept)
                if copy is not None and copy.maker is not None:
                    found.append(CopyUse(copy, kept, False, module=True))
        return found

    def _kept_on_a_module(self, statement: cst.CSTNode) -> cst.Assign | None:
        """`statement` when it sets an attribute of `self` in a method of a class proven an nn.Module. An assignment
        to a tensor's `.data` (`self.emb.weight.data = ...`) binds nothing: it swaps the storage of the Parameter
        already registered there, which stays the leaf."""
        if not isinstance(statement, cst.Assign) or not any(
            (key := dotted_name(target.target) or "").startswith("self.") and not key.endswith(".data")
            for target in statement.targets
        ):
            return None
        owner = self.collected.contexts[statement].class_def
        return statement if owner is not None and self.roles.is_model_class(owner) else None

    def copies_of(self, expression: cst.BaseExpression, at: cst.CSTNode, seen: set[cst.CSTNode]) -> list[LeafCopy]:
        """The copies of a leaf that `expression`, evaluated just before `at`, may hold."""
        made = self._made_copy(expression, at)
        if made is not None:
            return [made]
        if isinstance(expression, cst.Call):
            return self._returned_copies(expression, seen)
        key = dotted_name(expression)
        if key is None:
            return []
        definitions = self.origins.definitions(key, at)
        if all(definition.binding is Binding.OUTSIDE for definition in definitions):
            definitions = self._global_definitions(key, at)
        found: list[LeafCopy] = []
        for definition in definitions:
            if definition.binding is Binding.ASSIGN and definition.node not in seen:
                found.extend(self.copies_of(definition.value, definition.node, seen | {definition.node}))
        return found

    def _global_definitions(self, key: str, at: cst.CSTNode) -> tuple[Definition, ...]:
        """Where a name a function does not bind was bound: at module level, or `self.x` in another method."""
        function = self.collected.contexts[at].function
        if function is None:
            return ()
        if key.startswith("self.") and key.count(".") == 1:
            # Ex) self.log_alpha = torch.zeros(1, requires_grad=True).to(device) in __init__, optimized elsewhere
            owner = self.collected.owners.get(function)
            methods = self.collected.owners.items()
            scopes: list[Scope] = [method for method, cls in methods if cls is owner and method is not function]
        elif "." in key or key in parameter_names(function):
            return ()
        else:
            scopes = [self.collected.module]  # Ex) w1 = torch.randn(n, requires_grad=True).cuda(), used in a function
        return tuple(
            Definition(statement, statement.value, Binding.ASSIGN)
            for scope in scopes
            for statement in self.collected.statements_in_scope(scope)
            if isinstance(statement, cst.Assign)
            and any(dotted_name(target.target) == key for target in statement.targets)
        )

    def _made_copy(self, expression: cst.BaseExpression, at: cst.CSTNode) -> LeafCopy | None:
        if self.callers.without_grad(at):
            return None  # Ex) under no_grad, `w.to(device)` is a new leaf that does not require grad
        if any(".grad." in f".{name}." for name in names_in(expression)):
            return None  # Ex) w = w - lr * w.grad: a manual update rebinding the leaf, update-outside-no-grad's
        for source in _copied_from(expression):
            made = self._copy_of_source(expression, source, at)
            if made is not None:
                return made
        return None

    def _copy_of_source(
        self, expression: cst.BaseExpression, source: cst.BaseExpression, at: cst.CSTNode
    ) -> LeafCopy | None:
        maker = self._leaf_maker(source, at)
        if maker is None:
            inner = self._made_copy(source, at)
            return LeafCopy(expression, at, inner.maker) if inner is not None else None
        if not _changes(expression, maker if isinstance(maker, cst.Call) else None):
            return None
        return LeafCopy(expression, at, maker if isinstance(maker, cst.Call) and makes_leaf(maker) else None)

    def _leaf_maker(self, source: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The expression that made `source` a leaf that requires grad (itself when unknown), or None."""
        if is_leaf_value(source):
            return source
        if not isinstance(source, (cst.Name, cst.Attribute)) or self.leaves.held(source, at) is not Held.LEAF:
            return None
        key = dotted_name(source) or ""
        makers = [
            definition.value
            for definition in self.origins.definitions(key, at)
            if definition.binding is Binding.ASSIGN and is_leaf_value(definition.value)
        ]
        return makers[0] if len(makers) == 1 else source

    def _returned_copies(self, call: cst.Call, seen: set[cst.CSTNode]) -> list[LeafCopy]:
        # Ex) def init_latent(shape): z = torch.randn(shape, requires_grad=True); return z.to(DEVICE)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is None or helper in seen:
            return []
        found: list[LeafCopy] = []
        for statement in self.collected.statements_in_scope(helper):
            if isinstance(statement, cst.Return) and statement.value is not None:
                found.extend(self.copies_of(statement.value, statement, seen | {helper}))
        return found

    def _params_given(self, call: cst.Call) -> Iterator[cst.BaseExpression]:
        """The expressions `call` hands to an optimizer as its parameters, directly or through a helper."""
        if self.roles.role_of_value(call) is Role.OPTIMIZER:
            params = argument(call, 0, "params")
            if params is not None:
                yield params
            return
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            offset = 1 if helper in self.collected.owners and isinstance(call.func, cst.Attribute) else 0
            for index, name in self._builders.get(helper, []):
                given = argument(call, index - offset, name)
                if given is not None:
                    yield given
            return
        yield from self._given_to_other_module(call)

    def _given_to_other_module(self, call: cst.Call) -> Iterator[cst.BaseExpression]:
        # Another module's function that builds an optimizer: its summary does not say from which
        # parameter, so only arguments written as lists of tensors (or bound to one) are taken.
        if self.program is None or call not in self.collected.contexts:
            return
        at = self.collected.statement_of[call]
        lists = [arg.value for arg in call.args if self._is_tensor_list(arg.value, at)]
        if not lists:
            return  # checked first: resolving the callee costs more
        callee = self.program.callee_of(call, self.events.context(call), self.events)
        if callee is not None and any(effect.kind == BUILDS_OPTIMIZER for effect in callee.effects):
            yield from lists

    def _is_tensor_list(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        if isinstance(value, CONTAINERS):
            return True
        key = dotted_name(value)
        return key is not None and any(
            definition.binding is Binding.ASSIGN and isinstance(definition.value, CONTAINERS)
            for definition in self.origins.definitions(key, at)
        )

    @cached_property
    def _builders(self) -> dict[cst.FunctionDef, list[tuple[int, str]]]:
        """Same-module functions that build an optimizer on one of their parameters: (index, name) of each."""
        builders: dict[cst.FunctionDef, list[tuple[int, str]]] = {}
        for call in self.collected.calls:
            function = self.collected.contexts[call].function
            if function is None or self.roles.role_of_value(call) is not Role.OPTIMIZER:
                continue
            params = argument(call, 0, "params")
            read = set(names_in(params)) if params is not None else set()
            for index, param in enumerate(function.params.params):
                if param.name.value in read:
                    builders.setdefault(function, []).append((index, param.name.value))
        return builders

    def _tensors_in(
        self, params: cst.BaseExpression, at: cst.CSTNode, seen: set[cst.CSTNode]
    ) -> Iterator[tuple[cst.BaseExpression, cst.CSTNode]]:
        """Each tensor of a parameter list (literal, param groups, a name bound to a list, appended to)."""
        if isinstance(params, (cst.List, cst.Tuple, cst.Set)):
            for element in params.elements:
                if not isinstance(element, cst.StarredElement):
                    yield from self._tensors_in(element.value, at, seen)
        elif isinstance(params, (cst.ListComp, cst.GeneratorExp)):
            yield params.elt, at  # Ex) [torch.ones(2, requires_grad=True).to(device) for _ in layers]
        elif isinstance(params, cst.Dict):
            for entry in params.elements:
                if isinstance(entry, cst.DictElement) and _is_string(entry.key, "params"):
                    yield from self._tensors_in(entry.value, at, seen)
        elif isinstance(params, cst.BinaryOperation) and isinstance(params.operator, cst.Add):
            yield from self._tensors_in(params.left, at, seen)
            yield from self._tensors_in(params.right, at, seen)
        elif isinstance(params, cst.Call) and last_name(params.func) in ("list", "tuple", "chain"):
            for arg in params.args:
                yield from self._tensors_in(arg.value, at, seen)
        elif isinstance(params, cst.Call) and makes_leaf(params):
            return  # Ex) Adam([nn.Parameter(torch.zeros(3))])
        elif isinstance(params, (cst.Name, cst.Attribute)):
            yield from self._tensors_named(params, at, seen)
        else:
            yield params, at

    def _tensors_named(
        self, params: cst.Name | cst.Attribute, at: cst.CSTNode, seen: set[cst.CSTNode]
    ) -> Iterator[tuple[cst.BaseExpression, cst.CSTNode]]:
        key = dotted_name(params) or ""
        containers = [
            definition
            for definition in self.origins.definitions(key, at)
            if definition.binding is Binding.ASSIGN and isinstance(definition.value, CONTAINERS)
        ]
        if not containers:
            yield params, at
            return
        for definition in containers:
            if definition.node not in seen:
                yield from self._tensors_in(definition.value, definition.node, seen | {definition.node})
        for call in self._appended_to(key, at):
            for arg in call.args:
                yield from self._tensors_in(arg.value, self.collected.statement_of[call], seen)

    def _appended_to(self, key: str, at: cst.CSTNode) -> list[cst.Call]:
        # Ex) params = []; for ...: w = torch.randn(n, requires_grad=True).cuda(); params.append(w)
        scope = self.collected.contexts[at].scope
        order = self.collected.order.get(at, 0)
        return [
            call
            for call in self.collected.calls_in_scope(scope)
            if isinstance(call.func, cst.Attribute)
            and call.func.attr.value in APPENDING
            and dotted_name(call.func.value) == key
            and self.collected.order.get(self.collected.statement_of[call], 0) < order
        ]


def _copied_from(expression: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The tensors `expression` copies with a new history (`w` in `w.cuda()`, `w * 0.01`, `w[0]`)."""
    if isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute):
        method = expression.func.attr.value
        if method in DEVICE_MOVES or method in DTYPE_CASTS or method in COPYING_METHODS or method == "float":
            return [expression.func.value]
        return []
    if isinstance(expression, cst.BinaryOperation):
        return [expression.left, expression.right]  # a leaf on either side makes a non-leaf
    if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Minus):
        return [expression.expression]
    if isinstance(expression, cst.Subscript):
        return [expression.value]
    return []


def _changes(expression: cst.BaseExpression, maker: cst.Call | None) -> bool:
    """Whether a move or cast surely copies: `.float()` of a default tensor, `.to("cpu")` do not."""
    if not (isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute)):
        return True
    method = expression.func.attr.value
    made_with = _keywords(maker) if maker is not None and makes_leaf(maker) else {}
    if method == "float":
        dtype = made_with.get("dtype")
        return dtype is not None and last_name(dtype) not in NO_OP_TARGETS
    if method in DTYPE_CASTS:
        dtype = made_with.get("dtype")
        return dtype is None or last_name(dtype) not in DTYPE_CASTS[method]
    if method not in DEVICE_MOVES:
        return True
    if method == "cuda":
        return "device" not in made_with
    targets = [arg.value for arg in expression.args if arg.keyword is None or arg.keyword.value in TARGET_KEYWORDS]
    written = {_code(value) for value in made_with.values()}
    return not all(_code(target) in written or _is_no_op_target(target) for target in targets)


def _is_no_op_target(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.SimpleString):
        return str(target.evaluated_value) in NO_OP_TARGETS
    return dotted_name(target) in {"torch.float32", "torch.float", "torch.FloatTensor"}


def _code(node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node)


def _keywords(call: cst.Call) -> dict[str, cst.BaseExpression]:
    return {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}


def _updated_from_own_grad(statement: cst.BaseSmallStatement) -> cst.BaseExpression | None:
    """`w` for `w -= lr * w.grad` (or `w.data -= ...`): a manual update that needs `w.grad` filled."""
    if not isinstance(statement, cst.AugAssign):
        return None
    target: cst.BaseExpression = statement.target
    if isinstance(target, cst.Attribute) and target.attr.value == "data":
        target = target.value
    key = dotted_name(target)
    gradient = f"{key}.grad"
    reads = set(names_in(statement.value))
    if key is None or not any(name == gradient or name.startswith(gradient + ".") for name in reads):
        return None
    return target


def _is_string(node: cst.BaseExpression, value: str) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == value
