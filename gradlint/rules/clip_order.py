"""GL007: gradient clipping before backward, after the optimizer step, or on scaled gradients."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from gradlint.analysis import Event, Kind, ModuleAnalysis, Role, TrainingStep
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.syntax.names import last_name
from gradlint.fixes import insert_before
from gradlint.rule import Fix, Rule

SCALED = (
    "gradients are clipped while still multiplied by the GradScaler's scale, "
    "so the threshold is meaningless; call scaler.unscale_(optimizer) first"
)
LIGHTNING = (
    "gradients are clipped inside `training_step`, before Lightning backpropagates the returned loss, "
    "so the new gradients are not clipped; clip in `configure_gradient_clipping` instead"
)
ORDER = (Kind.BACKWARD, Kind.STEP)


class ClipOrder(Rule):
    """Checks for gradient clipping in the wrong place within a training step.

    Why is this bad?
    `clip_grad_norm_` and `clip_grad_value_` rescale the `.grad` tensors that exist at
    the moment they run. Before this step's `backward()` they clip stale or `None`
    gradients (the fresh ones are added afterwards, unclipped); after
    `optimizer.step()` the update has already been applied, so the clip does nothing
    for it. Either way nothing errors: training just runs without the clipping you
    asked for, and exploding gradients come back as `nan` losses.

    With a `torch.amp.GradScaler`, `scaler.scale(loss).backward()` leaves gradients
    multiplied by the scale (65536 at first). Clipping them to `max_norm=1.0` before
    `scaler.unscale_(optimizer)` shrinks every update by that factor, so training
    effectively stops. Call `scaler.unscale_(optimizer)` between `backward()` and the
    clip; `scaler.step(optimizer)` then knows they are unscaled. Where a flag chooses mixed
    precision (`if mixed: scaler.scale(loss).backward(); scaler.unscale_(opt) else:
    loss.backward()`, then the clip), the unscale in the arm that scaled covers that arm. So
    do methods of one helper object that test the same state of it (`amp.backward(loss)`
    scaling under `if self.activated:`, `amp.step(model, opt)` clipping in its `else`
    without a scaler): their arms go together.

    A helper that backpropagates and leaves the step to its callers (a multi-task
    weighting's `backward(losses)`) is judged on its own: a clip that comes before its
    backward on every path, with no backward before it (round its loops included),
    clips gradients the helper has not computed yet.

    Clipping with the optimizer step inside the accumulation `if`, and Accelerate's
    `accelerator.clip_grad_norm_` after `accelerator.backward(loss)`, are fine. A clip
    after every micro-batch's backward while the step runs only when the window closes
    (`loss.backward(); clip_grad_norm_(...); if (i + 1) % k == 0: optimizer.step()`) clips
    a partial sum each time, and the later micro-batches add their gradients unclipped:
    the update is not clipped to the norm asked for. It is reported at the clip; move it
    into the `if`, before the step. Where a clear runs on every pass (`model.zero_grad()` at
    the top of each batch), nothing is summed over the window and the clip bounds exactly
    the gradient the next step applies: not reported.

    With PyTorch Lightning's automatic optimization, Lightning backpropagates the loss
    `training_step` returns after it returns: a clip inside `training_step` runs before
    that backward. Clip in `configure_gradient_clipping` or with
    `Trainer(gradient_clip_val=...)`; with manual optimization, after `manual_backward`.

    Known problems
    A clip done in a helper of another module is seen where that helper is called in a
    training step, or in the helper's own module when it backpropagates itself. A
    helper whose backward runs under a condition the clip does not share
    (`clip(); if do_backward: loss.backward()`) is not reported.

    Fix safety
    Safe where offered: `scaler.unscale_(optimizer)` is inserted before the clip only when
    constructors or annotations prove the scaler is a GradScaler and the optimizer an
    optimizer, the scaler steps that one optimizer, the step has no other `unscale_`
    (twice raises), and the clip is not in a loop of its own (once per parameter group
    would unscale twice).

    References
    https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping
    https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html
    """

    code = "GL007"
    name = "clip-order"
    message = "gradients are clipped before this step's backward(), so the new gradients are not clipped"
    # No `step`: a helper that clips and backpropagates leaves the step to its callers.
    requires = (b"clip_grad", (b"backward", b"training_step"))
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    """

    def __init__(self, analysis: ModuleAnalysis) -> None:
        super().__init__(analysis)
        self.helper_clips: set[cst.CSTNode] = set()

    def check_module(self) -> None:
        # Lightning runs backward on what training_step returns, after training_step returns.
        automatic = backpropagated_returns(self.analysis.collected)
        for function in automatic:
            for clip in self.analysis.events.scope_events(function):
                if clip.kind is Kind.CLIP and not _measures_only(clip.node):
                    where = self.analysis.events.call_toward(function, clip.node) or clip.site
                    self.report(
                        where, LIGHTNING, related=[(function, "Lightning backpropagates the returned loss after this")]
                    )
        for function in self.analysis.collected.functions:
            if function not in automatic:
                self._check_backward_helper(self.analysis.events.scope_events(function))

    def _check_backward_helper(self, events: tuple[Event, ...]) -> None:
        """A function that backpropagates and leaves the step to its callers, clipping before its backward.

        Ex) def backward(self, losses): clip_grad_norm_(params, 1.0); self.combine(losses).backward()
        """
        if any(event.kind is Kind.STEP for event in events):
            return  # a training step of its own: judged by check_step
        for index, clip in enumerate(events):
            if clip.kind is not Kind.CLIP or not clip.direct or _measures_only(clip.node):
                continue
            following = self._backward_on_every_path(clip, events[:index], events[index + 1 :])
            if following is not None:
                backward_call = self.analysis.code(following.site)
                named = f"gradients are clipped before `{backward_call}`, so the new gradients are not clipped"
                self.helper_clips.add(clip.node)
                self.report(clip.node, named, related=[(following.site, "the gradients are computed only here")])

    def _backward_on_every_path(self, clip: Event, before: tuple[Event, ...], after: tuple[Event, ...]) -> Event | None:
        """The backward that follows `clip` whenever it runs, with none before it (round its loops included)."""
        branches = self.analysis.branches
        backwards = [event for event in (*before, *after) if event.kind is Kind.BACKWARD]
        if any(event in before and not branches.exclusive(event, clip) for event in backwards):
            return None
        if any(set(event.loops) & set(clip.loops) for event in backwards):
            return None  # the previous iteration's backward comes before the clip
        for event in after:
            if event.kind is Kind.BACKWARD and self._runs_with(event, clip):
                return event
        return None

    def _runs_with(self, event: Event, clip: Event) -> bool:
        """Whether `event` runs whenever `clip` does: every `if` around it also holds the clip, in the same arm."""
        branches = self.analysis.branches
        return all(
            branch in clip.ifs and branches.branch_of(branch, event.site) is branches.branch_of(branch, clip.node)
            for branch in event.ifs
            if isinstance(branch, cst.If)
        )

    def check_step(self, step: TrainingStep) -> None:
        cyclic = not isinstance(step.node, cst.FunctionDef)
        for clip in step.of_kind(Kind.CLIP):
            if _measures_only(clip.node) or clip.node in self.helper_clips:
                continue  # a helper's own clip before its backward is reported once, in the helper
            index = step.events.index(clip)
            # Events in the other branch of an `if` (`if use_amp: ... else: ...`) never run with this clip.
            exclusive = self.analysis.branches.exclusive
            before = tuple(event for event in step.events[:index] if not exclusive(event, clip))
            after = tuple(event for event in step.events[index + 1 :] if not exclusive(clip, event))
            previous = _first(reversed(before), ORDER)
            following = _first(after, ORDER) or (_first(before, ORDER) if cyclic else None)
            if following is not None and following.kind is Kind.STEP:
                if not self._check_window(clip, previous, following, step.events):
                    self._check_unscaled(step, clip, before, after if cyclic else ())
            elif previous is not None and previous.kind is Kind.STEP and not _cleared_since(before, previous):
                step_call = self.analysis.code(previous.site)
                named = f"gradients are clipped after `{step_call}`, so the update already used them unclipped"
                self.report(self._where(clip, previous), named, related=[(previous.site, "the step already ran")])
            elif following is not None and (previous is None or previous.kind is Kind.STEP):
                backward_call = self.analysis.code(following.site)
                named = f"gradients are clipped before `{backward_call}`, so the new gradients are not clipped"
                if clip.via is not None and clip.via == following.via:
                    named = f"`{clip.via}` clips gradients before its backward(), so the new gradients are not clipped"
                self.report(
                    self._where(clip, following),
                    named,
                    related=[(following.site, "the gradients are computed only here")],
                )

    def _check_window(self, clip: Event, previous: Event | None, step: Event, events: tuple[Event, ...]) -> bool:
        """Report a clip that runs on every micro-batch of an accumulation whose step runs once every k of them.

        Ex) loss.backward(); clip_grad_norm_(params, 1.0); if (i + 1) % k == 0: optimizer.step()
        """
        accumulations = self.analysis.accumulations
        window = accumulations.summed_window(events, step)
        if window is None or previous is None or previous.kind is not Kind.BACKWARD:
            return False
        if accumulations.decides(window, clip) or accumulations.decides(window, previous):
            return False  # the clip, or the backward it follows, runs only when the window closes
        test = self.analysis.code(window.test)
        named = (
            f"gradients are clipped after every micro-batch, outside `if {test}:` where the optimizer steps: "
            "each clip rescales a partial sum, and later micro-batches add unclipped gradients"
        )
        self.report(
            self._where(clip, step),
            named,
            related=[(step.site, "the optimizer steps only here, once the window's gradients are summed")],
        )
        return True

    def _where(self, clip: Event, neighbour: Event) -> cst.CSTNode:
        """The clip call, or the call leading to it from the function where `neighbour` is written."""
        scope = self.analysis.context(neighbour.node).scope
        return self.analysis.events.call_toward(scope, clip.node) or clip.site

    def _check_unscaled(
        self, step: TrainingStep, clip: Event, before: tuple[Event, ...], wrapped: tuple[Event, ...]
    ) -> None:
        # Walk back from the clip (round the loop if needed) to the backward that made the gradients, or to
        # each of the alternatives (`if scaler is not None: scaler.scale(loss).backward() else: loss.backward()`).
        # An `unscale_` in the arm of one alternative (`if amp: scaler.scale(loss).backward(); scaler.unscale_(opt)
        # else: loss.backward()`) unscales that alternative's gradients only.
        exclusive = self.analysis.branches.exclusive
        found: list[Event] = []
        unscales: list[Event] = []
        unscaled: set[int] = set()
        for event in (*reversed(before), *reversed(wrapped)):
            if event.kind is Kind.UNSCALE:
                if not any(exclusive(event, other) for other in found):
                    break
                unscales.append(event)
            elif event.kind is Kind.BACKWARD:
                if found and not all(exclusive(event, other) for other in found):
                    break
                found.append(event)
                if any(not exclusive(unscale, event) for unscale in unscales):
                    unscaled.add(id(event))
        scaled = next(
            (e for e in found if id(e) not in unscaled and (e.via_scaler or self._scaled_value(e))),
            None,
        )
        if scaled is not None:
            story = [(scaled.site, "the gradients are scaled by this backward")]
            self.report(self._where(clip, scaled), SCALED, self._unscale_first(step, clip), story)

    def _scaled_value(self, backward: Event) -> bool:
        """Whether the backward runs on a name bound to `scaler.scale(loss)`."""
        key = backward.target
        if key is None:
            return False
        statement = self.analysis.statement_of(backward.node)  # type: ignore[arg-type]  # a backward is a call
        return any(
            isinstance(definition.value, cst.Call)
            and isinstance(definition.value.func, cst.Attribute)
            and definition.value.func.attr.value == "scale"
            and self.analysis.roles.is_scaler(definition.value.func.value)
            for definition in self.analysis.origins.definitions(key, statement)
        )

    def _unscale_first(self, step: TrainingStep, clip: Event) -> Fix | None:
        """Insert `scaler.unscale_(optimizer)` before the clip when one optimizer is stepped by the scaler."""
        # Another unscale_ in the step would then run twice, which raises: no certain fix.
        if not clip.direct or any(event.kind is Kind.UNSCALE for event in step.events):
            return None
        scaled = {event.site: event for event in step.events if event.kind is Kind.STEP and event.via_scaler}
        if len(scaled) != 1:
            return None
        [(call, optimizer)] = [(site, event.value) for site, event in scaled.items()]
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and optimizer is not None):
            return None
        analysis = self.analysis
        statement = analysis.statement_of(clip.node)  # type: ignore[arg-type]  # a CLIP event's node is its call
        roles = analysis.roles
        if roles.proven_role(call.func.value) is not Role.SCALER or roles.proven_role(optimizer) is not Role.OPTIMIZER:
            return None
        here, there = analysis.context(statement), analysis.context(call)
        if here.scope is not there.scope or here.loops != there.loops:
            return None  # a clip per group in a loop would unscale twice, which raises
        unscale = cst.Expr(cst.Call(cst.Attribute(call.func.value, cst.Name("unscale_")), [cst.Arg(optimizer)]))
        return insert_before(analysis, statement, unscale, "call `scaler.unscale_(optimizer)` before clipping")


def _first(events: Iterable[Event], kinds: tuple[Kind, ...]) -> Event | None:
    return next((event for event in events if event.kind in kinds), None)


def _cleared_since(before: tuple[Event, ...], anchor: Event) -> bool:
    return any(event.kind is Kind.CLEAR for event in before[before.index(anchor) + 1 :])


def _measures_only(call: cst.CSTNode) -> bool:
    """`clip_grad_norm_(params, float("inf"))` only measures the norm, for logging."""
    if not isinstance(call, cst.Call):
        return False
    limits = [arg.value for arg in call.args if arg.keyword is None][1:2]
    limits += [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "max_norm"]
    return any(_is_infinite(limit) for limit in limits)


def _is_infinite(node: cst.BaseExpression) -> bool:
    # float("inf"), math.inf, torch.inf, np.inf
    if isinstance(node, cst.Call) and last_name(node.func) == "float" and node.args:
        text = node.args[0].value
        return isinstance(text, cst.SimpleString) and "inf" in text.value.lower()
    return last_name(node) == "inf"
