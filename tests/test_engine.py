"""The engine API and the shared analysis layer that rules query."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from test_flake8_plugin import LOOP as NOQA_LOOP  # one leak, with a comment slot

from gradlint import Config, Diagnostic, lint_source
from gradlint.analysis import Kind, Role, analyze
from gradlint.analysis.syntax.names import dotted_name
from gradlint.decoding import source_encoding
from gradlint.engine import find_targets, lint_targets

LEAK = """\
import torch
total = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss
"""


def test_lint_source_accepts_text_and_bytes() -> None:
    from_text = lint_source(LEAK, "train.py")
    assert from_text == lint_source(LEAK.encode(), "train.py")
    [diagnostic] = from_text
    assert isinstance(diagnostic, Diagnostic)
    assert (diagnostic.path, diagnostic.line, diagnostic.column, diagnostic.code) == ("train.py", 8, 5, "GL001")
    assert (diagnostic.end_line, diagnostic.end_column) == (8, 18)
    assert diagnostic.name == "loss-accumulation"


def test_pep263_encodings_and_bom_are_honoured() -> None:
    latin = ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + LEAK).encode("latin-1")
    bom = b"\xef\xbb\xbf" + LEAK.encode()
    assert [d.line for d in lint_source(latin, "latin.py")] == [10]
    assert [d.line for d in lint_source(bom, "bom.py")] == [8]


def test_syntax_error_is_gl000_with_position() -> None:
    [diagnostic] = lint_source("import torch\nloss.backward(\n", "broken.py")
    assert diagnostic.code == "GL000" and diagnostic.line >= 2 and "syntax error" in diagnostic.message


@pytest.mark.parametrize(
    ("tail", "line", "column", "message"),
    [
        ("print(loss\n", 9, 6, "'(' was never closed"),
        ("x = [1, 2\ny = 3\n", 9, 5, "'[' was never closed"),
        ("def f(:\n    pass\n", 9, 7, "invalid syntax"),
        ("s = 'caf\u00e9' + )\n", 9, 14, "unmatched ')'"),  # columns count characters, not bytes
        ("print 'hi'\n", 9, 1, "Missing parentheses in call to 'print'. Did you mean print(...)?"),
        ("if x:\npass\n", 10, 1, "expected an indented block after 'if' statement on line 9"),
    ],
)
def test_syntax_error_says_what_cpython_says_where_it_says_it(tail: str, line: int, column: int, message: str) -> None:
    [diagnostic] = lint_source(LEAK + tail, "broken.py")
    assert (diagnostic.code, diagnostic.line, diagnostic.column) == ("GL000", line, column)
    assert diagnostic.message == f"syntax error: {message}"


def test_syntax_check_parses_and_never_runs_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = f"import torch\nopen({str(marker)!r}, 'w')\nloss.backward(\n"
    [diagnostic] = lint_source(source, "broken.py")
    assert diagnostic.message == "syntax error: '(' was never closed" and not marker.exists()


def test_code_only_libcst_rejects_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(cst.ParserSyntaxError) as rejected:
        cst.parse_module("loss.backward(\n")

    def reject(source: object) -> cst.Module:
        raise rejected.value

    monkeypatch.setattr(cst, "parse_module", reject)
    [diagnostic] = lint_source(LEAK, "train.py")
    assert diagnostic.code == "GL000"
    assert diagnostic.message.startswith("cannot parse: LibCST does not support this code, which CPython accepts: ")


@pytest.mark.parametrize("codec", ["future_fstrings", "klingon"])
def test_a_cookie_naming_a_codec_not_installed_reads_utf8_and_says_so(codec: str) -> None:
    # Python refuses the file unless a package registers the codec: reported, and linted as UTF-8 all the same.
    source = f"# -*- coding: {codec} -*-\n# caf\u00e9\n".encode() + LEAK.encode()
    unread, leak = lint_source(source, "old.py")
    assert (unread.code, unread.line, leak.code, leak.line) == ("GL000", 1, "GL001", 10)
    assert unread.message == (
        f"unknown encoding: {codec}; Python cannot read this file unless a package registers it (linted as UTF-8)"
    )
    assert source_encoding(source) == "utf-8"
    # The same without the parse (no rule could fire), and nothing for a file torch does not reach.
    assert [d.code for d in lint_source(f"# coding: {codec}\nimport torch\n".encode(), "old.py")] == ["GL000"]
    assert lint_source(f"# coding: {codec}\nimport numpy\n".encode(), "old.py") == []
    # After a line of code a cookie is no cookie (PEP 263): Python reads the file, nothing to report.
    assert lint_source(f"import torch\n# coding: {codec}\n".encode(), "old.py") == []


def test_a_cookie_naming_a_codec_not_installed_on_bytes_not_utf8_is_gl000() -> None:
    source = b"# -*- coding: future_fstrings -*-\n# caf\xe9\n" + LEAK.encode()
    [diagnostic] = lint_source(source, "old.py")
    assert (diagnostic.code, diagnostic.message) == ("GL000", "cannot parse: unknown encoding: future_fstrings")
    with pytest.raises(SyntaxError):
        source_encoding(source)
    # Without the parse, the same answer (no rule could fire on this file).
    assert lint_source(b"# -*- coding: future_fstrings -*-\n# caf\xe9\n", "old.py")[0].code == "GL000"


def test_find_targets_lists_each_file_once_and_the_paths_that_hold_none(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "b.py").write_text("x = 1\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello\n")
    paths = [tmp_path / "pkg", tmp_path / "pkg" / "a.py", tmp_path / "notes", tmp_path / "build" / "b.py"]
    targets = find_targets(paths, Config(root=tmp_path))
    assert targets.files == (tmp_path / "pkg" / "a.py",)
    assert targets.empty == (tmp_path / "notes", tmp_path / "build" / "b.py")
    assert targets.checked == 1
    missing = find_targets([tmp_path / "gone.py"], Config(root=tmp_path))
    assert (missing.checked, missing.empty) == (0, ())  # reported as GL000, not as empty
    assert lint_targets(missing, Config(root=tmp_path))[0].code == "GL000"


def test_config_select_filters() -> None:
    assert lint_source(LEAK, "train.py", Config(select=("GL002",))) == []


def test_failing_rule_becomes_gl999_and_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradlint.rules.missing_zero_grad import MissingZeroGrad

    def explode(self: object, step: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(MissingZeroGrad, "check_step", explode)
    codes = {d.code: d.message for d in lint_source(LEAK, "train.py")}
    assert "GL001" in codes
    assert codes["GL999"].startswith("internal error in GL002, please report: ValueError: boom")


def parse(source: str) -> tuple[cst.Module, object]:
    module = cst.parse_module(source)
    return module, analyze(module)


def test_roles_from_constructors_annotations_and_names() -> None:
    module = cst.parse_module(
        "import torch\nfrom torch import optim\nimport argparse\n"
        "opt = argparse.ArgumentParser().parse_args()\n"
        "sgd = optim.SGD(params)\nscaler = torch.cuda.amp.GradScaler()\n"
        "crit = torch.nn.CrossEntropyLoss()\nnet = torch.nn.Linear(2, 2).to('cuda')\n"
        "sched = optim.lr_scheduler.StepLR(sgd, 1)\n"
        "def f(o: torch.optim.Optimizer, optimizer_g, g_optimizer, env): pass\n"
    )
    roles = analyze(module).roles
    role = {name: roles.role(cst.parse_expression(name)) for name in (
        "opt", "sgd", "scaler", "crit", "net", "sched", "o", "optimizer_g", "g_optimizer", "env"
    )}  # fmt: skip
    assert role == {
        "opt": Role.OTHER,
        "sgd": Role.OPTIMIZER,
        "scaler": Role.SCALER,
        "crit": Role.LOSS_FN,
        "net": Role.MODEL,
        "sched": None,
        "o": Role.OPTIMIZER,
        "optimizer_g": Role.OPTIMIZER,
        "g_optimizer": Role.OPTIMIZER,
        "env": None,
    }


def test_training_steps_inline_same_module_helpers() -> None:
    source = """\
