"""Tests that kill surviving mutants of the GL010 and GL011 rules (see benchmarks/mutation.md)."""

from __future__ import annotations

import pytest

from gradlint import lint_source

INTEGER_NAME = """\
import torch
from torch import nn

ids = torch.arange(4)
{use}
"""

NAMED = "`ids` is an integer or bool tensor, which cannot require gradients; this raises"


def gl010(source: str) -> list[tuple[int, int, str, list[tuple[int, str]]]]:
    """(line, column, message, [(related line, note)]) of each GL010 finding in `source`."""
    return [
        (d.line, d.column, d.message, [(place.line, place.note) for place in d.related])
        for d in lint_source(source.encode(), "x.py")
        if d.code == "GL010"
    ]


@pytest.mark.parametrize(
    ("use", "column"),
    [
        ("ids.requires_grad_()", 1),
        ("ids.requires_grad = True", 1),
        ("weights = nn.Parameter(ids)", 11),
    ],
    ids=["requires_grad_-call", "requires_grad-assignment", "parameter"],
)
def test_an_integer_name_made_to_require_grad_is_named_with_where_it_was_made(use: str, column: int) -> None:
    source = INTEGER_NAME.format(use=use)
    assert gl010(source) == [(5, column, NAMED, [(4, "`ids` is made with an integer dtype here")])]


@pytest.mark.parametrize(
    "frozen",
    ["nn.Parameter(torch.arange(4), requires_grad=False)", "nn.Parameter(torch.arange(4), False)"],
    ids=["requires_grad-keyword", "requires_grad-positional"],
)
def test_an_integer_parameter_that_does_not_require_grad_is_not_reported(frozen: str) -> None:
    reported = "import torch\nfrom torch import nn\n\nindex = nn.Parameter(torch.arange(4))\n"
    message = "`torch.arange(4)` is an integer or bool tensor, which cannot require gradients; this raises"
    assert gl010(reported) == [(4, 9, message, [])]
    assert gl010(reported.replace("nn.Parameter(torch.arange(4))", frozen)) == []


def test_a_parameter_through_an_nn_name_that_is_not_imported_is_reported() -> None:
    # `nn` is used without an import (a snippet, or a name a star import brings): `nn.Parameter` still counts.
    source = "import torch\n\nindex = nn.Parameter(torch.arange(4))\n"
    message = "`torch.arange(4)` is an integer or bool tensor, which cannot require gradients; this raises"
    assert gl010(source) == [(3, 9, message, [])]
