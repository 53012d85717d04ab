"""Freezing parameters: which objects are nn.Modules, what each freeze acts on, and what undoes it.

`module.requires_grad_(False)` and `p.requires_grad = False` on each parameter freeze;
`module.requires_grad = False` only sets a Python attribute. Whether a receiver is a
module is judged from constructors and annotations, from where a loop variable comes
(`.children()`, `.modules()`, an `nn.ModuleList`), from plain assignments, and, for a
name no statement of the module binds (a parameter, an attribute set elsewhere), from
names that say model (`model`, `backbone`, `text_encoder`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from gradlint.analysis.facts.origins import OUTSIDE, Binding, Definition, Origins
from gradlint.analysis.facts.roles import COMPUTED_SUFFIX, MODEL_NAME, MODULE_ONLY_METHODS, Role, Roles
from gradlint.analysis.facts.steps import EventIndex, rebound
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in

MODULE_ITERATORS = frozenset({"children", "modules"})
NAMED_MODULE_ITERATORS = frozenset({"named_children", "named_modules"})
PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters"})
ITERABLE_WRAPPERS = frozenset({"list", "tuple", "reversed", "iter"})
CONTAINERS_OF_MODULES = frozenset({"ModuleList", "Sequential"})
# `freeze_backbone`, `_freeze_stages`, `frozen`; not `unfreeze`, `train_frozen_backbone` or `unfrozen`,
# nor `freeze_bn`/`freeze_norm_stats`: freezing normalization statistics may keep the affine weights trainable.
FREEZE_NAME = re.compile(r"(?i)_*(freeze|frozen)(_(?!.*(bn|norm|stat))|$)")
# The names of a copy meant to lag behind or teach: EMA, teacher, target and momentum networks.
COPY_NAME = re.compile(r"(?i)(^|_)(ema|teacher|target|momentum|shadow|avg|average|swa|mean)(_|\d|$)|ema$")
# Optimizers whose update is zero for a zero gradient unless momentum or weight decay is set.
STATELESS_BY_DEFAULT = frozenset({"SGD"})
# Submodules of a known module named as torchvision, timm and transformers name them
# (`model.layer1`, `model.fc`, `vit.blocks`); `model.cls_token` is a Parameter and is not one.
LAYER_NAME = re.compile(
    r"(layer|conv|bn|fc|stage|block|downsample)\d*|stem|neck|heads?|features|embeddings|blocks|layers|lstm|gru|rnn|mlp"
)
# torch functions return tensors, except these loaders: `torch.hub.load(...)` stored as `backbone` is a model.
MODEL_LOADERS = frozenset({"torch.hub.load", "torch.jit.load", "torch.jit.script", "torch.jit.trace"})
# Types whose instances are tensors, never modules, as an `isinstance` test names them through the imports.
TENSOR_TYPES = frozenset(
    {"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter", "nn.Parameter", "nn.parameter.Parameter"}
)
# What helpers call the module they are given: `def freeze(module): ...`.
MODULE_WORD = re.compile(r"(sub)?module|child|(sub)?net")
MAX_DEPTH = 6


@dataclass(frozen=True)
class LateFreeze:
    """A freeze after the optimizer was built over the parameters, and the clear that zeroes their gradients."""

    statement: cst.CSTNode
    optimizer: cst.CSTNode
    clear: cst.CSTNode
    inner: cst.CSTNode | None = None  # the freeze inside the helper that `statement` calls


@dataclass(frozen=True)
class AliasFreeze:
    """A freeze of a copy (EMA, teacher, target network) that is the trained model itself."""

    statement: cst.CSTNode
    alias: cst.CSTNode
    evaluates: bool  # `.eval()` rather than a freeze


class Freezing:
    """Answers which statements set `requires_grad` wrongly or too late."""

    def __init__(self, collected: Collected, roles: Roles, origins: Origins, events: EventIndex) -> None:
        self.collected = collected
        self.roles = roles
        self.origins = origins
        self.events = events
        self._depth = 0

    # --- which objects are modules -------------------------------------------------

    @cached_property
    def _assignments(self) -> dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]]:
        """Every plain assignment of a dotted name in the module; None for a part of an unpacked value."""
        found: dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]] = {}
        for statement in self.collected.statements:
            if isinstance(statement, cst.Assign):
                for target in statement.targets:
                    self._record(found, statement, target.target, statement.value)
            elif isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
                value = statement.value if isinstance(statement, cst.AnnAssign) else None
                self._record(found, statement, statement.target, value)
        return found

    def _record(
        self,
        found: dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]],
        statement: cst.CSTNode,
        target: cst.BaseExpression,
        value: cst.BaseExpression | None,
    ) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._record(found, statement, element.value, None)
            return
        key = dotted_name(target)
        if key is not None:
            found.setdefault(key, []).append((statement, value))

    def is_module(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `expression`, just before statement `at`, holds an nn.Module (never a tensor)."""
        if self._depth > MAX_DEPTH:
            return False
        self._depth += 1
        try:
            return self._is_module(expression, at)
        finally:
            self._depth -= 1

    def _is_module(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        if isinstance(expression, cst.Call):
            return self._built_module(expression)
        key = dotted_name(expression)
        if key is None or key == "self" or self.collected.tested_types(key, at) & TENSOR_TYPES:
            return False  # Ex) if isinstance(m, nn.Parameter): m.requires_grad = False
        definitions = self.origins.definitions(key, at)
        if OUTSIDE not in definitions:
            return all(self._defines_module(definition, key) for definition in definitions)
        if self.roles.proven_role(expression) is Role.MODEL:
            return True
        if key in self.roles.annotations:
            return False  # annotated, and not as a module
        if key in self._assignments:
            return self._assigned_modules(key)
        return self._named_module(expression, at)

    def _assigned_modules(self, key: str) -> bool:
        # `self.backbone = build_backbone(cfg)` in one method, frozen in another: every
        # assignment of the name anywhere in the module must give it a module.
        assigned = self._assignments[key]
        return all(value is not None and self._assigned_module(value, at, key) for at, value in assigned)

    def _assigned_module(self, value: cst.BaseExpression, at: cst.CSTNode, key: str) -> bool:
        if not isinstance(value, cst.Call) or self._built_module(value):
            return self._built_module(value) if isinstance(value, cst.Call) else self.is_module(value, at)
        name = last_name(value.func) or ""
        qualified = self.roles.imports.resolve(value.func) or ""
        if (
            name[:1].isupper()
            or name in self.roles.classes
            or (qualified.startswith("torch.") and qualified not in MODEL_LOADERS)
        ):
            return False  # a class that is not a module, or a torch function that returns tensors
        # A builder function (`build_backbone(cfg)`): the name it is stored under, or its use, decides.
        return _says_model(key.rsplit(".", 1)[-1]) or self._used_as_module(key)

    def _named_module(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        # Bound nowhere in this module: a parameter, or an attribute of an object built elsewhere.
        key = dotted_name(expression) or ""
        name = last_name(expression) or ""
        if isinstance(expression, cst.Attribute) and (LAYER_NAME.fullmatch(name) or self._used_as_module(key)):
            return self.is_module(expression.value, at)
        if isinstance(expression, cst.Name) and MODULE_WORD.fullmatch(name):
            return True  # def freeze(module): ...
        if not _says_model(name):
            return False
        if isinstance(expression, cst.Attribute):
            return self.is_module(expression.value, at) or dotted_name(expression.value) == "self"
        return True

    def _used_as_module(self, key: str) -> bool:
        """Whether the file uses `key` as only a module is used: `x.parameters()`, `x.conv.weight`."""
        return key in self._module_method_receivers or key in self._layer_holders

    @cached_property
    def _module_method_receivers(self) -> frozenset[str]:
        return frozenset(
            key
            for call in self.collected.calls
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in MODULE_ONLY_METHODS
            for key in [dotted_name(call.func.value)]
            if key is not None
        )

    @cached_property
    def _layer_holders(self) -> frozenset[str]:
        """`m.outc` when the file reads `m.outc.conv.weight`: an object whose attribute has a weight holds layers."""
        holders: set[str] = set()
        for statement in self.collected.statements:
            for key in names_in(statement):
                parts = key.split(".")
                holders.update(".".join(parts[: i - 1]) for i in range(3, len(parts)) if parts[i] in ("weight", "bias"))
        return frozenset(holders)

    def _built_module(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "deepcopy":
            return bool(call.args) and self.is_module(call.args[0].value, self.collected.statement_of.get(call, call))
        return self.roles.proven_role(call) is Role.MODEL

    def _defines_module(self, definition: Definition, key: str) -> bool:
        if definition.binding is Binding.ASSIGN:
            return self._assigned_module(definition.value, definition.node, key)
        if definition.binding is not Binding.LOOP or not isinstance(definition.node, cst.For):
            return False
        loop = definition.node
        if isinstance(loop.target, cst.Tuple):
            last = loop.target.elements[-1].value if loop.target.elements else None
            named = last is not None and dotted_name(last) == key
            return named and self._iterates_modules(loop.iter, loop, named=True)
        return self._iterates_modules(loop.iter, loop, named=False)

    def _iterates_modules(self, iterable: cst.BaseExpression, at: cst.CSTNode, named: bool) -> bool:
        """Whether iterating `iterable` yields modules (or `(name, module)` pairs when `named`)."""
        if isinstance(iterable, cst.Call):
            name = last_name(iterable.func)
            if name in ITERABLE_WRAPPERS and len(iterable.args) == 1:
                return self._iterates_modules(iterable.args[0].value, at, named)
            if isinstance(iterable.func, cst.Attribute):
                return name in (NAMED_MODULE_ITERATORS if named else MODULE_ITERATORS)
            return False
        if isinstance(iterable, cst.Subscript) and _is_slice(iterable):
            return self._iterates_modules(iterable.value, at, named)
        if isinstance(iterable, (cst.List, cst.Tuple)) and not named:
            return bool(iterable.elements) and all(self.is_module(e.value, at) for e in iterable.elements)
        key = dotted_name(iterable)
        if key is None:
            return False
        definitions = self.origins.definitions(key, at)
        if OUTSIDE not in definitions:
            return all(
                d.binding is Binding.ASSIGN and self._iterates_modules(d.value, d.node, named) for d in definitions
            )
        built = [last_name(call.func) for call in self.roles.constructors(iterable)]
        return not named and bool(built) and all(name in CONTAINERS_OF_MODULES for name in built)

    # --- (a) requires_grad as a plain attribute of a module -------------------------

    def attribute_sets(self) -> Iterator[tuple[cst.Assign, cst.BaseExpression]]:
        """`module.requires_grad = ...` statements whose receiver is known to be a module."""
        for statement, receiver, _ in self._flag_assignments():
            if self.is_module(receiver, statement):
                yield statement, receiver

    def _flag_assignments(self) -> Iterator[tuple[cst.Assign, cst.BaseExpression, cst.BaseExpression]]:
        for statement in self.collected.statements:
            if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
                continue
            target = statement.targets[0].target
            if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad":
                yield statement, target.value, statement.value

    # --- (b) a freeze block that sets requires_grad to True --------------------------

    def unfreezing_in_freeze_blocks(self) -> Iterator[cst.CSTNode]:
        """Statements that set `requires_grad` to True inside code whose name says it freezes, and nothing else."""
        settings = self._flag_settings()
        for node, value, receiver in settings:
            if value is not True or not self._holds_parameters(receiver, node):
                continue
            if isinstance(node, cst.Assign) and self.is_module(receiver, node):
                continue  # a plain attribute of a module: reported as that
            # Freeze everything, then thaw some (`if freeze: for p in ...: p.requires_grad = False; if
            # freeze_expression: p.requires_grad = True`): each block the setting sits in must set only True.
            blocks = self._freeze_blocks(node)
            if blocks and all(v is True for block in blocks for n, v, _ in settings if self._inside(n, block)):
                yield node

    def _holds_parameters(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A module, a parameter of `.parameters()`, or a layer's `weight`/`bias`: not a loss or an input."""
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in ("weight", "bias"):
            return self.is_module(receiver.value, at)
        return self._parameters_owner(receiver, at) is not None or self.is_module(receiver, at)

    def _flag_settings(self) -> list[tuple[cst.CSTNode, bool | None, cst.BaseExpression]]:
        """Every statement that sets a `requires_grad` flag, the literal it sets (None if not literal), and on what."""
        found: list[tuple[cst.CSTNode, bool | None, cst.BaseExpression]] = [
            (statement, _literal(value), receiver) for statement, receiver, value in self._flag_assignments()
        ]
        for call in self.collected.calls:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "requires_grad_":
                value = _literal(call.args[0].value) if call.args else True
                found.append((self.collected.statement_of.get(call, call), value, func.value))
        return found

    def _freeze_blocks(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """The blocks around `node` that say they freeze: the bodies of `if freeze...:` and a function named so."""
        context = self.collected.contexts.get(node)
        if context is None:
            return []
        blocks: list[cst.CSTNode] = [
            branch.body
            for branch in context.ifs
            if isinstance(branch, cst.If) and _says_freeze(branch.test) and self.collected.in_body(branch, node)
        ]
        function = context.function
        if function is not None and FREEZE_NAME.match(function.name.value):
            blocks.append(function)
        return blocks

    def _inside(self, node: cst.CSTNode, block: cst.CSTNode) -> bool:
        context = self.collected.contexts.get(node)
        if context is None:
            return False
        if isinstance(block, cst.FunctionDef):
            return context.function is block
        return any(isinstance(b, cst.If) and b.body is block and self.collected.in_body(b, node) for b in context.ifs)

    # --- what a freeze acts on ---------------------------------------------------------

    def freezes(self) -> Iterator[tuple[cst.CSTNode, cst.BaseExpression]]:
        """Statements that freeze parameters, with the module whose parameters they freeze."""
        for statement, receiver, value in self._flag_assignments():
            if _literal(value) is False:
                owner = self._parameters_owner(receiver, statement)
                if owner is not None:
                    yield statement, owner
        for call in self.collected.calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "requires_grad_"
                and call.args
                and _literal(call.args[0].value) is False
            ):
                node = self.collected.statement_of.get(call, call)
                owner = self._parameters_owner(func.value, node)
                yield node, owner if owner is not None else func.value

    def _parameters_owner(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The module whose parameters `receiver` iterates (`p` in `for p in model.parameters()`)."""
        key = dotted_name(receiver)
        if key is None:
            return None
        definitions = self.origins.definitions(key, at)
        loops = [d for d in definitions if d.binding is Binding.LOOP and isinstance(d.node, cst.For)]
        if len(loops) != 1 or len(definitions) != 1:
            return None
        iterable = loops[0].value
        while isinstance(iterable, cst.Call) and last_name(iterable.func) in ITERABLE_WRAPPERS and iterable.args:
            iterable = iterable.args[0].value
        if (
            isinstance(iterable, cst.Call)
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value in PARAMETER_ITERATORS
        ):
            return iterable.func.value
        return None

    # --- (c) frozen after the optimizer was built, gradients zeroed ------------------

    def late_freezes(self) -> Iterator[LateFreeze]:
        """Freezes of parameters an earlier optimizer holds, where a clear zeroes gradients instead of dropping them.

        A freeze in a helper of this module counts at each call: `freeze_encoder(model)`
        after `Adam(model.parameters())` freezes parameters the optimizer holds.
        """
        optimizers = self._moving_optimizers()
        if not optimizers:
            return
        found: set[cst.CSTNode] = set()
        for statement, owner in self.freezes():
            late = self._late(statement, owner, optimizers)
            if late is not None:
                found.add(statement)
                yield late
        for statement, owner, inner in self._helper_freezes():
            late = self._late(statement, owner, optimizers) if inner not in found else None
            if late is not None:
                yield LateFreeze(late.statement, late.optimizer, late.clear, inner)

    def _late(
        self, statement: cst.CSTNode, owner: cst.BaseExpression, optimizers: list[tuple[cst.Assign, set[str]]]
    ) -> LateFreeze | None:
        frozen = dotted_name(owner)
        if frozen is None:
            return None
        for construction, held in optimizers:
            if not self._after(statement, construction) or not any(_within(frozen, key) for key in held):
                continue
            clear = self._zeroing_clear(construction, held)
            if clear is not None:
                return LateFreeze(statement, construction, clear)
        return None

    def _helper_freezes(self) -> Iterator[tuple[cst.CSTNode, cst.BaseExpression, cst.CSTNode]]:
        """Calls of this module's functions that freeze: (the call's statement, what it freezes there, the freeze)."""
        inside: dict[cst.FunctionDef, list[tuple[cst.CSTNode, cst.BaseExpression]]] = {}
        for statement, owner in self.freezes():
            context = self.collected.contexts.get(statement)
            if context is not None and context.function is not None:
                inside.setdefault(context.function, []).append((statement, owner))
        if not inside:
            return
        for call in self.collected.calls:
            helper = self.events.resolve_instance_method(call) or self.events.resolve_helper(call)
            if helper is None or helper not in inside:
                continue
            for inner, owner in inside[helper]:
                given = rebound(owner, helper, call)
                if given is not None:
                    yield self.collected.statement_of.get(call, call), given, inner

    def _zeroing_clear(self, construction: cst.Assign, held: set[str]) -> cst.CSTNode | None:
        """The first clear of this optimizer's gradients that zeroes them instead of setting them to None.

        `optimizer.zero_grad(set_to_none=False)` (or the model's), or `p.grad.zero_()` over
        the parameters of a model the optimizer holds, in the function that built the
        optimizer or a method of the same class.
        """
        optimizer = {dotted_name(target.target) for target in construction.targets}
        for call in self.collected.calls:
            func = call.func
            if not isinstance(func, cst.Attribute) or not self._near(call, construction):
                continue
            receiver = dotted_name(func.value)
            if (
                func.attr.value == "zero_grad"
                and any(
                    arg.keyword is not None and arg.keyword.value == "set_to_none" and _literal(arg.value) is False
                    for arg in call.args
                )
                and (receiver in optimizer or receiver in held)
            ):
                return call
            if func.attr.value == "zero_" and receiver is not None and self._zeroes_held(func.value, call, held):
                return call
        return None

    def _zeroes_held(self, grad: cst.BaseExpression, call: cst.Call, held: set[str]) -> bool:
        # p.grad.zero_() / p.grad.data.zero_() for p of model.parameters()
        while isinstance(grad, cst.Attribute) and grad.attr.value == "data":
            grad = grad.value
        if not (isinstance(grad, cst.Attribute) and grad.attr.value == "grad"):
            return False
        owner = self._parameters_owner(grad.value, self.collected.statement_of.get(call, call))
        key = dotted_name(owner) if owner is not None else None
        return key is not None and any(_within(key, model) for model in held)

    def _near(self, call: cst.Call, construction: cst.CSTNode) -> bool:
        """Whether `call` is in the function that built the optimizer, or a method of the same class."""
        here, there = self.collected.contexts.get(call), self.collected.contexts.get(construction)
        if here is None or there is None:
            return False
        return here.scope is there.scope or (here.class_def is not None and here.class_def is there.class_def)

    def _moving_optimizers(self) -> list[tuple[cst.Assign, set[str]]]:
        """Optimizers that still move parameters with a zero gradient, and the names their parameters come from."""
        found: list[tuple[cst.Assign, set[str]]] = []
        for statement in self.collected.statements:
            if not isinstance(statement, cst.Assign) or not isinstance(statement.value, cst.Call):
                continue
            call = statement.value
            if self.roles.role_of_value(call) is not Role.OPTIMIZER or not call.args or _stateless(call):
                continue
            held = {_parameters_source(key) for arg in call.args if arg.keyword is None for key in names_in(arg.value)}
            found.append((statement, held | self._aliases_of(held)))
        return found

    def _aliases_of(self, keys: set[str]) -> set[str]:
        # `self.model = model` beside `Adam(model.parameters())`: either name reaches the parameters.
        return {
            alias
            for alias, assigned in self._assignments.items()
            for _, value in assigned
            if value is not None and dotted_name(value) in keys
        }

    def _after(self, statement: cst.CSTNode, construction: cst.CSTNode) -> bool:
        """Whether `statement` runs after the optimizer is built: later in its function, or after `__init__`."""
        here, there = self.collected.contexts.get(statement), self.collected.contexts.get(construction)
        if here is None or there is None:
            return False
        if here.scope is there.scope:
            return self.collected.order[statement] > self.collected.order[construction]
        built_in = there.function
        return (
            built_in is not None
            and built_in.name.value == "__init__"
            and here.function is not None
            and here.class_def is not None
            and here.class_def is there.class_def
        )

    # --- (d) an EMA or teacher model that is the trained model itself ----------------

    def aliased_freezes(self) -> Iterator[AliasFreeze]:
        """Freezes (or `.eval()`) of a copy name that a plain assignment bound to the trained model itself."""
        candidates = [(*freeze, False) for freeze in self.freezes()]
        candidates += [(*call, True) for call in self._eval_calls()]
        for statement, owner, evaluates in candidates:
            key = dotted_name(owner)
            if key is None or not COPY_NAME.search(key.rsplit(".", 1)[-1]):
                continue
            definitions = self.origins.definitions(key, statement)
            if OUTSIDE in definitions or not definitions:
                continue
            aliases = [d for d in definitions if self._aliases_model(d)]
            if len(aliases) == len(definitions):
                yield AliasFreeze(statement, aliases[0].node, evaluates)

    def _aliases_model(self, definition: Definition) -> bool:
        value = definition.value
        source = dotted_name(value) if definition.binding is Binding.ASSIGN else None
        if source is None or COPY_NAME.search(source.rsplit(".", 1)[-1]):
            return False
        return self.is_module(value, definition.node)

    def _eval_calls(self) -> Iterator[tuple[cst.CSTNode, cst.BaseExpression]]:
        for call in self.collected.calls:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "eval" and not call.args:
                statement = self.collected.statement_of.get(call)
                if isinstance(statement, cst.Expr) and statement.value is call:
                    yield statement, func.value


def _literal(value: cst.BaseExpression) -> bool | None:
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


def _says_model(name: str) -> bool:
    """`model`, `backbone`, `text_encoder`: not `encoder_out` or `G`."""
    return len(name) >= 3 and MODEL_NAME.fullmatch(name) is not None and not COMPUTED_SUFFIX.fullmatch(name)


def _is_slice(subscript: cst.Subscript) -> bool:
    return len(subscript.slice) == 1 and isinstance(subscript.slice[0].slice, cst.Slice)


def _says_freeze(test: cst.BaseExpression) -> bool:
    name = last_name(test)
    return name is not None and FREEZE_NAME.match(name) is not None


def _within(frozen: str, held: str) -> bool:
    return frozen == held or frozen.startswith(held + ".")


def _parameters_source(key: str) -> str:
    """`model` for `model.parameters`: the module an optimizer's parameters come from."""
    owner, _, method = key.rpartition(".")
    return owner if owner and method in PARAMETER_ITERATORS else key


def _stateless(call: cst.Call) -> bool:
    """Plain SGD without momentum or weight decay: a zero gradient moves nothing."""
    if last_name(call.func) not in STATELESS_BY_DEFAULT:
        return False
    if len([arg for arg in call.args if arg.keyword is None]) > 2:
        return False  # SGD(params, lr, momentum, ...)
    return all(
        isinstance(arg.value, (cst.Integer, cst.Float)) and float(arg.value.value) == 0
        for arg in call.args
        if arg.keyword is not None and arg.keyword.value in ("momentum", "weight_decay")
    )
