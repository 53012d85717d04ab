"""Gradient accumulation: backward passes whose gradients add up into one optimizer step.

Two shapes are recognised. A step guarded by an accumulation condition (`if (i + 1) %
accum == 0:`, `if is_grad_step:` bound from one, `if not accumulating:` bound from `(i + 1) %
accum != 0`, `if n_accum >= accum_steps:` with a
counter that the loop increments, a helper's flag its caller passes one of these:
`train_step(batch, apply_gradient=(i + 1) % accum == 0)`; or one these skip, `if accumulating:
continue` before the step) while the backward runs on every
iteration; and an
inner micro-batch loop (`for micro_step in range(gradient_accumulation_steps):`, `for
chunk in batch.chunk(k):`, `while n_accum < k:`, a `while True:` that breaks once a growing
accumulation count reaches its bound) that backpropagates, with the step after it. For each, the
loss that reaches the backward is judged: divided (or multiplied by a reciprocal) by a
constant, divided by a running counter, not divided, or not known.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from enum import Enum

import libcst as cst

from gradlint.analysis.facts.frameworks import hook_methods, sets_flag
from gradlint.analysis.facts.leaves import parameter_names
from gradlint.analysis.facts.origins import OUTSIDE, Binding, Origins
from gradlint.analysis.facts.steps import Event, EventIndex, Kind
from gradlint.analysis.syntax.collect import Collected, Loop, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name
from gradlint.analysis.syntax.refs import arguments_of
from gradlint.analysis.syntax.tree import descendants

MAX_DEPTH = 4
# How far a loss is followed back through its assignments and operations to what divides it.
JUDGE_DEPTH = 16
# Words in a loop's bound or variable that say it walks the micro-batches of one step.
MICRO_WORDS = ("accum", "micro", "grad_acc", "chunk")
# Methods and functions that split one batch into micro-batches.
SPLITTERS = frozenset({"chunk", "split", "tensor_split"})
# Wrappers whose backward divides the loss by their own accumulation steps (Accelerate, DeepSpeed).
# The receivers of `backward(loss)` that divide the loss by their own accumulation steps:
# Accelerate's Accelerator and DeepSpeed's engine (`model_engine`, `self.deepspeed_model`).
SCALING_WRAPPER = re.compile(r"accelerator|engine|deepspeed", re.IGNORECASE)
# Calls that combine several losses: what each part was divided by is not followed.
COMBINERS = frozenset({"sum", "stack", "cat", "mean", "fsum"})
# Tensor methods that keep the scale of the value they are called on.
SCALE_KEEPING = frozenset({"mean", "sum", "float", "half", "to", "squeeze", "view", "reshape", "clone", "cuda"})


class Scaling(Enum):
    """How a backpropagated loss relates to the number of accumulated micro-batches."""

    SCALED = "scaled"  # divided by a constant (or gradients averaged): fine
    COUNTER = "counter"  # divided by a count that grows within the accumulation
    UNSCALED = "unscaled"  # the plain loss of a model or criterion call
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Accumulation:
    """A backward whose gradient is summed with others before `step` applies them."""

    backward: Event
    step: Event
    factor: cst.BaseExpression | None  # k, where the source names it
    counter: cst.BaseExpression | None = None  # the running count the loss is divided by
    counted_at: cst.CSTNode | None = None  # the statement that divides by it
    loop: Loop | None = None  # the loop whose iterations accumulate (None: a function run once per batch)


class Accumulations:
    """Finds gradient accumulation and judges how each accumulated loss is scaled."""

    def __init__(self, collected: Collected, events: EventIndex, origins: Origins) -> None:
        self.collected = collected
        self.events = events
        self.origins = origins

    def unscaled(self, scopes: list[Scope]) -> Iterator[tuple[Accumulation, Scaling]]:
        """Accumulated backwards whose loss is not divided by k, or divided by a running count."""
        seen: set[int] = set()
        for scope in scopes:
            if isinstance(scope, cst.FunctionDef) and scope in self.events.called:
                continue  # its events are judged where it is called
            for found in self._in_scope(self.events.scope_events(scope)):
                if id(found.backward.node) in seen or self._averages_gradients(found) or self._virtual(found):
                    continue
                scaling, judge = self.scaling(found)
                if scaling in (Scaling.UNSCALED, Scaling.COUNTER):
                    seen.add(id(found.backward.node))
                    counter, at = (judge.counter, judge.counted_at) if judge is not None else (None, None)
                    yield Accumulation(found.backward, found.step, found.factor, counter, at), scaling

    def _in_scope(self, events: tuple[Event, ...]) -> Iterator[Accumulation]:
        for step in (event for event in events if event.kind is Kind.STEP):
            yield from self._guarded(events, step)
            yield from self._after_micro_loop(events, step)

    # -- shape 1: a step under an accumulation condition ------------------------------------

    def _guarded(self, events: tuple[Event, ...], step: Event) -> Iterator[Accumulation]:
        for guard, skipped in self._guards(step):
            factor = self._holds_every_k(guard.test, guard, step.loops, 0, skipped, step.site)
            if factor is None:
                continue
            loop = self._window_loop(guard, skipped, step)
            if loop is None and not isinstance(self.collected.contexts[guard].scope, cst.FunctionDef):
                return
            # No loop: a function run once per batch by its caller (Lightning's `training_step(batch, batch_idx)`).
            inside = [event for event in events if (loop in event.loops if loop is not None else not event.loops)]
            if self._cleared_each_pass(guard, inside):
                return  # a clear on every micro-batch: GL002 owns it
            if any(e.kind is Kind.STEP and not self._accumulation_guards(e) for e in inside):
                return  # something steps every iteration: not accumulation
            backwards = self._accumulated(guard, [e for e in inside if e.kind is Kind.BACKWARD])
            for backward in backwards:
                yield Accumulation(backward, step, factor, loop=loop)
            return

    def _window_loop(self, guard: cst.If, skipped: bool, step: Event) -> Loop | None:
        """The loop whose passes an accumulation window `guard` (around `step`, or `continue`ing before it) counts."""
        if skipped:  # the loop the `continue` goes on with
            return self.collected.contexts[guard].loops[-1]
        return next((lp for lp in reversed(step.loops) if guard not in self.collected.contexts[lp].ifs), None)

    def _cleared_each_pass(self, guard: cst.If, inside: list[Event]) -> bool:
        """Whether a clear among the window's events runs on every pass, whatever `guard` says: then no gradient
        is summed over passes, whatever the step waits for."""
        return any(event.kind is Kind.CLEAR and not self.decides(guard, event) for event in inside)

    def summed_window(self, events: tuple[Event, ...], step: Event) -> cst.If | None:
        """`window(step)`, when the gradients of its passes are summed: no clear among `events` runs on every pass
        (`model.zero_grad()` at the top of each iteration leaves each step one micro-batch's gradient, however
        rarely it steps)."""
        window = self.window(step)
        if window is None:
            return None
        skipped = not any(guard is window for guard in step.ifs)
        loop = self._window_loop(window, skipped, step)
        inside = [event for event in events if (loop in event.loops if loop is not None else not event.loops)]
        return None if self._cleared_each_pass(window, inside) else window

    def _guards(self, event: Event) -> Iterator[tuple[cst.If, bool]]:
        """The `if` statements that decide whether `event` runs, each with whether it runs when the test fails:
        those around it, and those before it in its loop's body that `continue` (`if accumulating: continue`)."""
        for guard in event.ifs:
            if isinstance(guard, cst.If):
                yield guard, False
        for node in (event.site,) if event.node is event.site else (event.site, event.node):  # a helper's too
            context = self.collected.contexts.get(node)
            for guard in context.skips if context is not None else ():
                yield guard, True

    def decides(self, guard: cst.If, event: Event) -> bool:
        """Whether `guard` decides if `event` runs: it holds the event, or `continue`s before it."""
        return any(decider is guard for decider, _skipped in self._guards(event))

    def _accumulated(self, guard: cst.If, backwards: list[Event]) -> list[Event]:
        """The backwards that run on every iteration, whichever way `guard` goes."""
        guarded = [event for event in backwards if self.decides(guard, event)]
        branches = {self.collected.in_body(guard, event.node) for event in guarded}
        if guarded and len(branches) < 2:
            return []  # Ex) GAN: the generator's own backward and step, every n_critic batches
        return [event for event in backwards if not event.no_grad]

    def _accumulation_guards(self, event: Event) -> bool:
        return self.window(event) is not None

    def window(self, step: Event) -> cst.If | None:
        """The condition that lets `step` run once every k micro-batches (`if (i + 1) % k == 0:`, or `if i % k != 0:
        continue` before it), when one does: the end of an accumulation window."""
        return next(
            (
                guard
                for guard, skipped in self._guards(step)
                if self._holds_every_k(guard.test, guard, step.loops, 0, skipped, step.site) is not None
            ),
            None,
        )

    def _holds_every_k(
        self,
        test: cst.BaseExpression,
        at: cst.CSTNode,
        loops: tuple[Loop, ...],
        depth: int,
        negated: bool = False,
        site: cst.CSTNode | None = None,
    ) -> cst.BaseExpression | None:
        """k, when `test` (or its negation), read at the statement `at`, holds once every k iterations. A
        parameter of a helper is read as its call `site` passes it: `train_step(batch, apply_gradient=(i + 1) %
        k == 0)` steps once every k iterations under `if apply_gradient:`."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            # Ex) is_accumulating = (i + 1) % k != 0 ... if not is_accumulating: step
            return self._holds_every_k(test.expression, at, loops, depth + 1, not negated, site)
        if isinstance(test, cst.BooleanOperation):
            if negated:
                return None
            return self._holds_every_k(test.left, at, loops, depth + 1, site=site) or self._holds_every_k(
                test.right, at, loops, depth + 1, site=site
            )
        if isinstance(test, cst.Comparison):
            if negated:  # `not (i % k != 0)` holds once every k; `not (i % k == 0)` holds all but once
                differs = len(test.comparisons) == 1 and isinstance(test.comparisons[0].operator, cst.NotEqual)
                return _modulo_divisor(test.left) if differs else None
            return _modulo_divisor(test.left) or self._counter_bound(test, loops)
        key = dotted_name(test)
        if key is None:
            return None
        definitions = self.origins.definitions(key, at)
        for definition in definitions:  # Ex) is_grad_step = (i + 1) % k == 0
            if definition.binding is Binding.ASSIGN:
                found = self._holds_every_k(definition.value, at, loops, depth + 1, negated, site)
                if found is not None:
                    return found
        passed = self._passed(key, at, site) if definitions == (OUTSIDE,) else None
        if passed is not None and isinstance(site, cst.Call):
            caller = self.collected.statement_of.get(site, site)
            return self._holds_every_k(passed, caller, loops, depth + 1, negated)
        return None

    def _passed(self, key: str, at: cst.CSTNode, site: cst.CSTNode | None) -> cst.BaseExpression | None:
        """What the helper call `site` passes for `key`, a parameter of the helper that `at` sits in."""
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        if function is None or not isinstance(site, cst.Call) or self.events.resolve_helper(site) is not function:
            return None
        return arguments_of(function, site).get(key)

    def _counter_bound(self, test: cst.Comparison, loops: tuple[Loop, ...]) -> cst.BaseExpression | None:
        # Ex) if accum_n_steps >= accum_grad_n_steps:  (accum_n_steps += 1 in the loop)
        if len(test.comparisons) != 1 or not self.is_counter(test.left, loops):
            return None
        target = test.comparisons[0]
        if not isinstance(target.operator, (cst.GreaterThanEqual, cst.Equal, cst.GreaterThan)):
            return None
        return None if isinstance(target.comparator, (cst.Integer, cst.Float)) else target.comparator

    # -- shape 2: an inner micro-batch loop that backpropagates, the step after it ------------

    def _after_micro_loop(self, events: tuple[Event, ...], step: Event) -> Iterator[Accumulation]:
        depth = len(step.loops)
        for backward in events:
            if backward.kind is not Kind.BACKWARD or len(backward.loops) <= depth:
                continue
            if backward.loops[:depth] != step.loops or events.index(backward) > events.index(step):
                continue
            micro = backward.loops[depth]
            factor = self._micro_factor(micro)
            if factor is None:
                continue
            peeled = _less_one(factor)
            if peeled is not None and any(
                event.kind is Kind.BACKWARD and event.loops == step.loops and micro not in event.loops
                for event in events[events.index(backward) : events.index(step)]
            ):
                factor = peeled  # `range(k - 1)`, then the last micro-batch's backward before the step: k of them
            inner = [event for event in events if micro in event.loops]
            if any(event.kind in (Kind.STEP, Kind.CLEAR) for event in inner):
                continue  # steps inside (not accumulation), or clears every micro-batch (GL002)
            if _between(events, backward, step, Kind.STEP):
                continue
            yield Accumulation(backward, step, factor, loop=micro)

    def _micro_factor(self, loop: Loop) -> cst.BaseExpression | None:
        """k for a loop over the micro-batches of one step, else None."""
        if isinstance(loop, cst.While):
            return self._while_factor(loop)
        iterable = loop.iter
        if isinstance(iterable, cst.Call) and last_name(iterable.func) in ("zip", "enumerate") and iterable.args:
            iterable = iterable.args[0].value  # zip(x.chunk(k), y.chunk(k)), enumerate(micro_batches)
        named = any(word in (_text(node) or "").lower() for node in (loop.target, iterable) for word in MICRO_WORDS)
        if isinstance(iterable, cst.Call) and last_name(iterable.func) == "range" and len(iterable.args) == 1:
            bound = iterable.args[0].value
            counted = _less_one(bound) or bound  # `range(k - 1)`: k still names the micro-batches
            return bound if named or any(word in (_text(counted) or "").lower() for word in MICRO_WORDS) else None
        if isinstance(iterable, cst.Call) and last_name(iterable.func) in SPLITTERS:
            positional = [arg.value for arg in iterable.args if arg.keyword is None]
            if last_name(iterable.func) == "chunk" and positional:
                return positional[-1]  # x.chunk(k), torch.chunk(x, k): k parts
            return cst.Call(cst.Name("len"), [cst.Arg(iterable)])
        if named and isinstance(iterable, (cst.Name, cst.Attribute)):
            return cst.Call(cst.Name("len"), [cst.Arg(iterable)])
        return None

    def _while_factor(self, loop: cst.While) -> cst.BaseExpression | None:
        """k for a `while` loop that counts its micro-batches up to k: `while n_accum < k:`, or `while True:`
        that leaves on `if n_accum >= k: break`. A count that grows by a batch size gives `k / size`."""
        guards = [(loop.test, False)]
        for statement in self.collected.statements_in_loop(loop):
            context = self.collected.contexts.get(statement)
            if isinstance(statement, cst.Break) and context is not None and context.loops[-1:] == (loop,):
                inside = [
                    g
                    for g in context.ifs[-1:]
                    if g in self.collected.contexts and loop in self.collected.contexts[g].loops
                ]
                guards.extend((guard.test, True) for guard in inside if isinstance(guard, cst.If))
        for test, leaves in guards:
            found = self._count_bound(test, loop, leaves)
            if found is not None:
                return found
        return None

    def _count_bound(self, test: cst.BaseExpression, loop: cst.While, leaves: bool) -> cst.BaseExpression | None:
        # Ex) while micro_step < accum_steps:  /  if accum_batch_size >= total_batch_size: break
        if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return None
        operator, bound = test.comparisons[0].operator, test.comparisons[0].comparator
        expected = (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal) if leaves else (cst.LessThan, cst.NotEqual)
        step = self._increment(test.left, loop)
        if not isinstance(operator, expected) or step is None or isinstance(bound, (cst.Integer, cst.Float)):
            return None
        if not any(word in (_text(node) or "").lower() for node in (test.left, bound) for word in MICRO_WORDS):
            return None
        if isinstance(step, cst.Integer) and step.value == "1":
            return bound
        return cst.BinaryOperation(bound, cst.Divide(), step)

    def _increment(self, counter: cst.BaseExpression, loop: cst.While) -> cst.BaseExpression | None:
        """What `counter` grows by on each iteration of `loop` (`n += 1`: 1), if it grows there."""
        key = dotted_name(counter)
        for statement in self.collected.statements_in_loop(loop) if key is not None else ():
            if (
                isinstance(statement, cst.AugAssign)
                and isinstance(statement.operator, cst.AddAssign)
                and dotted_name(statement.target) == key
            ):
                return statement.value
        return None

    # -- judging the loss ----------------------------------------------------------------------

    def scaling(self, found: Accumulation) -> tuple[Scaling, _Judge | None]:
        """How the loss that `found.backward` propagates is scaled, and the judge that found the running count."""
        backward = found.backward
        node = backward.node
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and SCALING_WRAPPER.search(last_name(node.func.value) or "")
        ):
            return Scaling.SCALED, None  # accelerator.backward(loss) divides by its own steps
        value = backward.value
        if value is None or not isinstance(node, cst.Call) or node not in self.collected.statement_of:
            return Scaling.UNKNOWN, None
        original = self.events.classify(node)
        at_node = node if original is not None and original[1] is value else backward.site
        if not isinstance(at_node, cst.Call) or at_node not in self.collected.statement_of:
            return Scaling.UNKNOWN, None
        judge = _Judge(self, backward.loops, found.factor, found.loop)
        result = judge.expression(value, self.collected.statement_of[at_node], 0)
        return result, judge

    def is_counter(self, node: cst.BaseExpression, loops: tuple[Loop, ...]) -> bool:
        """Whether `node` reads a count that changes every iteration: `i`, `i + 1`, `n_accum` (`n_accum += 1`)."""
        if isinstance(node, cst.BinaryOperation):
            return self.is_counter(node.left, loops) or self.is_counter(node.right, loops)
        key = dotted_name(node)
        if key is None:
            return False
        for loop in loops:
            if isinstance(loop, cst.For) and key in _index_names(loop):
                return True
            for statement in self.collected.statements_in_loop(loop):
                if (
                    isinstance(statement, cst.AugAssign)
                    and isinstance(statement.operator, cst.AddAssign)
                    and dotted_name(statement.target) == key
                ):
                    return True
        return False

    def _virtual(self, found: Accumulation) -> bool:
        """Opacus before 1.0: `optimizer.virtual_step()` keeps the clipped per-sample gradients, `step()` averages."""
        scopes = {self.collected.contexts[node].scope for node in (found.step.node, found.step.site)}
        return any(
            last_name(call.func) == "virtual_step" for scope in scopes for call in self.collected.calls_in_scope(scope)
        )

    def _averages_gradients(self, found: Accumulation) -> bool:
        """Whether the scope that steps divides the gradients itself (`p.grad /= k`, `p.grad.div_(k)`)."""
        scopes = {self.collected.contexts[node].scope for node in (found.step.node, found.step.site)}
        return any(
            _divides_gradient(statement) for scope in scopes for statement in self.collected.statements_in_scope(scope)
        )


class _Judge:
    """Follows a loss back through its assignments to what it was divided by."""

    def __init__(
        self,
        accumulations: Accumulations,
        loops: tuple[Loop, ...],
        factor: cst.BaseExpression | None,
        micro: Loop | None = None,
    ):
        self.accumulations = accumulations
        self.loops = loops
        self.micro = micro
        self.factor = dotted_name(factor) if factor is not None else None
        self.counter: cst.BaseExpression | None = None
        self.counted_at: cst.CSTNode | None = None

    def expression(self, node: cst.BaseExpression, at: cst.CSTNode, depth: int) -> Scaling:
        if depth > JUDGE_DEPTH:
            return Scaling.UNKNOWN
        if isinstance(node, cst.BinaryOperation):
            return self._operation(node, at, depth)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            return self.expression(node.expression, at, depth + 1)  # -torch.min(surr1, surr2).mean(): same scale
        if isinstance(node, cst.Call):
            return self._call(node, at, depth)
        if isinstance(node, cst.Subscript) or (isinstance(node, cst.Attribute) and dotted_name(node) is None):
            return self.expression(node.value, at, depth + 1)  # out["loss"], losses[0], model(**batch).loss
        if isinstance(node, (cst.Name, cst.Attribute)):
            return self._name(node, at, depth)
        return Scaling.UNKNOWN

    def divided(self, divisor: cst.BaseExpression, at: cst.CSTNode) -> Scaling:
        if dotted_name(divisor) != self.factor and self.accumulations.is_counter(divisor, self.loops):
            self.counter, self.counted_at = divisor, at
            return Scaling.COUNTER
        return Scaling.SCALED

    def _operation(self, node: cst.BinaryOperation, at: cst.CSTNode, depth: int) -> Scaling:
        operator = node.operator
        if isinstance(operator, (cst.Divide, cst.FloorDivide)):
            if self._counts_micro_batch(node.right, at, depth):
                return self.expression(node.left, at, depth + 1)  # ce.sum() / mask.sum(): a mean over this one
            return self.divided(node.right, at)
        if isinstance(operator, cst.Multiply):
            for side in (node.left, node.right):
                if (
                    isinstance(side, cst.BinaryOperation)
                    and isinstance(side.operator, cst.Divide)
                    and not self._counts_micro_batch(side.right, at, depth)
                ):
                    return self.divided(side.right, at)  # loss * (1 / k)
        if isinstance(operator, cst.Multiply):
            sides = [side for side in (node.left, node.right) if not self._is_weight(side, at)]
            return _combine([self.expression(side, at, depth + 1) for side in sides])
        if isinstance(operator, (cst.Add, cst.Subtract)):
            return _combine([self.expression(node.left, at, depth + 1), self.expression(node.right, at, depth + 1)])
        return Scaling.UNKNOWN

    def _counts_micro_batch(self, divisor: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        """Whether `divisor` counts the current micro-batch (its tokens or rows): dividing by it takes a mean
        over that micro-batch, which is no scale for the accumulation. `len(micro_batches)` counted before the
        loop is k; `mask.sum()` of this micro-batch's mask is not."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(divisor, cst.BinaryOperation) and isinstance(divisor.operator, cst.Add):
            sides = [side for side in (divisor.left, divisor.right) if not isinstance(side, (cst.Integer, cst.Float))]
            return len(sides) == 1 and self._counts_micro_batch(sides[0], at, depth + 1)  # mask.sum() + 1e-8
        if isinstance(divisor, (cst.Name, cst.Attribute)) and (key := dotted_name(divisor)) is not None:
            definitions = self.accumulations.origins.definitions(key, at)
            return bool(definitions) and all(
                d.binding is Binding.ASSIGN and self._counts_micro_batch(d.value, d.node, depth + 1)
                for d in definitions
            )
        counted = _counted(divisor, self.accumulations.collected.imports.aliases)
        return counted is not None and self._in_iteration(counted, at)

    def _in_iteration(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `value` is made anew in each iteration that accumulates (the micro-batch, or data of it)."""
        while isinstance(value, (cst.Subscript, cst.Call)):
            value = value.value if isinstance(value, cst.Subscript) else value.func  # batch["mask"], x.float()
            value = value.value if isinstance(value, cst.Attribute) and dotted_name(value) is None else value
        key = dotted_name(value)
        definitions = self.accumulations.origins.definitions(key, at) if key is not None else frozenset()
        return bool(definitions) and all(self._made_in_iteration(d.binding, d.node) for d in definitions)

    def _made_in_iteration(self, binding: Binding, node: cst.CSTNode) -> bool:
        collected = self.accumulations.collected
        if binding is Binding.OUTSIDE or node not in collected.contexts:
            return False  # a parameter may be the whole batch: `len(micro_batches)` handed in
        if binding is Binding.LOOP:
            return node is self.micro
        context = collected.contexts[node]
        if self.micro is None:
            return isinstance(context.scope, cst.FunctionDef)  # a function run once per batch
        # In the loop, or in a helper the loop's iteration runs (where the backward's value was followed).
        return self.micro in context.loops or context.scope is not collected.contexts[self.micro].scope

    def _is_weight(self, node: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A loss weight (`0.5`, `alpha`, `self.kd_weight`) or a mask, not a scale the accumulation may have set."""
        if isinstance(node, (cst.Integer, cst.Float)):
            return True
        if isinstance(node, cst.BinaryOperation) and not isinstance(node.operator, cst.Divide):
            return self._is_weight(node.left, at) and self._is_weight(node.right, at)  # (1 - alpha)
        if isinstance(node, cst.Call) and _is_setting(node):
            return True  # loss * dist.get_world_size()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and last_name(node.func) in CASTS:
            node = node.func.value  # mask.to(loss.device), mask.float()
        key = dotted_name(node)
        if key is None or (self.factor is not None and self.factor in key):
            return False
        if any(word in key.lower() for word in ("scale", "accum", "inv", "norm")):
            return False
        if "mask" in (last_name(node) or "").lower():
            return True  # loss * loss_mask: selects tokens, scales nothing
        definitions = self.accumulations.origins.definitions(key, at)
        return all(
            d.binding is Binding.OUTSIDE or (d.binding is Binding.ASSIGN and _is_setting(d.value)) for d in definitions
        )

    def _call(self, node: cst.Call, at: cst.CSTNode, depth: int) -> Scaling:
        func = node.func
        name = last_name(func)
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        if name in ("div", "div_", "true_divide") and positional:
            return self.divided(positional[-1], at)
        if isinstance(func, cst.Attribute) and name in SCALE_KEEPING and not self._is_module(func.value):
            return self.expression(func.value, at, depth + 1)  # loss.mean(), criterion(out, y).sum()
        if name in ("sum", "mean") and self._is_module(func) and len(positional) == 1 and _one_tensor(positional[0]):
            return self.expression(positional[0], at, depth + 1)  # torch.sum(token_losses)
        if name in COMBINERS:
            return Scaling.UNKNOWN  # sum(losses), torch.stack(losses).mean()
        classified = self.accumulations.events.classify(node) if node in self.accumulations.collected.contexts else None
        if classified is not None and classified[0] is Kind.SCALE and classified[1] is not None:
            return self.expression(classified[1], at, depth + 1)  # scaler.scale(loss): unscale_ or step undoes it
        if self.factor is not None and any(dotted_name(arg.value) == self.factor for arg in node.args):
            return Scaling.SCALED  # compute_loss(batch, accum_steps): handed k, it may divide
        helper = self.accumulations.events.resolve_helper(node)
        if helper is not None:
            return self._returned(helper, depth)
        return Scaling.UNSCALED  # a model or criterion call

    def _is_module(self, node: cst.BaseExpression) -> bool:
        """Whether `node` names an imported module (`torch`, `np`), or a function of one, not a tensor."""
        if isinstance(node, cst.Attribute) and dotted_name(node) is not None and last_name(node) in ("sum", "mean"):
            node = node.value  # torch.sum
        return dotted_name(node) in self.accumulations.collected.imports.aliases or dotted_name(node) == "torch"

    def _returned(self, helper: cst.FunctionDef, depth: int) -> Scaling:
        collected = self.accumulations.collected
        results = [
            self.expression(statement.value, statement, depth + 1)
            for statement in collected.statements_in_scope(helper)
            if isinstance(statement, cst.Return) and statement.value is not None
        ]
        return _combine(results) if results else Scaling.UNKNOWN

    def _name(self, node: cst.BaseExpression, at: cst.CSTNode, depth: int) -> Scaling:
        key = dotted_name(node) or ""
        origins = self.accumulations.origins
        definitions = origins.definitions(key, at)
        if any(d.binding is Binding.OUTSIDE for d in definitions) and "." in key:
            head = key.split(".", 1)[0]
            if head not in ("self", "cls"):
                definitions = origins.definitions(head, at)  # outputs.loss: what `outputs` holds
        if self._scaled_in_place(key, at):
            return Scaling.SCALED
        results = [self._definition(d.binding, d.value, d.node, depth) for d in definitions]
        return _combine(results) if results else Scaling.UNKNOWN

    def _definition(self, binding: Binding, value: cst.BaseExpression, node: cst.CSTNode, depth: int) -> Scaling:
        if binding in (Binding.ASSIGN, Binding.UNPACK):
            return self.expression(value, node, depth + 1)
        if (
            binding is Binding.AUGMENT
            and isinstance(node, cst.AugAssign)
            and isinstance(node.operator, (cst.DivideAssign, cst.FloorDivideAssign))
        ):
            return self.divided(value, node)  # loss /= accum_steps
        return Scaling.UNKNOWN

    def _scaled_in_place(self, key: str, at: cst.CSTNode) -> bool:
        # Ex) loss.div_(accum_steps) earlier in the same scope
        collected = self.accumulations.collected
        scope = collected.contexts[at].scope if at in collected.contexts else collected.module
        limit = collected.order.get(at, 0)
        for statement in collected.statements_in_scope(scope):
            if collected.order.get(statement, 0) >= limit:
                break
            if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
                func = statement.value.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value in ("div_", "mul_")
                    and dotted_name(func.value) == key
                ):
                    return True
        return False


