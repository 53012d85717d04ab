"""Tests that kill surviving mutants of the GL002 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

from gradlint import Diagnostic, lint_source
from gradlint.rule import Edit, Fix
from gradlint.rules.missing_zero_grad import CLEAR_BEFORE_STEP, CLEAR_EVERY_MICRO_BATCH


def gl002(source: str) -> list[Diagnostic]:
    """The GL002 findings for `source` (dedented); fails on a crashed rule (GL999)."""
    found = lint_source(textwrap.dedent(source).encode(), "x.py")
    assert not [d for d in found if d.code == "GL999"], found
    return [d for d in found if d.code == "GL002"]


def summary(source: str) -> list[tuple[int, int, str, list[tuple[int, int, str]]]]:
    """(line, column, message, [(related line, column, note)]) of each GL002 finding."""
    return [(d.line, d.column, d.message, [(r.line, r.column, r.note) for r in d.related]) for d in gl002(source)]


def lines(source: str) -> list[int]:
    """The lines of the GL002 findings."""
    return [d.line for d in gl002(source)]


def never_cleared(*optimizers: str) -> str:
    """The message of a step whose optimizers are named."""
    names = " and ".join(f"`{name}`" for name in optimizers)
    return f"the gradients that {names} steps with are never cleared, so each step adds onto the last"


NOTHING_CLEARS_LOOP = "nothing in this loop clears the gradients"
NOTHING_CLEARS_FUNCTION = "nothing in this function clears the gradients"
STEPS_WITH_ALL = "steps with the gradients of every backward so far"
COMPUTED_HERE = "the gradients are computed here"
STEPS_HERE = "the optimizer steps here"
EACH_MICRO_BATCH = "each micro-batch"
FIX_DESCRIPTION = "clear the gradients before backward()"


# A clear between backward() and step(), and a clear on every micro-batch


def test_clear_between_backward_and_step_names_the_first_backward_and_the_step() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        recon = model(x)
        loss = torch.nn.functional.mse_loss(recon, y)
        loss.backward()
        sparsity = recon.abs().mean()
        sparsity.backward()
        optimizer.zero_grad()
        optimizer.step()
    """
    message = CLEAR_BEFORE_STEP.format(clear="optimizer.zero_grad()")
    assert message == "`optimizer.zero_grad()` runs between backward() and step(), so the step applies nothing"
    assert summary(source) == [(11, 5, message, [(8, 5, COMPUTED_HERE), (12, 5, STEPS_HERE)])]


ACCUMULATION = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
"""


def test_clear_on_every_micro_batch_names_the_loop_and_the_step() -> None:
    message = CLEAR_EVERY_MICRO_BATCH.format(clear="optimizer.zero_grad()")
    assert message == (
        "`optimizer.zero_grad()` runs on every micro-batch but the optimizer steps only every few, "
        "so the accumulated gradient is thrown away"
    )
    assert summary(ACCUMULATION) == [(6, 5, message, [(5, 1, EACH_MICRO_BATCH), (10, 9, STEPS_HERE)])]


def test_accumulation_loop_inside_an_if_still_discards_the_micro_batches() -> None:
    # The loop's own `if` is not one of the branches that make the clear or the backward conditional.
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.train:
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
    """
    message = CLEAR_EVERY_MICRO_BATCH.format(clear="optimizer.zero_grad()")
    assert summary(source) == [(7, 9, message, [(6, 5, EACH_MICRO_BATCH), (11, 13, STEPS_HERE)])]


ACCUMULATING_METHOD = """\
import torch


class Trainer:
    def train_step(self, batch, index):
        self.optimizer.zero_grad()
        loss = self.model(batch).mean() / self.accumulation
        loss.backward()
        if (index + 1) % self.accumulation == 0:
            self.optimizer.step()
"""


def test_accumulating_step_function_discards_the_micro_batches() -> None:
    message = CLEAR_EVERY_MICRO_BATCH.format(clear="self.optimizer.zero_grad()")
    assert summary(ACCUMULATING_METHOD) == [(6, 9, message, [(5, 5, EACH_MICRO_BATCH), (10, 13, STEPS_HERE)])]


