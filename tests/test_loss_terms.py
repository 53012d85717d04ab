"""GL006 and GL019 share the lineage of a loss and split its cases: wholly cut, or partly cut."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source

LOOP = """
import torch
import torch.nn.functional as F

def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        logits, aux = model(x)
        {loss}
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize(
    ("loss", "codes"),
    [
        ("loss = F.cross_entropy(logits.detach(), y) + aux.mean().detach()", {"GL006"}),
        ("loss = torch.tensor(F.cross_entropy(logits, y).item(), requires_grad=True)", {"GL006"}),
        ("loss = F.cross_entropy(logits, y) + aux.mean().detach()", {"GL019"}),
        ("loss = F.cross_entropy(logits, y) + torch.tensor(aux.mean().item(), requires_grad=True)", {"GL019"}),
        ("loss = F.cross_entropy(logits, y) + aux.mean() - aux.mean().detach()", set()),
        ("m = aux.mean(); loss = F.cross_entropy(logits, y) + aux.mean() - m.detach()", set()),
    ],
)
def test_a_loss_is_wholly_cut_for_gl006_and_partly_cut_for_gl019(loss: str, codes: set[str]) -> None:
    source = textwrap.dedent(LOOP).format(loss=loss)
    found = lint_source(source, "train.py", Config(select=("GL006", "GL019")))
    assert {d.code for d in found} == codes
    assert len({(d.line, d.column) for d in found}) == len(found)
