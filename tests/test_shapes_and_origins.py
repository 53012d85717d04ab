"""The origins, shapes and no-grad layers: where a value was made, whether it is a scalar, whether it has history."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint.analysis import Kind, ModuleAnalysis, analyze
from gradlint.analysis.facts.origins import OUTSIDE, Binding
from gradlint.analysis.facts.shapes import Shape

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
critic = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
criterion = nn.CrossEntropyLoss()
per_sample = nn.CrossEntropyLoss(reduction="none")
"""


def analysis_of(body: str) -> tuple[ModuleAnalysis, cst.Call]:
    """The analysis of `body` and its single backward call."""
    analysis = analyze(cst.parse_module(HEADER + textwrap.dedent(body)))
    (event,) = analysis.own_events(Kind.BACKWARD)
    assert isinstance(event.node, cst.Call)
    return analysis, event.node


def backward_value(body: str) -> tuple[ModuleAnalysis, cst.BaseExpression, cst.CSTNode]:
    analysis, call = analysis_of(body)
    (event,) = analysis.own_events(Kind.BACKWARD)
    assert event.value is not None
    return analysis, event.value, analysis.statement_of(call)


@pytest.mark.parametrize(
    ("body", "bindings"),
    [
        ("loss = criterion(model(x), y)\nloss.backward()", {Binding.ASSIGN}),
        ("if c:\n    loss = criterion(model(x), y)\nloss.backward()", {Binding.ASSIGN, Binding.OUTSIDE}),
        ("loss, aux = run(x)\nloss.backward()", {Binding.UNPACK}),
        ("for loss in losses:\n    loss.backward()", {Binding.LOOP}),
        ("def f(loss):\n    loss.backward()", {Binding.OUTSIDE}),
        ("loss = a\nloss += b\nloss.backward()", {Binding.AUGMENT}),
    ],
)
def test_reaching_definitions_follow_branches_loops_and_scopes(body: str, bindings: set[Binding]) -> None:
    analysis, call = analysis_of(body)
    definitions = analysis.origins.definitions("loss", analysis.statement_of(call))
    assert {definition.binding for definition in definitions} == bindings


def test_a_later_assignment_kills_an_earlier_one() -> None:
    analysis, call = analysis_of("loss = first(x)\nloss = second(x)\nloss.backward()")
    (definition,) = analysis.origins.definitions("loss", analysis.statement_of(call))
    assert definition is not OUTSIDE
    assert analysis.module.code_for_node(definition.value) == "second(x)"


def test_a_value_carried_round_a_loop_reaches_its_top() -> None:
    analysis, call = analysis_of("h = init\nfor x in xs:\n    h.backward()\n    h = step(h, x)")
    definitions = analysis.origins.definitions("h", analysis.statement_of(call))
    assert len(definitions) == 2


@pytest.mark.parametrize(
    ("body", "reads"),
    [
        ("h = model(x)\nout = head(h)\nloss = out.sum()\nloss.backward()", True),
        ("h = model(x)\nout = head(z)\nloss = out.sum()\nloss.backward()", False),
    ],
)
def test_reads_follows_assignments(body: str, reads: bool) -> None:
    analysis, value, at = backward_value(body)
    assert analysis.origins.reads(value, "h", at) is reads


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ("loss = per_sample(model(x), y)\nloss.backward()", Shape.NON_SCALAR),
        ("loss = per_sample(model(x), y).mean()\nloss.backward()", Shape.SCALAR),
        ("loss = per_sample(model(x), y)\n(loss * w).sum().backward()", Shape.SCALAR),
        ("loss = per_sample(model(x), y)\n(loss * w).backward()", Shape.NON_SCALAR),
        ("loss = per_sample(model(x), y).sum(dim=1)\nloss.backward()", Shape.UNKNOWN),
        ("criterion(model(x), y).backward()", Shape.SCALAR),
        ("F.mse_loss(model(x), y, reduction='none').backward()", Shape.NON_SCALAR),
        ("F.l1_loss(model(x), y, reduce=False).backward()", Shape.NON_SCALAR),
        ("((model(x) - y) ** 2).backward()", Shape.NON_SCALAR),
        ("((model(x) - y) ** 2).mean().backward()", Shape.SCALAR),
        ("torch.sigmoid(model(x)).backward()", Shape.NON_SCALAR),
        ("(critic(s) - y).pow(2).backward()", Shape.UNKNOWN),
        ("model(x)[0, 1].backward()", Shape.UNKNOWN),
        ("loss = per_sample(model(x), y)\nif c:\n    loss = loss.mean()\nloss.backward()", Shape.UNKNOWN),
        ("unknown(x).backward()", Shape.UNKNOWN),
    ],
)
def test_shapes(body: str, shape: Shape) -> None:
    analysis, value, at = backward_value(body)
    assert analysis.shapes.shape(value, at) is shape


def test_a_module_of_this_file_has_the_shape_its_forward_returns() -> None:
    body = """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            h = F.relu(self.fc(x))
            return h

    net = Net()
    net(x).backward()
    """
    analysis, value, at = backward_value(body)
    assert analysis.shapes.shape(value, at) is Shape.NON_SCALAR


@pytest.mark.parametrize(
    ("body", "without_grad"),
    [
        ("with torch.no_grad():\n    loss = criterion(model(x), y)\nloss.backward()", True),
        (
            "for x, y in loader:\n    with torch.no_grad():\n        out = model(x)\n    criterion(out, y).backward()",
            True,
        ),
        ("with torch.no_grad():\n    out = model(x)\nloss = criterion(out, model(x))\nloss.backward()", False),
        ("with torch.no_grad():\n    t = teacher(x)\nloss = criterion(model(x), t)\nloss.backward()", False),
        ("loss = criterion(model(x), y)\nwith torch.no_grad():\n    loss.backward()", False),
        ("with torch.no_grad():\n    alias = loss\nalias.backward()", False),
        ("def f(out, y):\n    with torch.no_grad():\n        t = model(y)\n    F.mse_loss(out, t).backward()", False),
        ("@torch.no_grad()\ndef f(x, y):\n    criterion(model(x), y).backward()", True),
        (
            "@torch.no_grad()\ndef f(x, y):\n    with torch.enable_grad():\n        criterion(model(x), y).backward()",
            False,
        ),
    ],
)
def test_values_computed_without_grad(body: str, without_grad: bool) -> None:
    analysis, value, at = backward_value(body)
    assert analysis.no_grad_values.computed_without_grad(value, at) is without_grad
