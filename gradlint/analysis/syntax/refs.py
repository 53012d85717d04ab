"""What a call names when its callee is not a function of the same module: a reference to resolve later.

A module knows the names it imports, its classes and their bases, but not what other
modules define. A call it cannot resolve alone becomes a `Ref` (`gradlint.index`): plain
data that the whole-program model (`gradlint.analysis.project.program`) resolves against the
other modules' outlines. Building refs never reads another file.

A constructor that sets `self.model = model` stores what its caller passes (`stored_parameters`):
`Evaluator(model).model` is the caller's `model`.
"""

from __future__ import annotations

import builtins

import libcst as cst

from gradlint.analysis.syntax.collect import Context
from gradlint.analysis.syntax.names import ImportMap, dotted_name
from gradlint.analysis.syntax.tree import descendants
from gradlint.index import Ref

BUILTINS = frozenset(dir(builtins))  # `len(x)` in a module with star imports is the builtin
# Ports for the literals that switch a parameter off: `train_step(model, batch, optimizer=None)`.
OFF_NONE = "=None"
OFF_FALSE = "=False"
# The deepest parameter path a summary keeps (`opt`, `self.optimizer`, `trainer.opt.inner`).
MAX_PORT_PARTS = 3


def call_ref(
    func: cst.BaseExpression, context: Context, imports: ImportMap, instance_class: str | None = None
) -> Ref | None:
    """The reference a call's `func` makes to code outside this module, or None.

    `instance_class` is the dotted name of the class the receiver of `obj.method(...)`
    was built from, when the module shows it (one constructor wherever `obj` is bound).
    """
    if isinstance(func, cst.Call) or (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call)):
        return _super_ref(func, context)
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
        if context.class_def is not None:
            return Ref("class", context.class_def.name.value, method=func.attr.value)
        return None
    if instance_class is not None and isinstance(func, cst.Attribute):
        target = name_ref(instance_class, imports, local_classes=True)
        return Ref(target.kind, target.name, target.level, func.attr.value) if target is not None else None
    dotted = dotted_name(func)
    return name_ref(dotted, imports) if dotted is not None else None


def name_ref(dotted: str, imports: ImportMap, *, local_classes: bool = False) -> Ref | None:
    """The reference the dotted name `dotted` makes through this module's imports."""
    head, _, rest = dotted.partition(".")
    if head in imports.relative:
        level, target = imports.relative[head]
        return Ref("relative", f"{target}.{rest}" if rest else target, level)
    if head in imports.aliases:
        base = imports.aliases[head]
        return Ref("absolute", f"{base}.{rest}" if rest else base)
    if local_classes:
        return Ref("class", dotted)
    if not rest and imports.stars and head not in BUILTINS:
        return Ref("star", head)  # Ex) from .layers import * ... conv_block(x)
    return None


def _super_ref(func: cst.BaseExpression, context: Context) -> Ref | None:
    # super().training_step(batch): the method of a base class.
    if (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Call)
        and isinstance(func.value.func, cst.Name)
        and func.value.func.value == "super"
        and context.class_def is not None
    ):
        return Ref("super", context.class_def.name.value, method=func.attr.value)
    return None


def port(expression: cst.BaseExpression | None, params: frozenset[str]) -> str | None:
    """The parameter path `expression` reads (`opt`, `self.optimizer`), or None for anything else."""
    if expression is None:
        return None
    if isinstance(expression, cst.Name) and expression.value in ("None", "False"):
        return OFF_NONE if expression.value == "None" else OFF_FALSE
    dotted = dotted_name(expression)
    if dotted is None:
        return None
    parts = dotted.split(".")
    if parts[0] not in params or len(parts) > MAX_PORT_PARTS:
        return None
    return dotted


def positional_params(function: cst.FunctionDef) -> tuple[str, ...]:
    """The names of the parameters a call can fill by position, `self` included."""
    return tuple(param.name.value for param in (*function.params.posonly_params, *function.params.params))


def all_params(function: cst.FunctionDef) -> frozenset[str]:
    """Every parameter name of `function`, star parameters included."""
    params = function.params
    names = [param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)]
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.append(star.name.value)
    return frozenset(names)


def call_positional_params(helper: cst.FunctionDef, call: cst.Call, *, constructor: bool = False) -> list[cst.Param]:
    """The parameters of `helper` that `call`'s positional arguments fill, in order: without `self` when the call
    binds it (`obj.method(x)`, or `Cls(x)` running `__init__` when `constructor`)."""
    positional = list(helper.params.posonly_params) + list(helper.params.params)
    binds_self = constructor or isinstance(call.func, cst.Attribute)
    if positional and positional[0].name.value in ("self", "cls") and binds_self:
        positional = positional[1:]
    return positional


def arguments_of(
    helper: cst.FunctionDef, call: cst.Call, *, constructor: bool = False
) -> dict[str, cst.BaseExpression]:
    """The helper's parameters mapped to what `call` passes them (by position, then keyword); `constructor`: the
    call builds an instance of the class whose `__init__` `helper` is.

    A spread argument (`*args`, `**kwargs`) fills the parameters after the positional ones with its items:
    `inner(model, *args)` gives inner's second parameter `args[0]`.
    """
    positional = call_positional_params(helper, call, constructor=constructor)
    given: dict[str, cst.BaseExpression] = {}
    index = 0
    for arg in call.args:
        if arg.keyword is not None or arg.star == "**":
            continue
        if arg.star == "*":
            for offset, param in enumerate(positional[index:]):
                given.setdefault(param.name.value, _item(arg.value, cst.Integer(str(offset))))
            break
        if index < len(positional):
            given[positional[index].name.value] = arg.value
        index += 1
    given.update((arg.keyword.value, arg.value) for arg in call.args if arg.keyword is not None)
    for arg in call.args:
        if arg.star == "**":
            for param in (*positional, *helper.params.kwonly_params):
                given.setdefault(param.name.value, _item(arg.value, cst.SimpleString(f'"{param.name.value}"')))
    return given


def _item(value: cst.BaseExpression, index: cst.BaseExpression) -> cst.Subscript:
    return cst.Subscript(value=value, slice=[cst.SubscriptElement(cst.Index(index))])


def stored_parameters(function: cst.FunctionDef) -> tuple[tuple[str, str], ...]:
    """(parameter, attribute) for each `self.attribute = parameter` in the straight line of `function`'s body (a
    constructor keeping what it is given), where the body rebinds neither the parameter nor the attribute."""
    params = all_params(function) - {"self", "cls"}
    if not params or not isinstance(function.body, cst.IndentedBlock):
        return ()
    bound: dict[str, int] = {}
    for node in descendants(function.body):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
            targets = [node.target]
        for target in targets:
            for element in descendants(target) if isinstance(target, (cst.Tuple, cst.List)) else [target]:
                key = dotted_name(element) if isinstance(element, cst.BaseExpression) else None
                if key is not None:
                    bound[key] = bound.get(key, 0) + 1
    found = []
    for line in function.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for statement in line.body:
            if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
                continue
            attribute, value = _attribute_of_self(statement.targets[0].target), statement.value
            if (
                attribute is not None
                and isinstance(value, cst.Name)
                and value.value in params
                and value.value not in bound
                and bound.get(f"self.{attribute}") == 1
            ):
                found.append((value.value, attribute))
    return tuple(found)


def _attribute_of_self(target: cst.BaseExpression) -> str | None:
    """`model` for `self.model`: exactly an attribute of `self`."""
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
        return target.attr.value
    return None