def test_accumulating_step_function_defined_under_an_if_discards_the_micro_batches() -> None:
    # The `if` around the `def` is not a branch inside the function.
    source = """\
    import torch

    if ACCUMULATE:

        def train_step(model, optimizer, batch, index):
            optimizer.zero_grad()
            loss = model(batch).mean() / 8
            loss.backward()
            if (index + 1) % 8 == 0:
                optimizer.step()
    """
    message = CLEAR_EVERY_MICRO_BATCH.format(clear="optimizer.zero_grad()")
    assert summary(source) == [(6, 9, message, [(5, 5, EACH_MICRO_BATCH), (10, 13, STEPS_HERE)])]


def test_clear_every_batch_with_a_step_under_a_plain_if_is_fine() -> None:
    # Only a step under a modulo test is gradient accumulation.
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if torch.isfinite(loss):
            optimizer.step()
    """
    assert gl002(source) == []


# Steps that never clear: the message, the story and the fix


PLAIN_LOOP = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_module_level_loop_without_a_clear_is_reported_with_its_fix() -> None:
    findings = gl002(PLAIN_LOOP)
    assert [(d.line, d.column, d.message) for d in findings] == [(7, 5, never_cleared("optimizer"))]
    finding = findings[0]
    assert [(r.line, r.column, r.note) for r in finding.related] == [
        (5, 1, NOTHING_CLEARS_LOOP),
        (8, 5, STEPS_WITH_ALL),
    ]
    assert finding.fix == Fix(FIX_DESCRIPTION, (Edit(7, 5, 7, 5, "optimizer.zero_grad()\n    "),), safe=False)
    assert finding.fix.safe is False


def test_step_function_without_a_clear_says_function() -> None:
    source = """\
    import torch


    class Regressor:
        def __init__(self):
            self.net = torch.nn.Linear(4, 1)
            self.optimizer = torch.optim.Adam(self.net.parameters())

        def fit_batch(self, x, y):
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            loss.backward()
            self.optimizer.step()
    """
    assert summary(source) == [
        (11, 9, never_cleared("self.optimizer"), [(9, 5, NOTHING_CLEARS_FUNCTION), (12, 9, STEPS_WITH_ALL)]),
    ]


GAN_WITHOUT_CLEARS = """\
import torch

generator = torch.nn.Linear(8, 16)
discriminator = torch.nn.Linear(16, 1)
g_opt = torch.optim.Adam(generator.parameters())
d_opt = torch.optim.Adam(discriminator.parameters())
for real in loader:
    fake = generator(torch.randn(real.size(0), 8))
    d_loss = discriminator(fake.detach()).mean() - discriminator(real).mean()
    d_loss.backward()
    d_opt.step()
    g_loss = -discriminator(fake).mean()
    g_loss.backward()
    g_opt.step()
"""


def test_two_optimizers_that_never_clear_are_both_named_and_get_no_fix() -> None:
    findings = gl002(GAN_WITHOUT_CLEARS)
    assert [(d.line, d.message) for d in findings] == [(10, never_cleared("d_opt", "g_opt"))]
    finding = findings[0]
    assert finding.message == (
        "the gradients that `d_opt` and `g_opt` steps with are never cleared, so each step adds onto the last"
    )
    assert [(r.line, r.note) for r in finding.related] == [
        (7, NOTHING_CLEARS_LOOP),
        (11, STEPS_WITH_ALL),
        (14, STEPS_WITH_ALL),
    ]
    assert finding.fix is None


GAN_CLEARING_ONLY_D = """\
import torch

generator = torch.nn.Linear(8, 16)
discriminator = torch.nn.Linear(16, 1)
g_opt = torch.optim.Adam(generator.parameters())
d_opt = torch.optim.Adam(discriminator.parameters())
for real in loader:
    fake = generator(torch.randn(real.size(0), 8))
    d_opt.zero_grad()
    d_loss = discriminator(fake.detach()).mean() - discriminator(real).mean()
    d_loss.backward()
    d_opt.step()
    g_loss = -discriminator(fake).mean()
    g_loss.backward()
    g_opt.step()