def trainer_losses_unscaled(collected: Collected) -> Iterator[tuple[cst.FunctionDef, cst.Return]]:
    """Hugging Face Trainers' `compute_loss` overrides that ignore `num_items_in_batch`, divide by nothing, and whose
    class declares its loss already scaled for accumulation (`loss_is_scaled_for_ga = True`).

    Trainer's `training_step` (transformers 5) divides the loss `compute_loss` returns by the
    accumulation steps unless the loss counts as scaled: `loss_is_scaled_for_ga` when the
    class sets it, otherwise when the model's forward takes loss kwargs and the batch gives
    `num_items_in_batch`, both known only at run time. Only the declaration proves that
    Trainer leaves the division to `compute_loss`; without it, whether the loss is divided
    is unknown, and nothing is reported.
    """
    for function in hook_methods(collected, "backpropagated"):
        owner = collected.owners[function]
        if function.name.value != "compute_loss" or not sets_flag(collected, owner, "loss_is_scaled_for_ga", "True"):
            continue
        if "num_items_in_batch" not in parameter_names(function) or _reached_identifiers(collected, function, owner) & (
            TRAINER_SCALING_NAMES
        ):
            continue
        returns = [s for s in collected.statements_in_scope(function) if isinstance(s, cst.Return) and s.value]
        if returns:
            yield function, returns[-1]