import torch
class T:
    def clear(self):
        self.optimizer.zero_grad()
    def step(self, batch):
        self.scaler.scale(self.loss(batch)).backward()
        self.scaler.step(self.optimizer)
    def fit(self):
        for batch in self.loader:
            self.clear()
            self.step(batch)
"""
    analysis = analyze(cst.parse_module(source))
    [step] = analysis.training_steps
    assert isinstance(step.node, cst.For)
    assert [event.kind for event in step.events] == [Kind.CLEAR, Kind.SCALE, Kind.BACKWARD, Kind.STEP]
    backward = step.of_kind(Kind.BACKWARD)[0]
    assert backward.via_scaler and dotted_name(step.of_kind(Kind.STEP)[0].value) == "self.optimizer"


def test_grad_mode_contexts() -> None:
    source = """\
import torch
@torch.no_grad()
def evaluate():
    a = model(x)
with torch.no_grad():
    b = model(x)
    with torch.enable_grad():
        c = model(x)
with torch.set_grad_enabled(phase == "train"):
    d = model(x)
e = model(x)
"""
    module = cst.parse_module(source)
    analysis = analyze(module)
    modes = {
        statement.targets[0].target.value: analysis.context(statement).grad_mode.value
        for statement in analysis.collected.statements
        if isinstance(statement, cst.Assign)
    }
    assert modes == {"a": "disabled", "b": "disabled", "c": "enabled", "d": "unknown", "e": "enabled"}


def test_grad_mode_is_unknown_under_decorators_nobody_can_read_and_in_callbacks() -> None:
    source = """\
import functools
import torch
from tools import smart_inference_mode


def plain(fn):
    return fn


@smart_inference_mode()
def a_():
    a = model(x)


@plain
@functools.wraps(f)
def b_():
    b = model(x)


def outer(quantize):
    def callback(m):
        c = m(x)

    def helper():
        d = model(x)

    quantize(model, callback)
    return helper()
