"""Tests that kill surviving mutants of the GL003, GL004 and GL013 rules (see benchmarks/mutation.md)."""

from __future__ import annotations

import pytest

from gradlint import Diagnostic, lint_source

Finding = tuple[int, int, str, list[tuple[int, int, str]]]


def findings(source: str, code: str) -> list[Finding]:
    """(line, column, message, [(related line, related column, note)]) of each `code` finding in `source`."""
    return [
        (d.line, d.column, d.message, [(place.line, place.column, place.note) for place in d.related])
        for d in lint_source(source.encode(), "x.py")
        if d.code == code
    ]


def only(source: str, code: str) -> Diagnostic:
    """The single finding of `source`, which must have `code`."""
    [found] = lint_source(source.encode(), "x.py")
    assert found.code == code
    return found


# GL003 update-outside-no-grad

ATTRIBUTE_UPDATE = "model.weight.sub_(0.1 * model.weight.grad)"
UPDATED_IN_PLACE = (
    "`model.weight`, a leaf that requires grad, is updated in place outside torch.no_grad(), which raises"
)
EVERY_ITERATION = "updated on every iteration, with autograd recording"

ONE_LOOP = f"""\
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    {ATTRIBUTE_UPDATE}
"""

THREE_LOOPS = f"""\
import torch
for epoch in range(3):
    for x, y in loader:
        for step in range(2):
            loss = criterion(model(x), y)
            loss.backward()
            {ATTRIBUTE_UPDATE}
"""


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (ONE_LOOP, [(5, 5, UPDATED_IN_PLACE, [(2, 1, EVERY_ITERATION)])]),
        (THREE_LOOPS, [(7, 13, UPDATED_IN_PLACE, [(4, 9, EVERY_ITERATION)])]),
    ],
    ids=["one-loop", "innermost-of-three-loops"],
)
def test_an_update_with_no_visible_source_points_at_its_innermost_loop(source: str, expected: list[Finding]) -> None:
    assert findings(source, "GL003") == expected


def test_an_update_with_no_visible_source_outside_a_loop_has_no_notes() -> None:
    source = f"import torch\nloss = criterion(model(x), y)\nloss.backward()\n{ATTRIBUTE_UPDATE}\n"
    assert findings(source, "GL003") == [(4, 1, UPDATED_IN_PLACE, [])]


REBINDING = """\
import torch
w = torch.randn(3, requires_grad=True)
loss = (w * 2).sum()
loss.backward()
{update}
"""


@pytest.mark.parametrize(
    "update",
    [
        "w = torch.sub(w, 0.1 * w.grad)",  # a call, not an operator
        "w = 2 * w - 0.1 * w.grad",  # the left operand is not `w` itself
        "w = w * (1 - 0.1 * w.grad)",  # neither `-` nor `+`
    ],
    ids=["call", "scaled-left-operand", "multiplication"],
)
def test_a_rebinding_that_is_not_w_minus_or_plus_a_term_gets_no_fix(update: str) -> None:
    found = only(REBINDING.format(update=update), "GL003")
    assert found.line == 5
    assert found.message.startswith("the parameter is rebound to a value computed with autograd on")
    assert found.fix is None


@pytest.mark.parametrize(("update", "in_place"), [("w = w - 0.1 * w.grad", "-="), ("w = w + -0.1 * w.grad", "+=")])
def test_a_rebinding_w_minus_or_plus_a_term_is_fixed_as_an_in_place_update(update: str, in_place: str) -> None:
    found = only(REBINDING.format(update=update), "GL003")
    assert found.fix is not None and found.fix.safe is False
    expected = f"with torch.no_grad():\n    w {in_place} {update[8:]}\n    w.grad = None"  # fresh, as rebinding made it
    assert [edit.text for edit in found.fix.edits] == [expected]


# GL004 inplace-on-grad-tensor

HELPER_BACKPROPAGATES_FIRST = """\
import torch

def squash(x):
    y = x.sigmoid()
    y.sum().backward()
    y.mul_(2)
    return y

x = torch.randn(3, requires_grad=True)
out = squash(x)
{after}"""

SAVED_Y = "`y`, saved for backward, is modified in place, so backward raises 'modified by an inplace operation'"


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("", []),  # the helper's own backward ran before the change: nothing needs the saved value again
        ("out.sum().backward()\n", [(6, 5, SAVED_Y, [(4, 5, "`y` is computed here and saved for backward")])]),
    ],
    ids=["no-backward-after-the-call", "backward-after-the-call"],
)
def test_a_saved_tensor_changed_in_a_helper_after_its_own_backward_needs_a_later_backward(
    after: str, expected: list[Finding]
) -> None:
    assert findings(HELPER_BACKPROPAGATES_FIRST.format(after=after), "GL004") == expected


# GL013 backward-under-no-grad

HELPER_UNDER_NO_GRAD = """\
import torch

def reset(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {event}

with torch.no_grad():
    reset(model)

for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
"""


@pytest.mark.parametrize(
    ("event", "lines"),
    [
        ("optimizer.zero_grad()", []),
        ("optimizer.step()", []),
        ("model(torch.ones(1)).sum().backward()", [8]),  # a real backward, on a loss computed under no_grad
    ],
    ids=["zero_grad", "step", "backward"],
)
def test_a_helper_under_no_grad_is_reported_only_when_it_backpropagates(event: str, lines: list[int]) -> None:
    assert [line for line, *_ in findings(HELPER_UNDER_NO_GRAD.format(event=event), "GL013")] == lines


def test_an_in_place_call_in_the_backward_statement_runs_before_that_backward() -> None:
    # `scores.mul_(2)` changes exp's saved output before `.backward()` of the same statement runs.
    source = """\
import torch


def train(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        scores = torch.exp(model(x))
        scores.mul_(2).sum().backward()
        optimizer.step()
"""
    message = (
        "`scores`, saved for backward, is modified in place, so backward raises 'modified by an inplace operation'"
    )
    assert [(line, column, text) for line, column, text, _ in findings(source, "GL004")] == [(8, 9, message)]