# What a `compute_loss` override reads when it scales for accumulation or defers to Trainer's own.
TRAINER_SCALING_NAMES = frozenset(
    {"num_items_in_batch", "gradient_accumulation_steps", "current_gradient_accumulation_steps", "compute_loss"}
)


def _reached_identifiers(collected: Collected, function: cst.FunctionDef, owner: cst.ClassDef) -> set[str]:
    """The names read in `function` and in the methods of its class it calls or hands on (`self._compute_loss`
    divides by `self.current_gradient_accumulation_steps`), followed a few calls deep."""
    methods = {method.name.value: method for method, cls in collected.owners.items() if cls is owner}
    found: set[str] = set()
    pending, seen = [function], {function}
    while pending and len(seen) <= MAX_REACHED_METHODS:
        current = pending.pop()
        names = _identifiers(current.body)
        found |= names
        for node in descendants(current.body):
            if (
                isinstance(node, cst.Attribute)
                and dotted_name(node.value) == "self"
                and (method := methods.get(node.attr.value)) is not None
                and method not in seen
            ):
                seen.add(method)
                pending.append(method)
    return found


MAX_REACHED_METHODS = 8


def _identifiers(node: cst.CSTNode) -> set[str]:
    """Every name and attribute name read under `node`."""
    return {inner.value for inner in descendants(node) if isinstance(inner, cst.Name)}


