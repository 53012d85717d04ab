"""Tests that kill surviving mutants of the GL001 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Diagnostic, lint_source

GOT_GRAPH = "`{}` gets its autograd graph here"
EACH_ITERATION = "each iteration of this loop adds another graph"
EACH_CALL = "each call of this method adds another graph"
BACKWARD_NOTE = "backward frees the step's buffers, but the graph stays referenced"


def gl001(source: str) -> list[Diagnostic]:
    """The GL001 findings for `source` (dedented); fails on a crashed rule (GL999)."""
    found = lint_source(textwrap.dedent(source).encode(), "x.py")
    assert not [d for d in found if d.code == "GL999"], found
    return [d for d in found if d.code == "GL001"]


def only(source: str) -> Diagnostic:
    """The one GL001 finding for `source`; fails when there is none or several."""
    found = gl001(source)
    assert len(found) == 1, [(d.line, d.message) for d in found]
    return found[0]


def kept(key: str, value: str, *, holds: bool = False) -> str:
    """The GL001 message for `key` keeping `value` (a container holding a tensor when `holds`)."""
    what = "which holds a" if holds else "a"
    return (
        f"`{key}` keeps `{value}`, {what} tensor with autograd history, across iterations: "
        "every step's graph stays alive"
    )


def summary(source: str) -> list[tuple[int, int, str]]:
    """(line, column, message) of each GL001 finding."""
    return [(d.line, d.column, d.message) for d in gl001(source)]


def notes(finding: Diagnostic) -> list[tuple[int, str]]:
    """(line, note) of each related location of a finding."""
    return [(r.line, r.note) for r in finding.related]


def fixed_with(finding: Diagnostic) -> tuple[str, list[str]] | None:
    """The fix's description and the text of its edits, or None without a fix."""
    if finding.fix is None:
        return None
    return finding.fix.description, [edit.text for edit in finding.fix.edits]


DETACH = "use `.detach()` to drop the graph"
ITEM = "use `.item()` to drop the graph"


# Same-module methods that keep their argument on `self` (`meter.update(loss)`)

METER = """\
import torch.nn.functional as F


class LossMeter:
    def __init__(self):
        self.sum = 0.0

    def update(self, value):
        self.sum += value

    def show(self, value):
        print(f"loss {value:.4f}")


meter = LossMeter()
for x, y in loader:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    meter.update(loss)
    meter.show(loss)
"""


def test_a_meter_method_summing_its_only_argument_onto_self_is_reported() -> None:
    # The argument binds to the parameter right after `self`, and that parameter is kept.
    found = only(METER)
    assert (found.line, found.column, found.message) == (21, 5, kept("meter", "loss"))
    assert notes(found) == [(18, GOT_GRAPH.format("loss")), (16, EACH_ITERATION), (19, BACKWARD_NOTE)]


def test_a_method_that_only_prints_its_argument_keeps_nothing() -> None:
    # `meter.show(loss)` (line 22) passes the loss to a method that stores nothing on self.
    assert [d.line for d in gl001(METER)] == [21]


HISTORY = """\
import torch.nn.functional as F


class History:
    def __init__(self, writer):
        self.values = []
        self.writer = writer
        self.sum = 0.0
        self.count = 0

    def record(self, value):
        self.values.append(value)

    def publish(self, value, step):
        self.writer.add_scalar("train/loss", value, step)

    def update(self, value, n=1):
        if n <= 0:
            raise ValueError("n must be positive")
        self.sum += value * n
        self.count += n


history = History(writer)
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    history.{call}
"""


def test_a_method_appending_its_argument_to_a_list_on_self_is_reported() -> None:
    found = only(HISTORY.format(call="record(loss)"))
    assert (found.line, found.column, found.message) == (30, 5, kept("history", "loss"))
    assert fixed_with(found) == (DETACH, [".detach()"])


def test_a_method_passing_its_argument_to_a_writer_on_self_keeps_nothing() -> None:
    # A call on an attribute of self that is not append/extend/insert keeps nothing.
    assert gl001(HISTORY.format(call="publish(loss, step)")) == []


def test_a_method_that_validates_before_summing_onto_self_is_reported() -> None:
    # The `raise` statement before `self.sum += value * n` is skipped, not misread.
    found = only(HISTORY.format(call="update(loss, x.size(0))"))
    assert (found.line, found.column, found.message) == (30, 5, kept("history", "loss"))


