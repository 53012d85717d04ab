"""The lineage layer: which operations cut a backpropagated value off from the model."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint.analysis import Kind, analyze
from gradlint.analysis.facts.lineage import criterion_sides

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
model = nn.Linear(4, 2)
criterion = nn.CrossEntropyLoss()
"""


def lineage_of_backward(body: str) -> tuple[bool, list[str]]:
    """(live, the source of each cut) for the single backward call of `body`."""
    module = cst.parse_module(HEADER + textwrap.dedent(body))
    analysis = analyze(module)
    (event,) = analysis.own_events(Kind.BACKWARD)
    assert event.value is not None and isinstance(event.node, cst.Call)
    lineage = analysis.lineage.of(event.value, analysis.statement_of(event.node))
    return lineage.live, [module.code_for_node(cut) for cut in lineage.cuts]


@pytest.mark.parametrize(
    ("body", "cut"),
    [
        ("loss = criterion(model(x).argmax(1).float(), y)\nloss.backward()", "model(x).argmax(1)"),
        ("_, pred = model(x).max(1)\nloss = F.mse_loss(pred.float(), y)\nloss.backward()", "model(x).max(1)"),
        ("p = model(x).max(dim=1).indices\nF.l1_loss(p.float(), y).backward()", "model(x).max(dim=1).indices"),
        ("out = model(x)\nloss = ((out > 0).float() - y).abs().mean()\nloss.backward()", "(out > 0)"),
        ("out = model(x)\nloss = torch.tensor(criterion(out, y).item())\nloss.backward()", None),
        ("out = model(x).data\nloss = F.mse_loss(out, y)\nloss.backward()", "model(x).data"),
    ],
)
def test_a_cut_prediction_leaves_no_gradient_path(body: str, cut: str | None) -> None:
    live, cuts = lineage_of_backward(body)
    assert not live
    if cut is None:
        assert cuts and cuts[0].startswith("torch.tensor(")
    else:
        assert cuts == [cut]


@pytest.mark.parametrize(
    "body",
    [
        "loss = criterion(model(x), y.argmax(1))\nloss.backward()",
        "soft = model(x).softmax(-1)\nhard = F.one_hot(soft.argmax(-1), 2).float()\n"
        "(criterion(hard - soft.detach() + soft, y)).backward()",
        "with torch.no_grad():\n    target = model(x2).max(1)[0]\nF.mse_loss(model(x), target).backward()",
        "def compute(out, y):\n    return criterion(out, y)\nloss = compute(model(x), y)\nloss.backward()",
        "loss = sum(criterion(head(x), y) for head in heads)\nloss.backward()",
        "def update(log_probs, values, returns):\n"
        "    loss = -(log_probs * (returns - values.detach())).mean()\n    loss.backward()",
    ],
)
def test_a_remaining_gradient_path_keeps_the_value_live(body: str) -> None:
    live, _ = lineage_of_backward(body)
    assert live


def test_criterion_sides_split_prediction_and_target() -> None:
    call = cst.parse_expression("crit(out, y)")
    assert isinstance(call, cst.Call)
    predictions, targets = criterion_sides(call)
    assert [cst.Module([]).code_for_node(node) for node in (*predictions, *targets)] == ["out", "y"]
    triplet = cst.parse_expression("F.triplet_margin_loss(a, p, n)")
    assert isinstance(triplet, cst.Call)
    assert len(criterion_sides(triplet)[0]) == 3 and criterion_sides(triplet)[1] == []


def test_as_tensor_of_a_tensor_keeps_its_history() -> None:
    live, cuts = lineage_of_backward("loss = torch.as_tensor(criterion(model(x), y))\nloss.backward()")
    assert live and cuts == []
    live, cuts = lineage_of_backward("loss = torch.as_tensor(criterion(model(x), y).item())\nloss.backward()")
    assert not live and len(cuts) == 1


def test_a_loss_handed_in_may_carry_history() -> None:
    body = "def step(x, y, aux_loss):\n    loss = F.mse_loss(model(x).round(), y) + aux_loss\n    loss.backward()"
    live, _ = lineage_of_backward(body)
    assert live
