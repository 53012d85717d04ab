"""GL020: a moved or cast copy of a leaf handed to an optimizer in place of the leaf."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.training.copies import CopyUse, LeafCopy
from gradlint.fixes import method_call, replace_node, without_keyword
from gradlint.rule import Fix, Rule


class NonLeafOptimized(Rule):
    """Checks for tensors made to require grad, then moved or cast, and optimized as parameters.

    Why is this bad?
    A tensor made with `requires_grad=True` (or an `nn.Parameter`, or switched on with
    `requires_grad_()`) is a leaf of the autograd graph. `.cuda()`, `.to(device)`,
    `.double()`, `.half()`, `.type(dtype)`, a view (`.view`, `.reshape`, indexing), a
    clone or arithmetic (`* 0.01`) applied to it while autograd records return a new
    tensor with a history: a non-leaf. Given to an optimizer (`Adam([w])`, param groups),
    it raises `ValueError: can't optimize a non-leaf Tensor`; updated by hand
    (`w -= lr * w.grad`), its `.grad` stays None. A move that changes nothing (`.to(device)`
    on CPU when the tensor is on CPU already) returns the leaf itself, so the script runs
    on a laptop and fails on the GPU. Make the tensor where it belongs
    (`torch.randn(3, device=device, requires_grad=True)`), or switch grad on after the move
    (`torch.randn(3).to(device).requires_grad_()`, `nn.Parameter(t.to(device))`).

    Kept on a module (`self.w = nn.Parameter(torch.randn(n)).to(device)` in an
    `nn.Module`), the copy is no Parameter: the module does not register it, so
    `model.parameters()` leaves it out and the optimizer of the model never trains it (on
    the CPU the move returns the Parameter itself, and the bug shows only on the GPU).
    Wrap the moved tensor instead: `nn.Parameter(torch.randn(n).to(device))`, or move
    the whole module with `model.to(device)`. Only a leaf made inline in the same
    statement is reported there; this case gets no fix.

    Not reported: a tensor made on its device and dtype, `requires_grad_()`, `.detach()`
    or `nn.Parameter(...)` after the move, `model.to(device)` (a module moves in place),
    a copy used only in the forward pass, `.float()` of a tensor made with the default
    dtype and `.to("cpu")` (both return the leaf itself), and moves under `torch.no_grad()`.
    A move under `no_grad` makes a new leaf that does not require grad: the optimizer
    accepts it and it never trains, a different bug that this rule leaves alone.

    Other reads of a copy's `.grad` (a print, a norm) are left to grad-read-before-backward.

    Known problems
    Values are followed through assignments, aliases, lists and list comprehensions,
    `append`, module-level names, `self` attributes set in another method of the
    class, and same-module helpers (one that returns a leaf it makes, moved by its caller,
    included). A copy returned by a function of another module is
    not seen; a helper of another module that builds an optimizer is assumed to build it
    on a list of tensors it is passed, since its summary does not say which parameter.
    The variant where the leaf goes to the optimizer and its copy, made once, is used in
    every forward pass (the forward then never sees the updates) is not reported.
    Unpacking (`w, b = w.cuda(), b.cuda()`) is not followed.

    Fix safety
    Where the leaf is made inline (`torch.randn(3, requires_grad=True).cuda()`), the fix
    moves `requires_grad` after the move: `torch.randn(3).cuda().requires_grad_()`. The
    values, device and dtype are the same, and the temporary leaf it replaces had no
    other reference; where the move did copy, the original code raised (or its manual
    update found `.grad` None), so the fix is safe. Copies of a named leaf get no fix:
    other references to the leaf would be left behind.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.is_leaf.html
    https://discuss.pytorch.org/t/valueerror-cant-optimize-a-non-leaf-tensor/21751
    """

    code = "GL020"
    name = "non-leaf-optimized"
    message = "a leaf that requires grad is moved or cast before it is optimized; the copy is not a leaf, so the optimizer raises"  # noqa: E501
    requires = ((b"requires_grad", b"Parameter"),)  # every report copies a leaf made by one of them
    example = """
        w = torch.randn(10, 3, requires_grad=True).cuda()
        optimizer = torch.optim.SGD([w], lr=0.1)
    """
    use_instead = """
        w = torch.randn(10, 3, device="cuda", requires_grad=True)
        optimizer = torch.optim.SGD([w], lr=0.1)
    """

    def check_module(self) -> None:
        uses: dict[cst.CSTNode, list[CopyUse]] = {}
        for use in self.analysis.leaf_copies.uses:
            uses.setdefault(use.copy.node, []).append(use)
        for found in uses.values():
            copy = found[0].copy
            # A module keeps only Parameters: a leaf made after the move would still go unregistered, so no fix.
            fix = None if any(use.module for use in found) else self._fix(copy)
            self.report(copy.node, self._message(copy, found), fix, self._story(found))

    def _message(self, copy: LeafCopy, uses: list[CopyUse]) -> str:
        named = self.analysis.code(copy.node)
        if any(use.module for use in uses):
            return f"`{named}` is a copy of a leaf that requires grad, not a Parameter; the module does not register it, so model.parameters() leaves it out and it never trains"  # noqa: E501
        if any(use.optimizer for use in uses):
            return f"`{named}` is a copy of a leaf that requires grad, not the leaf; the optimizer given it raises can't optimize a non-leaf Tensor"  # noqa: E501
        return f"`{named}` is a copy of a leaf that requires grad, not the leaf; its .grad stays None, so the update from it fails"  # noqa: E501

    def _story(self, uses: list[CopyUse]) -> list[tuple[cst.CSTNode, str]]:
        return [(use.node, _used_here(use)) for use in uses]

    def _fix(self, copy: LeafCopy) -> Fix | None:
        maker = copy.maker
        statement = copy.statement
        if maker is None or not _keyword_true(maker, "requires_grad"):
            return None
        if not (isinstance(statement, (cst.Assign, cst.Return)) and _whole_value(statement.value, copy.node)):
            return None  # the copy is part of a larger expression: leave it to a person
        if not _copies_only(copy.node, maker):
            return None  # the leaf was made on another line (other references to it may exist), or mixed with others
        inline = copy.node.deep_replace(maker, without_keyword(maker, "requires_grad"))
        if not isinstance(inline, cst.BaseExpression):
            return None
        description = "switch grad on after the move: `.requires_grad_()`"
        return replace_node(self.analysis, copy.node, method_call(inline, "requires_grad_"), description)


def _used_here(use: CopyUse) -> str:
    if use.module:
        return "the copy is kept on the module here, where only a Parameter is registered"
    return "the copy is optimized here" if use.optimizer else "the copy is updated from its own .grad here"


def _keyword_true(call: cst.Call, keyword: str) -> bool:
    return any(
        arg.keyword is not None
        and arg.keyword.value == keyword
        and isinstance(arg.value, cst.Name)
        and arg.value.value == "True"
        for arg in call.args
    )


def _whole_value(value: cst.BaseExpression | None, copy: cst.BaseExpression) -> bool:
    """Whether `copy` is the value bound, or the element of a list comprehension bound."""
    return value is copy or (isinstance(value, (cst.ListComp, cst.GeneratorExp)) and value.elt is copy)


def _copies_only(node: cst.BaseExpression, maker: cst.Call) -> bool:
    """Whether `node` is `maker` moved, cast, viewed or scaled by constants: no other tensor in it."""
    if node is maker:
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return _copies_only(node.func.value, maker)
    if isinstance(node, cst.Subscript):
        return _copies_only(node.value, maker)
    if isinstance(node, cst.UnaryOperation):
        return _copies_only(node.expression, maker)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.right, cst.BaseNumber):
            return _copies_only(node.left, maker)
        return isinstance(node.left, cst.BaseNumber) and _copies_only(node.right, maker)
    return False