# Which regions keep graphs: loops that backpropagate, training-step methods


def test_features_a_forward_stores_on_self_are_not_reported() -> None:
    # forward is no training step (no backward, not a Lightning training_step): the
    # features it keeps are read and cleared by the step, so only the loop is checked.
    source = """\
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 8)
            self.head = nn.Linear(8, 2)
            self.features = []

        def forward(self, x):
            h = self.body(x)
            self.features.append(h)
            return self.head(h)

        def feature_penalty(self):
            penalty = sum(f.pow(2).mean() for f in self.features)
            self.features.clear()
            return penalty


    net = Net()
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y) + 0.01 * net.feature_penalty()
        loss.backward()
        optimizer.step()
    """
    assert gl001(source) == []


def test_a_local_total_of_a_step_function_without_a_loop_is_not_reported() -> None:
    # Outside a loop only an attribute of self outlives the call; `total` is a local.
    source = """\
    import torch.nn.functional as F


    def train_step(model, batch, optimizer):
        optimizer.zero_grad()
        recon = model(batch)
        loss = F.mse_loss(recon, batch)
        loss.backward()
        optimizer.step()
        total, seen = 0.0, 0
        total += loss
        return total
    """
    assert gl001(source) == []


def test_a_meter_made_in_the_step_function_is_fresh_on_every_call() -> None:
    # `meter.values` is not rebound itself, but `meter` is made anew on every call.
    source = """\
    import torch.nn.functional as F


    class Meter:
        def __init__(self):
            self.values = []


    def train_step(model, optimizer, x, y):
        meter = Meter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        meter.values.append(loss)
        print(len(meter.values))
    """
    assert gl001(source) == []


def test_a_step_method_keeping_the_loss_on_self_tells_each_call_adds_a_graph() -> None:
    source = """\
    import torch.nn.functional as F


    class Trainer:
        def step(self, x, y):
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss)
    """
    found = only(source)
    assert (found.line, found.column, found.message) == (10, 9, kept("self.losses", "loss"))
    assert notes(found) == [(7, GOT_GRAPH.format("loss")), (5, EACH_CALL), (8, BACKWARD_NOTE)]


def test_a_lightning_training_step_keeping_the_loss_has_no_backward_note() -> None:
    # Lightning calls backward itself: the story ends at the method, without a backward.
    source = """\
    import lightning as L
    import torch.nn.functional as F


    class Classifier(L.LightningModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.train_losses.append(loss)
            return loss
    """
    found = only(source)
    assert (found.line, found.column, found.message) == (9, 9, kept("self.train_losses", "loss"))
    assert notes(found) == [(8, GOT_GRAPH.format("loss")), (6, EACH_CALL)]


def test_an_accumulator_started_afresh_every_iteration_is_not_reported() -> None:
    source = """\
    import torch.nn.functional as F

    for x, y in loader:
        optimizer.zero_grad()
        out, aux = model(x)
        main = F.cross_entropy(out, y)
        side = F.cross_entropy(aux, y)
        (main + 0.3 * side).backward()
        optimizer.step()
        step_log = 0.0
        step_log += main
        step_log += side
        print(f"step loss {step_log:.3f}")
    """
    assert gl001(source) == []


def test_a_gradient_penalty_summed_in_an_autograd_grad_loop_is_not_reported() -> None:
    # The inner loop computes gradients with torch.autograd.grad but calls no backward:
    # its sum is part of the critic loss, backpropagated once per batch by the outer loop.
    source = """\
    import torch

    for real, _ in loader:
        d_opt.zero_grad()
        fake = generator(torch.randn(real.size(0), 64)).detach()
        penalty = 0.0
        for alpha in torch.rand(4):
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            score = critic(mixed)
            (grad,) = torch.autograd.grad(score.sum(), mixed, create_graph=True)
            penalty += ((grad.norm(2, dim=1) - 1) ** 2).mean()
        d_loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty / 4
        d_loss.backward()
        d_opt.step()
    """
    assert gl001(source) == []


# What counts as adding to the accumulator (`running = loss + running`, torch.cat, ...)

