"""`torch.set_grad_enabled(...)` written as a statement switches grad mode for what follows it in its block."""

from __future__ import annotations

import textwrap

import libcst as cst

from gradlint.analysis.syntax.collect import collect


def _modes(source: str) -> dict[str, bool]:
    module = cst.parse_module(textwrap.dedent(source))
    collected = collect(module)
    return {module.code_for_node(s).strip(): collected.contexts[s].no_grad for s in collected.statements}


def test_a_statement_switches_grad_off_for_the_rest_of_its_block_and_back_on() -> None:
    modes = _modes(
        """\
        import torch
        def evaluate(model, loader):
            torch.set_grad_enabled(False)
            for x in loader:
                y = model(x)
            torch.set_grad_enabled(True)
            z = model(x)
        """
    )
    assert modes["torch.set_grad_enabled(False)"] is False
    assert modes["y = model(x)"] is True
    assert modes["torch.set_grad_enabled(True)"] is True
    assert modes["z = model(x)"] is False


def test_the_switch_does_not_reach_beyond_its_block() -> None:
    modes = _modes(
        """\
        import torch
        def run(model, x, quiet):
            if quiet:
                torch.set_grad_enabled(False)
                inside = model(x)
            after = model(x)
        """
    )
    assert modes["inside = model(x)"] is True
    assert modes["after = model(x)"] is False  # not assumed beyond the block


def test_a_flag_that_is_no_literal_leaves_the_mode_unknown() -> None:
    module = cst.parse_module("import torch\ndef f(m, x, train):\n    torch.set_grad_enabled(train)\n    y = m(x)\n")
    collected = collect(module)
    statement = collected.statements[-1]
    assert collected.contexts[statement].grad_mode.name == "UNKNOWN"
