"""GL014's per-epoch rebuilds (which optimizers keep state) and GL016's models loaded in eval mode."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source


def lines(source: str, code: str) -> list[int]:
    found = lint_source(textwrap.dedent(source), "train.py", Config(select=(code,)))
    return [diagnostic.line for diagnostic in found]


EPOCH_LOOP = """
import torch

def fit(model, loader, epochs, momentum):
    for epoch in range(epochs):
        optimizer = {construction}
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
"""


@pytest.mark.parametrize(
    ("construction", "reported"),
    [
        ("torch.optim.Adam(model.parameters())", True),
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", True),
        ("torch.optim.SGD(model.parameters(), 0.1, 0.9)", True),  # momentum given by position
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)", True),
        ("torch.optim.SGD(model.parameters(), lr=0.1)", False),  # plain SGD keeps no state
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0)", False),
    ],
)
def test_a_stateful_optimizer_rebuilt_every_epoch_is_reported(construction: str, reported: bool) -> None:
    assert lines(EPOCH_LOOP.format(construction=construction), "GL014") == ([6] if reported else [])


def test_a_loop_over_something_else_than_epochs_is_not_an_epoch_loop() -> None:
    source = EPOCH_LOOP.replace("for epoch in range(epochs)", "for lr in (1e-3, 1e-4)")
    assert lines(source.format(construction="torch.optim.Adam(model.parameters(), lr=lr)"), "GL014") == []


PRETRAINED = """
import torch
from {library} import AutoModel

def fit(loader):
    model = AutoModel.from_pretrained("name")
    optimizer = torch.optim.AdamW(model.parameters())
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize(("library", "reported"), [("transformers", True), ("diffusers", True), ("mylib", False)])
def test_only_hugging_face_loaders_hand_back_a_model_in_eval_mode(library: str, reported: bool) -> None:
    assert lines(PRETRAINED.format(library=library), "GL016") == ([6] if reported else [])


@pytest.mark.parametrize(
    "switch",
    [
        "model.train()",
        "model.train(True)",
        "model = other_model",  # another model under the name
        "prepare_for_training(model)",  # a helper that may switch it
    ],
)
def test_anything_that_may_switch_the_model_keeps_it_quiet(switch: str) -> None:
    source = PRETRAINED.format(library="transformers").replace(
        "    optimizer = torch", f"    {switch}\n    optimizer = torch"
    )
    assert lines(source, "GL016") == []


def test_a_model_loaded_in_a_loop_is_not_judged() -> None:
    source = PRETRAINED.format(library="transformers").replace(
        '    model = AutoModel.from_pretrained("name")',
        "    for name in names:\n        model = AutoModel.from_pretrained(name)",
    )
    assert lines(source, "GL016") == []