# Reductions that count what a tensor or a batch holds: `mask.sum()`, `torch.sum(mask)`, `len(x)`, `x.size(0)`.
COUNTS = frozenset({"sum", "numel", "count_nonzero", "size", "len"})


def _counted(divisor: cst.BaseExpression, modules: Collection[str]) -> cst.BaseExpression | None:
    """What `divisor` counts: `mask` in `mask.sum()`, `torch.sum(mask)`, `len(mask)`, `mask.size(0)`."""
    if isinstance(divisor, cst.Subscript) and isinstance(divisor.value, cst.Attribute):
        return divisor.value.value if divisor.value.attr.value == "shape" else None
    if not isinstance(divisor, cst.Call) or last_name(divisor.func) not in COUNTS:
        return None
    func = divisor.func
    if isinstance(func, cst.Attribute) and dotted_name(func.value) not in (*modules, "torch"):
        return func.value
    positional = [arg.value for arg in divisor.args if arg.keyword is None and not arg.star]
    return positional[0] if positional else None


# Tensor methods that change a value's type or device only.
CASTS = frozenset({"to", "float", "half", "bfloat16", "cuda", "type_as"})
# Counts of processes or samples: a factor of them weighs a loss (`loss * dp_size`), it scales no accumulation.
PROCESS_COUNTS = frozenset({"get_world_size", "size"})


