"""GL011: an optimizer stepped both through its GradScaler and directly in one step."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event, Kind, Role, TrainingStep
from gradlint.fixes import remove_statement
from gradlint.rule import Fix, Rule


class DoubleStep(Rule):
    """Checks for training steps that call both `scaler.step(optimizer)` and `optimizer.step()`.

    Why is this bad?
    `GradScaler.step(optimizer)` unscales the gradients and then calls
    `optimizer.step()` itself (unless it found inf/NaN gradients), even for a scaler
    built with `enabled=False`. Calling `optimizer.step()` as well updates the
    parameters twice per batch, and the extra update applies gradients that may still
    be multiplied by the loss scale (65536 by default), or inf/NaN ones the scaler just
    decided to skip. Nothing raises: the loss jumps or turns NaN, or the model
    trains with an effectively doubled learning rate. Keep only `scaler.step(optimizer)`
    followed by `scaler.update()`.

    Steps in exclusive branches (`if use_amp: scaler.step(opt) else: opt.step()`, or a
    branch that ends in `continue`/`return`) are fine and not reported, also when they
    are the two arms of one `if` in a helper of another module that the step calls
    (`self.train_step(batch)` of a base class), directly or through a helper of its own
    module (`self.train_one_iteration(batch)` calling the base class's `self.optimizer_step(opt)`).

    Known problems
    Branches are known apart by their `if`: two `if`s on the same test
    (`if scaler: ...` twice) are not known to be taken together or not at all.

    Fix safety
    Safe where offered: the direct `optimizer.step()` is removed only when a constructor
    or annotation proves the other step is a GradScaler's (which calls `optimizer.step()`
    itself), both run in the same function, and the scaler's step runs whenever the
    direct one does.

    References
    https://pytorch.org/docs/stable/amp.html#torch.amp.GradScaler.step
    """

    code = "GL011"
    name = "double-step"
    message = "the optimizer is stepped directly and through its GradScaler, so the parameters are updated twice"
    requires = (b"step", b"caler")  # scaler, GradScaler
    example = """
        scaler = torch.amp.GradScaler()
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            optimizer.step()
            scaler.update()
    """
    use_instead = """
        scaler = torch.amp.GradScaler()
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """

    def check_step(self, step: TrainingStep) -> None:
        steps = step.of_kind(Kind.STEP)
        branches = self.analysis.branches
        for direct in (event for event in steps if not event.via_scaler and event.target is not None):
            for scaled in (event for event in steps if event.via_scaler and self.analysis.same_target(event, direct)):
                first, second = sorted((direct, scaled), key=step.events.index)
                if not branches.exclusive(first, second):
                    story = [(scaled.site, "the GradScaler steps the same optimizer here")]
                    named = (
                        f"`{direct.target}` is stepped directly and by `{self.analysis.code(scaled.site)}`, "
                        "so the parameters are updated twice"
                    )
                    self.report(direct.node, named, self._keep_scaled(direct, scaled), story)
                    break

    def _keep_scaled(self, direct: Event, scaled: Event) -> Fix | None:
        """Delete the direct step when the scaler's step runs whenever it does."""
        analysis = self.analysis
        if (
            not direct.direct
            or not scaled.direct
            or not isinstance(direct.node, cst.Call)
            or not set(scaled.ifs) <= set(direct.ifs)
        ):
            return None
        statement = analysis.statement_of(direct.node)
        if not (isinstance(statement, cst.Expr) and statement.value is direct.node):
            return None  # Ex) loss = optimizer.step(closure): the value is used
        if analysis.context(statement).scope is not analysis.context(scaled.site).scope:
            return None
        call = scaled.node
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
            return None
        if analysis.roles.proven_role(call.func.value) is not Role.SCALER:
            return None  # only a GradScaler's step is known to call `optimizer.step()` itself
        return remove_statement(analysis, statement, "remove the direct `optimizer.step()`")
