"""Which module classes hold no parameters: what their forward returns has a graph only from its inputs.

A species converter that maps atomic numbers through a buffer, a metric computed by a
module with no weights, a block of activations and pooling: calling one builds a graph
only when an input already carries one. A class is proven to hold none when it derives
from `torch.nn.Module` (directly, or through classes proven the same way) and nothing
any of its methods stores on `self` can hold one: literals, plain tensors made by torch
functions without `requires_grad=True`, buffers, torch's layers without weights (`nn.ReLU`,
`nn.Dropout`, `nn.MaxPool2d`, the losses), layers whose weight is frozen from the start
(`nn.Embedding.from_pretrained(t)`, whose `freeze` defaults to True) and instances of
classes proven the same way; what holds only frozen weights builds no graph either.
Anything else (an argument stored on `self`, a layer with weights, an unknown call,
`add_module`, `setattr`) may hold parameters: unknown, so the class is not proven.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import ImportMap, dotted_name, is_true

# torch.nn layers that own no parameters (and are built without any, whatever their arguments).
PARAMETERLESS_LAYERS = frozenset(
    {
        "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh",
        "Softmax", "Softmin", "Softmax2d", "LogSoftmax", "LogSigmoid", "Softplus", "Softsign", "Softshrink",
        "Hardshrink", "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink", "Threshold", "GLU",
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
        "Identity", "Flatten", "Unflatten", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Fold", "Unfold",
        "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "LPPool1d", "LPPool2d",
        "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
        "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
        "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d",
        "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d",
        "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
        "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d",
        "CosineSimilarity", "PairwiseDistance",
    }
)  # fmt: skip
# torch.nn layers built from a tensor whose weight does not require grad unless `freeze=False` is passed.
FROZEN_BY_DEFAULT = frozenset({"torch.nn.Embedding.from_pretrained", "torch.nn.EmbeddingBag.from_pretrained"})
MODULE_BASES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# Methods of `self` that store nothing that could hold parameters.
HARMLESS_SELF_CALLS = frozenset({"register_buffer", "train", "eval", "to", "cuda", "cpu", "float", "double", "half"})


def weightless_layer(qualified: str | None) -> bool:
    """Whether `qualified` names one of torch's layers that own no parameters (`torch.nn.Softmax`, a loss)."""
    if qualified is None or not qualified.startswith("torch.nn.") or qualified.count(".") != 2:
        return False
    layer = qualified.rsplit(".", 1)[1]
    return layer in PARAMETERLESS_LAYERS or layer.endswith("Loss")


def parameterless_classes(
    collected: Collected, imports: ImportMap, elsewhere: Callable[[str], bool] | None = None
) -> frozenset[str]:
    """The names of this module's top-level classes proven to hold no parameters. `elsewhere(dotted)` answers
    for a class another module of the project defines (None: such a class is unknown)."""
    classes = {
        statement.name.value: statement for statement in collected.module.body if isinstance(statement, cst.ClassDef)
    }
    proven: set[str] = set()
    changed = True
    while changed:  # a class proven lets the classes built on it or holding it be proven
        changed = False
        for name, cls in classes.items():
            if name in proven:
                continue
            known = _Known(imports, proven, elsewhere)
            if _bases_proven(cls, known) and _stores_nothing_trainable(collected, cls, known):
                proven.add(name)
                changed = True
    return frozenset(proven)


class _Known:
    """Answers whether a class named in this module is proven to hold no parameters."""

    def __init__(self, imports: ImportMap, proven: set[str], elsewhere: Callable[[str], bool] | None) -> None:
        self.imports = imports
        self.proven = proven
        self.elsewhere = elsewhere

    def module_base(self, base: cst.BaseExpression) -> bool:
        qualified = self.imports.resolve(base) or dotted_name(base) or ""
        return qualified in MODULE_BASES or self.parameterless(base)

    def parameterless(self, func: cst.BaseExpression) -> bool:
        dotted = dotted_name(func)
        if dotted is None:
            return False
        if dotted in self.proven:
            return True
        if weightless_layer(self.imports.resolve(func)):
            return True
        return self.elsewhere is not None and "." not in dotted.partition(".")[2] and self.elsewhere(dotted)


def _bases_proven(cls: cst.ClassDef, known: _Known) -> bool:
    return bool(cls.bases) and not cls.keywords and all(known.module_base(base.value) for base in cls.bases)


def _stores_nothing_trainable(collected: Collected, cls: cst.ClassDef, known: _Known) -> bool:
    methods = [function for function, owner in collected.owners.items() if owner is cls]
    for method in methods:
        for statement in collected.statements_in_scope(method):
            if isinstance(statement, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                targets = (
                    [target.target for target in statement.targets]
                    if isinstance(statement, cst.Assign)
                    else [statement.target]
                )
                value = statement.value
                if any(_on_self(target) for target in targets) and (value is None or not _free(value, known)):
                    return False
                if any(_unfreezes(target) for target in targets):
                    return False
            elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
                call = statement.value
                if _stores_through(call) or _unfreezes(call.func):
                    return False
    return True


def _on_self(target: cst.BaseExpression) -> bool:
    """`self.x` (or `self.x, self.y`): an attribute of the module itself, which `nn.Module` registers."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_on_self(element.value) for element in target.elements)
    key = dotted_name(target) or ""
    return key.startswith("self.") and key.count(".") == 1


def _unfreezes(node: cst.BaseExpression) -> bool:
    """`self.embed.weight.requires_grad = ...` or `self.embed.requires_grad_(...)`: a frozen weight may train."""
    key = dotted_name(node) or ""
    return key.startswith("self.") and key.rsplit(".", 1)[1] in ("requires_grad", "requires_grad_")


def _stores_through(call: cst.Call) -> bool:
    """`self.add_module(...)`, `self.register_parameter(...)`, `setattr(self, ...)`: stores what cannot be read."""
    func = call.func
    if isinstance(func, cst.Name) and func.value == "setattr":
        return bool(call.args) and dotted_name(call.args[0].value) == "self"
    if isinstance(func, cst.Attribute) and dotted_name(func.value) == "self":
        return func.attr.value not in HARMLESS_SELF_CALLS and func.attr.value.startswith(("add_", "register_"))
    return False


def _free(value: cst.BaseExpression, known: _Known) -> bool:
    """Whether `value`, stored on a module, surely holds no parameter."""
    if isinstance(value, (cst.BaseNumber, cst.BaseString)):
        return True
    if isinstance(value, cst.Name):
        return value.value in ("None", "True", "False")
    if isinstance(value, (cst.Tuple, cst.List, cst.Set)):
        return all(_free(element.value, known) for element in value.elements)
    if isinstance(value, cst.UnaryOperation):
        return _free(value.expression, known)
    if isinstance(value, cst.BinaryOperation):
        return _free(value.left, known) and _free(value.right, known)
    if not isinstance(value, cst.Call):
        return False
    if any(arg.keyword is not None and arg.keyword.value == "requires_grad" for arg in value.args):
        return False
    qualified = known.imports.resolve(value.func) or ""
    if qualified in FROZEN_BY_DEFAULT:
        return all(arg.keyword is None or arg.keyword.value != "freeze" or is_true(arg.value) for arg in value.args)
    if qualified.startswith("torch.") and not qualified.startswith("torch.nn."):
        return qualified.rsplit(".", 1)[1][:1].islower()  # a function making a plain tensor, not a class
    return known.parameterless(value.func)
