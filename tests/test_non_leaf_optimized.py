"""GL020's fix: grad switched on after the move, only where the leaf was a temporary of the same expression."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source
from gradlint.fix import fix_source

SCRIPT = """\
import torch

device = "cuda"
{line}
optimizer = torch.optim.Adam([w], lr=0.1)
"""


def fixed(line: str) -> str:
    return fix_source(SCRIPT.format(line=line), "fit.py", Config(), False).text


def gl020_lines(source: str) -> list[int]:
    return [d.line for d in lint_source(textwrap.dedent(source), "fit.py", Config()) if d.code == "GL020"]


@pytest.mark.parametrize(
    ("line", "after"),
    [
        ("w = torch.randn(3, requires_grad=True).to(device)", "w = torch.randn(3).to(device).requires_grad_()"),
        ("w = torch.zeros(3, requires_grad=True) * 0.01", "w = (torch.zeros(3) * 0.01).requires_grad_()"),
        (
            "w = torch.ones(2, 3, dtype=torch.float64, requires_grad=True).float().cuda()",
            "w = torch.ones(2, 3, dtype=torch.float64).float().cuda().requires_grad_()",
        ),
    ],
)
def test_inline_leaf_gets_grad_after_the_move_and_is_then_quiet(line: str, after: str) -> None:
    assert gl020_lines(SCRIPT.format(line=line)) == [4]
    result = fixed(line)
    assert result == SCRIPT.format(line=after)
    assert gl020_lines(result) == []


@pytest.mark.parametrize(
    "line",
    [
        "w = torch.randn(3, requires_grad=True); w = w.to(device)",  # a named leaf: others may hold it
        "w = torch.randn(3, requires_grad=True).cuda() * bias",  # another tensor mixed in
        "w = nn.Parameter(torch.randn(3)).cuda()",  # a Parameter: no keyword to move
    ],
)
def test_no_fix_where_the_leaf_is_not_a_temporary_of_the_copy_alone(line: str) -> None:
    source = SCRIPT.format(line=line).replace("import torch\n", "import torch\nimport torch.nn as nn\nbias = 1\n")
    assert gl020_lines(source)
    assert fix_source(source, "fit.py", Config(), False).text == source


def test_moves_that_return_the_leaf_itself_are_quiet() -> None:
    for line in (
        "w = torch.randn(3, requires_grad=True).float()",
        'w = torch.randn(3, requires_grad=True).to("cpu")',
        "w = torch.randn(3, device=device, requires_grad=True).to(device, non_blocking=True)",
        "w = torch.randn(3, dtype=torch.float64, requires_grad=True).double()",
    ):
        assert gl020_lines(SCRIPT.format(line=line)) == [], line