"""
    analysis = analyze(cst.parse_module(source))
    modes = {
        statement.targets[0].target.value: analysis.context(statement).grad_mode.value
        for statement in analysis.collected.statements
        if isinstance(statement, cst.Assign)
    }
    assert modes == {"a": "unknown", "b": "enabled", "c": "unknown", "d": "enabled"}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("out", True),
        ("loss", True),
        ("loss * 2 + out.mean()", True),
        ("outputs.loss", True),
        ("loss.item()", False),
        ("loss.detach()", False),
        ("float(loss)", False),
        ("out.argmax(1)", False),
        ("(out.argmax(1) == y).sum()", False),
        ("out.detach().cpu().numpy()", False),
        ("evaluated", False),
        ("helper_float()", False),
        ("helper_tensor()", True),
        ("returned", True),
        ("unknown_value", False),
        ("sum([loss, loss])", True),
        ("np.sum(loss * 2)", False),  # numpy computes arrays: no graph, whatever it is handed
        ("np.log(probabilities)", False),
        ("scipy.special.softmax(scores)", False),
    ],
)
def test_grad_carrying_values(expression: str, expected: bool) -> None:
    source = f"""\
import numpy as np
import scipy.special
import torch
def helper_float():
    return criterion(model(x), y).item()
def helper_tensor():
    return criterion(model(x), y)
out = model(x)
outputs = model(**batch)
loss = criterion(out, y)
with torch.no_grad():
    evaluated = model(x)
returned = helper_tensor()
probabilities = torch.softmax(model(x), -1)
scores = model(x)
probe = {expression}
"""
    module = cst.parse_module(source)
    analysis = analyze(module)
    probe = analysis.collected.statements[-1]
    assert isinstance(probe, cst.Assign)
    assert analysis.is_grad(probe.value, probe) is expected


def test_mxnet_files_are_out_of_scope() -> None:
    source = "from mxnet import autograd\nfor x in data:\n    loss = net(x)\n    loss.backward()\n    trainer.step(1)\n"
    assert lint_source(source, "mx.py") == []


@pytest.mark.parametrize(
    ("comment", "silenced"),
    [
        ("  # noqa", True),
        ("  # noqa: GL001", True),
        ("  # noqa: GL00", True),  # codes are prefixes, as in flake8
        ("  # noqa: GL0", True),
        ("  # noqa: E501,GL00", True),
        ("  # noqa: GL01", False),  # not a prefix of GL001
        ("  # noqa: GL0011", False),
        ("  # noqa: GL002", False),
    ],
)
def test_noqa_codes_are_matched_as_prefixes(comment: str, silenced: bool) -> None:
    found = lint_source(NOQA_LOOP.format(comment=comment), "train.py")
    assert [d.code for d in found] == ([] if silenced else ["GL001"])


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_noqa_is_read_on_the_line_of_the_finding_whatever_the_line_ends(newline: str) -> None:
    # LibCST counts a line at each of the three line ends; so must the noqa filter (flake8 does).
    lines = [
        "import torch",
        "ids = torch.tensor([3, 1, 2], requires_grad=True)  # noqa: GL010",
        "idx = torch.tensor([0, 2], requires_grad=True)",
        "print(ids, idx)  # noqa",
    ]
    found = lint_source(newline.join(lines) + newline, "train.py")
    assert [(d.code, d.line) for d in found] == [("GL010", 3)]


CLIP_AFTER_STEP = """\
import torch

for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


def test_gl007_tells_a_clip_after_the_step_from_one_before_the_next_backward() -> None:
    # The gradients were cleared after the step: the clip runs before the next backward
    # computes any; without the clear, it clips gradients the step already applied.
    [cleared] = lint_source(CLIP_AFTER_STEP, "train.py")
    assert cleared.code == "GL007"
    assert cleared.message.startswith("gradients are clipped before `loss.backward()`")
    found = lint_source(CLIP_AFTER_STEP.replace("    optimizer.zero_grad()\n", ""), "train.py")
    [uncleared] = [d for d in found if d.code == "GL007"]
    assert uncleared.message.startswith("gradients are clipped after `optimizer.step()`")


# Two definitions of one term, on the two paths of an `if`: whichever the analysis takes first decides the line.
BRANCHED_TERMS = """\
import torch


def train(generator, flow_net, criterion, optimizer, loader, lite):
    for frames, target in loader:
        fake = generator(frames)
        if lite:
            flow = flow_net.estimate(fake).detach()
        else:
            flow = (flow_net(fake * 255.0) / 255.0).detach()
        loss = criterion(fake, target) + criterion(flow, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_findings_do_not_depend_on_the_hash_seed_or_on_memory_addresses(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(BRANCHED_TERMS)
    root = Path(__file__).parents[1]
    command = [sys.executable, "-m", "gradlint", "--no-cache", "-q", "--select", "GL019", str(path)]
    outputs = {
        subprocess.run(
            command, cwd=root, env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True, text=True
        ).stdout
        for seed in range(6)
    }
    assert len(outputs) == 1 and ":8:20: GL019" in outputs.pop()  # the first definition, in source order
