"""GL012: `backward()` without a `gradient` on a tensor that is clearly not a scalar."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Kind
from gradlint.analysis.facts.shapes import Shape
from gradlint.rule import Rule

SCALAR_ERROR = "'grad can be implicitly created only for scalar outputs'"
LIGHTNING_RETURN = (
    "training_step returns `{loss}`, which is not a scalar; Lightning calls backward() on it, "
    "which raises 'grad can be implicitly created only for scalar outputs'"
)
# Keywords that hand backward() the vector of a vector-Jacobian product.
GRADIENT_KEYWORDS = frozenset({"gradient", "grad_tensors"})


class BackwardNonScalar(Rule):
    """Checks for `backward()` called without a `gradient` on a tensor that is not a scalar.

    Why is this bad?
    `backward()` can only create the starting gradient itself for a one-element
    tensor. A loss built with `reduction="none"` (one value per sample), an unreduced
    element-wise loss such as `(pred - y) ** 2`, or a model's raw output has one element
    per sample, and the call raises
    `RuntimeError: grad can be implicitly created only for scalar outputs`.
    Reduce it first (`loss.mean()`, `(loss * weights).sum()`), or pass the vector of
    a vector-Jacobian product explicitly: `out.backward(gradient=torch.ones_like(out))`.

    A LightningModule's `training_step` that returns such a loss fails the same way,
    since Lightning calls `backward()` on what it returns.

    Only tensors whose shape the source makes plain are reported: a criterion built in
    the same file, a `torch.nn.functional` loss, a model made of `torch.nn` layers.

    Known problems
    A batch of one sample is a one-element tensor and does not raise; it is still
    reported, because the same line fails on the next batch size.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html
    """

    code = "GL012"
    name = "backward-non-scalar"
    message = (
        "backward() is called without a gradient on a tensor that is not a scalar, "
        "so it raises 'grad can be implicitly created only for scalar outputs'"
    )
    requires = ((b"backward", b"training_step"),)  # Lightning backpropagates what training_step returns
    example = """
        criterion = torch.nn.CrossEntropyLoss(reduction="none")
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        criterion = torch.nn.CrossEntropyLoss(reduction="none")
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.mean().backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        analysis = self.analysis
        for event in analysis.own_events(Kind.BACKWARD):
            call = event.node
            if not isinstance(call, cst.Call) or event.value is None or _passes_gradient(call, event.value):
                continue
            statement = analysis.statement_of(call)
            if analysis.shapes.shape(event.value, statement) is Shape.NON_SCALAR:
                named = analysis.code(event.value)
                message = f"backward() is called without a gradient on `{named}`, which is not a scalar, so it raises "
                self.report(call, message + SCALAR_ERROR, related=self._sources(event.value, statement))
        for returned in analysis.lineage.backpropagated():
            if (
                isinstance(returned.at, cst.Return)
                and analysis.shapes.shape(returned.value, returned.at) is Shape.NON_SCALAR
            ):
                message = LIGHTNING_RETURN.format(loss=analysis.code(returned.value))
                self.report(returned.value, message, related=self._sources(returned.value, returned.at))

    def _sources(self, value: cst.BaseExpression, at: cst.CSTNode) -> list[tuple[cst.CSTNode, str]]:
        named = self.analysis.code(value)
        return [(source, f"`{named}` keeps one value per element here") for source in self.analysis.sources(value, at)]


def _passes_gradient(call: cst.Call, loss: cst.BaseExpression) -> bool:
    # Ex) out.backward(v)  /  torch.autograd.backward(outs, grad_tensors)  /  accelerator.backward(loss, gradient=v)
    if any(arg.keyword is not None and arg.keyword.value in GRADIENT_KEYWORDS for arg in call.args):
        return True
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    # The loss is either the receiver (`loss.backward(v)`) or the first argument (`backward(loss, v)`).
    given = positional[1:] if positional and positional[0] is loss else positional
    return bool(given)
