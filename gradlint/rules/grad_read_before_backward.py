"""GL021: a `.grad` used where it is still None: before any backward pass, or on a non-leaf never retained."""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from gradlint.analysis.training.gradreads import GradRead, GradReads
from gradlint.rule import Rule

NOT_RETAINED = "`{key}` is not a leaf and `retain_grad()` is never called on it, so `{key}.grad` is always None"

Story = list[tuple[cst.CSTNode, str]]


class GradReadBeforeBackward(Rule):
    """Checks for `.grad` used where it can only be None: before any backward pass, or on a non-leaf.

    Why is this bad?
    A leaf tensor (a parameter, a tensor made with `requires_grad=True`) has
    `.grad` None until the first backward pass that reaches it. Zeroing or reading it
    before that (`w.grad.data.zero_()` at the top of the first iteration, a gradient-norm
    log before `loss.backward()`) raises `AttributeError: 'NoneType' object has no
    attribute ...` on the first step. A non-leaf tensor (the result of an operation on
    tensors that require grad: an activation, `x @ w1`) never gets a `.grad` unless
    `retain_grad()` was called on it before the backward pass: its `.grad` is always None
    and PyTorch warns "The .grad attribute of a Tensor that is not a leaf Tensor is
    being accessed".

    Only uses that need a tensor are reported (`.zero_()`, `.data`, `.norm()`, indexing,
    arithmetic, `+=`): printing or storing a None is not. Not reported: a read guarded by
    a None test on the same gradient (`if p.grad is not None`) or by a `try` that catches
    the error; a gradient the scope assigned before (`p.grad = torch.zeros_like(p)`);
    zeroing at the end of the loop body (the backward above it filled the gradient); a
    read in a function that a caller in this module reaches after a backward pass;
    Lightning's hooks that run after backward (`on_after_backward`,
    `on_before_optimizer_step`, `configure_gradient_clipping`); results of
    `torch.autograd.grad`. A `retain_grad()` called after the backward pass is GL015
    late-retain-grad's finding; this rule reports a non-leaf's `.grad` only when
    `retain_grad()` is never called on it.

    Known problems
    Any earlier backward pass of the scope counts as filling the gradient, even one
    through another loss. A read inside an `if` that the backward pass is not also in
    (`if step > 0:`) is not reported, since the test may skip the first iteration. A
    backward pass that a caller in another module runs before calling the reading
    function is not seen. A helper of another module of the project that uses the
    gradients of the parameters it is given (`reset_gradients(model)`) is also reported
    at a call of it that comes before the first backward pass of the caller's scope,
    naming the helper; a use it guards with a test of `.grad` is not counted. Reads in
    the header of an `if`, `while` or `for` are not examined.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.grad.html
    https://pytorch.org/docs/stable/generated/torch.Tensor.retain_grad.html
    """

    code = "GL021"
    name = "grad-read-before-backward"
    message = "a gradient is used before any backward pass has filled it, so `.grad` is still None and this raises"
    requires = (b".grad",)
    example = """
        for x, y in loader:
            loss = ((x @ w - y) ** 2).mean()
            w.grad.data.zero_()
            loss.backward()
            with torch.no_grad():
                w -= lr * w.grad
    """
    use_instead = """
        for x, y in loader:
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w -= lr * w.grad
            w.grad.zero_()
    """

    @cached_property
    def reads(self) -> GradReads:
        """The module's `.grad` uses and the facts about them."""
        return GradReads(self.analysis)

    def check_module(self) -> None:
        reads = self.reads
        for read in reads.reads:
            if not reads.is_tensor(read) or reads.may_be_none_checked(read):
                continue
            story = self._unfilled(read)
            if story is not None:
                named = f"`{self.analysis.code(read.node)}` is used before any backward pass has filled it, "
                self.report(read.node, named + "so it is still None and this raises", related=story)
                continue
            made = reads.is_non_leaf(read)
            if made is not None:
                key = read.key
                related = [(made, f"`{key}` is computed here from tensors that require grad")]
                self.report(read.node, NOT_RETAINED.format(key=key), related=related)
        for outside in reads.outside:
            if reads.backward_before(outside.call):
                continue
            after = reads.backward_after(outside.call)
            if after is not None:
                function = outside.via.rpartition(".")[2]
                message = (
                    f"`{function}` (in `{outside.via}`) uses the `.grad` of `{self.analysis.code(outside.value)}` "
                    "before any backward pass has filled it, so it is still None and this raises"
                )
                self.report(outside.call, message, related=[(after.site, "the first backward pass runs only here")])

    def _unfilled(self, read: GradRead) -> Story | None:
        """Where the first backward pass runs, when `read` runs before any can have filled `.grad`."""
        reads = self.reads
        statement = read.statement
        if reads.backward_before(statement):
            return None
        after = reads.backward_after(statement)
        if after is not None:
            return [(after.site, "the first backward pass runs only here")]
        function = self.analysis.context(statement).function
        if function is None or reads.runs_backward(function) or self.analysis.context(statement).ifs:
            return None
        return self._unfilled_at_every_call(function)

    def _unfilled_at_every_call(self, function: cst.FunctionDef) -> Story | None:
        """For a helper that runs no backward itself: every call of it comes before the first backward pass."""
        reads = self.reads
        story: Story = []
        sites = reads.call_sites(function)
        for site in sites:
            after = reads.backward_after(site) if not reads.backward_before(site) else None
            if after is None:
                return None
            story += [(site, f"`{function.name.value}` is called here"), (after.site, "the first backward runs here")]
        return story or None