"""


def test_the_one_uncleared_optimizer_of_a_gan_gets_the_fix_at_its_own_backward() -> None:
    findings = gl002(GAN_CLEARING_ONLY_D)
    assert [(d.line, d.column, d.message) for d in findings] == [(14, 5, never_cleared("d_opt", "g_opt"))]
    finding = findings[0]
    assert finding.fix == Fix(FIX_DESCRIPTION, (Edit(14, 5, 14, 5, "g_opt.zero_grad()\n    "),), safe=False)


GAN_CLEARING_ONLY_G = """\
import torch

generator = torch.nn.Linear(8, 16)
discriminator = torch.nn.Linear(16, 1)
g_opt = torch.optim.Adam(generator.parameters())
d_opt = torch.optim.Adam(discriminator.parameters())
for real in loader:
    fake = generator(torch.randn(real.size(0), 8))
    d_loss = discriminator(fake.detach()).mean() - discriminator(real).mean()
    d_loss.backward()
    d_opt.step()
    g_opt.zero_grad()
    g_loss = -discriminator(fake).mean()
    g_loss.backward()
    g_opt.step()
"""


def test_an_uncleared_first_optimizer_is_reported_at_the_backward_before_its_step() -> None:
    # Not at the generator's backward, the last one of the loop.
    findings = gl002(GAN_CLEARING_ONLY_G)
    assert [(d.line, d.column, d.message) for d in findings] == [(10, 5, never_cleared("d_opt", "g_opt"))]
    finding = findings[0]
    assert finding.fix == Fix(FIX_DESCRIPTION, (Edit(10, 5, 10, 5, "d_opt.zero_grad()\n    "),), safe=False)


def test_backward_in_a_helper_gets_no_fix() -> None:
    # The clear would go before the helper call, which may do more than backpropagate.
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def backpropagate(loss):
        loss.backward()


    for x, y in loader:
        backpropagate(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    """
    findings = gl002(source)
    assert [(d.line, d.message) for d in findings] == [(12, never_cleared("optimizer"))]
    finding = findings[0]
    assert finding.fix is None


def test_clearing_the_base_optimizer_of_a_wrapper_counts_for_the_one_stepped_optimizer() -> None:
    # With a single stepped optimizer, any optimizer's clear is taken to cover its parameters.
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    base_optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = Lookahead(base_optimizer, k=5)
    for x, y in loader:
        base_optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    """
    assert gl002(source) == []


def test_an_optimizer_stepped_before_any_backward_does_not_crash_the_rule() -> None:
    # `g_opt` is never cleared, but no backward comes before its step in the loop: nothing
    # is reported for it (a miss), and above all the rule does not fail.
    source = """\
    import torch

    generator = torch.nn.Linear(8, 16)
    discriminator = torch.nn.Linear(16, 1)
    g_opt = torch.optim.Adam(generator.parameters())
    d_opt = torch.optim.Adam(discriminator.parameters())
    for real in loader:
        g_opt.step()
        fake = generator(torch.randn(real.size(0), 8))
        d_opt.zero_grad()
        d_loss = discriminator(fake.detach()).mean() - discriminator(real).mean()
        d_loss.backward()
        d_opt.step()
        g_loss = -discriminator(fake).mean()
        g_loss.backward()
    """
    assert gl002(source) == []


# Steps that set the gradients themselves


def test_assigning_received_gradients_overwrites_them() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        averaged = exchange_with_workers(model)
        for param, grad in zip(model.parameters(), averaged):
            param.grad = grad
        optimizer.step()
    """
    assert gl002(source) == []


def test_copying_into_the_grad_data_overwrites_the_gradients() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        averaged = exchange_with_workers(model)
        for param, grad in zip(model.parameters(), averaged):
            param.grad.data.copy_(grad)
        optimizer.step()
    """
    assert gl002(source) == []


def test_assigning_the_grad_data_overwrites_the_gradients() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        averaged = exchange_with_workers(model)
        for param, grad in zip(model.parameters(), averaged):
            param.grad.data = grad
        optimizer.step()
    """
    assert gl002(source) == []


