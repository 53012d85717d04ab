"""GL002: a training step that never clears gradients, or clears them at the wrong time."""

from __future__ import annotations

from collections.abc import Collection
from itertools import pairwise

import libcst as cst

from gradlint.analysis import Event, Kind, Role, TrainingStep
from gradlint.analysis.facts.origins import Binding, Definition
from gradlint.analysis.facts.steps import ends_loop, straight_run
from gradlint.analysis.syntax.collect import Loop, Scope
from gradlint.analysis.syntax.names import dotted_name, operand_names
from gradlint.analysis.syntax.tree import children
from gradlint.fixes import insert_before
from gradlint.rule import Fix, Rule

CLEAR_BEFORE_STEP = "`{clear}` runs between backward() and step(), so the step applies nothing"
CLEAR_EVERY_MICRO_BATCH = (
    "`{clear}` runs on every micro-batch but the optimizer steps only every few, "
    "so the accumulated gradient is thrown away"
)

STALE = (
    "`{optimizer}` steps twice with no clear between: this backward adds onto the gradients its last step "
    "applied, so the next step applies them again"
)

FOREIGN = (
    "`{optimizer}` steps with the gradients the backward of `{loss}` left on `{model}` for another optimizer: "
    "nothing clears `{model}` between that backward and this one"
)

MAX_DEPTH = 4


