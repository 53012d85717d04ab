"""Tests that kill surviving mutants of the GL005 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from gradlint import Diagnostic, lint_source

Summary = tuple[int, int, str, list[tuple[int, str]]]


def torch_code(source: str) -> bytes:
    """`source` dedented, as a module torch reaches: the import goes last, so that its lines stay as written."""
    return (textwrap.dedent(source) + "\nimport torch\n").encode()


def gl005(source: str) -> list[Diagnostic]:
    """The GL005 findings for `source` (dedented); fails on a crashed rule (GL999)."""
    found = lint_source(torch_code(source), "x.py")
    assert not [d for d in found if d.code == "GL999"], found
    return [d for d in found if d.code == "GL005"]


def summary(source: str) -> list[Summary]:
    """(line, column, message, [(related line, note)]) of each GL005 finding."""
    return [(d.line, d.column, d.message, [(r.line, r.note) for r in d.related]) for d in gl005(source)]


def fixes(source: str) -> list[tuple[int, tuple[str, bool] | None]]:
    """(line, (fix description, safe) or None) of each GL005 finding."""
    return [(d.line, (d.fix.description, d.fix.safe) if d.fix else None) for d in gl005(source)]


def unused(loss: str) -> str:
    """The message for a retained graph that nothing backpropagates again."""
    return f"retain_graph=True keeps `{loss}`'s graph alive but nothing backpropagates through it again"


BUILT = "the retained graph is built here"
NOTHING_IN_LOOP = "nothing in this loop backpropagates through it again"
REMOVE = "remove `retain_graph=True`"


# What the finding says


def test_create_graph_backward_keeps_its_graph_for_the_higher_order_pass() -> None:
    source = """\
    def train_with_hessian_penalty(model, criterion, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward(retain_graph=True, create_graph=True)
            optimizer.step()
    """
    assert gl005(source) == []


def test_two_backwards_side_by_side_name_both_calls_and_the_next_backward() -> None:
    source = """\
    def train_step(model, optimizer, x, y):
        optimizer.zero_grad()
        out = model(x)
        recon_loss = (out - y).abs().mean()
        sparsity = out.pow(2).mean()
        recon_loss.backward(retain_graph=True)
        sparsity.backward()
        optimizer.step()
    """
    assert summary(source) == [
        (
            6,
            5,
            "`recon_loss.backward(retain_graph=True)` and `sparsity.backward()` run through one graph with "
            "nothing between them; backpropagating the sum of the losses once needs no retained graph",
            [(4, BUILT), (7, "the next backward, right after it")],
        ),
    ]


def test_a_summed_loss_points_at_the_last_statement_it_is_built_from() -> None:
    source = """\
    def train(model, criterion, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            task_loss = criterion(model(x), y)
            penalty = model.weight.pow(2).sum()
            (task_loss + 0.01 * penalty).backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [
        (6, 9, unused("(task_loss + 0.01 * penalty)"), [(5, BUILT), (2, NOTHING_IN_LOOP)]),
    ]


def test_a_loss_passed_by_keyword_is_read_like_a_positional_one() -> None:
    source = """\
    import torch


    def train(model, criterion, optimizer, loader: torch.utils.data.DataLoader):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            torch.autograd.backward(tensors=loss, retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(8, 9, unused("loss"), [(7, BUILT), (5, NOTHING_IN_LOOP)])]
    assert fixes(source) == [(8, (REMOVE, True))]


def test_a_loss_that_cannot_be_read_is_named_the_loss_and_its_fix_needs_review() -> None:
    source = """\
    def train(model, accelerator, optimizer, loader):
        for batch in loader:
            optimizer.zero_grad()
            outputs = {"loss": model(**batch).loss}
            accelerator.backward(**outputs, retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("the loss"), [(2, NOTHING_IN_LOOP)])]
    assert fixes(source) == [(5, (REMOVE, False))]


def test_a_step_function_without_a_loop_gets_the_fix() -> None:
    source = """\
    class Trainer:
        def training_step(self, batch):
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(batch["image"]), batch["label"])
            loss.backward(retain_graph=True)
            self.optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT)])]
    assert fixes(source) == [(5, (REMOVE, False))]


def test_a_while_loop_step_is_reported() -> None:
    source = """\
    def train(model, criterion, optimizer, loader, max_steps):
        batches = iter(loader)
        step = 0
        while step < max_steps:
            x, y = next(batches)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward(retain_graph=True)
            optimizer.step()
            step += 1
    """
    assert summary(source) == [(8, 9, unused("loss"), [(7, BUILT), (4, NOTHING_IN_LOOP)])]


# Which fix is offered


RESUMABLE_RNN_TRAINER = """\
def train_{task}(model, criterion, optimizer, loader, batch_size, resumed=None):
    if resumed is not None:
        hidden = resumed
    else:
        hidden = model.init_hidden(batch_size)
    for x, y in loader:
        optimizer.zero_grad()
        logits, hidden = model(x, hidden)
        loss = criterion(logits, y)
        loss.backward(retain_graph=True)
        optimizer.step()
"""
RNN_TASKS = ("chars", "words", "tags", "phonemes", "notes", "prices", "events", "keystrokes")


def test_an_rnn_hidden_state_carried_round_the_loop_gets_no_fix() -> None:
    # The cure is `hidden = hidden.detach()`: without the flag the next iteration raises.
    # `hidden` reaches the backward from three assignments, met in no fixed order; the one
    # inside the loop must be found whichever comes first, in each of the eight trainers.
    source = "\n\n".join(RESUMABLE_RNN_TRAINER.format(task=task) for task in RNN_TASKS)
    assert fixes(source) == [(10 + 13 * index, None) for index in range(len(RNN_TASKS))]


def test_a_hidden_state_kept_on_self_gets_no_fix() -> None:
    source = """\
    class LanguageModelTrainer:
        def train_epoch(self, loader):
            self.hidden = self.model.init_hidden(32)
            for inputs, targets in loader:
                self.optimizer.zero_grad()
                output, self.hidden = self.rnn(inputs, self.hidden)
                loss = self.criterion(output, targets)
                loss.backward(retain_graph=True)
                self.optimizer.step()
    """
    assert fixes(source) == [(8, None)]


def test_a_loss_built_from_self_attributes_gets_a_safe_fix() -> None:
    source = """\
    from torch.utils.data import DataLoader


    class Trainer:
        def fit(self, loader: DataLoader):
            for x, y in loader:
                self.optimizer.zero_grad()
                loss = self.criterion(self.model(x), y)
                loss.backward(retain_graph=True)
                self.optimizer.step()
    """
    assert fixes(source) == [(9, (REMOVE, True))]
    # Batches of an iterable of unknown kind may carry a graph the caller built, whatever it is called.
    assert fixes(source.replace("loader: DataLoader", "loader")) == [(9, (REMOVE, False))]


def test_a_classmethod_loss_built_from_cls_attributes_gets_a_safe_fix() -> None:
    source = """\
    from torch.utils.data import DataLoader


    class SharedTrainer:
        @classmethod
        def fit(cls, loader: DataLoader):
            for x, y in loader:
                cls.optimizer.zero_grad()
                loss = cls.criterion(cls.model(x), y)
                loss.backward(retain_graph=True)
                cls.optimizer.step()
    """
    assert fixes(source) == [(10, (REMOVE, True))]


def test_a_helper_that_backpropagates_gets_no_fix() -> None:
    # Other callers of the helper may backpropagate the graph again.
    source = """\
    def backpropagate(loss):
        loss.backward(retain_graph=True)


    def train(model, criterion, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            backpropagate(criterion(model(x), y))
            optimizer.step()
    """
    assert summary(source) == [(2, 5, unused("loss"), [(6, NOTHING_IN_LOOP)])]
    assert fixes(source) == [(2, None)]


def test_a_repeated_retain_graph_keyword_gets_no_fix() -> None:
    # Python rejects the repeated keyword; gradlint still reports it, but cannot know which one to drop.
    source = """\
    def train(model, criterion, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward(retain_graph=True, retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]
    assert fixes(source) == [(5, None)]


class Deadline(Exception):
    """Raised when a lint takes longer than the test allows."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise Deadline (inside whatever is running) after `seconds` of wall-clock time."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise Deadline(f"still linting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="the deadline needs SIGALRM")
def test_a_long_chain_of_residual_blocks_is_walked_once_per_statement() -> None:
    # Each `h = h + model.blocks[i](h)` reads `h` twice: walking every path instead of every
    # statement once doubles the work per block (2**24 paths here).
    blocks = "".join(f"        h = h + model.blocks[{i}](h)\n" for i in range(24))
    source = (
        "def train(model, criterion, optimizer, loader):\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        h = model.stem(x)\n"
        f"{blocks}"
        "        loss = criterion(model.head(h), y)\n"
        "        loss.backward(retain_graph=True)\n"
        "        optimizer.step()\n"
    )
    with deadline(60):
        found = fixes(source)
    assert found == [(30, (REMOVE, False))]  # the loader's batches are of unknown kind


# Two backward calls: summable or not


def test_a_second_backward_in_a_helper_is_not_summable() -> None:
    source = """\
    class MultiTaskTrainer:
        def backprop(self, loss):
            loss.backward()

        def step(self, x, y):
            self.optimizer.zero_grad()
            features = self.trunk(x)
            cls_loss = self.cls_criterion(self.cls_head(features), y)
            reg_loss = self.reg_head(features).pow(2).mean()
            cls_loss.backward(retain_graph=True)
            self.backprop(reg_loss)
            self.optimizer.step()
    """
    assert gl005(source) == []


def test_an_optimizer_step_right_after_the_first_backward_is_not_summable() -> None:
    source = """\
    def actor_critic_update(actor_opt, critic_opt, policy_net, value_net, states, returns):
        actor_opt.zero_grad()
        critic_opt.zero_grad()
        features = policy_net(states)
        actor_loss = -value_net(features).mean()
        critic_loss = (value_net(features) - returns).pow(2).mean()
        actor_loss.backward(retain_graph=True)
        actor_opt.step()
        critic_loss.backward()
        critic_opt.step()
    """
    assert gl005(source) == []


def test_gradients_read_between_the_backwards_are_not_summable() -> None:
    source = """\
    def per_task_gradients(model, optimizer, x, y_a, y_b):
        optimizer.zero_grad()
        shared = model.encoder(x)
        loss_a = model.head_a(shared).sub(y_a).pow(2).mean()
        loss_b = model.head_b(shared).sub(y_b).pow(2).mean()
        loss_a.backward(retain_graph=True)
        grads_a = [p.grad.clone() for p in model.encoder.parameters()]
        loss_b.backward()
        optimizer.step()
        return grads_a
    """
    assert gl005(source) == []


# Loops over items that may share a graph, and loops over fresh data


def test_steps_counted_down_from_range_are_fresh() -> None:
    source = """\
    def unrolled(model, criterion, optimizer, x_seq, y_seq, steps):
        for t in reversed(range(steps)):
            optimizer.zero_grad()
            loss = criterion(model(x_seq[t]), y_seq[t])
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]


def test_steps_from_a_tqdm_module_range_are_fresh() -> None:
    source = """\
    import tqdm


    def curriculum(model, criterion, optimizer, x_all, y_all, n):
        for step in tqdm.tqdm(range(n)):
            optimizer.zero_grad()
            loss = criterion(model(x_all[step]), y_all[step])
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(8, 9, unused("loss"), [(7, BUILT), (5, NOTHING_IN_LOOP)])]


def test_enumerated_traces_from_a_method_may_share_a_graph() -> None:
    source = """\
    class TraceObjective:
        def loss_and_grads(self, model, guide):
            for i, (model_trace, guide_trace) in enumerate(self._traces(model, guide)):
                particle = model_trace.log_prob_sum() - guide_trace.log_prob_sum()
                particle.backward(retain_graph=True)
    """
    assert gl005(source) == []


def test_traces_from_a_function_called_without_arguments_may_share_a_graph() -> None:
    source = """\
    def elbo_gradients():
        for model_trace, guide_trace in sample_traces():
            particle = model_trace.log_prob_sum() - guide_trace.log_prob_sum()
            particle.backward(retain_graph=True)
    """
    assert gl005(source) == []


def test_pairs_handed_in_are_fresh_data() -> None:
    source = """\
    def fit_pairs(model, optimizer, pairs):
        for src, tgt in pairs:
            optimizer.zero_grad()
            loss = (model(src) - tgt).pow(2).mean()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]


def test_zipped_lists_handed_in_are_fresh_data() -> None:
    source = """\
    def fit_translation(model, optimizer, sources, references):
        for i, (src, tgt) in enumerate(zip(sources, references)):
            optimizer.zero_grad()
            loss = (model(src) - tgt).pow(2).mean()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]


def test_batches_a_call_makes_are_fresh_when_named_as_data() -> None:
    source = """\
    def fit_generated(model, criterion, optimizer, make_batches):
        for inputs, targets in make_batches():
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]


