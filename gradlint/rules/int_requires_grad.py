"""GL010: gradients requested for an integer or bool tensor."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.dtypes import DtypeKind
from gradlint.analysis.syntax.names import last_name
from gradlint.rule import Rule


class IntRequiresGrad(Rule):
    """Checks for integer and bool tensors that are made to require gradients.

    Why is this bad?
    Only floating point and complex tensors can be differentiated. `requires_grad=True`
    on `torch.tensor([1, 2, 3])` (int64, because the literals are ints),
    `torch.arange(10)`, `torch.randint(...)`, a tensor with `dtype=torch.long`, or
    `.long().requires_grad_()` raises `RuntimeError: Only Tensors of floating point
    and complex dtype can require gradients`, and so does `nn.Parameter` around an
    integer tensor (parameters require gradients by default). Write float literals
    (`[1.0, 2.0]`), pass `dtype=torch.float32`, or cast with `.float()` first; an
    integer buffer that must not learn belongs in `register_buffer` or
    `nn.Parameter(..., requires_grad=False)`.

    Float literals and float or complex dtypes are fine and not reported.

    Known problems
    Only dtypes visible in the source are known: a tensor built from a variable or
    returned by another module's function is not judged.

    References
    https://pytorch.org/docs/stable/notes/autograd.html#setting-requires-grad
    """

    code = "GL010"
    name = "int-requires-grad"
    message = "an integer or bool tensor cannot require gradients; this raises at runtime"
    requires = ((b"requires_grad", b"Parameter"),)  # every report names one of them
    example = """
        weights = torch.tensor([1, 2, 3], requires_grad=True)
    """
    use_instead = """
        weights = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    """

    def visit_Call(self, node: cst.Call) -> None:
        dtypes = self.analysis.dtypes
        func = node.func
        if _keyword_is(node, "requires_grad", "True") and not self._is_parameter(func):
            if dtypes.dtype_of_construction(node) is DtypeKind.INTEGRAL:
                self.report(node, self._named(node))
            return
        at = self.analysis.statement_of(node)
        if isinstance(func, cst.Attribute) and func.attr.value == "requires_grad_":
            if _enables(node) and dtypes.dtype_of(func.value, at) is DtypeKind.INTEGRAL:
                self.report(node, self._named(func.value), related=self._made(func.value, at))
            return
        # Ex) nn.Parameter(torch.arange(n)): parameters require gradients by default.
        data = _argument(node, 0, "data")
        flag = _argument(node, 1, "requires_grad")
        if (
            self._is_parameter(func)
            and data is not None
            and not (isinstance(flag, cst.Name) and flag.value == "False")
            and dtypes.dtype_of(data, at) is DtypeKind.INTEGRAL
        ):
            self.report(node, self._named(data), related=self._made(data, at))

    def _is_parameter(self, func: cst.BaseExpression) -> bool:
        resolved = self.analysis.imports.resolve(func) or ""
        return last_name(func) == "Parameter" and resolved.startswith(("torch.", "nn."))

    def visit_Assign(self, node: cst.Assign) -> None:
        # Ex) index.requires_grad = True
        value = node.value
        if not (isinstance(value, cst.Name) and value.value == "True"):
            return
        for target in node.targets:
            attribute = target.target
            if (
                isinstance(attribute, cst.Attribute)
                and attribute.attr.value == "requires_grad"
                and self.analysis.dtypes.dtype_of(attribute.value, node) is DtypeKind.INTEGRAL
            ):
                self.report(node, self._named(attribute.value), related=self._made(attribute.value, node))

    def _named(self, tensor: cst.BaseExpression) -> str:
        return (
            f"`{self.analysis.code(tensor)}` is an integer or bool tensor, which cannot require gradients; this raises"
        )

    def _made(self, tensor: cst.BaseExpression, at: cst.CSTNode) -> list[tuple[cst.CSTNode, str]]:
        """Where the integer tensor was made."""
        named = self.analysis.code(tensor)
        return [
            (source, f"`{named}` is made with an integer dtype here") for source in self.analysis.sources(tensor, at)
        ]


def _keyword_is(call: cst.Call, keyword: str, value: str) -> bool:
    return any(
        arg.keyword is not None
        and arg.keyword.value == keyword
        and isinstance(arg.value, cst.Name)
        and arg.value.value == value
        for arg in call.args
    )


def _enables(call: cst.Call) -> bool:
    # x.requires_grad_() and x.requires_grad_(True) enable; requires_grad_(False) does not.
    if not call.args:
        return True
    value = call.args[0].value
    return isinstance(value, cst.Name) and value.value == "True"


def _argument(call: cst.Call, index: int, keyword: str) -> cst.BaseExpression | None:
    """The argument passed at position `index` or as `keyword=`, if any."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if index < len(positional):
        return positional[index]
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == keyword), None)