def test_scaling_the_gradients_in_place_does_not_overwrite_them() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for param in model.parameters():
            param.grad.mul_(1.0 / world_size)
        optimizer.step()
    """
    assert lines(source) == [7]


def test_a_loop_that_skips_bad_batches_is_reported() -> None:
    # `continue` is a statement without a value.
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not torch.isfinite(loss):
            continue
        loss.backward()
        optimizer.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(9, never_cleared("optimizer"))]


# Clears between the backward and the step that are fine, or not


def test_clearing_the_model_between_a_measuring_backward_and_the_real_one_is_fine() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        probe = torch.nn.functional.mse_loss(model(x), y)
        probe.backward()
        norms.append(grad_norm(model))
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y) + 0.1 * norms[-1]
        loss.backward()
        optimizer.step()
    """
    assert gl002(source) == []


def test_clearing_after_a_trailing_backward_is_fine() -> None:
    source = """\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        held_out = torch.nn.functional.mse_loss(model(x_val), y_val)
        held_out.backward()
        alignment.append(grad_vector(model))
        model.zero_grad()
    """
    assert gl002(source) == []


def test_clearing_the_discriminator_before_the_generator_step_is_fine() -> None:
    # The generator's backward also fills the discriminator's gradients; clearing them is
    # not clearing what g_opt is about to apply.
    source = """\
    import torch

    generator = torch.nn.Linear(8, 16)
    discriminator = torch.nn.Linear(16, 1)
    g_opt = torch.optim.Adam(generator.parameters())
    d_opt = torch.optim.Adam(discriminator.parameters())
    for real in loader:
        fake = generator(torch.randn(real.size(0), 8))
        d_opt.zero_grad()
        d_loss = discriminator(fake.detach()).mean() - discriminator(real).mean()
        d_loss.backward()
        d_opt.step()
        g_opt.zero_grad()
        g_loss = -discriminator(fake).mean()
        g_loss.backward()
        discriminator.zero_grad()
        g_opt.step()
    """
    assert gl002(source) == []


# Who owns the optimizer of a step function


def test_a_step_function_handed_its_trainer_leaves_the_clear_to_the_caller() -> None:
    source = """\
    import torch


    def train_step(trainer, batch):
        loss = trainer.model(batch).mean()
        loss.backward()
        trainer.optimizer.step()
    """
    assert gl002(source) == []


def test_a_classmethod_stepping_its_class_optimizer_is_reported() -> None:
    # `cls` is not an argument the caller hands in.
    source = """\
    import torch


    class SharedTrainer:
        @classmethod
        def update(cls, batch):
            loss = cls.model(batch).mean()
            loss.backward()
            cls.optimizer.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("cls.optimizer"))]


def test_an_unnamed_optimizer_is_not_owned_by_any_parameter() -> None:
    # Whatever a parameter is called (even `XXXX`), a step on `optimizers["main"]` is not on it.
    source = """\
    import torch


    def amp_step(XXXX, batch):
        with torch.autocast("cuda"):
            loss = XXXX(batch).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizers["main"])
        scaler.update()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(7, never_cleared('optimizers["main"]'))]


def test_an_amp_loop_stepping_an_optimizer_from_a_dict_is_reported() -> None:
    source = """\
    import torch

    scaler = torch.cuda.amp.GradScaler()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizers["main"])
        scaler.update()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(7, never_cleared('optimizers["main"]'))]


# One step of an optimizer built in the same pass as its parameters: nothing to add onto


def test_a_probe_built_and_stepped_once_beside_a_cleared_encoder_is_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def train_probe_and_encoder(encoder, encoder_opt, images, labels):
        encoder_opt.zero_grad()
        features = encoder(images)
        probe = torch.nn.Linear(128, 10)
        probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        probe_opt.step()
        encoder_opt.step()
    """
    assert gl002(source) == []


