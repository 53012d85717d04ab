"""GL015: `retain_grad()` called after the backward pass it was meant for."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event, Kind
from gradlint.analysis.facts.origins import OUTSIDE
from gradlint.analysis.syntax.names import dotted_name
from gradlint.rule import Rule


class LateRetainGrad(Rule):
    """Checks for `retain_grad()` called after the backward pass that should fill `.grad`.

    Why is this bad?
    A non-leaf tensor (an activation, an embedding output, a logit) gets a `.grad`
    only if `retain_grad()` was called on it before `backward()` ran: the call installs
    a hook that the backward pass triggers. Called afterwards it does nothing, and the
    `.grad` read next is `None` (with the warning "The .grad attribute of a Tensor that
    is not a leaf Tensor is being accessed"), so saliency maps, gradient norms and
    debugging prints silently show nothing. Call `retain_grad()` right after the tensor
    is computed, before `backward()`.

    A `retain_grad()` followed by another backward pass (a second loss, the next
    iteration over the same tensor), or on a tensor the function returns to its caller,
    is not reported. A non-leaf's `.grad` read with no `retain_grad()` call at all is
    GL021 grad-read-before-backward's finding; this rule owns a `retain_grad()` that
    comes after the backward pass.

    Known problems
    A backward pass that a caller runs after the function returns is not seen.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.retain_grad.html
    """

    code = "GL015"
    name = "late-retain-grad"
    message = "retain_grad() is called after the backward pass, so it has no effect and .grad stays None"
    requires = (b"retain_grad", b"backward")
    example = """
        hidden = model.encoder(x)
        loss = criterion(model.head(hidden), y)
        loss.backward()
        hidden.retain_grad()
        print(hidden.grad.norm())
    """
    use_instead = """
        hidden = model.encoder(x)
        hidden.retain_grad()
        loss = criterion(model.head(hidden), y)
        loss.backward()
        print(hidden.grad.norm())
    """

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "retain_grad" and not node.args):
            return
        key = dotted_name(func.value)
        if key is None:
            return
        analysis = self.analysis
        order = analysis.collected.order
        context = analysis.context(node)
        backwards = [e for e in analysis.events.scope_events(context.scope) if e.kind is Kind.BACKWARD]
        exclusive = analysis.collected.exclusive  # a backward in the other branch of an `if` never ran before it
        before = [e for e in backwards if order[e.site] < order[node] and not exclusive(e.site, node)]
        if not before or any(self._reaches_same_tensor(e, key, node) for e in backwards if e not in before):
            return  # nothing ran yet, or a later backward pass will fill it
        if any(self._repeats_with_same_tensor(loop, key, before) for loop in context.loops):
            return
        if self._handed_to_caller(key, node):
            return
        if self._existed_before(key, node, before[-1]):
            named = f"`{key}.retain_grad()` is called after the backward pass, so `{key}.grad` stays None"
            self.report(node, named, related=[(before[-1].site, "the backward pass already ran here")])

    def _reaches_same_tensor(self, later: Event, key: str, call: cst.Call) -> bool:
        """Whether a later backward may run through the tensor `key` holds at `call`."""
        origins, statement_of = self.analysis.origins, self.analysis.statement_of
        if not isinstance(later.node, cst.Call) or not later.direct or later.value is None:
            return True  # a backward inside a helper: its loss cannot be traced here
        at = statement_of(later.node)
        same_value = not set(origins.definitions(key, statement_of(call))).isdisjoint(origins.definitions(key, at))
        return same_value and origins.reads(later.value, key, at)

    def _handed_to_caller(self, key: str, call: cst.Call) -> bool:
        """Whether the function returns the tensor itself (not its `.grad`): its caller may backpropagate again."""
        analysis = self.analysis
        scope = analysis.context(call).scope
        order = analysis.collected.order
        return any(
            isinstance(statement, cst.Return)
            and statement.value is not None
            and analysis.context(statement).scope is scope
            and order[statement] > order[call]
            and key in _returned_names(statement.value)
            for statement in analysis.collected.statements
        )

    def _repeats_with_same_tensor(self, loop: cst.For | cst.While, key: str, before: list[Event]) -> bool:
        """Whether the next pass of `loop` backpropagates again through the same tensor."""
        return any(loop in event.loops for event in before) and not self.analysis.rebinds(loop, key)

    def _existed_before(self, key: str, call: cst.Call, backward: Event) -> bool:
        """Whether every value `key` may hold was made before `backward` ran."""
        analysis = self.analysis
        order = analysis.collected.order
        definitions = analysis.origins.definitions(key, analysis.statement_of(call))
        return all(d is OUTSIDE or order.get(d.node, 0) < order[backward.site] for d in definitions)


def _returned_names(value: cst.BaseExpression) -> set[str | None]:
    # Ex) return h  /  return logits, h  /  return {"hidden": h}
    if isinstance(value, (cst.Tuple, cst.List)):
        return {dotted_name(element.value) for element in value.elements}
    if isinstance(value, cst.Dict):
        return {dotted_name(element.value) for element in value.elements if isinstance(element, cst.DictElement)}
    return {dotted_name(value)}
