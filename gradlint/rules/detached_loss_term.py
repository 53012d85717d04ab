"""GL019: a loss term cut from the graph and summed with terms that keep a gradient."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Kind
from gradlint.analysis.facts.lineage import Backpropagated
from gradlint.analysis.facts.terms import CutTerm, LossTerms
from gradlint.rule import Rule

ADDED = "and it is added to a loss with a gradient: it changes the loss but trains nothing"
FROM_FORWARD = "and `forward` returns it as a loss beside an output with a gradient: adding it to a loss trains nothing"


class DetachedLossTerm(Rule):
    """Checks for loss terms cut from the graph and then added into a loss that is backpropagated.

    Why is this bad?
    `.detach()`, `.item()`, `.data`, `float(t)`, `.numpy()`, `.tolist()` and copying
    tensors into `torch.tensor(...)` drop autograd history, and so does computing a term
    inside `with torch.no_grad():` (a hint loss written in the teacher's `no_grad` block;
    the teacher's output used as a criterion's target is fine). A term cut this way and added
    to a loss whose other terms still have a gradient changes the loss value that is
    printed, but contributes nothing to `backward()`: the adversarial, auxiliary or
    regularization term it stands for trains nothing, and no error says so.
    `torch.tensor(x, requires_grad=True)` does not help: it makes a new leaf, and the
    gradient stops at it.

    A mean or sum of a sum is the sum of its terms' means, so a term detached inside the
    reduction is one too: a soft actor-critic's `(alpha * log_prob - q.detach()).mean()` trains
    the policy on its entropy alone. A squared or absolute error of a difference is no such sum.

    A loss whose every path to the model is cut (so its gradients are None) is GL006's
    (non-differentiable-loss); this rule reports losses that are only partly cut. Not
    reported: detached values used for logging or early stopping (`running += loss.item()`),
    detached targets inside a criterion (`F.mse_loss(pred, target.detach())`), either
    side of a distance stopped on purpose while the other trains (VQ-VAE's commitment
    loss `F.mse_loss(quantized.detach(), z)`, where `z` is what the module's `forward`
    received: an activation, whatever it is called), straight-through estimators (`y + (y_hard - y).detach()`, where the
    detached part shares a value with a term that keeps its gradient), a detached weight
    that scales a term with a gradient (`w.detach() * loss_b`), constants (`loss + 0.0`)
    and losses computed under `torch.no_grad()`.

    A model whose `forward` returns `torch.tensor(aux_losses)` beside its output is reported
    too: the caller adds that auxiliary loss to its own, and it trains nothing.

    A term returned by a function of another module of the project is cut when every `return`
    of that function gives a value cut from the history it had (`return penalty.item()`,
    `return out.detach()`, a function decorated `@torch.no_grad()` that returns a model's
    output): its summary says so.

    Known problems
    A loss is seen where it is backpropagated (`backward()`, also in a helper of another
    module, a Lightning `training_step`, a Trainer's `compute_loss`) or returned under a
    name that says loss. A function of another module that cuts on some paths only, and a
    loss built as `sum(...)` or `torch.stack(...).sum()` of a list, are not seen.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html
    https://pytorch.org/docs/stable/generated/torch.tensor.html
    """

    code = "GL019"
    name = "detached-loss-term"
    message = (
        "this term is cut from the graph and added to a loss with a gradient: it changes the loss but trains nothing"
    )
    # A loss is backpropagated here, by a helper, or returned under a name that says loss.
    requires = ((b"backward", b"loss"),)
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            logits, aux = model(x)
            aux_loss = aux.pow(2).mean().item()
            loss = criterion(logits, y) + 0.1 * aux_loss
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for x, y in loader:
            optimizer.zero_grad()
            logits, aux = model(x)
            aux_loss = aux.pow(2).mean()
            loss = criterion(logits, y) + 0.1 * aux_loss
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        terms = LossTerms(self.analysis.collected, self.analysis.lineage, self.analysis.origins)
        reported: set[cst.CSTNode] = set()
        for loss, note, backpropagated in self._losses():
            cuts = terms.cut_terms(loss.value, loss.at, backpropagated=backpropagated)
            # A loss only returned and summed in evaluation code is a validation loss: it is only reported.
            cuts = [cut for cut in cuts if backpropagated or not self._evaluates(cut.term.at)]
            self._report_cuts(cuts, loss, note, reported)
        for returned, statement in self._forward_tuples():
            cuts = terms.returned_rewraps(returned, statement)
            loss = Backpropagated(returned, statement)
            self._report_cuts(cuts, loss, "returned beside the model's output here", reported, FROM_FORWARD)

    def _report_cuts(
        self,
        cuts: list[CutTerm],
        loss: Backpropagated,
        note: str,
        reported: set[cst.CSTNode],
        consequence: str = ADDED,
    ) -> None:
        for cut in cuts:
            if cut.operation not in reported:
                reported.add(cut.operation)
                if isinstance(cut.operation, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                    computed = self.analysis.code(_bound(cut.operation))
                    named = f"`{computed}` is computed under torch.no_grad(), which cuts this term from the graph"
                elif isinstance(cut.operation, cst.Call) and self.analysis.lineage.cut_elsewhere(cut.operation):
                    code = self.analysis.code(cut.operation)
                    named = f"`{code}` returns a value its function in another module cut from the graph"
                else:
                    named = f"`{self.analysis.code(cut.operation)}` cuts this term from the graph"
                related = [(loss.at, note.format(self.analysis.code(loss.value)))]
                self.report(cut.operation, f"{named}, {consequence}", related=related)

    def _losses(self) -> list[tuple[Backpropagated, str, bool]]:
        """The losses whose terms are judged, each with a note for its related location and if it is backpropagated."""
        lineage = self.analysis.lineage
        backpropagated = lineage.backpropagated()
        found = [(loss, "`{}` is backpropagated here", True) for loss in backpropagated]
        found.extend((loss, "`{}` is backpropagated by this call", True) for loss in self._backpropagated_by_calls())
        seen = {loss.at for loss in backpropagated}
        for statement in self.analysis.collected.statements:
            if isinstance(statement, cst.Return) and statement.value is not None and statement not in seen:
                returned = [Backpropagated(value, statement) for value in _returned_losses(statement.value)]
                found.extend((loss, "`{}` is returned as a loss here", False) for loss in returned)
        return found

    def _evaluates(self, statement: cst.CSTNode) -> bool:
        """Whether `statement` lies in evaluation code (after `model.eval()`, or in a validation loop's function)."""
        context = self.analysis.collected.contexts[statement]
        order = self.analysis.collected.order[statement]
        return any(region.start < order < region.end for region in self.analysis.evaluation.regions(context.scope))

    def _forward_tuples(self) -> list[tuple[cst.Tuple, cst.Return]]:
        """What `forward` methods return as tuples: an output and, often, an auxiliary loss for the caller to add."""
        collected = self.analysis.collected
        return [
            (statement.value, statement)
            for function in collected.functions
            if function.name.value == "forward"
            for statement in collected.statements_in_scope(function)
            if isinstance(statement, cst.Return) and isinstance(statement.value, cst.Tuple)
        ]

    def _backpropagated_by_calls(self) -> list[Backpropagated]:
        """Losses handed to a helper, of this module or another, that calls `backward()` on them."""
        collected = self.analysis.collected
        scopes: list[cst.Module | cst.FunctionDef] = [collected.module, *collected.functions]
        return [
            Backpropagated(event.value, collected.statement_of[event.site])
            for scope in scopes
            for event in self.analysis.events.scope_events(scope)
            if event.kind is Kind.BACKWARD
            and not event.direct
            and event.value is not None
            and not event.no_grad
            and isinstance(event.site, cst.Call)
            and event.site in collected.statement_of
        ]


def _returned_losses(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    # Ex) return loss  /  return next_frames, loss: a value named as a loss, for the caller to backpropagate
    values = [element.value for element in value.elements] if isinstance(value, cst.Tuple) else [value]
    return [item for item in values if isinstance(item, cst.Name) and "loss" in item.value.lower()]


def _bound(statement: cst.Assign | cst.AnnAssign | cst.AugAssign) -> cst.BaseExpression:
    """What an assignment binds: its (first) target."""
    return statement.targets[0].target if isinstance(statement, cst.Assign) else statement.target
