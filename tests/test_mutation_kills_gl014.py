"""Tests that kill surviving mutants of the GL014 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source

ONLY_GL014 = Config(select=("GL014",))

IN_LOOP = (
    "an optimizer or GradScaler is built inside the training loop, "
    "so its state (momentum, Adam moments, loss scale) restarts every step"
)
HELPER_NOTE = "this helper builds an optimizer or GradScaler"
STEP_NOTE = "every pass through this training step builds it again"


def built(name: str) -> str:
    """The message GL014 gives for `name(...)` built directly in the step."""
    return f"`{name}` is built inside the training loop, so its state (momentum, Adam moments, loss scale) restarts"


def built_per_call(name: str) -> str:
    """The message GL014 gives for `name(...)` built in a function that steps once per call."""
    return (
        f"`{name}` is built on every call of this training step, "
        "so its state (momentum, Adam moments, loss scale) restarts"
    )


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, code, message) of each GL014 finding in `source`, dedented."""
    found = lint_source(textwrap.dedent(source).encode(), "x.py", ONLY_GL014)
    return [(d.line, d.code, d.message) for d in found]


def helper_chain(depth: int) -> str:
    """A loop that calls h1, which calls h2, ... down to h`depth`, which builds an Adam."""
    helpers = "".join(f"def h{i}(model):\n    return h{i + 1}(model)\n" for i in range(1, depth))
    return (
        "import torch\n"
        f"{helpers}"
        f"def h{depth}(model):\n"
        "    return torch.optim.Adam(model.parameters())\n"
        "def train(model, loader):\n"
        "    for x in loader:\n"
        "        opt = h1(model)\n"
        "        model(x).sum().backward()\n"
        "        opt.step()\n"
    )


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_construction_up_to_three_helpers_deep_is_reported_with_its_helper(depth: int) -> None:
    [found] = lint_source(helper_chain(depth).encode(), "x.py", ONLY_GL014)
    call_line = 2 * depth + 4  # `opt = h1(model)`
    assert (found.line, found.column, found.code, found.message) == (call_line, 15, "GL014", IN_LOOP)
    assert [(r.line, r.note) for r in found.related] == [(2, HELPER_NOTE), (call_line - 1, STEP_NOTE)]


def test_a_construction_four_helpers_deep_is_not_followed() -> None:
    assert findings(helper_chain(4)) == []


def test_a_conditional_call_does_not_hide_a_later_construction_in_the_loop() -> None:
    source = """\
        import torch
        def train(model, loader):
            for x in loader:
                if x is None:
                    print("empty batch")
                opt = torch.optim.Adam(model.parameters())
                model(x).sum().backward()
                opt.step()
        """
    assert findings(source) == [(6, "GL014", built("torch.optim.Adam"))]


def test_a_conditional_call_does_not_hide_a_later_construction_in_a_helper() -> None:
    source = """\
        import torch
        def make_optimizer(model, verbose):
            if verbose:
                print("building the optimizer")
            return torch.optim.Adam(model.parameters())
        def train(model, loader):
            for x in loader:
                opt = make_optimizer(model, False)
                model(x).sum().backward()
                opt.step()
        """
    assert findings(source) == [(8, "GL014", IN_LOOP)]


def test_a_step_loop_inside_an_if_is_still_checked() -> None:
    # The `if` around the whole loop does not make the construction conditional per step.
    source = """\
        import torch
        def train(model, loader, enabled):
            if enabled:
                for x in loader:
                    opt = torch.optim.Adam(model.parameters())
                    model(x).sum().backward()
                    opt.step()
        """
    assert findings(source) == [(5, "GL014", built("torch.optim.Adam"))]


@pytest.mark.parametrize("guard", ["", "if True:\n    "])
def test_a_construction_under_an_if_in_a_training_step_is_a_lazy_rebuild(guard: str) -> None:
    # Also when the function itself is defined under an `if`: only the `if` inside it counts.
    body = textwrap.dedent(
        """\
        def training_step(model, x, opt):
            if opt is None:
                opt = torch.optim.Adam(model.parameters())
            model(x).sum().backward()
            opt.step()
        """
    )
    source = "import torch\n" + guard + body.replace("\n", "\n    " if guard else "\n")
    assert findings(source) == []


def test_an_unguarded_construction_in_a_training_step_under_an_if_is_reported() -> None:
    source = """\
        import torch
        if True:
            def training_step(model, x):
                opt = torch.optim.Adam(model.parameters())
                model(x).sum().backward()
                opt.step()
        """
    assert findings(source) == [(4, "GL014", built_per_call("torch.optim.Adam"))]


@pytest.mark.parametrize(
    ("construction", "name"),
    [
        ("torch.optim.SGD(model.parameters(), lr=0.1, nesterov=False)", "torch.optim.SGD"),
        ("torch.cuda.amp.GradScaler(enabled=True)", "torch.cuda.amp.GradScaler"),
    ],
)
def test_only_enabled_false_makes_a_construction_stateless(construction: str, name: str) -> None:
    source = f"""\
import torch
def train(model, loader, opt):
    for x in loader:
        made = {construction}
        model(x).sum().backward()
        opt.step()
"""
    assert findings(source) == [(4, "GL014", built(name))]


def test_a_disabled_grad_scaler_is_not_reported() -> None:
    source = """\
        import torch
        def train(model, loader, opt):
            for x in loader:
                scaler = torch.cuda.amp.GradScaler(enabled=False)
                scaler.scale(model(x).sum()).backward()
                scaler.step(opt)
        """
    assert findings(source) == []


@pytest.mark.parametrize(
    ("fresh", "parameters"),
    [
        ("net = Net()", "net.parameters()"),  # the object owning the parameters is new
        ("self.z = torch.randn(3, requires_grad=True)", "[self.z]"),  # the attribute itself is new
    ],
)
def test_an_optimizer_over_parameters_created_in_the_same_iteration_is_not_reported(
    fresh: str, parameters: str
) -> None:
    source = f"""\
import torch
class Attack:
    def run(self, loader):
        for x in loader:
            {fresh}
            opt = torch.optim.Adam({parameters})
            (x * 2).sum().backward()
            opt.step()
"""
    assert findings(source) == []


def test_an_optimizer_over_parameters_made_before_the_loop_is_reported() -> None:
    source = """\
        import torch
        class Attack:
            def run(self, loader):
                net = Net()
                self.z = torch.randn(3, requires_grad=True)
                for x in loader:
                    opt = torch.optim.Adam(net.parameters())
                    opt2 = torch.optim.Adam([self.z])
                    (x * 2).sum().backward()
                    opt.step()
        """
    assert findings(source) == [(7, "GL014", built("torch.optim.Adam")), (8, "GL014", built("torch.optim.Adam"))]
