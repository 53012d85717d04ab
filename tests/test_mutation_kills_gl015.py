"""Tests that kill surviving mutants of the GL015 rule (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest

from gradlint import Config, lint_source

ONLY_GL015 = Config(select=("GL015",))


def torch_code(source: str) -> bytes:
    """`source` dedented, as a module torch reaches: the import goes last, so that its lines stay as written."""
    return (textwrap.dedent(source) + "\nimport torch\n").encode()


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, code, message) of each GL015 finding in `source`, dedented."""
    found = lint_source(torch_code(source), "x.py", ONLY_GL015)
    return [(d.line, d.code, d.message) for d in found]


def late(key: str) -> str:
    """The message GL015 gives for `key.retain_grad()` after the backward pass."""
    return f"`{key}.retain_grad()` is called after the backward pass, so `{key}.grad` stays None"


def test_a_late_retain_grad_is_reported_with_the_backward_that_already_ran() -> None:
    source = """\
        def saliency(model, x):
            hidden = model.encoder(x)
            model.head(hidden).sum().backward()
            hidden.retain_grad()
            return hidden.grad
        """
    [found] = lint_source(torch_code(source), "x.py", ONLY_GL015)
    assert (found.line, found.column, found.code, found.message) == (4, 5, "GL015", late("hidden"))
    assert [(r.line, r.column, r.note) for r in found.related] == [(3, 5, "the backward pass already ran here")]


def test_a_tensor_computed_after_the_backward_is_not_late() -> None:
    # Its retain_grad() is for a backward that has not run yet: nothing was missed.
    source = """\
        def saliency(model, x):
            model(x).sum().backward()
            hidden = model.encoder(x)
            hidden.retain_grad()
            return hidden.grad
        """
    assert findings(source) == []


@pytest.mark.parametrize(
    "second_backward",
    [
        "model.head(hidden).sum().backward()",  # the loss is computed from `hidden` in place
        "loss = model.head(hidden).sum()\n    loss.backward()",  # through a named loss
    ],
)
def test_a_second_backward_through_the_same_tensor_fills_its_grad(second_backward: str) -> None:
    source = f"""\
def two_losses(model, x):
    hidden = model.encoder(x)
    model(x).sum().backward()
    hidden.retain_grad()
    {second_backward}
    return hidden.grad
"""
    assert findings(source) == []


def test_a_second_backward_through_another_tensor_does_not_excuse_a_late_retain_grad() -> None:
    source = """\
        def two_losses(model, x):
            hidden = model.encoder(x)
            model(x).sum().backward()
            hidden.retain_grad()
            loss = model(x).mean()
            loss.backward()
            return hidden.grad
        """
    assert findings(source) == [(4, "GL015", late("hidden"))]


def test_a_later_backward_inside_a_helper_may_fill_the_grad() -> None:
    # The helper's loss cannot be traced back to `hidden` from here: give it the benefit of the doubt.
    source = """\
        def backward_of(loss):
            loss.backward()


        def two_losses(model, x):
            hidden = model.encoder(x)
            model(x).sum().backward()
            hidden.retain_grad()
            backward_of(model.head(hidden).sum())
            return hidden.grad
        """
    assert findings(source) == []


def test_a_retain_grad_method_that_runs_backward_itself_is_not_late() -> None:
    # `self.retain_grad()` calls this class's own method: its backward runs inside the call, not before it.
    source = """\
        class Probe:
            def retain_grad(self):
                self.loss.backward()

            def run(self):
                self.retain_grad()
        """
    assert findings(source) == []


def test_the_next_loop_pass_backpropagates_through_a_tensor_the_loop_does_not_rebind() -> None:
    source = """\
        def unrolled(model, x, steps):
            hidden = model.encoder(x)
            for _ in range(steps):
                model.head(hidden).sum().backward(retain_graph=True)
                hidden.retain_grad()
            return hidden.grad
        """
    assert findings(source) == []


def test_a_loop_that_rebinds_the_tensor_does_not_excuse_a_late_retain_grad() -> None:
    source = """\
        def probe(model, loader):
            for x in loader:
                hidden = model.encoder(x)
                model.head(hidden).sum().backward()
                hidden.retain_grad()
                print(hidden.grad)
        """
    assert findings(source) == [(5, "GL015", late("hidden"))]


@pytest.mark.parametrize(
    "returned",
    ["hidden", "logits, hidden", "[logits, hidden]", '{"logits": logits, "hidden": hidden}'],
)
def test_a_tensor_returned_to_the_caller_is_not_reported(returned: str) -> None:
    # The caller may run another backward through it.
    source = f"""\
def features(model, x):
    hidden = model.encoder(x)
    logits = model.head(hidden)
    logits.sum().backward()
    hidden.retain_grad()
    return {returned}
"""
    assert findings(source) == []


@pytest.mark.parametrize(
    "returned",
    ["hidden.grad", "logits, hidden.grad", "[logits, hidden.grad]", '{"logits": logits, "hidden": hidden.grad}'],
)
def test_returning_only_the_grad_does_not_excuse_a_late_retain_grad(returned: str) -> None:
    source = f"""\
def features(model, x):
    hidden = model.encoder(x)
    logits = model.head(hidden)
    logits.sum().backward()
    hidden.retain_grad()
    return {returned}
"""
    assert findings(source) == [(5, "GL015", late("hidden"))]
