"""Tests that kill surviving mutants of the GL006 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import pytest

from gradlint import lint_source

# A loss whose only path to the model goes through `.item()`; {wrap} re-wraps it and backpropagates.
REWRAPPED = """\
import torch
import torch.nn as nn


def train(model, inputs, targets):
    criterion = nn.CrossEntropyLoss()
    loss = criterion(model(inputs), targets)
{wrap}
"""

# A loss whose only path to the model goes through `argmax`; {between} runs before its backward.
ARGMAX = """\
import torch
import torch.nn as nn


def train(model, inputs, targets, w):
    criterion = nn.MSELoss()
    loss = criterion(model(inputs).argmax(1).float(), targets)
{between}
    loss.backward()
"""

# A loss that keeps its gradient path; {after} follows its backward.
LIVE = """\
import torch
import torch.nn as nn


def train(model, inputs, targets):
    criterion = nn.MSELoss()
    loss = criterion(model(inputs), targets)
    loss.backward()
{after}
"""

NEW_LEAF = (
    "`{leaf}` makes the loss a new leaf that requires grad: "
    "backward() no longer fails, but no parameter gets a gradient"
)
ARGMAX_CUT = (
    "`loss` reaches the model output only through `model(inputs).argmax(1)`, which has no gradient, so nothing learns"
)

Finding = tuple[int, int, str, list[tuple[int, str]]]


def gl006(source: str) -> list[Finding]:
    """(line, column, message, [(related line, note)]) of each GL006 finding in `source`."""
    return [
        (d.line, d.column, d.message, [(place.line, place.note) for place in d.related])
        for d in lint_source(source.encode(), "x.py")
        if d.code == "GL006"
    ]


def shortened(code: str) -> str:
    """`code` as messages name it: at most 40 characters, the last one an ellipsis when cut."""
    return code if len(code) <= 40 else code[:39] + "…"


def test_a_loss_rewrapped_with_requires_grad_and_backpropagated_directly_is_a_new_leaf() -> None:
    source = REWRAPPED.format(wrap="    torch.tensor(loss.item(), requires_grad=True).backward()")
    leaf = "torch.tensor(loss.item(), requires_grad…"
    assert gl006(source) == [(8, 5, NEW_LEAF.format(leaf=leaf), [(8, f"`{leaf}` is backpropagated here")])]


@pytest.mark.parametrize(
    "constructor",
    ["torch.tensor", "torch.Tensor", "torch.FloatTensor", "torch.DoubleTensor", "Variable"],
)
def test_a_loss_rewrapped_with_requires_grad_into_a_name_is_a_new_leaf(constructor: str) -> None:
    wrap = f"    loss = {constructor}(loss.item(), requires_grad=True)\n    loss.backward()"
    leaf = shortened(f"{constructor}(loss.item(), requires_grad=True)")
    assert gl006(REWRAPPED.format(wrap=wrap)) == [
        (8, 12, NEW_LEAF.format(leaf=leaf), [(9, "`loss` is backpropagated here")])
    ]


@pytest.mark.parametrize(
    "keyword",
    ["requires_grad=False", "pin_memory=True"],
    ids=["requires_grad-false", "other-keyword-true"],
)
def test_a_rewrapped_loss_that_does_not_ask_for_grad_is_reported_as_cut_not_as_a_new_leaf(keyword: str) -> None:
    wrap = f"    kept = torch.tensor(loss.item(), {keyword})\n    kept.backward()"
    cut = shortened(f"torch.tensor(loss.item(), {keyword})")
    message = f"`kept` reaches the model output only through `{cut}`, which has no gradient, so nothing learns"
    assert gl006(REWRAPPED.format(wrap=wrap)) == [(8, 12, message, [(9, "`kept` is backpropagated here")])]


@pytest.mark.parametrize(
    ("wrap", "line", "column", "leaf", "backpropagated"),
    [
        (
            "    torch.tensor(loss.item()).requires_grad_().backward()",
            8,
            5,
            "torch.tensor(loss.item()).requires_grad…",
            (8, "`torch.tensor(loss.item()).requires_grad…` is backpropagated here"),
        ),
        (
            "    wrapped = torch.tensor(loss.item()).requires_grad_()\n    wrapped.backward()",
            8,
            15,
            "torch.tensor(loss.item()).requires_grad…",
            (9, "`wrapped` is backpropagated here"),
        ),
        (
            "    wrapped = torch.tensor(loss.item()).requires_grad_(True)\n    wrapped.backward()",
            8,
            15,
            "torch.tensor(loss.item()).requires_grad…",
            (9, "`wrapped` is backpropagated here"),
        ),
    ],
    ids=["backpropagated-directly", "through-a-name", "through-a-name-with-true"],
)
def test_requires_grad_call_on_a_loss_without_gradient_is_a_new_leaf(
    wrap: str, line: int, column: int, leaf: str, backpropagated: tuple[int, str]
) -> None:
    assert gl006(REWRAPPED.format(wrap=wrap)) == [(line, column, NEW_LEAF.format(leaf=leaf), [backpropagated])]


@pytest.mark.parametrize(
    "wrap",
    [
        "    criterion(model(inputs), targets).requires_grad_().backward()",
        "    fresh = criterion(model(inputs), targets).requires_grad_()\n    fresh.backward()",
    ],
    ids=["backpropagated-directly", "through-a-name"],
)
def test_requires_grad_call_on_a_loss_that_keeps_its_gradient_is_not_reported(wrap: str) -> None:
    assert gl006(REWRAPPED.format(wrap=wrap)) == []


@pytest.mark.parametrize(
    ("between", "line", "column", "message"),
    [
        ("    loss.requires_grad_()", 8, 5, NEW_LEAF.format(leaf="loss.requires_grad_()")),
        ("    loss.requires_grad_(True)", 8, 5, NEW_LEAF.format(leaf="loss.requires_grad_(True)")),
        ("    loss.requires_grad_(False)", 7, 22, ARGMAX_CUT),
        ("    w.requires_grad_()", 7, 22, ARGMAX_CUT),
    ],
    ids=["requires_grad_", "requires_grad_-true", "requires_grad_-false", "another-tensor"],
)
def test_only_a_requires_grad_call_that_turns_grad_on_for_the_loss_itself_makes_it_a_new_leaf(
    between: str, line: int, column: int, message: str
) -> None:
    assert gl006(ARGMAX.format(between=between)) == [(line, column, message, [(9, "`loss` is backpropagated here")])]


def test_setting_requires_grad_after_the_backward_is_not_reported() -> None:
    assert gl006(LIVE.format(after="    loss.requires_grad = True")) == []


def test_setting_requires_grad_before_the_backward_is_reported_even_on_a_loss_with_a_gradient() -> None:
    # The assignment raises on a tensor with history: wherever it runs, the loss has none.
    source = LIVE.replace("    loss.backward()\n{after}", "    loss.requires_grad = True\n    loss.backward()")
    assert gl006(source) == [
        (8, 5, NEW_LEAF.format(leaf="loss.requires_grad = True"), [(9, "`loss` is backpropagated here")])
    ]


def test_the_statement_that_defines_the_loss_is_not_a_later_requires_grad_assignment() -> None:
    # Only statements strictly after the loss's last definition can make it a new leaf.
    source = "def train():\n    loss = loss.requires_grad = True\n    loss.backward()\n"
    assert gl006(source) == []


def test_the_backward_statement_itself_is_not_a_requires_grad_call_before_it() -> None:
    # Only statements strictly before the backward can make the loss a new leaf.
    source = ARGMAX.replace("{between}\n    loss.backward()", "    loss.requires_grad_(loss.backward())")
    assert gl006(source) == [(7, 22, ARGMAX_CUT, [(8, "`loss` is backpropagated here")])]
