"""GL014: an optimizer or GradScaler built anew on every training step."""

from __future__ import annotations

import re

import libcst as cst

from gradlint.analysis import Kind, Role, TrainingStep
from gradlint.analysis.syntax.collect import Loop
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in, prefixes
from gradlint.rule import Rule

MAX_CALL_DEPTH = 3
# The loop around a step loop that runs once per epoch: `for epoch in range(...)`,
# `while epoch < args.epochs`; a loop over folds, trials or learning rates is not one.
EPOCH = re.compile(r"epoch", re.IGNORECASE)


class OptimizerInLoop(Rule):
    """Checks for optimizers and GradScalers constructed inside the training loop.

    Why is this bad?
    An optimizer keeps state between steps: momentum buffers, Adam's running
    moments and step count, a GradScaler's loss scale and growth tracker. Built inside
    the loop that steps it, it starts from nothing on every step: Adam degenerates into
    sign-SGD with its largest bias correction, momentum never builds up, the loss scale
    never adapts, and learning-rate schedulers keep pointing at an optimizer that is
    no longer used. Training is slow or unstable and nothing raises. Build it once,
    before the loop.

    A stateful optimizer (any but SGD without momentum) that the step loop steps and
    that is rebuilt at every pass of the epoch loop around it (a loop whose header
    names an epoch) is reported too: its momentum or Adam moments restart every epoch.
    An optimizer built once per fold or per trial of a hyperparameter search is not
    reported, nor one rebuilt per epoch together with a new model, plain SGD rebuilt per
    epoch with the epoch's learning rate, one built under an `if` (a lazy or periodic
    rebuild), or one over parameters created in the same iteration, or in the same call of
    the helper that builds it (a fresh latent or adversarial perturbation optimized for one
    step, a new probe fitted per feature set).

    A function that backpropagates and steps once per call, with no loop around them
    (`optimize_parameters`, `train_step`, whatever its name), is one training step: its
    caller runs it per batch, so a stateful optimizer or a GradScaler built in it (not
    under an `if`, not over parameters it creates) restarts every step. Plain SGD
    without momentum keeps no state and is not reported there. A function whose steps all
    happen inside the helpers it calls (stages that each build and step their own
    optimizer) is not taken for such a step: each helper call is a fit of its own.

    Known problems
    Optimizers built by a factory in another module are not seen. An epoch loop is
    recognised by the word "epoch" in its header, and per-epoch rebuilds are judged only
    for an optimizer assigned to the name the step loop steps.

    References
    https://pytorch.org/docs/stable/optim.html#constructing-it
    """

    code = "GL014"
    name = "optimizer-in-loop"
    message = (
        "an optimizer or GradScaler is built inside the training loop, "
        "so its state (momentum, Adam moments, loss scale) restarts every step"
    )
    quiet_in_tests = True
    requires = (b"backward", b"step")
    example = """
        for x, y in loader:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """

    def check_step(self, step: TrainingStep) -> None:
        node = step.node
        events = self.analysis.events
        steps = step.of_kind(Kind.STEP)
        if isinstance(node, cst.FunctionDef) and any(
            isinstance(e.node, cst.Call) and events.step_closure(e.node) is not None for e in steps
        ):
            return  # `LBFGS.step(closure)` iterates by itself: one call of the function is a whole fit
        # A function whose every step happens inside the helpers it calls: each helper call is a fit of its own,
        # and nothing shows that a caller runs the function once per batch.
        self._check_region(node, 0, helpers=not isinstance(node, cst.FunctionDef) or any(e.direct for e in steps))
        if not isinstance(node, cst.FunctionDef):
            self._check_epoch_loop(step, node)

    def _check_epoch_loop(self, step: TrainingStep, node: Loop) -> None:
        """Report a stateful optimizer this step steps, rebuilt on every pass of the epoch loop around it.

        Ex) `for epoch in range(n): opt = SGD(model.parameters(), momentum=0.9); for x, y in loader: ...`
        """
        analysis = self.analysis
        loops = analysis.context(node).loops
        if not loops or not EPOCH.search(self._loop_header(loops[-1])):
            return
        epoch_loop = loops[-1]
        stepped = {dotted_name(event.value) for event in step.of_kind(Kind.STEP) if event.value is not None}
        base_ifs = len(analysis.context(epoch_loop).ifs)
        for call in analysis.collected.calls_in_loop(epoch_loop):
            context = analysis.context(call)
            if context.loops[-1] is not epoch_loop or len(context.ifs) > base_ifs:
                continue
            if self._assigned_name(call) not in stepped or not self._keeps_state(call):
                continue
            if self._over_new_model(call, epoch_loop):
                continue  # a new model each pass: a fold, a trial
            story: list[tuple[cst.CSTNode, str]] = [
                (epoch_loop, "every epoch builds it again"),
                (node, "the step loop it serves"),
            ]
            built = analysis.code(call.func)
            self.report(call, f"`{built}` is built anew every epoch, so its momentum or moments restart", related=story)

    def _over_new_model(self, call: cst.Call, epoch_loop: Loop) -> bool:
        if not call.args:
            return True
        return any(self.analysis.assigns_fresh(epoch_loop, prefix) for prefix in _parameter_prefixes(call))

    def _loop_header(self, loop: Loop) -> str:
        if isinstance(loop, cst.For):
            return self.analysis.code(loop.target) + " " + self.analysis.code(loop.iter)
        return self.analysis.code(loop.test)

    def _assigned_name(self, call: cst.Call) -> str | None:
        statement = self.analysis.statement_of(call)
        if not isinstance(statement, cst.Assign) or statement.value is not call or len(statement.targets) != 1:
            return None
        return dotted_name(statement.targets[0].target)

    def _keeps_state(self, call: cst.Call) -> bool:
        """Whether the optimizer or GradScaler `call` builds keeps state between steps: any but SGD without
        momentum."""
        if not self._constructs_optimizer(call):
            return False
        if self.analysis.roles.role_of_value(call) is not Role.OPTIMIZER:
            return True  # a GradScaler: its loss scale
        if last_name(call.func) != "SGD":
            return True
        momentum = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "momentum"]
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        value = momentum[0] if momentum else positional[2] if len(positional) > 2 else None
        if value is None:
            return False
        return not (isinstance(value, (cst.Integer, cst.Float)) and float(value.value) == 0)

    def _check_region(self, region: Loop | cst.FunctionDef, depth: int, helpers: bool) -> None:
        """Report constructions that run unconditionally on every pass through the step `region` (with `helpers`,
        those in the helpers it calls too)."""
        analysis = self.analysis
        base_ifs = len(analysis.context(region).ifs) if not isinstance(region, cst.FunctionDef) else 0
        for call in self._calls_in(region):
            context = analysis.context(call)
            if len(context.ifs) > base_ifs:
                continue  # a lazy or periodic rebuild: `if optimizer is None:`
            story = [(region, "every pass through this training step builds it again")]
            if self._constructs_optimizer(call):
                # A function that steps once per call: its caller's loop runs it, and only lost state matters.
                stateless = isinstance(region, cst.FunctionDef) and not self._keeps_state(call)
                if not (stateless or self._over_fresh_parameters(call, region)):
                    self.report(call, self._named(call, region), related=story)
                continue
            helper = analysis.events.resolve_helper(call) if helpers else None
            if helper is not None and depth < MAX_CALL_DEPTH and self._runs_construction(helper, depth + 1):
                self.report(call, related=[(helper, "this helper builds an optimizer or GradScaler"), *story])

    def _named(self, call: cst.Call, region: Loop | cst.FunctionDef) -> str:
        built = self.analysis.code(call.func)
        where = (
            "on every call of this training step" if isinstance(region, cst.FunctionDef) else "inside the training loop"
        )
        return f"`{built}` is built {where}, so its state (momentum, Adam moments, loss scale) restarts"

    def _runs_construction(self, function: cst.FunctionDef, depth: int) -> bool:
        # Ex) a `make_optimizer(model)` or `self.setup()` helper called on every step
        analysis = self.analysis
        for call in self._calls_in(function):
            if analysis.context(call).ifs:
                continue
            if self._constructs_optimizer(call):
                if self._over_fresh_parameters(call, function):
                    continue  # Ex) a helper that fits a new probe: fresh parameters and their optimizer per call
                return True
            helper = analysis.events.resolve_helper(call)
            if helper is not None and depth < MAX_CALL_DEPTH and self._runs_construction(helper, depth + 1):
                return True
        return False

    def _calls_in(self, region: Loop | cst.FunctionDef) -> list[cst.Call]:
        collected = self.analysis.collected
        if isinstance(region, cst.FunctionDef):
            return collected.calls_in_scope(region)
        return collected.calls_in_loop(region)

    def _constructs_optimizer(self, call: cst.Call) -> bool:
        # A class instantiation (`Adam(...)`, `GradScaler()`), not `self.optimizers()` fetching one;
        # a GradScaler(enabled=False) keeps no state.
        name = last_name(call.func) or ""
        disabled = any(
            arg.keyword is not None and arg.keyword.value == "enabled" and last_name(arg.value) == "False"
            for arg in call.args
        )
        return (
            name[:1].isupper()
            and not disabled
            and self.analysis.roles.role_of_value(call) in (Role.OPTIMIZER, Role.SCALER)
        )

    def _over_fresh_parameters(self, call: cst.Call, region: Loop | cst.FunctionDef) -> bool:
        """Whether the parameters it optimizes are themselves created anew in this iteration of the loop, or this
        call of the function (`params = torch.zeros(n, requires_grad=True)` there): a new fit, not a lost state."""
        if not call.args:
            return False
        return any(self.analysis.rebinds(region, prefix) for prefix in _parameter_prefixes(call))


def _parameter_prefixes(call: cst.Call) -> list[str]:
    """Every name, and every prefix of a dotted name, the optimizer's first argument reads (`model`, `model.enc`)."""
    return [prefix for key in names_in(call.args[0].value) for prefix in prefixes(key)]