class MissingZeroGrad(Rule):
    """Checks for training steps that backpropagate and step without clearing gradients.

    Why is this bad?
    `backward()` adds into `.grad`. Without a reset (`optimizer.zero_grad()`,
    `model.zero_grad()`, `p.grad = None`), every step applies the sum of all earlier
    gradients, so updates grow until training diverges, often silently. A clear between
    `backward()` and `step()` makes the step apply nothing; a clear on every micro-batch
    of gradient accumulation throws the accumulated gradient away.

    Clears done in a helper of the same module (`self.reset_grad()`) count, and gradient
    accumulation that clears right after its conditional step is fine. A clear of tensors
    the optimizer was not built over clears nothing it steps: float32 master weights whose
    optimizer steps them while the model's low-precision copies' gradients, once added into
    the masters', are freed (`param.grad = None` in a loop over the copies).

    A tensor updated in place from its own gradient (`w -= lr * w.grad` under `no_grad`,
    `p.data.add_(p.grad, alpha=-lr)`) is a step as `optimizer.step()` is: without
    `w.grad.zero_()`, `w.grad = None` or a `zero_grad()`, each update applies the sum of
    every gradient so far.

    A clear on every micro-batch is this rule's finding; GL018 accumulation-not-scaled
    owns only the loss of an accumulation that is not divided by the number of micro-batches.

    A step that hands what it steps (the optimizer, the model or its parameters) to a
    function gradlint cannot read, imported from outside the project (`reset(optimizer)`,
    `hooks.before_step(model)`), may be cleared there: unknown, so not reported.

    An optimizer stepped twice in one step needs a clear before each step's backward: with
    one clear for two steps (`loss_a.backward(); opt.step(); opt.zero_grad(); loss_b.backward();
    opt.step()` in a loop), the first step of each iteration applies the second's gradients
    of the iteration before once more. Judged only where the steps, clears and backwards run
    unconditionally in the step.

    A backward through the models of two optimizers leaves gradients on both. A GAN that
    backpropagates the generator's loss (computed through the discriminator), steps the
    generator, then backpropagates and steps the discriminator with no clear of the
    discriminator in between, updates the discriminator with the generator's objective too.
    Which models a loss reaches is traced through the step's own assignments and the
    module's helpers (`.detach()` cuts), which models an optimizer updates through its
    constructor; a step that may freeze a model (a `requires_grad` written there, the model
    handed to a call such as `set_requires_grad(netD, False)`) or runs under an `if` of its
    own is not judged.

    A clear in one arm of an `if` covers only the steps of that arm: `if amp:
    opt.zero_grad(); ...; scaler.step(opt) else: loss.backward(); opt.step()` never clears
    in its `else`.

    A step after which its loop ends (the lines after it `break`, `return`, or set the flag a
    `while not stop:` loop tests) closes an accumulation: no backward of that loop follows it,
    and the clear belongs to the loop around it (`optimizer.zero_grad()` at the top of each
    outer step).

    A step that sets the gradients itself (`p.grad = g`, `p.grad.data = g`, `p.grad.copy_(g)`,
    here or in a helper of the module) applies what it set: nothing accumulates, and a clear
    followed by such a set before the step (`opt.zero_grad(); p.grad = saved; opt.step()`, the
    gradients of a sharpness-aware or perturbation step written back) leaves the step
    something to apply.

    Known problems
    A clear done by a caller in another module is not seen.

    Fix safety
    Unsafe: accumulating gradients may be intended. `optimizer.zero_grad()` is inserted
    before the backward only when a constructor or annotation proves the stepped object
    is an optimizer (not only its name), it is the only uncleared optimizer of the step,
    and the backward and the step sit in the same loop and branch, so the clear runs
    exactly when the step does.

    References
    https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    """

    code = "GL002"
    name = "missing-zero-grad"
    message = "gradients are never cleared in this training step, so each step adds onto the last"
    quiet_in_tests = True
    requires = (b"backward", (b"step", b".grad"))  # `w -= lr * w.grad` steps by hand
    example = """
        for x, y in loader:
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

    def check_step(self, step: TrainingStep) -> None:
        backwards = step.of_kind(Kind.BACKWARD)
        uncleared = self._uncleared_backward(step)
        if uncleared is not None:
            self.report(uncleared.site, self._named(step), self._clear_first(step, uncleared), self._story(step))
            return
        stale = self._stale_since_last_step(step)
        if stale is not None:
            backward, previous, current = stale
            named = STALE.format(optimizer=self.analysis.code(current.value) if current.value else "the optimizer")
            story = [
                (previous.site, "this step already applied the gradients that are still there"),
                (current.site, "and this one applies them again"),
            ]
            self.report(backward.site, named, related=story)
            return
        for foreign in self.analysis.updates.foreign_gradients(step):
            code = self.analysis.code
            named = FOREIGN.format(
                optimizer=code(foreign.applied.value) if foreign.applied.value else "the optimizer",
                loss=code(foreign.backward.value) if foreign.backward.value else "the first loss",
                model=foreign.model,
            )
            story = [
                (foreign.backward.site, f"this backward puts gradients on `{foreign.model}` too"),
                (foreign.taken.site, "they were for this step"),
                (foreign.applied.site, f"and this step applies them with `{foreign.model}`'s own"),
            ]
            self.report(foreign.own.site, named, related=story)
            return
        steps = [(event.site, "the optimizer steps here") for event in step.of_kind(Kind.STEP)]
        for clear in step.of_kind(Kind.CLEAR):
            if self._between_backward_and_step(step, clear):
                before = [(event.site, "the gradients are computed here") for event in backwards[:1]]
                message = CLEAR_BEFORE_STEP.format(clear=self.analysis.code(clear.site))
                self.report(clear.site, message, related=[*before, *steps])
            elif self._discards_accumulation(step, clear, backwards):
                message = CLEAR_EVERY_MICRO_BATCH.format(clear=self.analysis.code(clear.site))
                self.report(clear.site, message, related=[(step.node, "each micro-batch"), *steps])

    def _named(self, step: TrainingStep) -> str:
        optimizers = [event.value for event in step.of_kind(Kind.STEP) if event.value is not None]
        if not optimizers:
            return self.message
        names = " and ".join(dict.fromkeys(f"`{self.analysis.code(value)}`" for value in optimizers))
        manual = all(event.by_hand for event in step.of_kind(Kind.STEP))
        gradients = f"the gradients that update {names}" if manual else f"the gradients that {names} steps with"
        named = f"{gradients} are never cleared, so each step adds onto the last"
        helpers = list(dict.fromkeys(event.via for event in step.events if event.via is not None))
        if helpers:
            named += " (" + ", ".join(f"`{helper}`" for helper in helpers) + " runs in the step)"
        return named

    def _story(self, step: TrainingStep) -> list[tuple[cst.CSTNode, str]]:
        """The training step that never clears, and the optimizer steps that apply the summed gradients."""
        where = "function" if isinstance(step.node, cst.FunctionDef) else "loop"
        story: list[tuple[cst.CSTNode, str]] = [(step.node, f"nothing in this {where} clears the gradients")]
        story += [
            (event.site, "steps with the gradients of every backward so far" + _in(event))
            for event in step.of_kind(Kind.STEP)
        ]
        return story

    def _uncleared_backward(self, step: TrainingStep) -> Event | None:
        clears = step.of_kind(Kind.CLEAR)
        steps = [
            event
            for event in step.of_kind(Kind.STEP)
            if not self._fresh_single_step(step, event) and not self._ends_loop(step, event)
        ]
        if not steps or self._overwrites_gradients(step):
            return None
        # A clear in the other arm of an `if` never runs with the step (`if amp: opt.zero_grad(); ...;
        # scaler.step(opt) else: loss.backward(); opt.step()`): it covers only the steps of its own arm.
        branches = self.analysis.branches
        bare = next((event for event in steps if all(branches.exclusive(c, event) for c in clears)), None)
        if bare is not None and clears:
            return next(
                (
                    b
                    for b in reversed(step.events[: step.events.index(bare)])
                    if b.kind is Kind.BACKWARD and not branches.exclusive(b, bare)
                ),
                None,
            )
        if not clears:
            if _caller_owns_optimizer(step):
                return None
            # A callee gradlint cannot read that receives what steps may clear it (`reset(optimizer)`).
            stepped = {key for event in steps for key in self.analysis.stepped_objects(event)}
            if self.analysis.handed_to_unknown(step.node, stepped) is not None:
                return None
            return step.of_kind(Kind.BACKWARD)[0]
        # Which tensors an optimizer's clear covers is known by optimizer; a tensor updated by hand
        # (`p -= lr * p.grad`) may be among any clear's parameters: counted as cleared.
        steps = [event for event in steps if not event.by_hand]
        targets = {event.target for event in steps}
        if len(targets) < 2 or None in targets or any(not self._clears_one_optimizer(c) for c in clears):
            return None  # one optimizer, or a clear that covers every parameter
        cleared = {clear.target for clear in clears}
        for event in steps:
            if event.target not in cleared:
                return _last_before(step.events, event, Kind.BACKWARD)
        return None

    def _ends_loop(self, step: TrainingStep, event: Event) -> bool:
        """A step after which its loop ends (`optimizer.step(); stop_accumulating = True` in `while not
        stop_accumulating:`): the loop accumulates until it, and what clears is the enclosing loop's business."""
        if isinstance(step.node, cst.FunctionDef) or not event.direct:
            return False
        statement = self.analysis.statement_of(event.node) if isinstance(event.node, cst.Call) else event.node
        return statement is not None and ends_loop(step.node, statement)

    def _stale_since_last_step(self, step: TrainingStep) -> tuple[Event, Event, Event] | None:
        """The backward whose gradients an optimizer applies together with those its previous step already applied:
        it steps twice in the step, and no clear that covers it runs between a step and the one before it (in a
        loop, the last step of the previous iteration is the one before the first). Only a straight run of events
        is judged: any of them under an `if` of the step's own, and nothing is said."""
        steps = [
            event
            for event in step.of_kind(Kind.STEP)
            if event.direct and not event.by_hand and not self._fresh_single_step(step, event)
        ]
        events = straight_run(step, self.analysis.collected)
        if events is None:
            return None
        cyclic = not isinstance(step.node, cst.FunctionDef)
        for target in dict.fromkeys(event.target for event in steps if event.target is not None):
            mine = [index for index, event in enumerate(events) if event in steps and event.target == target]
            if len(mine) < 2:
                continue
            # In a loop the last step of the previous iteration comes before the first.
            pairs = pairwise([mine[-1], *mine] if cyclic else mine)
            for previous, current in pairs:
                between = (
                    events[previous + 1 : current] if previous < current else events[previous + 1 :] + events[:current]
                )
                if any(
                    e.kind is Kind.CLEAR and (e.target == target or not self._clears_one_optimizer(e)) for e in between
                ):
                    continue
                backwards = [event for event in between if event.kind is Kind.BACKWARD]
                if backwards:
                    return backwards[-1], events[previous], events[current]
        return None

    def _overwrites_gradients(self, step: TrainingStep) -> bool:
        """Whether the step sets the gradients itself (`p.grad = g`, `p.grad.copy_(g)`): nothing accumulates."""
        return bool(step.of_kind(Kind.SET_GRAD))

    def _fresh_single_step(self, step: TrainingStep, event: Event) -> bool:
        """One step of an optimizer built in the same pass as the parameters it updates.

        Ex) a test that builds a model and its optimizer, backpropagates once and steps once, or
        a loop (in a function or a script) that makes a fresh latent or model and an optimizer
        for it on every iteration: no
        earlier gradients exist to add onto, however often the function or the loop runs.
        """
        analysis = self.analysis
        key = event.target
        if not isinstance(event.node, (cst.Call, cst.AugAssign)) or key is None:
            return False  # `optimizer.step()`, or `w -= lr * w.grad`
        scope = analysis.context(event.node).scope
        loops = analysis.context(event.node).loops
        if loops and not event.direct:
            return False
        direct = [other for other in step.of_kind(Kind.STEP) if other.target == key and other.direct]
        if event.direct and len(direct) != 1 and not event.by_hand:
            return False  # an optimizer stepped twice; a tensor updated twice from one gradient adds nothing up
        at = analysis.statement_of(event.node) if isinstance(event.node, cst.Call) else event.node
        definitions = analysis.origins.definitions(key, at)
        return bool(definitions) and all(self._built_here(definition, scope, loops) for definition in definitions)

    def _built_here(self, definition: Definition, scope: Scope, loops: tuple[Loop, ...]) -> bool:
        # SGD(model.parameters()), optim_cls(params) with `model`/`params` made in the function,
        # not `self.optimizers()`, which hands back an existing one, nor an optimizer of a model passed in.
        analysis = self.analysis
        value = definition.value
        if (
            definition.binding is not Binding.ASSIGN
            or analysis.context(definition.node).scope is not scope
            or analysis.context(definition.node).loops != loops
            or not isinstance(value, cst.Call)
            or not _names_a_constructor(value.func, analysis.roles.imports.aliases)
        ):
            return False
        positional = [arg.value for arg in value.args if arg.keyword is None and not arg.star]
        params = [arg.value for arg in value.args if arg.keyword is not None and arg.keyword.value == "params"]
        built_from = positional[:1] + params  # an optimizer is built from its parameters
        return bool(built_from) and all(self._made_in(param, definition.node, loops, 0) for param in built_from)

    def _made_in(self, value: cst.BaseExpression, at: cst.CSTNode, loops: tuple[Loop, ...], depth: int) -> bool:
        """Whether every name `value` reads was assigned in the same pass (scope and loops) from values made there."""
        analysis = self.analysis
        if depth > MAX_DEPTH:
            return False
        if _copies(value):
            return True  # `latents.detach().clone()`: a new tensor whatever it was copied from
        for name in operand_names(value, analysis.roles.imports.aliases):
            if name in ("True", "False", "None"):
                continue
            definitions = analysis.origins.definitions(name, at)
            if "." in name and all(d.binding is Binding.OUTSIDE for d in definitions):
                definitions = analysis.origins.definitions(name.split(".", 1)[0], at)  # `reference.weight`
            if not definitions or any(
                d.binding is not Binding.ASSIGN
                or analysis.context(d.node).scope is not analysis.context(at).scope
                or analysis.context(d.node).loops != loops
                or d.value is None
                or not self._made_in(d.value, d.node, loops, depth + 1)
                for d in definitions
            ):
                return False
        return True

    def _clear_first(self, step: TrainingStep, backward: Event) -> Fix | None:
        """Insert `optimizer.zero_grad()` before the backward: unsafe, as accumulating may be intended."""
        cleared = {clear.target for clear in step.of_kind(Kind.CLEAR)}
        stepped = {event.target: event for event in step.of_kind(Kind.STEP) if event.target not in cleared}
        if len(stepped) != 1 or not backward.direct or not isinstance(backward.site, cst.Call):
            return None
        [event] = stepped.values()
        analysis = self.analysis
        statement = analysis.statement_of(backward.site)
        if event.value is None or analysis.roles.proven_role(event.value) is not Role.OPTIMIZER:
            return None  # `x.zero_grad()` on what only looks like an optimizer
        here, there = analysis.context(statement), analysis.context(event.site)
        if (here.scope, here.loops, here.ifs) != (there.scope, there.loops, there.ifs):
            return None  # the clear must run exactly when the step does, on every path to it
        clear = cst.Expr(cst.Call(cst.Attribute(event.value, cst.Name("zero_grad"))))
        return insert_before(self.analysis, statement, clear, "clear the gradients before backward()", safe=False)

    def _clears_one_optimizer(self, clear: Event) -> bool:
        # A clear inside a helper names the helper's own variables: assume it covers all.
        inlined = not clear.direct
        return not inlined and clear.value is not None and self.analysis.roles.is_optimizer(clear.value)

    def _between_backward_and_step(self, step: TrainingStep, clear: Event) -> bool:
        index = step.events.index(clear)
        before = next((e for e in reversed(step.events[:index]) if e.kind in (Kind.BACKWARD, Kind.STEP)), None)
        after = next((e for e in step.events[index + 1 :] if e.kind in (Kind.BACKWARD, Kind.STEP)), None)
        if before is None or after is None or before.kind is not Kind.BACKWARD or after.kind is not Kind.STEP:
            return False
        if not set(clear.ifs) <= set(after.ifs) or self.analysis.branches.exclusive(clear, after):
            return False  # a clear that skips the step (`if not finite: zero_grad(); continue`, or `... else: step()`)
        if any(event.kind is Kind.SET_GRAD for event in step.events[index + 1 : step.events.index(after)]):
            return False  # the gradient is set again before the step: `opt.zero_grad(); p.grad = saved; opt.step()`
        single_optimizer = len({event.target for event in step.of_kind(Kind.STEP)}) == 1
        if self.analysis.clears_other_tensors(clear, after):
            return False  # Ex) float32 master weights stepped; the copies' gradients, already added in, freed
        return clear.target == after.target or (not self._clears_one_optimizer(clear) and single_optimizer)

    def _discards_accumulation(self, step: TrainingStep, clear: Event, backwards: list[Event]) -> bool:
        base = len(self.analysis.context(step.node).ifs) if not isinstance(step.node, cst.FunctionDef) else 0
        if clear.ifs[base:] or any(event.ifs[base:] for event in backwards):
            return False
        return all(_under_modulo(event.ifs[base:]) for event in step.of_kind(Kind.STEP))