def test_a_fresh_optimizer_stepped_twice_without_a_clear_is_reported() -> None:
    # The second step adds the second backward onto the first.
    source = """\
    import torch


    def refine(decoder, target):
        z = torch.zeros(16, requires_grad=True)
        opt = torch.optim.Adam([z], lr=0.01)
        loss = (decoder(z) - target).pow(2).mean()
        loss.backward()
        opt.step()
        loss = (decoder(z) - target).abs().mean()
        loss.backward()
        opt.step()
        return z
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("opt"))]


def test_an_optimizer_taken_from_an_attribute_is_not_fresh() -> None:
    source = """\
    import torch


    class Trainer:
        def train_batch(self, batch):
            optimizer = self.optimizer
            loss = self.model(batch).mean()
            loss.backward()
            optimizer.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("optimizer"))]


def test_an_optimizer_looked_up_by_a_method_is_not_fresh() -> None:
    # `self.optimizers.get(...)` hands back an existing optimizer, whatever its arguments.
    source = """\
    import torch


    class MultiTaskTrainer:
        def train_decoder(self, batch):
            opt = self.optimizers.get("decoder")
            loss = self.decoder(batch).mean()
            loss.backward()
            opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("opt"))]


def test_an_optimizer_class_from_a_registry_dict_is_not_a_known_constructor() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def finetune(model, batch, labels, name):
        opt = OPTIMIZERS[name](model.parameters(), lr=0.01)
        loss = F.cross_entropy(model(batch), labels)
        loss.backward()
        opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("opt"))]


def test_an_optimizer_class_held_in_a_variable_builds_a_fresh_optimizer() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_probe(features, labels, optimizer_cls):
        probe = torch.nn.Linear(128, 10)
        opt = optimizer_cls(probe.parameters(), lr=0.1)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_a_fresh_optimizer_given_its_parameters_by_keyword_is_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_probe(features, labels):
        probe = torch.nn.Linear(128, 10)
        opt = torch.optim.SGD(params=probe.parameters(), lr=0.1)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_only_the_parameters_of_a_fresh_optimizer_matter_not_its_learning_rate() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_probe(features, labels, learning_rate):
        probe = torch.nn.Linear(128, 10)
        opt = torch.optim.SGD(probe.parameters(), learning_rate)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_a_keyword_before_the_params_keyword_is_not_the_parameters() -> None:
    source = """\
    import torch


    def invert(decoder, target, learning_rate):
        latent = torch.zeros(16, requires_grad=True)
        opt = torch.optim.Adam(lr=learning_rate, params=[latent])
        loss = (decoder(latent) - target).pow(2).mean()
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_an_optimizer_over_a_fresh_layer_weight_is_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_probe(features, labels):
        num_classes = 10
        probe = torch.nn.Linear(128, num_classes, bias=False)
        opt = torch.optim.SGD([probe.weight], lr=0.1)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_an_optimizer_over_a_weight_two_attributes_deep_is_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_probe(features, labels):
        probe = LinearProbe(128, 10)
        opt = torch.optim.SGD([probe.fc.weight, probe.fc.bias], lr=0.1)
        loss = F.cross_entropy(probe(features), labels)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_an_embedding_built_with_a_none_argument_is_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def fit_embedding(tokens, targets):
        table = torch.nn.Embedding(1000, 64, padding_idx=None)
        opt = torch.optim.SparseAdam(table.parameters())
        loss = F.mse_loss(table(tokens), targets)
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_a_latent_stored_on_self_in_the_same_call_is_fresh() -> None:
    source = """\
    import torch


    class Inverter:
        def invert(self, target):
            self.latent = torch.zeros(16, requires_grad=True)
            opt = torch.optim.Adam([self.latent], lr=0.05)
            loss = (self.decoder(self.latent) - target).pow(2).mean()
            loss.backward()
            opt.step()
    """
    assert gl002(source) == []


