"""GL003: a parameter updated by hand from its gradient while autograd is recording."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.mutations import ManualUpdate
from gradlint.analysis.syntax.names import dotted_name
from gradlint.fixes import reference, wrap_in_with
from gradlint.rule import Fix, Rule

REBINDING = (
    "the parameter is rebound to a value computed with autograd on, so it is no longer a leaf "
    "and its .grad stays None from now on"
)


class UpdateOutsideNoGrad(Rule):
    """Checks for manual parameter updates from gradients outside `torch.no_grad()`.

    Why is this bad?
    A parameter (an `nn.Parameter`, an element of `model.parameters()`, a tensor made
    with `requires_grad=True`) is a leaf of the autograd graph. Updating it in place
    while autograd records (`p -= lr * p.grad`, `p.sub_(...)`, `p.add_(p.grad, alpha=-lr)`,
    `p.copy_(...)`) raises `RuntimeError: a leaf Variable that requires grad is being
    used in an in-place operation.` Rebinding it instead (`w = w - lr * w.grad`) runs,
    but the new `w` is the output of a subtraction, not a leaf: the next `backward()`
    leaves `w.grad` as `None`, and the following update fails or silently stops
    training.

    Wrap the update in `with torch.no_grad():` (or decorate the function with
    `@torch.no_grad()`), as every `torch.optim` optimizer does in its `step`. Updates
    inside `torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(False)`
    and through `p.data` are not reported, and neither are rebindings to a fresh leaf
    (`w = (w - lr * w.grad).detach().requires_grad_()`) or MAML-style fast weights
    built from `torch.autograd.grad` results.

    A helper of another module of the project that updates the parameters it is given
    (`def sgd(params, lr): for p in params: p -= lr * p.grad`) is reported at the call
    that runs it with autograd recording (`sgd(model.parameters(), 0.1)` in a training
    loop), naming the helper: that call decides the grad mode.

    Known problems
    An update is reported only where autograd surely records: module-level code, a
    function that backpropagates itself, or a function called from such code in the
    same module. A helper whose callers live in another module is reported at those
    callers (above), not in its own module, where it is assumed to run under `no_grad`
    (a hand-written optimizer's `step`). Updates inside a custom optimizer's
    `param_groups` loop are not followed through calls.

    Fix safety
    Wrapping an in-place update in `with torch.no_grad():` is safe: a leaf tensor that
    requires grad raises when updated in place outside `no_grad`, so the code being fixed
    never ran. Rewriting `w = w - lr * w.grad` as an in-place update is unsafe: other
    references to `w` then see the update.

    References
    https://pytorch.org/tutorials/beginner/pytorch_with_examples.html#pytorch-tensors-and-autograd
    https://pytorch.org/docs/stable/generated/torch.no_grad.html
    """

    code = "GL003"
    name = "update-outside-no-grad"
    message = "a parameter is updated in place from its gradient outside torch.no_grad(), which raises at runtime"
    requires = (b"grad",)
    example = """
        w = torch.randn(3, requires_grad=True)
        loss = (w * 2).sum()
        loss.backward()
        w -= 0.1 * w.grad
    """
    use_instead = """
        w = torch.randn(3, requires_grad=True)
        loss = (w * 2).sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
    """

    def check_module(self) -> None:
        analysis = self.analysis
        for update in analysis.mutations.updates:
            if analysis.callers.with_grad(update.statement):
                message = REBINDING if update.rebinding else self._named(update)
                self.report(update.node, message, self._fix(update), self._story(update))
        for outside in analysis.outside_updates:
            function = outside.via.rpartition(".")[2]
            message = (
                f"`{function}` (in `{outside.via}`) updates the parameters in `{analysis.code(outside.value)}` in "
                "place from their gradients, and it runs here outside torch.no_grad(), which raises"
            )
            self.report(outside.call, message)

    def _named(self, update: ManualUpdate) -> str:
        target = self.analysis.code(update.target)
        return f"`{target}`, a leaf that requires grad, is updated in place outside torch.no_grad(), which raises"

    def _story(self, update: ManualUpdate) -> list[tuple[cst.CSTNode, str]]:
        """Where the updated tensor was made a leaf that requires grad."""
        target = self.analysis.code(update.target)
        sources = self.analysis.sources(update.target, update.statement)
        story: list[tuple[cst.CSTNode, str]] = [(source, f"`{target}` requires grad from here") for source in sources]
        loops = self.analysis.context(update.statement).loops
        if not story and loops:
            story.append((loops[-1], "updated on every iteration, with autograd recording"))
        return story

    def _fix(self, update: ManualUpdate) -> Fix | None:
        no_grad = reference(self.analysis.imports, "torch.no_grad")
        if no_grad is None:
            return None
        if not update.rebinding:
            description = "wrap the update in `with torch.no_grad():`"
            return wrap_in_with(self.analysis, update.statement, cst.Call(no_grad), description)
        # Rebinding under no_grad would make a tensor that no longer requires grad at all;
        # updating in place instead changes what other references to the tensor see, so a
        # person must judge: the fix is unsafe. The rebinding gave a tensor without a gradient:
        # the gradient is dropped after the update, so the next one does not add onto it (GL002).
        in_place = _in_place(update.statement)
        if in_place is None:
            return None
        dropped = cst.Assign([cst.AssignTarget(cst.Attribute(in_place.target, cst.Name("grad")))], cst.Name("None"))
        description = "update the parameter in place under `torch.no_grad()`, then drop its gradient"
        return wrap_in_with(
            self.analysis, update.statement, cst.Call(no_grad), description, safe=False, body=(in_place, dropped)
        )


def _in_place(statement: cst.BaseSmallStatement) -> cst.AugAssign | None:
    """`w -= x` for `w = w - x` (and `+`), else None."""
    if not (isinstance(statement, cst.Assign) and isinstance(statement.value, cst.BinaryOperation)):
        return None
    target, value = statement.targets[0].target, statement.value
    operator = {cst.Subtract: cst.SubtractAssign, cst.Add: cst.AddAssign}.get(type(value.operator))
    if operator is None or dotted_name(value.left) != dotted_name(target) or dotted_name(target) is None:
        return None
    return cst.AugAssign(target=target, operator=operator(), value=value.right)