def _caller_owns_optimizer(step: TrainingStep) -> bool:
    # A step helper handed its optimizer (timm's `NativeScaler.__call__(loss, optimizer)`)
    # is called by a loop elsewhere that owns the optimizer and clears it.
    if not isinstance(step.node, cst.FunctionDef):
        return False
    params = {param.name.value for param in step.node.params.params} - {"self", "cls"}
    return any((event.target or "").split(".")[0] in params for event in step.of_kind(Kind.STEP))


def _under_modulo(ifs: tuple[cst.CSTNode, ...]) -> bool:
    # Ex) if (i + 1) % accumulation_steps == 0:
    return any(isinstance(node, cst.If) and _has_modulo(node.test) for node in ifs)


def _has_modulo(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return True
    return any(_has_modulo(child) for child in children(node))


def _last_before(events: tuple[Event, ...], anchor: Event, kind: Kind) -> Event | None:
    index = events.index(anchor)
    return next((event for event in reversed(events[:index]) if event.kind is kind), None)


def _names_a_constructor(func: cst.BaseExpression, modules: Collection[str]) -> bool:
    # SGD, optim_cls, torch.optim.Adam: not `self.optimizers()` or `trainer.get_optimizer()`
    key = dotted_name(func)
    return key is not None and ("." not in key or key.split(".")[0] in modules)


def _copies(value: cst.BaseExpression) -> bool:
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("detach", "clone")
    )


def _in(event: Event) -> str:
    """Where an event reached through a call of another module happens."""
    return f", in `{event.via}`" if event.via is not None else ""
