"""The analyses behind GL008-GL011: freed graphs, evaluation code, dtype kinds, exclusive branches."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint.analysis import Kind, ModuleAnalysis, analyze
from gradlint.analysis.facts.branches import fixed_tests, negates
from gradlint.analysis.facts.dtypes import DtypeKind

HEADER = """
import torch
import torch.nn as nn
model = nn.Linear(4, 2)
criterion = nn.MSELoss()
"""


def analysis_of(body: str) -> ModuleAnalysis:
    return analyze(cst.parse_module(HEADER + textwrap.dedent(body)))


def code(analysis: ModuleAnalysis, node: cst.CSTNode) -> str:
    return analysis.module.code_for_node(node)


@pytest.mark.parametrize(
    ("body", "reused"),
    [
        ("loss = criterion(model(x), y)\nloss.backward()\nloss.backward()", 1),
        ("loss = criterion(model(x), y)\nloss.backward(retain_graph=True)\nloss.backward()", 0),
        ("loss = criterion(model(x), y)\nloss.backward(create_graph=True)\nloss.backward()", 0),
        ("loss = criterion(model(x), y)\nloss.backward(retain_graph=keep)\nloss.backward()", 0),
        ("loss = criterion(model(x), y)\ntorch.autograd.grad(loss, [x])\nloss.backward()", 1),
        ("out = model(x)\na = out.sum()\nb = out.mean()\na.backward()\nb.backward()", 1),
        ("out = model(x)\na = out.sum()\nb = out.detach().mean()\na.backward()\nb.backward()", 0),
        ("loss = criterion(model(x), y)\nfor _ in range(3):\n    loss.backward()", 1),
        ("for x in xs:\n    loss = criterion(model(x), y)\n    loss.backward()", 0),
        ("h = None\nfor x in xs:\n    h = model(x, h)\n    h.sum().backward()", 1),
        (
            "h = None\nfor x in xs:\n    if h is not None:\n        h = h.detach()\n"
            "    h = model(x, h)\n    h.sum().backward()",
            0,
        ),
        ("if c:\n    loss = criterion(model(x), y)\n    loss.backward()\nelse:\n    loss = criterion(model(z), y)", 0),
        ("loss = criterion(model(x), y)\nif c:\n    loss.backward()\n    return\nloss.backward()", 0),
    ],
)
def test_a_backward_through_a_freed_graph_is_found(body: str, reused: int) -> None:
    wrapped = "def f(x, y, z, xs, c, keep):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    analysis = analysis_of(wrapped)
    assert len(analysis.freed_graphs.reuses()) == reused


def test_a_reuse_names_the_backward_that_freed_the_graph() -> None:
    analysis = analysis_of("loss = criterion(model(x), y)\nloss.backward()\nloss.backward()\n")
    (reuse,) = analysis.freed_graphs.reuses()
    assert reuse.kind is Kind.BACKWARD
    assert analysis.collected.order[reuse.freed_by] < analysis.collected.order[reuse.node]


@pytest.mark.parametrize(
    ("expression", "kind"),
    [
        ("torch.tensor([1, 2, 3])", DtypeKind.INTEGRAL),
        ("torch.tensor([1, 2.0])", DtypeKind.FLOATING),
        ("torch.tensor([[True], [False]])", DtypeKind.INTEGRAL),
        ("torch.tensor([])", DtypeKind.FLOATING),
        ("torch.tensor(data)", None),
        ("torch.arange(10)", DtypeKind.INTEGRAL),
        ("torch.arange(0, 1, 0.1)", DtypeKind.FLOATING),
        ("torch.arange(n)", None),
        ("torch.randint(0, 5, (3,))", DtypeKind.INTEGRAL),
        ("torch.randint(0, 5, (3,), dtype=torch.float32)", DtypeKind.FLOATING),
        ("torch.full((2,), 7)", DtypeKind.INTEGRAL),
        ("torch.zeros(3, dtype=torch.long)", DtypeKind.INTEGRAL),
        ("torch.ones(3)", DtypeKind.FLOATING),
        ("labels.long()", DtypeKind.INTEGRAL),
        ("torch.arange(5).float()", DtypeKind.FLOATING),
        ("torch.arange(5).to('cuda')", DtypeKind.INTEGRAL),
        ("torch.arange(5).to(torch.float16)", DtypeKind.FLOATING),
        ("numpy.arange(5)", None),
    ],
)
def test_dtype_kind_is_read_from_the_source(expression: str, kind: DtypeKind | None) -> None:
    analysis = analysis_of(f"value = {expression}\n")
    statement = analysis.collected.statements[-1]
    assert isinstance(statement, cst.Assign)
    assert analysis.dtypes.dtype_of(statement.value, statement) is kind


def test_a_name_takes_the_dtype_of_its_latest_assignment() -> None:
    analysis = analysis_of("idx = torch.randperm(5)\nidx = idx.float()\nidx.requires_grad_()\n")
    call = analysis.collected.calls[-1]
    assert isinstance(call.func, cst.Attribute)
    assert analysis.dtypes.dtype_of(call.func.value, analysis.statement_of(call)) is DtypeKind.FLOATING


@pytest.mark.parametrize(
    ("first", "second", "opposite"),
    [
        ("use_amp", "not use_amp", True),
        ("not self.amp", "self.amp", True),
        ("scaler is None", "scaler is not None", True),
        ("mode == 'amp'", "mode != 'amp'", True),
        ("use_amp", "use_amp", False),
        ("scaler is None", "other is not None", False),
        ("a < b", "a >= b", False),
    ],
)
def test_opposite_if_tests(first: str, second: str, opposite: bool) -> None:
    assert negates(cst.parse_expression(first), cst.parse_expression(second)) is opposite


@pytest.mark.parametrize(
    ("body", "fixed"),
    [
        # Tested twice, never changed once tested: one value for the whole call.
        (
            "args = self.args\nfor x in xs:\n    if args['fp16']:\n        a()\n    if args['fp16']:\n        b()\n",
            ["args['fp16']"],
        ),
        ("for x in xs:\n    if not self.amp:\n        a()\n    if self.amp:\n        b()\n", ["not self.amp"]),
        (
            "args['lr'] = 1\nfor x in xs:\n    if args['fp16']:\n        a()\n    if args['fp16']:\n        b()\n",
            ["args['fp16']"],
        ),
        # Changed in the loop, or after the first test, or read through a call: not fixed.
        ("for x in xs:\n    if warm:\n        a()\n    warm = x > 0\n    if warm:\n        b()\n", []),
        ("if amp:\n    a()\namp = False\nif amp:\n    b()\n", []),
        ("if amp():\n    a()\nif amp():\n    b()\n", []),
        ("for x in xs:\n    if args['fp16']:\n        args['fp16'] = False\n    if args['fp16']:\n        b()\n", []),
        # Tested once: nothing to pair.
        ("if amp:\n    a()\n", []),
    ],
)
def test_conditions_tested_twice_and_never_changed_are_fixed(body: str, fixed: list[str]) -> None:
    analysis = analyze(cst.parse_module("def train(self, xs, amp, warm, args):\n" + textwrap.indent(body, "    ")))
    function = analysis.collected.functions[0]
    assert [cst.Module([]).code_for_node(test) for test in fixed_tests(analysis.collected, function)] == fixed


@pytest.mark.parametrize(
    ("body", "reported"),
    [
        ("model.eval()\nfor x in xs:\n    out = model(x)\n", ["model(x)"]),
        ("model.eval()\nwith torch.no_grad():\n    for x in xs:\n        out = model(x)\n", []),
        ("model.eval()\nmodel.train()\nfor x in xs:\n    out = model(x)\n", []),
        ("model.eval()\nfor x in xs:\n    x.requires_grad_()\n    out = model(x)\n", []),
        ("model.eval()\nfor x in xs:\n    model(x).sum().backward()\n", []),
        ("model.eval()\nfor x in xs:\n    a = model(x)\n    b = model(x + 1)\n", ["model(x)"]),
        ("model.eval()\nnet = Net().to('cpu')\nfor x in xs:\n    n = Net()\n", []),
    ],
)
def test_evaluation_loops_report_their_first_forward_call(body: str, reported: list[str]) -> None:
    analysis = analysis_of(body)
    found = analysis.evaluation.graph_building_forwards()
    assert [code(analysis, call) for call in found] == reported


@pytest.mark.parametrize(
    ("name", "body", "evaluates"),
    [
        ("predict", "for x in test_loader:\n    out.append(model(x))", True),
        ("predict", "for x in range(3):\n    out.append(model(x))", False),
        ("train_epoch", "for x in loader:\n    out.append(model(x))", False),
        ("predict", "for x in loader:\n    optimizer.zero_grad()\n    out.append(model(x))", False),
        ("predict", "for x in loader:\n    out.append(model(x))\nreturn criterion(model(x), x)", False),
    ],
)
def test_a_function_is_evaluation_code_by_its_shape(name: str, body: str, evaluates: bool) -> None:
    analysis = analysis_of(f"def {name}(model, loader, test_loader, out):\n" + textwrap.indent(body, "    "))
    assert bool(analysis.evaluation.graph_building_forwards()) is evaluates