LOOP = """\
import torch
import torch.nn.functional as F

{name} = torch.empty(0)
for x, y in loader:
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    {statement}
"""


def test_a_loss_added_on_the_left_of_the_running_sum_is_reported() -> None:
    source = LOOP.format(name="running", statement="running = loss + running")
    found = only(source)
    assert (found.line, found.column, found.message) == (11, 5, kept("running", "loss"))
    assert fixed_with(found) == (DETACH, [".detach()"])


@pytest.mark.parametrize("join", ["torch.cat", "torch.stack", "torch.concat"])
def test_outputs_joined_onto_the_accumulator_name_the_list_that_holds_the_tensor(join: str) -> None:
    source = LOOP.format(name="preds", statement=f"preds = {join}((preds, logits))")
    found = only(source)
    assert (found.line, found.column, found.message) == (11, 5, kept("preds", "[logits]", holds=True))
    assert notes(found) == [
        (7, GOT_GRAPH.format("[logits]")),
        (5, EACH_ITERATION),
        (9, BACKWARD_NOTE),
    ]
    assert found.fix is None  # the checked list is synthesized, not in the source


def test_a_window_that_detaches_its_old_part_is_not_reported() -> None:
    # Truncated backpropagation: only this step's output carries a graph into the next one.
    source = LOOP.format(name="context", statement="context = torch.cat([context[1:].detach(), logits])")
    assert gl001(source) == []


# The fix: `.item()` only for a local number that nothing but logging reads

FIT = """\
import torch.nn.functional as F


def fit(model, loader, optimizer):
    total = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss
    {after}
"""


def test_a_local_total_that_is_only_printed_gets_item() -> None:
    found = only(FIT.format(after='print(f"epoch loss {total:.3f}")'))
    assert (found.line, found.message, fixed_with(found)) == (11, kept("total", "loss"), (ITEM, [".item()"]))


def test_an_attribute_total_that_is_only_printed_still_gets_detach() -> None:
    # Another method may read `self.total` as a tensor.
    source = """\
    import torch.nn.functional as F


    class Trainer:
        def fit(self, loader):
            self.total = 0.0
            for x, y in loader:
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.total += loss
            print(self.total)
    """
    found = only(source)
    assert (found.line, found.message, fixed_with(found)) == (12, kept("self.total", "loss"), (DETACH, [".detach()"]))


def test_a_tuple_reset_of_the_total_keeps_the_detach_fix() -> None:
    # `total, seen = 0.0, 0` reads `total` (as a target) and is neither a plain number
    # start, nor an accumulation, nor a logging call.
    source = """\
    import torch.nn.functional as F


    def fit(model, loader, optimizer, epochs):
        total = 0.0
        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss
            print(epoch, total)
            total, seen = 0.0, 0
    """
    found = only(source)
    assert (found.line, found.message, fixed_with(found)) == (12, kept("total", "loss"), (DETACH, [".detach()"]))


def test_a_decay_that_reads_the_accumulator_keeps_the_detach_fix() -> None:
    # `ema -= 0.1 * ema` adds a value that reads `ema` itself: not a plain accumulation.
    source = """\
    import torch.nn.functional as F


    def fit(model, loader, optimizer):
        ema = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            ema -= 0.1 * ema
            ema += 0.1 * loss
        print(ema)
    """
    assert [(d.line, d.message, fixed_with(d)) for d in gl001(source)] == [
        (11, kept("ema", "0.1 * ema"), None),
        (12, kept("ema", "0.1 * loss"), (DETACH, ["(0.1 * loss).detach()"])),
    ]


def test_yielding_the_epoch_total_is_not_logging() -> None:
    source = """\
    import torch.nn.functional as F


    def epochs(model, loader, optimizer, count):
        for epoch in range(count):
            total = 0.0
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss
            yield total
    """
    found = only(source)
    assert (found.line, found.message, fixed_with(found)) == (12, kept("total", "loss"), (DETACH, [".detach()"]))


def test_a_tensor_method_named_like_a_logging_call_on_the_total_is_not_logging() -> None:
    # `total.log()` is the tensor's natural logarithm, which a float does not have.
    found = only(FIT.format(after="total.log()"))
    assert (found.line, found.message, fixed_with(found)) == (11, kept("total", "loss"), (DETACH, [".detach()"]))
