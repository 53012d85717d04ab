"""Tensor proofs: which values a fix may treat as tensors (and one-element tensors), never by guessing."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint.analysis import analyze
from gradlint.analysis.facts.roles import Role

HEADER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x)

class Pair(nn.Module):
    def forward(self, x):
        return x, x

layer = nn.Linear(8, 2)
stack = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
lstm = nn.LSTM(8, 4)
head = Head()
pair = Pair()
criterion = nn.CrossEntropyLoss()
model = load_somehow()
"""


def facts(body: str) -> tuple[bool, bool]:
    """(tensor, one-element tensor) for the value `probe(VALUE)` sees in `body`."""
    module = cst.parse_module(HEADER + textwrap.dedent(body))
    analysis = analyze(module)
    [call] = [c for c in analysis.collected.calls if isinstance(c.func, cst.Name) and c.func.value == "probe"]
    statement = analysis.statement_of(call)
    value = call.args[0].value
    return analysis.tensors.is_tensor(value, statement), analysis.tensors.is_scalar_tensor(value, statement)


@pytest.mark.parametrize(
    ("body", "tensor", "scalar"),
    [
        ("probe(torch.stack([a, b]))", True, False),
        ("probe(F.cross_entropy(a, b))", True, True),
        ("probe(torch.chunk(a, 2))", False, False),  # a tuple
        ("probe(torch.is_tensor(a))", False, False),  # a bool
        ("probe(torch.max(torch.ones(3), 1))", False, False),  # (values, indices)
        ("probe(torch.max(torch.ones(3)))", True, True),  # reduced over every element
        ("probe(layer(x))", True, False),
        ("probe(stack(x))", True, False),
        ("probe(lstm(x))", False, False),  # (output, (h, c))
        ("probe(head(x))", True, False),  # forward returns a layer's output
        ("probe(pair(x))", False, False),  # forward returns a tuple
        ("probe(criterion(layer(x), y))", True, True),
        ("probe(model(x))", False, False),  # a model of unknown kind may return anything
        ("out = layer(x)\nprobe(out.mean())", True, True),
        ("out = layer(x)\nprobe(out.mean().item())", False, False),
        ("out = layer(x)\nprobe(out.shape)", False, False),
        ("out = layer(x)\nprobe(out.data)", True, False),
        ("out = layer(x)\nprobe(out[0] * 2)", True, False),
        ("out = layer(x)\nprobe(out.max(1))", False, False),
        ("a, b = layer(x), 3\nprobe(b)", False, False),  # unpacked: unproven
        ("n = 0\nn += layer(x)\nprobe(n)", True, False),
        ("loss = compute(x)\nloss.backward()\nprobe(loss)", True, True),  # backward proves it
        ("loss = compute(x)\nloss.backward(torch.ones(3))\nprobe(loss)", True, False),
        ("loss = compute(x)\nloss.backward()\nloss = other(x)\nprobe(loss)", False, False),  # rebound
        ("loss = compute(x)\nscaler.scale(loss).backward()\nprobe(loss)", True, True),
        ("loss = compute(x)\ntorch.autograd.backward(loss)\nprobe(loss)", False, False),  # takes sequences too
        ("probe(3)", False, False),
        ("probe(loss.item() / n)", False, False),
    ],
)
def test_tensor_proofs(body: str, tensor: bool, scalar: bool) -> None:
    assert facts(body) == (tensor, scalar)


def test_proven_roles_come_from_constructors_and_annotations_never_from_names() -> None:
    source = """\
    import torch
    from torch.cuda.amp import GradScaler

    def train(model, opt, trainer_opt: torch.optim.Optimizer):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GradScaler()
        alias = optimizer
        optimizer.step(); opt.step(); trainer_opt.step(); scaler.step(optimizer); alias.step()
    """
    analysis = analyze(cst.parse_module(textwrap.dedent(source)))
    receivers = {
        cst.Module([]).code_for_node(call.func.value): call.func.value
        for call in analysis.collected.calls
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"
    }
    roles = analysis.roles
    assert roles.proven_role(receivers["optimizer"]) is Role.OPTIMIZER
    assert roles.proven_role(receivers["alias"]) is Role.OPTIMIZER
    assert roles.proven_role(receivers["trainer_opt"]) is Role.OPTIMIZER
    assert roles.proven_role(receivers["scaler"]) is Role.SCALER
    assert roles.role(receivers["opt"]) is Role.OPTIMIZER  # a guess from the name, fine for reporting
    assert roles.proven_role(receivers["opt"]) is None  # but no proof for a fix
