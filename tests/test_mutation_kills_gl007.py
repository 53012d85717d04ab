"""Tests that kill surviving mutants of the GL007 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Diagnostic, lint_source
from gradlint.rules.clip_order import LIGHTNING, SCALED


def gl007(source: str) -> list[Diagnostic]:
    """The GL007 findings for `source` (dedented); fails on a crashed rule (GL999)."""
    found = lint_source(textwrap.dedent(source).encode(), "x.py")
    assert not [d for d in found if d.code == "GL999"], found
    return [d for d in found if d.code == "GL007"]


def summary(source: str) -> list[tuple[int, int, str, list[tuple[int, str]]]]:
    """(line, column, message, [(related line, note)]) of each GL007 finding."""
    return [(d.line, d.column, d.message, [(r.line, r.note) for r in d.related]) for d in gl007(source)]


BEFORE_BACKWARD = (
    "gradients are clipped before `criterion(model(x), y).backward()`, so the new gradients are not clipped"
)
COMPUTED_HERE = "the gradients are computed only here"
SCALED_HERE = "the gradients are scaled by this backward"


# Lightning: a clip inside an automatic-optimization training_step

LIGHTNING_STEP = """\
import lightning as L
import torch


class Regressor(L.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self.net(batch).mean()
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        return loss
"""


def test_lightning_clip_reports_its_message_and_the_training_step() -> None:
    assert summary(LIGHTNING_STEP) == [
        (8, 9, LIGHTNING, [(6, "Lightning backpropagates the returned loss after this")]),
    ]


def test_lightning_norm_measurement_and_other_events_are_not_reported() -> None:
    source = """\
    import lightning as L
    import torch


    class Regressor(L.LightningModule):
        def training_step(self, batch, batch_idx):
            loss = self.net(batch).mean()
            norm = torch.nn.utils.clip_grad_norm_(self.parameters(), float("inf"))
            self.log("grad_norm", norm)
            optimizer.zero_grad()
            return loss
    """
    assert gl007(source) == []


def test_lightning_helper_called_twice_is_reported_once_at_the_first_call() -> None:
    # Both inlined clips are located with call_toward, which finds the first call of the helper.
    source = """\
    import lightning as L
    import torch


    class Regressor(L.LightningModule):
        def clip(self):
            torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)

        def training_step(self, batch, batch_idx):
            loss = self.net(batch).mean()
            self.clip()
            self.clip()
            return loss
    """
    assert [(d.line, d.column) for d in gl007(source)] == [(11, 9)]


# Clip order within a loop or function


def test_clip_after_step_names_the_step_that_already_ran() -> None:
    source = """\
    import torch

    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    assert summary(source) == [
        (
            7,
            5,
            "gradients are clipped after `optimizer.step()`, so the update already used them unclipped",
            [(6, "the step already ran")],
        ),
    ]


def test_a_clear_just_before_the_step_does_not_hide_a_clip_after_it() -> None:
    # Only a clear between the step and the clip makes the clip precede the next backward.
    source = """\
    import torch

    for x, y in loader:
        criterion(model(x), y).backward()
        optimizer.zero_grad()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    assert summary(source) == [
        (
            7,
            5,
            "gradients are clipped after `optimizer.step()`, so the update already used them unclipped",
            [(6, "the step already ran")],
        ),
    ]


def test_a_clip_after_a_norm_measurement_is_still_checked() -> None:
    source = """\
    import math
    import torch

    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        criterion(model(x), y).backward()
        optimizer.step()
    """
    assert summary(source) == [(7, 5, BEFORE_BACKWARD, [(8, COMPUTED_HERE)])]


@pytest.mark.parametrize(
    "clip",
    [
        'torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))',
        'torch.nn.utils.clip_grad_norm_(model.parameters(), float("INF"))',
        "torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)",
        "torch.nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=torch.inf)",
    ],
)
def test_an_infinite_max_norm_only_measures(clip: str) -> None:
    source = f"""\
import math
import torch

for x, y in loader:
    optimizer.zero_grad()
    {clip}
    criterion(model(x), y).backward()
    optimizer.step()
"""
    assert gl007(source) == []


@pytest.mark.parametrize(
    "clip",
    [
        # An infinite norm_type clips by the largest gradient: a real clip.
        'torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, float("inf"))',
        'torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, norm_type=float("inf"))',
        "torch.nn.utils.clip_grad_norm_(model.parameters(), float(args.max_norm))",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), float(info))",
    ],
)
def test_a_finite_or_unknown_max_norm_clips(clip: str) -> None:
    source = f"""\
import math
import torch

for x, y in loader:
    optimizer.zero_grad()
    {clip}
    criterion(model(x), y).backward()
    optimizer.step()
"""
    assert summary(source) == [(6, 5, BEFORE_BACKWARD, [(7, COMPUTED_HERE)])]


# Clipping scaled gradients

AMP = """\
import torch

scaler = torch.amp.GradScaler()
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""


def test_clip_of_scaled_gradients_reports_message_backward_and_fix() -> None:
    [finding] = gl007(AMP)
    assert (finding.line, finding.column, finding.message) == (8, 5, SCALED)
    assert [(r.line, r.note) for r in finding.related] == [(7, SCALED_HERE)]
    assert finding.fix is not None
    assert finding.fix.description == "call `scaler.unscale_(optimizer)` before clipping"


def test_a_backward_on_an_unnamed_loss_is_not_scaled() -> None:
    source = """\
    import torch

    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    """
    assert gl007(source) == []


def test_a_loop_clipping_before_the_step_walks_round_to_the_scaled_backward() -> None:
    source = """\
    import torch

    scaler = torch.amp.GradScaler()
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in loader:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scaler.scale(criterion(model(x), y)).backward()
    """
    assert summary(source) == [(6, 5, SCALED, [(10, SCALED_HERE)])]


@pytest.mark.parametrize(
    "body",
    [
        # The backward after the step belongs to the next call of the function.
        """\
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
""",
        # The step before the backward belongs to the previous call of the function.
        """\
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""",
    ],
    ids=["clip-first", "step-first"],
)
def test_a_function_does_not_wrap_round_to_its_own_end(body: str) -> None:
    source = f"""\
import torch

scaler = torch.amp.GradScaler()


def train_step(model, optimizer, loss):
{body}"""
    assert gl007(source) == []


def test_a_scaler_step_in_a_helper_gets_no_fix() -> None:
    source = """\
    import torch

    scaler = torch.amp.GradScaler()
    optimizer = torch.optim.AdamW(model.parameters())


    def apply_update():
        scaler.step(optimizer)
        scaler.update()


    for x, y in loader:
        optimizer.zero_grad()
        scaler.scale(criterion(model(x), y)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        apply_update()
    """
    [finding] = gl007(source)
    assert (finding.line, finding.message, finding.fix) == (15, SCALED, None)


def test_the_walk_back_passes_other_events_to_reach_the_scaled_backward() -> None:
    source = AMP.replace("    torch.nn.utils", "    model.encoder.zero_grad()\n    torch.nn.utils")
    assert summary(source) == [(9, 5, SCALED, [(7, SCALED_HERE)])]
