"""Gradient accumulation (analysis/training/accumulation.py): which loops accumulate, and how each loss is scaled."""

from __future__ import annotations

import textwrap

from gradlint.analysis import analyze
from gradlint.analysis.training.accumulation import Accumulations, Scaling
from gradlint.checking import parse


def unscaled(source: str) -> list[tuple[str, Scaling, str | None]]:
    """(the backward as written, verdict, k as written) for each accumulated backward judged unscaled or counted."""
    module = parse(textwrap.dedent(source))
    analysis = analyze(module, frozenset())
    analysis.training_steps  # noqa: B018 (inlines every helper, so `called` is complete)
    accumulations = Accumulations(analysis.collected, analysis.events, analysis.origins)
    found = []
    for accumulation, scaling in accumulations.unscaled([analysis.collected.module, *analysis.collected.functions]):
        backward = analysis.code(accumulation.backward.node)
        factor = analysis.code(accumulation.factor) if accumulation.factor is not None else None
        found.append((backward, scaling, factor))
    return found


WHILE_COUNTED = """\
    import torch.nn.functional as F


    def forward_backward(model, stream, accum_steps):
        n_accum = 0
        while True:
            x, y = next(stream)
            F.cross_entropy(model(x), y).backward()
            n_accum += 1
            if n_accum >= accum_steps:
                break


    def train(model, optimizer, stream, accum_steps):
        for _ in range(10):
            forward_backward(model, stream, accum_steps)
            optimizer.step()
            optimizer.zero_grad()
"""


BACKWARD = "F.cross_entropy(model(x), y).backward()"


def test_a_while_loop_that_breaks_at_an_accumulation_count_is_a_micro_batch_loop() -> None:
    assert unscaled(WHILE_COUNTED) == [(BACKWARD, Scaling.UNSCALED, "accum_steps")]


def test_a_count_that_grows_by_a_batch_size_gives_k_as_a_ratio() -> None:
    source = WHILE_COUNTED.replace("n_accum += 1", "n_accum += len(x)")
    assert unscaled(source) == [(BACKWARD, Scaling.UNSCALED, "accum_steps / len(x)")]


def test_a_while_loop_test_that_counts_up_to_k_is_a_micro_batch_loop() -> None:
    source = WHILE_COUNTED.replace("while True:", "while n_accum < accum_steps:").replace(
        "            if n_accum >= accum_steps:\n                break\n", ""
    )
    assert unscaled(source) == [(BACKWARD, Scaling.UNSCALED, "accum_steps")]


def test_a_while_loop_whose_count_is_not_of_micro_batches_is_not_accumulation() -> None:
    source = WHILE_COUNTED.replace("n_accum", "attempts").replace("accum_steps", "max_attempts")
    assert unscaled(source) == []


def test_a_while_loop_whose_count_does_not_grow_in_it_is_not_a_micro_batch_loop() -> None:
    source = WHILE_COUNTED.replace("n_accum += 1", "n_accum = 1")
    assert unscaled(source) == []


TOKEN_MEAN = """\
    import torch
    import torch.nn.functional as F


    def loss_and_backward(model, micro_batch):
        mask = micro_batch["mask"]
        token_losses = F.cross_entropy(model(micro_batch["x"]), micro_batch["y"], reduction="none") * mask
        loss = torch.sum(token_losses) / (mask.sum() + 1e-8)
        loss.backward()
        return loss


    def train_step(model, optimizer, batch, micro_size):
        micro_batches = batch.split(micro_size)
        for micro_batch in micro_batches:
            loss_and_backward(model, micro_batch) / len(micro_batches)
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_mean_over_the_micro_batchs_own_tokens_is_no_scale() -> None:
    assert unscaled(TOKEN_MEAN) == [("loss.backward()", Scaling.UNSCALED, "len(micro_batches)")]


def test_a_token_count_handed_in_from_before_the_loop_scales() -> None:
    source = TOKEN_MEAN.replace("(mask.sum() + 1e-8)", "n_tokens").replace(
        "def loss_and_backward(model, micro_batch):", "def loss_and_backward(model, micro_batch, n_tokens):"
    )
    source = source.replace("loss_and_backward(model, micro_batch)", "loss_and_backward(model, micro_batch, total)")
    assert unscaled(source) == []


def test_a_token_mean_divided_by_k_as_well_scales() -> None:
    source = TOKEN_MEAN.replace("(mask.sum() + 1e-8)", "(mask.sum() + 1e-8) / len(micro_batches)")
    assert unscaled(source) == []


def test_a_process_count_and_a_mask_weigh_the_loss_without_scaling_it() -> None:
    source = TOKEN_MEAN.replace("(mask.sum() + 1e-8)", "(mask.sum() + 1e-8) * dp_size").replace(
        'mask = micro_batch["mask"]\n',
        'mask = micro_batch["mask"]\n        dp_size = torch.distributed.get_world_size()\n',
    )
    assert unscaled(source) == [("loss.backward()", Scaling.UNSCALED, "len(micro_batches)")]