@pytest.mark.parametrize(
    ("target", "iterable", "head"),
    [
        ("name, head", "heads.items()", "head"),
        ("head", "heads.values()", "head"),
        ("name", "heads.keys()", "heads[name]"),
    ],
)
def test_modules_from_a_dict_are_not_items_that_share_a_graph(target: str, iterable: str, head: str) -> None:
    source = f"""\
    def fit_heads(model, optimizer, heads, x, y):
        for {target} in {iterable}:
            optimizer.zero_grad()
            loss = ({head}(model(x)) - y).pow(2).mean()
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("loss"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]


def test_a_loss_that_cannot_be_read_in_enumerated_batches_is_reported() -> None:
    source = """\
    import torch


    class Trainer:
        def fit(self, raw):
            for step, (images, labels) in enumerate(self.augmented_batches(raw)):
                self.optimizer.zero_grad()
                loss = self.criterion(self.model(images), labels)
                self.accelerator.backward(**{"loss": loss}, retain_graph=True)
                self.optimizer.step()
    """
    assert summary(source) == [(9, 13, unused("the loss"), [(6, NOTHING_IN_LOOP)])]


# Graphs built before the loop, and graphs built in it


def test_an_annotated_loss_is_built_in_the_loop() -> None:
    source = """\
    import torch


    def train(model, criterion, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            loss: torch.Tensor = criterion(model(x), y)
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(8, 9, unused("loss"), [(7, BUILT), (5, NOTHING_IN_LOOP)])]


def test_jacobian_rows_that_rebind_the_loop_item_keep_their_graph() -> None:
    source = """\
    def jacobian_rows(model, x):
        outputs = model(x)
        rows = []
        for out in outputs:
            out = out.sum()
            out.backward(retain_graph=True)
            rows.append(x.grad.clone())
            x.grad.zero_()
        return rows
    """
    assert gl005(source) == []


def test_losses_unpacked_in_the_loop_are_fresh() -> None:
    source = """\
    def train(model, optimizer, loader):
        for x, y in loader:
            optimizer.zero_grad()
            main_loss, aux_loss = model.losses(x, y)
            (main_loss + aux_loss).backward(retain_graph=True)
            optimizer.step()
    """
    assert summary(source) == [(5, 9, unused("(main_loss + aux_loss)"), [(4, BUILT), (2, NOTHING_IN_LOOP)])]
