"""The leaves, mutations, callers and graphs layers, queried directly."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint.analysis import ModuleAnalysis, analyze

HEADER = """
import copy
import torch
import torch.nn as nn
model = nn.Linear(4, 2)
"""


def analysis_of(body: str) -> ModuleAnalysis:
    return analyze(cst.parse_module(HEADER + textwrap.dedent(body)))


def statement(analysis: ModuleAnalysis, text: str) -> cst.BaseSmallStatement:
    """The last simple statement whose source is `text`."""
    found = [s for s in analysis.collected.statements if analysis.module.code_for_node(s).strip() == text]
    assert found, f"no statement {text!r}"
    return found[-1]


def target_is_leaf(body: str, text: str) -> bool:
    """Whether the tensor the in-place statement `text` modifies is a leaf that requires grad."""
    analysis = analysis_of(body)
    at = statement(analysis, text)
    (operation,) = [op for op in analysis.mutations.operations if op.statement is at]
    return analysis.leaves.is_leaf(operation.target, at)


@pytest.mark.parametrize(
    ("body", "text", "leaf"),
    [
        ("w = torch.zeros(3, requires_grad=True)\nw.add_(1)", "w.add_(1)", True),
        ("w = torch.zeros(3)\nw.add_(1)\nw.requires_grad_()", "w.add_(1)", False),
        ("w = torch.zeros(3)\nw.requires_grad = True\nw += 1", "w += 1", True),
        ("w = nn.Parameter(torch.zeros(3))\nw.requires_grad_(False)\nw.zero_()", "w.zero_()", False),
        ("w = nn.Parameter(torch.zeros(3), requires_grad=False)\nw.zero_()", "w.zero_()", False),
        ("for p in model.parameters():\n    p.mul_(2)", "p.mul_(2)", True),
        ("for name, p in model.named_parameters():\n    p.mul_(2)", "p.mul_(2)", True),
        ("for i, p in enumerate(list(model.parameters())):\n    p.mul_(2)", "p.mul_(2)", True),
        ("for a, b in zip(model.parameters(), [1, 2]):\n    b.mul_(2)", "b.mul_(2)", False),
        (
            "params = [p for p in model.parameters() if p.requires_grad]\nfor q in params:\n    q[0] = 1",
            "q[0] = 1",
            True,
        ),
        (
            "opt = torch.optim.SGD(model.parameters(), 0.1)\nfor g in opt.param_groups:\n    for p in g['params']:\n"
            "        p.mul_(2)",
            "p.mul_(2)",
            True,
        ),
        (
            "ema = copy.deepcopy(model)\nema.requires_grad_(False)\nfor p in ema.parameters():\n    p.mul_(2)",
            "p.mul_(2)",
            False,
        ),
        (
            "ema = copy.deepcopy(model)\nfor p in ema.parameters():\n    p.detach_()\nfor q in ema.parameters():\n"
            "    q.mul_(2)",
            "q.mul_(2)",
            False,
        ),
        ("model.weight.fill_(0)", "model.weight.fill_(0)", True),
        ("model.weight.data.fill_(0)", "model.weight.data.fill_(0)", False),
        ("def f(params):\n    for p in params:\n        p.mul_(2)\nf(model.parameters())", "p.mul_(2)", True),
        ("def f(params):\n    for p in params:\n        p.mul_(2)\nf([torch.zeros(3)])", "p.mul_(2)", False),
        (
            "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.w = nn.Parameter(torch.ones(2))\n    def bump(self):\n        self.w.add_(1)",
            "self.w.add_(1)",
            True,
        ),
    ],
)
def test_leaves(body: str, text: str, leaf: bool) -> None:
    assert target_is_leaf(body, text) is leaf


@pytest.mark.parametrize(
    ("body", "updates"),
    [
        ("w = torch.zeros(3, requires_grad=True)\nw -= 0.1 * w.grad", ["w -= 0.1 * w.grad"]),
        ("w = torch.zeros(3, requires_grad=True)\nw = w - 0.1 * w.grad", ["w = w - 0.1 * w.grad"]),
        ("w = torch.zeros(3, requires_grad=True)\nw = (w - 0.1 * w.grad).detach().requires_grad_()", []),
        ("w = torch.zeros(3, requires_grad=True)\nw.add_(torch.randn(3))", []),
        ("w = torch.zeros(3, requires_grad=True)\nfast = w - 0.1 * w.grad", []),
        (
            "for p, g in zip(model.parameters(), torch.autograd.grad(loss, model.parameters())):\n    p.sub_(g)",
            ["p.sub_(g)"],
        ),
        ("for p in model.parameters():\n    d = p.grad\n    p.mul_(0.9).add_(d)", ["p.mul_(0.9).add_(d)"]),
    ],
)
def test_manual_updates(body: str, updates: list[str]) -> None:
    analysis = analysis_of(body)
    found = [analysis.module.code_for_node(update.node).strip() for update in analysis.mutations.updates]
    assert found == updates


@pytest.mark.parametrize(
    ("body", "text", "saved"),
    [
        ("x = torch.randn(3, requires_grad=True)\ny = torch.exp(x)\ny += 1", "y += 1", True),
        ("x = torch.randn(3, requires_grad=True)\ny = x.sigmoid().view(-1)\ny.mul_(2)", "y.mul_(2)", True),
        ("x = torch.randn(3, requires_grad=True)\ny = x * 2\ny += 1", "y += 1", False),
        ("x = torch.randn(3, requires_grad=True)\ny = x * 2\nz = torch.log(y)\ny += 1", "y += 1", True),
        ("x = torch.randn(3, requires_grad=True)\ny = x * 2\nz = y * 3\ny += 1", "y += 1", False),
        ("x = torch.randn(3, requires_grad=True)\ny = x * 2\nz = y * x\ny += 1", "y += 1", True),
        ("x = torch.randn(3, requires_grad=True)\ny = x * 2\nz = 1 / y\ny += 1", "y += 1", True),
        ("h = model(torch.randn(2, 4))\nh.relu_()", "h.relu_()", False),
        ("h = model(torch.randn(2, 4))\nh.relu_()\nh += 1", "h += 1", True),
        ("h = model(torch.randn(2, 4))\nout = model(h)\nh += 1", "h += 1", True),
        ("x = torch.randn(3)\ny = torch.exp(x)\ny += 1", "y += 1", False),
        (
            "x = torch.randn(3, requires_grad=True)\nwith torch.no_grad():\n    y = torch.exp(x)\ny += 1",
            "y += 1",
            False,
        ),
        ("x = torch.randn(3, requires_grad=True)\ny = torch.exp(x).detach()\ny += 1", "y += 1", False),
    ],
)
def test_saved_for_backward(body: str, text: str, saved: bool) -> None:
    analysis = analysis_of(body)
    at = statement(analysis, text)
    (operation,) = [op for op in analysis.mutations.operations if op.statement is at]
    assert analysis.graphs.saved_for_backward(operation.target, at) is saved


@pytest.mark.parametrize(
    ("body", "text", "with_grad"),
    [
        ("w = nn.Parameter(torch.ones(2))\nw.add_(1)", "w.add_(1)", True),
        ("def helper(w):\n    w.add_(1)", "w.add_(1)", False),
        ("def helper(w):\n    w.add_(1)\nhelper(model.weight)", "w.add_(1)", True),
        ("def helper(w):\n    w.add_(1)\nwith torch.no_grad():\n    helper(model.weight)", "w.add_(1)", False),
        ("def step(w, loss):\n    loss.backward()\n    w.add_(1)", "w.add_(1)", True),
        ("torch.set_grad_enabled(False)\nmodel.weight.add_(1)", "model.weight.add_(1)", False),
        (
            "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.w = nn.Parameter(torch.ones(2))\n        self.w.add_(1)",
            "self.w.add_(1)",
            True,
        ),
    ],
)
def test_callers_grad_mode(body: str, text: str, with_grad: bool) -> None:
    analysis = analysis_of(body)
    assert analysis.callers.with_grad(statement(analysis, text)) is with_grad


def test_helper_called_from_a_class_header_or_decorator() -> None:
    # Regression: a call site outside any statement (torch/_inductor registers classes this way).
    body = """
    def register(params):
        for p in params:
            p.add_(1)
        return lambda cls: cls

    @register(model.parameters())
    class Decorated(nn.Module):
        pass

    class Based(register(model.parameters())):
        pass
    """
    assert target_is_leaf(body, "p.add_(1)")
