"""GL022: which receivers are modules, and the unsafe `requires_grad_()` fix."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source
from gradlint.fix import fix_source

ONLY = Config(select=("GL022",))


def findings(source: str) -> list[int]:
    return [d.line for d in lint_source("import torch\nfrom torch import nn\n" + textwrap.dedent(source), "f.py", ONLY)]


@pytest.mark.parametrize(
    "receiver",
    [
        "nn.Linear(4, 4)",  # a torch.nn layer
        "torch.nn.Sequential(nn.Linear(4, 4))",
        "copy_of(model)",  # a builder, stored under a name that says model
    ],
)
def test_a_module_built_here_is_reported(receiver: str) -> None:
    assert findings(f"model = {receiver}\nmodel.requires_grad = False\n") == [4]


@pytest.mark.parametrize(
    "source",
    [
        "w = torch.zeros(3)\nw.requires_grad = False\n",  # a tensor
        "w = nn.Parameter(torch.zeros(3))\nw.requires_grad = False\n",  # a parameter
        "class Flag:\n    pass\nmodel = Flag()\nmodel.requires_grad = False\n",  # a class that is not a module
        "model = torch.load('m.pt')\nmodel.requires_grad = False\n",  # unknown: torch.load may return tensors
        "def f(model):\n    model.pos_embed.requires_grad = False\n",  # a Parameter of a model
        "def f(cfg):\n    cfg.requires_grad = False\n",  # a name that says nothing
    ],
)
def test_what_is_not_known_to_be_a_module_is_quiet(source: str) -> None:
    assert findings(source) == []


def test_the_fix_calls_requires_grad_and_is_unsafe() -> None:
    source = "import torch\n\ndef f(model):\n    model.encoder.requires_grad = not tune  # keep\n"
    assert fix_source(source, "f.py", Config(), unsafe=False).text == source
    fixed = fix_source(source, "f.py", Config(), unsafe=True).text
    assert fixed == source.replace("model.encoder.requires_grad = not tune", "model.encoder.requires_grad_(not tune)")


def test_a_late_freeze_needs_an_optimizer_that_moves_zero_gradients() -> None:
    late = """
        def train(model, loader, warm):
            opt = torch.optim.SGD(model.parameters(), lr=0.1{extra})
            for step, (x, y) in enumerate(loader):
                if step == warm:
                    model.encoder.requires_grad_(False)
                opt.zero_grad(set_to_none=False)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    """
    assert findings(late.format(extra="")) == []
    assert findings(late.format(extra=", momentum=0.9")) == [8]
    assert findings(late.format(extra=", weight_decay=1e-4")) == [8]
