"""GL013: `backward()` on a value computed while autograd was off."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event, Kind
from gradlint.analysis.facts.origins import OUTSIDE
from gradlint.analysis.syntax.collect import Scope
from gradlint.analysis.syntax.names import dotted_name
from gradlint.rule import Rule

GRAD_ERROR = "'element 0 of tensors does not require grad'"
LIGHTNING_RETURN = (
    "training_step returns `{loss}`, computed with autograd off; Lightning's backward() on it raises "
    "'element 0 of tensors does not require grad'"
)
WRAPPED_STEP = "`{step}` runs inside torch.no_grad(), so the backward() in it raises 'does not require grad'"


class BackwardUnderNoGrad(Rule):
    """Checks for `backward()` on a loss computed inside `torch.no_grad()` or `inference_mode()`.

    Why is this bad?
    Under `torch.no_grad()` (a `with` block, a `@torch.no_grad()` decorator copied
    from an `evaluate` function, `torch.inference_mode()`, `set_grad_enabled(False)`)
    autograd records nothing, so the loss has no `grad_fn` and `backward()` raises
    `RuntimeError: element 0 of tensors does not require grad and does not have a
    grad_fn`. The same happens when only the forward pass ran under `no_grad` and the
    loss was computed from its output afterwards, and when a caller wraps the whole
    training step in `no_grad`. Compute the forward pass and the loss with grad
    enabled; keep `no_grad` for evaluation and for targets that must not be trained
    (teachers, target networks).

    `backward()` written inside a `no_grad` block is fine when the loss was computed
    outside it, and is not reported. A LightningModule's `training_step` that returns
    such a loss fails the same way. Do not silence the error with
    `loss.requires_grad_()`: the error goes away and nothing learns.

    Known problems
    A loss computed under `no_grad` by a function of another module, or mixed with a
    value of unknown origin (a parameter of the function), is not reported.

    References
    https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation
    """

    code = "GL013"
    name = "backward-under-no-grad"
    message = (
        "backward() is called on a value computed with autograd off (no_grad/inference_mode), "
        "so it raises 'element 0 of tensors does not require grad'"
    )
    requires = ((b"backward", b"training_step"),)  # Lightning backpropagates what training_step returns
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            with torch.no_grad():
                loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        analysis = self.analysis
        for event in analysis.own_events(Kind.BACKWARD):
            if event.value is None or not isinstance(event.node, cst.Call):
                continue
            statement = analysis.statement_of(event.node)
            if analysis.no_grad_values.computed_without_grad(event.value, statement):
                named = (
                    f"backward() is called on `{analysis.code(event.value)}`, computed with autograd off, so it raises "
                )
                self.report(event.node, named + GRAD_ERROR, related=self._computed(event.value, statement))
        for returned in analysis.lineage.backpropagated():
            no_grad = analysis.no_grad_values.computed_without_grad(returned.value, returned.at)
            if isinstance(returned.at, cst.Return) and no_grad:
                message = LIGHTNING_RETURN.format(loss=analysis.code(returned.value))
                self.report(returned.value, message, related=self._computed(returned.value, returned.at))
        scopes: list[Scope] = [analysis.module, *analysis.collected.functions]
        for scope in scopes:
            for event in analysis.events.scope_events(scope):
                self._check_wrapped_step(event)

    def _check_wrapped_step(self, event: Event) -> None:
        # Ex) with torch.no_grad(): train_step(batch)  -- the loss is computed inside the helper
        analysis = self.analysis
        site, backward = event.site, event.node
        if event.kind is Kind.BACKWARD and event.via is not None:
            self._check_outside_step(event)
            return
        if event.kind is not Kind.BACKWARD or site is backward or event.value is None:
            return
        if not isinstance(backward, cst.Call):
            return
        if not analysis.context(site).no_grad or analysis.context(backward).no_grad:
            return
        if not self._reenables_grad(analysis.context(backward).scope) and self._computed_in_helper(
            event.value, backward
        ):
            message = WRAPPED_STEP.format(step=analysis.code(site))
            self.report(site, message, related=[(backward, "the helper backpropagates here")])

    def _check_outside_step(self, event: Event) -> None:
        """A backward in a function of another module: run under no_grad, or given a loss computed without grad."""
        analysis = self.analysis
        where = f" (it backpropagates in `{event.via}`)"
        if event.no_grad and event.value is None:
            # Ex) with torch.no_grad(): engine.train_step(model, batch)
            self.report(event.site, WRAPPED_STEP.format(step=analysis.code(event.site)) + where)
            return
        statement = analysis.statement_of(event.site)  # type: ignore[arg-type]  # a call
        if event.value is not None and analysis.no_grad_values.computed_without_grad(event.value, statement):
            # Ex) with torch.no_grad(): out = model(x)   then   helpers.backward_given(out.sum())
            message = (
                f"`{analysis.code(event.value)}` is computed with autograd off, and `{event.via}` backpropagates it, "
                "which raises 'does not require grad'"
            )
            self.report(event.site, message, related=self._computed(event.value, statement))

    def _computed(self, value: cst.BaseExpression, at: cst.CSTNode) -> list[tuple[cst.CSTNode, str]]:
        named = self.analysis.code(value)
        return [
            (source, f"`{named}` is computed with autograd off here") for source in self.analysis.sources(value, at)
        ]

    def _computed_in_helper(self, value: cst.BaseExpression, backward: cst.Call) -> bool:
        """Whether the helper computes the loss itself rather than receiving it."""
        analysis = self.analysis
        if isinstance(value, cst.Call):
            return True
        if not isinstance(value, (cst.Name, cst.Attribute)):
            return False
        key = dotted_name(value)
        definitions = analysis.origins.definitions(key, analysis.statement_of(backward)) if key else frozenset()
        return (
            bool(definitions)
            and OUTSIDE not in definitions
            and all(isinstance(d.value, (cst.Call, cst.BinaryOperation)) for d in definitions)
        )

    def _reenables_grad(self, scope: Scope) -> bool:
        """Whether the helper turns autograd back on itself (`with torch.enable_grad():`)."""
        return self.analysis.collected.enables_grad(scope)