def test_a_detached_copy_of_an_argument_is_fresh() -> None:
    source = """\
    import torch


    def invert(decoder, target, init):
        z = init.detach()
        z.requires_grad_(True)
        opt = torch.optim.Adam([z], lr=0.05)
        loss = (decoder(z) - target).pow(2).mean()
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_an_optimizer_over_part_of_a_model_passed_in_is_not_fresh() -> None:
    # The head's gradients live on in the caller's model between calls.
    source = """\
    import torch
    import torch.nn.functional as F


    def finetune_head(model, images, labels):
        head = model.head
        opt = torch.optim.SGD(head.parameters(), lr=0.01)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(9, never_cleared("opt"))]


def test_a_chained_parameter_list_with_a_passed_in_backbone_is_not_fresh() -> None:
    source = """\
    import itertools

    import torch
    import torch.nn.functional as F


    def fit_head(backbone, images, labels):
        head = torch.nn.Linear(512, 10)
        params = itertools.chain(head.parameters(recurse=True), backbone.parameters())
        opt = torch.optim.SGD(params, lr=0.01)
        loss = F.cross_entropy(head(backbone(images)), labels)
        loss.backward()
        opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(12, never_cleared("opt"))]


def test_a_latent_made_before_the_loop_is_not_fresh_in_each_iteration() -> None:
    source = """\
    import torch


    def fit_latent(decoder, targets):
        latent = torch.zeros(16, requires_grad=True)
        for target in targets:
            opt = torch.optim.Adam([latent], lr=0.1)
            loss = (decoder(latent) - target).pow(2).mean()
            loss.backward()
            opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(9, never_cleared("opt"))]


def test_a_latent_made_four_assignments_back_is_fresh() -> None:
    source = """\
    import torch


    def invert(decoder, target):
        noise = torch.randn(16)
        scaled = noise * 0.1
        shifted = scaled + 1.0
        latent = shifted.requires_grad_()
        opt = torch.optim.Adam([latent], lr=0.05)
        loss = (decoder(latent) - target).pow(2).mean()
        loss.backward()
        opt.step()
    """
    assert gl002(source) == []


def test_the_search_for_where_a_parameter_was_made_stops_after_four_assignments() -> None:
    # One assignment more than the test above: past MAX_DEPTH, the latent counts as not made here.
    source = """\
    import torch


    def invert(decoder, target):
        noise = torch.randn(16)
        centred = noise - noise.mean()
        scaled = centred * 0.1
        shifted = scaled + 1.0
        latent = shifted.requires_grad_()
        opt = torch.optim.Adam([latent], lr=0.05)
        loss = (decoder(latent) - target).pow(2).mean()
        loss.backward()
        opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(12, never_cleared("opt"))]


def test_a_block_five_attributes_deep_into_a_model_passed_in_is_not_fresh() -> None:
    source = """\
    import torch
    import torch.nn.functional as F


    def finetune_last_block(model, batch, target):
        net = model.module
        encoder = net.encoder
        stage = encoder.stages[-1]
        block = stage.blocks[-1]
        layer = block.mlp
        opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
        loss = F.mse_loss(model(batch), target)
        loss.backward()
        opt.step()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(13, never_cleared("opt"))]


def test_a_step_in_a_default_argument_does_not_see_the_enclosing_optimizer_as_fresh() -> None:
    # Odd code, but it is the one way an event's statement sits in another scope than the event.
    source = """\
    import torch

    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def train(loss, _=optimizer.step()):
        loss.backward()
    """
    assert [(d.line, d.message) for d in gl002(source)] == [(8, never_cleared("optimizer"))]


def test_optimizers_handed_in_and_stepped_in_a_helper_loop_are_not_fresh() -> None:
    # The helper's loop variable names optimizers built by the caller's caller: nothing proves them new.
    source = """\
    import torch.nn.functional as F


    def train(model, loader, optimizers):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            step_all(optimizers)


    def step_all(optimizers):
        for optimizer in optimizers:
            optimizer.step()
    """
    assert [(d.line, d.column, d.message) for d in gl002(source)] == [(7, 9, never_cleared("optimizer"))]
