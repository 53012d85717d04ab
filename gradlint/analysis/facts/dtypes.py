"""The kind of dtype (integral or floating) a tensor expression has, when the code shows it.

Only what is certain from the source counts: a `dtype=` argument, a literal's Python
types (`torch.tensor([1, 2])` is int64), a factory that always makes integers
(`torch.randint`, `torch.randperm`) or always floats (`torch.randn`), a cast such as
`.long()` or `.float()`, or the latest assignment of a name in the same scope. Anything
else is unknown (None).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

import libcst as cst

from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name, last_name


class DtypeKind(Enum):
    """Whether a tensor's dtype can carry gradients."""

    INTEGRAL = "integral"  # integers and bool: cannot require gradients
    FLOATING = "floating"  # floating point and complex


INTEGRAL_DTYPES = frozenset(
    {
        "long", "int", "int64", "int32", "int16", "int8", "short", "uint8", "uint16", "uint32", "uint64",
        "bool", "LongTensor", "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor",
    }
)  # fmt: skip
FLOATING_DTYPES = frozenset(
    {
        "float", "float32", "float64", "float16", "bfloat16", "double", "half", "complex64", "complex128",
        "cfloat", "cdouble", "chalf", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
    }
)  # fmt: skip
INTEGRAL_CASTS = frozenset({"long", "int", "bool", "short", "byte", "char"})
FLOATING_CASTS = frozenset({"float", "double", "half", "bfloat16", "cfloat", "cdouble"})
# Methods whose result has the dtype of the tensor they are called on.
SAME_DTYPE_METHODS = frozenset(
    {
        "to", "cuda", "cpu", "clone", "detach", "contiguous", "view", "reshape", "unsqueeze", "squeeze",
        "flatten", "t", "transpose", "permute", "expand", "repeat", "pin_memory",
    }
)  # fmt: skip
ALWAYS_INTEGRAL = frozenset(
    {"randint", "randperm", "LongTensor", "IntTensor", "ShortTensor", "ByteTensor", "BoolTensor"}
)
ALWAYS_FLOATING = frozenset(
    {"randn", "rand", "zeros", "ones", "empty", "linspace", "logspace", "eye", "normal", "FloatTensor", "DoubleTensor"}
)
FROM_DATA = frozenset({"tensor", "as_tensor", "asarray"})
RANGES = frozenset({"arange", "range"})


