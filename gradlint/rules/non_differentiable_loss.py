"""GL006: a backpropagated loss that reaches the model only through operations without a gradient."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.origins import Binding
from gradlint.analysis.syntax.names import dotted_name, last_name
from gradlint.rule import Rule

NEW_LEAF = (
    "`{leaf}` makes the loss a new leaf that requires grad: "
    "backward() no longer fails, but no parameter gets a gradient"
)
# Constructors that accept requires_grad=True; Variable(loss, requires_grad=True) detaches too.
LEAF_CONSTRUCTORS = frozenset({"tensor", "Tensor", "FloatTensor", "DoubleTensor", "Variable"})


class NonDifferentiableLoss(Rule):
    """Checks for losses that depend on the model's output only through operations without a gradient.

    Why is this bad?
    `argmax`, `argmin`, `round`, `floor`, `ceil`, `sign`, `trunc` and comparisons
    (`(out > 0).float()`) have a zero or no gradient; `.detach()`, `.data`, `.numpy()`,
    `.item()` and re-wrapping with `torch.tensor(...)` cut the graph. When every path from
    the loss back to the model goes through one of them, `loss.backward()` raises
    `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn`,
    or, when something else in the loss requires grad, runs and leaves the parameters'
    `.grad` at `None` or zero: the model never learns. The common "fix" for the error,
    `torch.tensor(loss, requires_grad=True)`, `loss.requires_grad_()` or
    `loss.requires_grad = True`, hides it and trains nothing (the last one raises
    `you can only change requires_grad flags of leaf variables` on any loss that still
    has a graph, so wherever it runs, the loss has none).

    Compute the loss from the raw outputs (logits, probabilities) with a differentiable
    criterion, and keep `argmax` and rounding for metrics. Operations on the target side
    (`criterion(out, y.argmax(1))`), metrics that are never backpropagated, code under
    `torch.no_grad()`, straight-through estimators (`y_hard - y_soft.detach() + y_soft`),
    `F.gumbel_softmax(logits, hard=True)` and detached targets (DQN target networks,
    teachers, EMA models) are fine and not reported: a path with a gradient remains.
    What a LightningModule's `training_step` or a Hugging Face `Trainer` subclass's
    `compute_loss` returns counts as backpropagated: the framework calls `backward()` on it.
    A loss only partly cut (a detached term added to terms that keep a gradient) is GL019's.

    Known problems
    Values computed in functions of other modules are assumed to keep a gradient.

    References
    https://pytorch.org/docs/stable/notes/autograd.html
    https://pytorch.org/docs/stable/generated/torch.argmax.html
    """

    code = "GL006"
    name = "non-differentiable-loss"
    message = "the loss reaches the model output only through this operation, which has no gradient, so nothing learns"
    # Lightning backpropagates what training_step returns, a Hugging Face Trainer what compute_loss does.
    requires = ((b"backward", b"training_step", b"compute_loss"),)
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(logits.argmax(dim=1).float(), y.float())
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(logits, y)
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        analysis = self.analysis
        for backpropagated in analysis.lineage.backpropagated():
            value, statement = backpropagated.value, backpropagated.at
            lineage = analysis.lineage.of(value, statement)
            leaf = self._new_leaf(value, statement)
            backward = [(statement, f"`{analysis.code(value)}` is backpropagated here")]
            if leaf is not None:
                self.report(leaf, NEW_LEAF.format(leaf=analysis.code(leaf)), related=backward)
            elif not lineage.live:
                for operation in lineage.cuts:
                    cut = analysis.code(operation)
                    named = (
                        f"`{analysis.code(value)}` reaches the model output only through `{cut}`, which has no gradient"
                    )
                    self.report(operation, f"{named}, so nothing learns", related=backward)

    def _new_leaf(self, value: cst.BaseExpression, at: cst.CSTNode) -> cst.CSTNode | None:
        """The `torch.tensor(x, requires_grad=True)` or `requires_grad_()` that makes the loss a new leaf."""
        key = dotted_name(value)
        if key is None:
            return _leaf_constructor(value) or self._forced_without_history(value, at)
        definitions = [d for d in self.analysis.origins.definitions(key, at) if d.binding is not Binding.OUTSIDE]
        if len(definitions) == 1 and definitions[0].binding is Binding.ASSIGN:
            constructed = _leaf_constructor(definitions[0].value)
            if constructed is not None:
                return constructed
            forced = self._forced_without_history(definitions[0].value, definitions[0].node)
            if forced is not None:
                return forced
        start = max((self.analysis.collected.order[d.node] for d in definitions), default=0)
        return self._forcing_statement(key, at, start)

    def _forced_without_history(self, value: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
        """`x.requires_grad_()` made the loss itself, where `x` has no gradient path: a new leaf that trains nothing.
        (On an input that then feeds a computation, the new leaf is where the gradients go.)"""
        forced = _forcing_call(value)
        if forced is None or not isinstance(forced.func, cst.Attribute):
            return None
        return None if self.analysis.lineage.of(forced.func.value, at).live else forced

    def _forcing_statement(self, key: str, at: cst.CSTNode, start: int) -> cst.CSTNode | None:
        # Ex) loss.requires_grad_()  /  loss.requires_grad = True, between the loss and its backward
        collected = self.analysis.collected
        context, end = collected.contexts.get(at), collected.order.get(at)
        if context is None or end is None:
            return None  # Ex) `with loss.backward():` (nnsight): the backward is a compound statement's item
        for statement in collected.statements_in_scope(context.scope):
            if not start < collected.order[statement] < end:
                continue
            # `requires_grad_()` on a value that keeps a gradient path (as it was before the switch) changes nothing...
            forced = _forcing_call(statement.value, key) if isinstance(statement, cst.Expr) else None
            receiver = forced.func.value if forced is not None and isinstance(forced.func, cst.Attribute) else None
            if receiver is not None and not self.analysis.lineage.of(receiver, statement).live:
                return statement
            # ...but assigning `requires_grad` raises on any tensor with history: if it runs, the loss has none.
            if (
                isinstance(statement, cst.Assign)
                and last_name(statement.value) == "True"
                and any(dotted_name(target.target) == f"{key}.requires_grad" for target in statement.targets)
            ):
                return statement
        return None


def _leaf_constructor(value: cst.BaseExpression) -> cst.Call | None:
    if not isinstance(value, cst.Call) or last_name(value.func) not in LEAF_CONSTRUCTORS:
        return None
    forced = any(
        arg.keyword is not None and arg.keyword.value == "requires_grad" and last_name(arg.value) == "True"
        for arg in value.args
    )
    return value if forced else None


def _forcing_call(value: cst.BaseExpression, key: str | None = None) -> cst.Call | None:
    """`x.requires_grad_()` (on `key` when given), not `requires_grad_(False)`."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return None
    if value.func.attr.value != "requires_grad_" or (value.args and last_name(value.args[0].value) == "False"):
        return None
    return value if key is None or dotted_name(value.func.value) == key else None
