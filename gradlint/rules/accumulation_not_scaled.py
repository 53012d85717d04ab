"""GL018: gradient accumulation that sums the micro-batches' gradients instead of averaging them."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event
from gradlint.analysis.syntax.collect import Scope
from gradlint.analysis.training.accumulation import Accumulation, Scaling, trainer_losses_unscaled
from gradlint.rule import Rule

UNSCALED = (
    "`{loss}` is backpropagated on every micro-batch but the optimizer steps once every `{k}`, and the loss is "
    "not divided by `{k}`, so each step applies the sum of their gradients, `{k}` times too large"
)
COUNTER = (
    "the loss is divided by the running count `{counter}`, not by the number of accumulated micro-batches, "
    "so early micro-batches weigh more than later ones in each optimizer step"
)

TRAINER_LOSS = (
    "this `compute_loss` ignores `num_items_in_batch` and divides by nothing, and the class declares its loss "
    "scaled, so Trainer skips its own division: each step sums the accumulated micro-batches' losses"
)


class AccumulationNotScaled(Rule):
    """Checks for gradient accumulation whose losses are not divided by the number of micro-batches.

    Why is this bad?
    `backward()` adds into `.grad`. With gradient accumulation (backward on every
    micro-batch, `optimizer.step()` once every k), the step applies the sum of k
    gradients. Each loss must be divided by k (or the gradients averaged before the
    step) for the update to match the one of a k times larger batch; otherwise the
    effective learning rate is k times larger, and changing k changes the training.
    Dividing by a running count (`loss / (i + 1)`, `loss / n_accum` where `n_accum += 1`)
    weighs the micro-batches unequally: the first one counts k times more than the last.

    Recognised accumulation: a step under `if (i + 1) % k == 0:` (or a flag bound from
    such a test, `if not accumulating:` with `accumulating = (i + 1) % k != 0`, or a
    counter compared with k, or a helper's parameter its caller passes such a test,
    `train_step(batch, apply_gradient=(i + 1) % k == 0)` stepping under `if
    apply_gradient:`; or a step that such a test skips, `if accumulating: continue`
    before it) while the backward runs on every iteration, and an inner
    micro-batch loop (`for micro_step in range(accum_steps):`, `for chunk in
    batch.chunk(k):`, or a `while` loop that counts its micro-batches up to k: `while
    n_accum < k:`, or `if n_accum >= k: break`) that backpropagates, with the step after
    it, also when the loop is in a helper and the step in its caller. A loop over `range(k -
    1)` whose last micro-batch is backpropagated after it, before the step, accumulates k.

    Not reported: a loss divided by any constant (`loss / accum_steps`, `loss /
    len(micro_batches)`, `loss / total_tokens` counted before the loop, `loss * (1 / k)`,
    `loss.div_(k)`, `scaler.scale(loss / k)`), gradients averaged before the step
    (`p.grad /= k`), `accelerator.backward(loss)` and DeepSpeed's `engine.backward(loss)`
    (they divide by their own accumulation steps), Opacus' `optimizer.virtual_step()`
    (the privacy engine averages over the virtual batch), Lightning's `accumulate_grad_batches`,
    a step taken on every iteration (even under `if scheduler is not None:`), and GAN
    steps whose guarded branch has a backward of its own.

    Dividing by a count of the micro-batch's own tokens or rows (`ce.sum() / mask.sum()`,
    the mask of this micro-batch, in the loop or in the helper it calls) takes a mean
    over that micro-batch: it is no scale for the accumulation, and such a loss is
    reported when nothing else divides it by k. A loss divided only after its backward
    (`loss_and_backward(micro) / n_micro`) is reported too: that changes what is logged,
    not the gradients. A mask (`loss * loss_mask`) or a count of processes (`loss *
    dist.get_world_size()`) weighs a loss and scales nothing.

    A `zero_grad()` inside the micro-batch loop (which keeps only the last micro-batch)
    belongs to GL002 missing-zero-grad; this rule stays quiet there.

    A Hugging Face `Trainer.compute_loss` override that takes `num_items_in_batch` is
    reported when it neither uses it, nor divides by `gradient_accumulation_steps`, nor
    calls `super().compute_loss`, and its class declares the loss already scaled
    (`loss_is_scaled_for_ga = True`): Trainer then uses the loss as it is. Without the
    declaration Trainer (transformers 5) divides by the accumulation steps itself unless
    the model's forward takes loss kwargs and the batch gives `num_items_in_batch`, which
    only the run decides: such an override is not reported.

    Known problems
    A loss that comes from a call of another module is taken to be unscaled unless the
    call is handed k; a backward written in another module's helper is not judged. The
    micro-batch loop is recognised by its names (`accum`, `micro`, `chunk`, in a `while`
    loop's count or its bound) or by `chunk`/`split`. A loss with any scaled term (`ce /
    k + kl`) counts as scaled, and a division by a loop count of an outer loop (`loss /
    epoch`) reads as a running count. A mask is known by its name (`mask` in it).
    Whether a Trainer's model takes loss kwargs is not known statically, so an override
    is judged only where its class declares its loss scaled; one that takes `**kwargs`
    instead of `num_items_in_batch` is not checked.

    References
    https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation
    https://huggingface.co/docs/transformers/main_classes/trainer
    """

    code = "GL018"
    name = "accumulation-not-scaled"
    message = (
        "the loss is backpropagated on every micro-batch but not divided by the number of accumulation steps, "
        "so each optimizer step applies the sum of their gradients"
    )
    quiet_in_tests = True
    requires = ((b"backward", b"num_items_in_batch"),)  # a Trainer's compute_loss has no backward
    example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    use_instead = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """

    def check_module(self) -> None:
        analysis = self.analysis
        analysis.training_steps  # noqa: B018 (inlines every helper once, so `called` is complete)
        accumulations = analysis.accumulations
        scopes: list[Scope] = [analysis.collected.module, *analysis.collected.functions]
        for function, returned in trainer_losses_unscaled(analysis.collected):
            unused = [(function.name, "`num_items_in_batch` is accepted here and never used")]
            self.report(returned, TRAINER_LOSS, related=unused)
        for found, scaling in accumulations.unscaled(scopes):
            # A running count is reported where the loss is divided by it; a missing division at the backward.
            counted = scaling is Scaling.COUNTER and found.counted_at is not None
            where = found.counted_at if counted and found.counted_at is not None else _written(found.backward)
            story = self._story(found)
            if where is not _written(found.backward):
                story.insert(
                    0, (_written(found.backward), "the divided loss is backpropagated here, every micro-batch")
                )
            self.report(where, self._message(found, scaling), related=story)

    def _message(self, found: Accumulation, scaling: Scaling) -> str:
        code = self.analysis.code
        if scaling is Scaling.COUNTER and found.counter is not None:
            return COUNTER.format(counter=code(found.counter))
        if found.factor is None or found.backward.value is None:
            return self.message
        return UNSCALED.format(loss=code(found.backward.value), k=code(found.factor))

    def _story(self, found: Accumulation) -> list[tuple[cst.CSTNode, str]]:
        step, backward = found.step, found.backward
        story = [(_written(step), "the optimizer steps here, once for all the accumulated micro-batches")]
        if step.site is not _written(step):
            story.append((step.site, "the step runs through this call"))
        if backward.site is not _written(backward):
            story.append((backward.site, "each micro-batch's backward runs through this call"))
        return story


def _written(event: Event) -> cst.CSTNode:
    """Where an event is written: in this module, its own node; in another module, the call that reaches it."""
    return event.node if event.via is None else event.site