class TensorDtypes:
    """Answers the dtype kind of tensor expressions of one module."""

    def __init__(self, collected: Collected) -> None:
        self.collected = collected
        self.imports = collected.imports
        self._assignments: dict[str, list[cst.Assign]] = {}
        for statement in collected.statements:
            if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
                key = dotted_name(statement.targets[0].target)
                if key is not None:
                    self._assignments.setdefault(key, []).append(statement)

    def dtype_of(self, node: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> DtypeKind | None:
        """The dtype kind of `node` evaluated at statement `at`, or None when unknown."""
        if depth > 8:
            return None
        if isinstance(node, (cst.Name, cst.Attribute)):
            source = self._latest_assignment(node, at)
            return self.dtype_of(source.value, source, depth + 1) if source is not None else None
        if not isinstance(node, cst.Call):
            return None
        if isinstance(node.func, cst.Attribute) and not self._is_torch(node.func):
            return self._dtype_of_method(node, node.func, at, depth)
        return self.dtype_of_construction(node)

    def dtype_of_construction(self, call: cst.Call) -> DtypeKind | None:
        """The dtype kind of a `torch.*` factory call, from `dtype=` or the factory and its data.

        The pre-0.4 `Variable(data, requires_grad=True)` has the dtype of the tensor it wraps.
        """
        if not self._is_torch(call.func):
            return None
        if last_name(call.func) == "Variable":
            wrapped = call.args[0].value if call.args and call.args[0].keyword is None else None
            return self.dtype_of_construction(wrapped) if isinstance(wrapped, cst.Call) else None
        explicit = _keyword(call, "dtype")
        if explicit is not None:
            return self.dtype_kind(explicit)
        name = last_name(call.func) or ""
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if name in ALWAYS_INTEGRAL:
            return DtypeKind.INTEGRAL
        if name in ALWAYS_FLOATING:
            return DtypeKind.FLOATING
        if name in FROM_DATA and positional:
            return literal_dtype(positional[0])
        at = self.collected.statement_of.get(call)
        if name in RANGES and positional:
            return _combine(self._number_dtype(arg, at) for arg in positional)
        if name == "full" and len(positional) > 1:
            return self._number_dtype(positional[1], at)
        return None

    def _number_dtype(self, node: cst.BaseExpression, at: cst.CSTNode | None) -> DtypeKind | None:
        # Ex) LENGTH = 32 ... torch.arange(LENGTH): a name bound to a number literal.
        if not isinstance(node, cst.Name) or at is None:
            return literal_dtype(node)
        function = self.collected.contexts[at].function
        if function is not None and node.value in {param.name.value for param in function.params.params}:
            return None
        source = self._latest_assignment(node, at) or self._module_constant(node.value)
        return literal_dtype(source.value) if source is not None else None

    def _module_constant(self, key: str) -> cst.Assign | None:
        module = self.collected.module
        bound = [s for s in self._assignments.get(key, []) if self.collected.contexts[s].scope is module]
        return bound[0] if len(bound) == 1 else None

    def dtype_kind(self, dtype: cst.BaseExpression) -> DtypeKind | None:
        """INTEGRAL for `torch.long`, `torch.bool`, ...; FLOATING for `torch.float16`, ...; else None."""
        name = last_name(dtype)
        if not self._is_torch(dtype):
            return None
        if name in INTEGRAL_DTYPES:
            return DtypeKind.INTEGRAL
        return DtypeKind.FLOATING if name in FLOATING_DTYPES else None

    def _dtype_of_method(self, call: cst.Call, func: cst.Attribute, at: cst.CSTNode, depth: int) -> DtypeKind | None:
        method = func.attr.value
        if method in INTEGRAL_CASTS and not call.args:
            return DtypeKind.INTEGRAL
        if method in FLOATING_CASTS and not call.args:
            return DtypeKind.FLOATING
        if method in ("to", "type"):
            for arg in call.args:
                kind = self.dtype_kind(arg.value)
                if kind is not None:
                    return kind
        if method in SAME_DTYPE_METHODS:
            return self.dtype_of(func.value, at, depth + 1)
        return None

    def _latest_assignment(self, node: cst.BaseExpression, at: cst.CSTNode) -> cst.Assign | None:
        key = dotted_name(node)
        context = self.collected.contexts.get(at)
        if key is None or context is None:
            return None
        order = self.collected.order
        before = [
            statement
            for statement in self._assignments.get(key, [])
            if self.collected.contexts[statement].scope is context.scope and order[statement] < order[at]
        ]
        return max(before, key=order.__getitem__) if before else None

    def _is_torch(self, node: cst.BaseExpression) -> bool:
        return (self.imports.resolve(node) or "").startswith("torch.")


def literal_dtype(node: cst.BaseExpression) -> DtypeKind | None:
    """The dtype kind torch infers for literal data: ints and bools are integral, floats floating."""
    if isinstance(node, cst.Integer):
        return DtypeKind.INTEGRAL
    if isinstance(node, (cst.Float, cst.Imaginary)):
        return DtypeKind.FLOATING
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return DtypeKind.INTEGRAL
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        return literal_dtype(node.expression)
    if isinstance(node, (cst.List, cst.Tuple)):
        if not node.elements:
            return DtypeKind.FLOATING  # torch.tensor([]) is float32
        return _combine(literal_dtype(element.value) for element in node.elements)
    return None


def _combine(kinds: Iterable[DtypeKind | None]) -> DtypeKind | None:
    # One float makes the whole tensor floating; all-integral data stays integral.
    seen = set(kinds)
    if DtypeKind.FLOATING in seen:
        return DtypeKind.FLOATING
    return DtypeKind.INTEGRAL if seen == {DtypeKind.INTEGRAL} else None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)