def _is_setting(value: cst.BaseExpression) -> bool:
    """A literal, or a count of processes or samples: `2`, `mesh.size("dp")`, `dist.get_world_size()`."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.IfExp):
        return _is_setting(value.body) and _is_setting(value.orelse)
    return isinstance(value, cst.Call) and last_name(value.func) in PROCESS_COUNTS


def _one_tensor(value: cst.BaseExpression) -> bool:
    """Not a sequence written out or built: `torch.sum(x)` reduces one tensor, `torch.sum([a, b])` combines."""
    return not isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.Set))


def _combine(results: list[Scaling]) -> Scaling:
    """Any scaled part makes the loss scaled; it is unscaled only when every part is."""
    for verdict in (Scaling.SCALED, Scaling.COUNTER):
        if verdict in results:
            return verdict
    if results and all(result is Scaling.UNSCALED for result in results):
        return Scaling.UNSCALED
    return Scaling.UNKNOWN


def _modulo_divisor(node: cst.BaseExpression) -> cst.BaseExpression | None:
    # Ex) (i + 1) % accum_steps == 0  ->  accum_steps
    strings = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)
    if (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Modulo)
        and not isinstance(node.left, strings)
    ):
        return node.right
    return None


def _index_names(loop: cst.For) -> set[str]:
    """The count a loop binds: `i` of `for i in range(n)` and of `for i, batch in enumerate(loader)`."""
    iterable = loop.iter
    if not isinstance(iterable, cst.Call):
        return set()
    called = last_name(iterable.func)
    target = loop.target
    if called == "range" and isinstance(target, cst.Name):
        return {target.value}
    if called == "enumerate" and isinstance(target, cst.Tuple) and target.elements:
        first = target.elements[0].value
        return {first.value} if isinstance(first, cst.Name) else set()
    return set()


def _between(events: tuple[Event, ...], first: Event, last: Event, kind: Kind) -> bool:
    start, end = events.index(first), events.index(last)
    return any(event.kind is kind for event in events[start + 1 : end])


def _divides_gradient(statement: cst.BaseSmallStatement) -> bool:
    """`p.grad /= k`, `p.grad.div_(k)`, `p.grad.data.mul_(1 / k)`, `p.grad = p.grad / k`."""
    if isinstance(statement, cst.AugAssign):
        return isinstance(statement.operator, (cst.DivideAssign, cst.MultiplyAssign)) and _mentions_grad(
            statement.target
        )
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        func = statement.value.func
        return isinstance(func, cst.Attribute) and func.attr.value in ("div_", "mul_") and _mentions_grad(func.value)
    if isinstance(statement, cst.Assign):
        divides = isinstance(statement.value, cst.BinaryOperation) and isinstance(statement.value.operator, cst.Divide)
        return divides and any(_mentions_grad(target.target) for target in statement.targets)
    return False


def _mentions_grad(node: cst.BaseExpression) -> bool:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Attribute) and node.attr.value in ("grad", "grads"):
            return True
        node = node.value
    return isinstance(node, cst.Name) and node.value in ("grad", "grads")


def _less_one(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`k` of `k - 1`."""
    if (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Subtract)
        and isinstance(node.right, cst.Integer)
        and node.right.value == "1"
    ):
        return node.left
    return None


def _text(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Tuple):
        return " ".join(filter(None, (_text(element.value) for element in node.elements)))
    return dotted_name(node)
