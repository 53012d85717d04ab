"""Autofix: each fix, formatting kept, idempotence, and writes that never lose code."""

from __future__ import annotations

import os
import stat
import textwrap
import time
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

import gradlint.fix
from gradlint import Config, lint_source
from gradlint.cli import main
from gradlint.fix import apply_edits, fix_file, fix_source, write_atomically
from gradlint.rule import Diagnostic, Edit, Fix

LOOP = """\
import torch

def train(model, loader, optimizer, criterion):
    total = 0
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss  # running sum, for the log
        losses.append(loss)
    print("epoch loss", total)
    return losses
"""
FIXED_LOOP = LOOP.replace("total += loss ", "total += loss.item() ").replace(
    "losses.append(loss)", "losses.append(loss.detach())"
)


def fixed(source: str, unsafe: bool = False) -> str:
    return fix_source(textwrap.dedent(source), "train.py", Config(), unsafe).text


def test_gl001_sum_of_a_backpropagated_loss_into_a_number_becomes_item() -> None:
    result = fix_source(LOOP, "train.py", Config())
    assert result.text == FIXED_LOOP  # the comment and every other byte kept
    assert result.applied == 2
    assert result.remaining == []


@pytest.mark.parametrize(
    "use",
    ['print("epoch loss", total.cpu())', "history.append(total)", "return total", 'print(f"{total}"); save(total)'],
)
def test_gl001_accumulator_read_other_than_by_logging_gets_detach_not_item(use: str) -> None:
    source = LOOP.replace('print("epoch loss", total)', use)
    assert "total += loss.detach()  # running sum" in fixed(source)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("datapoint_count", "a count the forward helper returned beside the loss"),
        ("loss.item() / n", "already a float"),
        ("self.compute_loss(x)", "a value from a method of unknown type"),
        ("outputs[0]", "an element of a structure of unknown type"),
    ],
)
def test_gl001_no_fix_without_proof_that_the_value_is_a_tensor(value: str, why: str) -> None:
    source = textwrap.dedent(
        f"""\
        import torch

        def train(model, loader, optimizer, n):
            total = 0
            for x, y in loader:
                optimizer.zero_grad()
                loss, datapoint_count = model.forward_loss(x, y)
                outputs = model(x)
                loss.backward()
                optimizer.step()
                total += {value}
            print(total)
        """
    )
    for diagnostic in lint_source(source, "train.py"):
        assert diagnostic.fix is None, why
    assert fixed(source, unsafe=True) == source


@pytest.mark.parametrize(
    ("value", "method"),
    [
        ("torch.nn.functional.mse_loss(model(x), y)", "item"),  # a reduced loss: one element
        ('torch.nn.functional.mse_loss(model(x), y, reduction="none")', "detach"),  # one per sample
        ("torch.stack([loss, loss])", "detach"),
    ],
)
def test_gl001_fix_on_values_proven_tensors_by_the_torch_function_that_made_them(value: str, method: str) -> None:
    source = LOOP.replace("total += loss ", f"total += {value} ")
    wrapped = f"({value})" if " " in value and not value.endswith(")") else value
    assert f"total += {wrapped}.{method}() " in fixed(source)


def test_gl001_compound_value_is_parenthesized() -> None:
    source = LOOP.replace("total += loss ", "total += loss * 2 ")
    assert "total += (loss * 2).detach()" in fixed(source)


def test_gl001_self_referencing_assignment_is_fixed_in_place() -> None:
    source = LOOP.replace("total += loss ", "total = total + loss ")
    assert "total = total + loss.detach()  # running sum" in fixed(source)


def test_fixed_file_lints_clean_and_fixing_twice_changes_nothing() -> None:
    once = fixed(LOOP)
    assert lint_source(once, "train.py") == []
    again = fix_source(once, "train.py", Config())
    assert (again.text, again.applied) == (once, 0)


def test_unsafe_fixes_are_applied_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    unsafe = Fix("rename", (Edit(1, 1, 1, 2, "y"),), safe=False)
    finding = Diagnostic("t.py", 1, 1, "GL001", 1, 2, "loss-accumulation", "m", unsafe)
    monkeypatch.setattr(
        gradlint.fix, "lint_source", lambda data, *args, **kwargs: [finding] if data.startswith(b"x") else []
    )
    assert fix_source("x = 1\n").text == "x = 1\n"
    assert fix_source("x = 1\n", unsafe=True).text == "y = 1\n"


def test_a_fix_whose_result_does_not_parse_is_never_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = Fix("break", (Edit(1, 1, 1, 1, "("),))
    good = Fix("rename", (Edit(2, 1, 2, 2, "z"),))
    findings = [
        Diagnostic("t.py", line, 1, "GL001", line, 2, "loss-accumulation", "m", fix)
        for line, fix in ((1, broken), (2, good))
    ]
    monkeypatch.setattr(gradlint.fix, "lint_source", lambda data, *args, **kwargs: findings if b"y" in data else [])
    assert fix_source("x = 1\ny = 2\n").text == "x = 1\nz = 2\n"


def test_overlapping_fixes_wait_for_the_next_pass() -> None:
    edits = [Edit(1, 1, 1, 2, "a"), Edit(1, 1, 1, 1, "b"), Edit(1, 3, 2, 1, "c")]
    assert apply_edits("xy\nz", [edits[0], edits[2]]) == "aycz"
    one, two = (
        Diagnostic("t.py", 1, 1, "GL001", 1, 2, "loss-accumulation", "m", Fix(name, (edit,)))
        for name, edit in (("one", edits[0]), ("two", edits[1]))
    )
    assert gradlint.fix._non_overlapping([one, two], "xy\n") == [one]


@pytest.mark.parametrize(
    ("prefix", "newline", "encoding"),
    [
        (b"", "\n", "utf-8"),
        (b"\xef\xbb\xbf", "\n", "utf-8"),  # BOM
        (b"", "\r\n", "utf-8"),
        (b"", "\r", "utf-8"),
        (b"# -*- coding: latin-1 -*-\n", "\n", "latin-1"),
    ],
    ids=["plain", "bom", "crlf", "cr", "latin-1"],
)
def test_fix_keeps_bom_line_endings_encoding_and_mode(
    tmp_path: Path, prefix: bytes, newline: str, encoding: str
) -> None:
    source = LOOP.replace("# running sum", "# somme courante: é")
    path = tmp_path / "train.py"
    path.write_bytes(prefix + source.replace("\n", newline).encode(encoding))
    path.chmod(0o750)
    result = fix_file(path, Config())
    assert result.applied == 2 and result.skipped is None
    expected = FIXED_LOOP.replace("# running sum", "# somme courante: é")
    assert path.read_bytes() == prefix + expected.replace("\n", newline).encode(encoding)
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no temporary left behind


def test_fix_through_a_symlink_rewrites_the_target(tmp_path: Path) -> None:
    target = tmp_path / "real.py"
    target.write_text(LOOP)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    fix_file(link, Config())
    assert link.is_symlink() and target.read_text() == FIXED_LOOP


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_an_interrupted_write_leaves_the_original_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "train.py"
    path.write_text(LOOP)

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    result = fix_file(path, Config())
    assert result.skipped == "cannot write: No space left on device"
    assert path.read_text() == LOOP
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]
    assert {d.code for d in result.remaining} == {"GL001"}


def test_a_file_changed_on_disk_while_fixing_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.py"
    path.write_text(LOOP)
    original_fix_source = gradlint.fix.fix_source

    def edit_meanwhile(*args: object, **kwargs: object) -> gradlint.fix.FixedSource:
        path.write_text(LOOP + "# edited in the editor\n")
        return original_fix_source(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gradlint.fix, "fix_source", edit_meanwhile)
    result = fix_file(path, Config())
    assert result.skipped == "the file changed on disk since it was read; not written"
    assert path.read_text() == LOOP + "# edited in the editor\n"


def test_write_atomically_refuses_when_the_bytes_differ(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_bytes(b"x = 1\n")
    assert write_atomically(path, b"x = 2\n", b"x = 0\n") is not None
    assert write_atomically(path, b"x = 2\n", b"x = 1\n") is None
    assert path.read_bytes() == b"x = 2\n"


def test_cli_diff_shows_the_change_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(LOOP)
    result = CliRunner().invoke(main, ["check", "--diff", str(path)])
    assert result.exit_code == 1
    assert "-        total += loss  # running sum, for the log\n" in result.output
    assert "+        losses.append(loss.detach())\n" in result.output
    assert path.read_text() == LOOP


def test_cli_fix_writes_reports_counts_and_a_second_run_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(LOOP)
    assert "Found 2 problems in 1 file; 2 fixable with --fix." in CliRunner().invoke(main, [str(path)]).output
    first = CliRunner().invoke(main, ["check", "--fix", str(path)])
    assert first.exit_code == 0
    assert "Fixed 2 problems." in first.output
    assert path.read_text() == FIXED_LOOP
    second = CliRunner().invoke(main, ["check", "--diff", str(path)])
    assert second.exit_code == 0
    assert path.read_text() == FIXED_LOOP


GL003_UPDATE = """\
import torch

w = torch.randn(3, requires_grad=True)
for step in range(10):
    loss = (w * 2).sum()
    loss.backward()
    # plain SGD
    w -= 0.1 * w.grad  # the update
    w.grad = None
"""


def test_gl003_in_place_update_is_wrapped_in_no_grad_keeping_comments() -> None:
    expected = GL003_UPDATE.replace(
        "    w -= 0.1 * w.grad  # the update\n", "    with torch.no_grad():\n        w -= 0.1 * w.grad  # the update\n"
    )
    assert fixed(GL003_UPDATE) == expected


def test_gl003_uses_the_name_torch_is_imported_under() -> None:
    source = GL003_UPDATE.replace("import torch\n", "import torch as th\n").replace("torch.randn", "th.randn")
    assert "    with th.no_grad():\n        w -= 0.1 * w.grad" in fixed(source)


def test_gl003_rebinding_is_updated_in_place_only_as_an_unsafe_fix() -> None:
    # The rebinding made a tensor without a gradient: the update in place drops the gradient after it.
    source = GL003_UPDATE.replace("w -= 0.1 * w.grad", "w = w - 0.1 * w.grad").replace("    w.grad = None\n", "")
    assert fixed(source) == source
    expected = source.replace(
        "    w = w - 0.1 * w.grad  # the update\n",
        "    with torch.no_grad():\n        w -= 0.1 * w.grad\n        w.grad = None  # the update\n",
    )
    assert fixed(source, unsafe=True) == expected


GL007_AMP = """\
import torch

scaler = torch.amp.GradScaler()
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""


def test_gl007_unscale_is_inserted_before_the_clip() -> None:
    expected = GL007_AMP.replace("    torch.nn.utils", "    scaler.unscale_(optimizer)\n    torch.nn.utils")
    assert fixed(GL007_AMP) == expected


def test_gl007_no_fix_when_unscale_already_follows_the_clip() -> None:
    source = GL007_AMP.replace("    scaler.step(", "    scaler.unscale_(optimizer)\n    scaler.step(")
    assert fixed(source) == source


FIXTURES = sorted((Path(__file__).parent.parent / "fixtures").glob("*/*.py"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_fixing_any_fixture_yields_code_that_parses_and_needs_no_second_pass(path: Path) -> None:
    once = fix_source(path.read_text(), str(path), Config(), unsafe=True)
    cst.parse_module(once.text)
    again = fix_source(once.text, str(path), Config(), unsafe=True)
    assert (again.text, again.applied) == (once.text, 0)
    assert len(once.remaining) <= len(lint_source(path.read_text(), str(path)))


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("source", [GL003_UPDATE, GL007_AMP], ids=["GL003", "GL007"])
def test_inserted_lines_use_the_file_line_ending(source: str, newline: str) -> None:
    assert fixed(source.replace("\n", newline)) == fixed(source).replace("\n", newline)


GL005_RETAIN = """\
import torch

for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward(retain_graph=True)  # "fixes" backward-twice
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("loss.backward(retain_graph=True)", "loss.backward()"),
        ("loss.backward(None, retain_graph=True)", "loss.backward(None)"),
        ("loss.backward(retain_graph=True, inputs=None)", "loss.backward(inputs=None)"),
        ("loss.backward(\n        None,\n        retain_graph=True,\n    )", "loss.backward(\n        None,\n    )"),
    ],
    ids=["only", "last", "first", "trailing-comma"],
)
def test_gl005_retain_graph_is_removed_with_tidy_commas(call: str, expected: str) -> None:
    source = GL005_RETAIN.replace("loss.backward(retain_graph=True)", call)
    assert fixed(source) == GL005_RETAIN.replace("loss.backward(retain_graph=True)", expected)


GL009_EVAL = """\
import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    # one pass over the validation set
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    return correct
"""


def test_gl009_loop_is_wrapped_in_no_grad_only_as_an_unsafe_fix() -> None:
    assert fixed(GL009_EVAL) == GL009_EVAL
    assert fixed(GL009_EVAL, unsafe=True) == GL009_EVAL.replace(
        "    for x, y in loader:\n        correct",
        "    with torch.no_grad():\n        for x, y in loader:\n            correct",
    )


def test_wrapping_shifts_code_lines_but_never_the_text_of_a_multi_line_string() -> None:
    loop = (
        "    for x, y in loader:\n"
        "        logits = model(\n"
        "            x,\n"
        "        )\n"
        '        note = """keep\n'
        'this text"""\n'
        "\n"
        "        correct += (logits.argmax(1) == y).sum().item()\n"
    )
    wrapped = (
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            logits = model(\n"
        "                x,\n"
        "            )\n"
        '            note = """keep\n'
        'this text"""\n'
        "\n"
        "            correct += (logits.argmax(1) == y).sum().item()\n"
    )
    source = GL009_EVAL.replace(GL009_EVAL[GL009_EVAL.index("    for") : GL009_EVAL.index("    return")], loop)
    assert fixed(source, unsafe=True) == source.replace(loop, wrapped)


def test_fixes_cost_the_size_of_the_node_not_of_the_module() -> None:
    # 100 training functions with two findings each: one module walk per fix would take minutes.
    functions = [LOOP.replace("import torch\n", "").replace("def train(", f"def train{i}(") for i in range(100)]
    source = "import torch\n" + "\n".join(functions)
    started = time.perf_counter()
    result = fix_source(source, "big.py", Config())
    assert (result.applied, result.remaining) == (200, [])
    assert time.perf_counter() - started < 30


def test_gl002_clear_is_inserted_before_backward_only_as_an_unsafe_fix() -> None:
    source = LOOP.replace("        optimizer.zero_grad()\n", "").replace("        losses.append(loss)\n", "")
    source = source.replace("total += loss  # running sum, for the log", "total += loss.item()")
    assert fixed(source, unsafe=True) == source  # `optimizer` only looks like one: no fix
    source = source.replace("optimizer, criterion):", "optimizer: torch.optim.Optimizer, criterion):")
    assert fixed(source) == source
    assert fixed(source, unsafe=True) == source.replace(
        "        loss.backward()", "        optimizer.zero_grad()\n        loss.backward()"
    )


GL011_AMP = GL007_AMP.replace("    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "").replace(
    "    scaler.step(optimizer)\n", "    scaler.step(optimizer)\n    optimizer.step()  # twice\n"
)


def test_gl011_the_direct_step_is_removed() -> None:
    assert fixed(GL011_AMP) == GL011_AMP.replace("    optimizer.step()  # twice\n", "")


def test_gl011_no_fix_when_the_direct_step_is_alone_in_its_block() -> None:
    source = GL011_AMP.replace("    optimizer.step()  # twice\n", "    if log:\n        optimizer.step()\n")
    assert [(d.code, d.fix) for d in lint_source(source, "train.py")] == [("GL011", None)]


def test_line_mapping_follows_insertions_removals_and_replacements() -> None:
    lines = gradlint.fix.line_mapping(
        [
            Edit(2, 5, 2, 5, "with x:\n        "),  # a header inserted before line 2: new lines 2-3 are old 2
            Edit(4, 1, 6, 1, ""),  # old lines 4-5 removed: old 6 is new 4
            Edit(8, 3, 8, 7, "y.item()"),  # replaced within old line 8
        ]
    )
    assert [lines(n) for n in range(1, 9)] == [1, 2, 2, 3, 6, 7, 8, 9]


def test_a_fix_that_brings_a_new_finding_is_dropped_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    trading = Fix("trade", (Edit(1, 1, 1, 2, "w"),))
    good = Fix("rename", (Edit(2, 1, 2, 2, "z"),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        found = []
        if data.startswith(b"x"):
            found.append(Diagnostic("t.py", 1, 1, "GL001", 1, 2, "loss-accumulation", "m", trading))
        if b"y" in data:
            found.append(Diagnostic("t.py", 2, 1, "GL001", 2, 2, "loss-accumulation", "m", good))
        if data.startswith(b"w"):
            found.append(Diagnostic("t.py", 1, 1, "GL013", 1, 2, "backward-under-no-grad", "n"))
        return found

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("x = 1\ny = 2\n")
    assert result.text == "x = 1\nz = 2\n"
    assert result.applied == 1
    [rejected] = result.rejected
    assert (rejected.diagnostic.code, rejected.diagnostic.line) == ("GL001", 1)
    assert "new finding: GL013 at line 1" in rejected.reason
    assert [(d.code, d.line) for d in result.remaining] == [("GL001", 1)]


def test_a_finding_that_moves_with_the_code_is_not_new(monkeypatch: pytest.MonkeyPatch) -> None:
    insert = Fix("insert", (Edit(1, 1, 1, 1, "pass\n"),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        lines = data.decode().splitlines()
        found = [Diagnostic("t.py", lines.index("y = 2") + 1, 1, "GL002", 1, 2, "missing-zero-grad", "m")]
        if not data.startswith(b"pass"):
            found.append(Diagnostic("t.py", 1, 1, "GL001", 1, 2, "loss-accumulation", "m", insert))
        return found

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("x = 1\ny = 2\n")
    assert result.text == "pass\nx = 1\ny = 2\n"
    assert result.rejected == ()


EPOCHS = """\
import torch

def fit(model, train_loader, val_x, val_y, optimizer, criterion, agent):
    for epoch in range(10):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        preds = model(val_x)  # the epoch's evaluation, in the epoch loop itself
        accuracy = (preds.argmax(1) == val_y).float().mean()
        print(epoch, accuracy.item())
"""


def test_gl009_wraps_only_the_evaluation_block_after_eval_never_the_training_loop_around_it() -> None:
    [finding] = lint_source(EPOCHS, "train.py")
    assert finding.code == "GL009"
    result = fix_source(EPOCHS, "train.py", Config(), unsafe=True)
    assert result.text == EPOCHS.replace(
        "        preds = model(val_x)  # the epoch's evaluation, in the epoch loop itself\n"
        "        accuracy = (preds.argmax(1) == val_y).float().mean()\n"
        "        print(epoch, accuracy.item())\n",
        "        with torch.no_grad():\n"
        "            preds = model(val_x)  # the epoch's evaluation, in the epoch loop itself\n"
        "            accuracy = (preds.argmax(1) == val_y).float().mean()\n"
        "            print(epoch, accuracy.item())\n",
    )
    assert result.remaining == [] and result.rejected == ()


def test_gl009_wraps_the_validation_loop_and_stops_at_model_train() -> None:
    source = EPOCHS.replace(
        "        preds = model(val_x)  # the epoch's evaluation, in the epoch loop itself\n",
        "        for vx in val_x:\n            preds = model(vx)\n",
    )
    source = source.replace("accuracy.item())\n", "accuracy.item())\n        model.train()\n")
    result = fix_source(source, "train.py", Config(), unsafe=True)
    wrapped = "        with torch.no_grad():\n            for vx in val_x:\n                preds = model(vx)\n"
    assert wrapped in result.text
    assert "        accuracy = (preds" in result.text  # after the loop: left as it was
    assert result.remaining == []


@pytest.mark.parametrize("call", ["agent.update(preds)", "train_step(model, preds)", "preds.requires_grad_()"])
def test_gl009_no_fix_when_the_evaluation_code_calls_what_might_need_gradients(call: str) -> None:
    source = EPOCHS.replace("        print(epoch, accuracy.item())\n", f"        {call}\n")
    for diagnostic in lint_source(source, "train.py"):
        assert diagnostic.fix is None
    assert fixed(source, unsafe=True) == source


def test_a_gl009_fix_that_would_put_training_under_no_grad_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # The old fix wrapped the innermost loop around the forward: here, the whole epoch loop.
    from gradlint.analysis.training.evaluation import Evaluation

    def whole_loop(self: Evaluation, call: cst.Call) -> tuple[cst.CSTNode, ...]:
        return (self.collected.contexts[call].loops[0],)

    monkeypatch.setattr(Evaluation, "no_grad_target", whole_loop)
    result = fix_source(EPOCHS, "train.py", Config(), unsafe=True)
    assert result.text == EPOCHS
    [rejected] = result.rejected
    assert rejected.diagnostic.code == "GL009"
    assert "new finding: GL013" in rejected.reason


def test_cli_says_which_fix_was_dropped_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradlint.analysis.training.evaluation import Evaluation

    monkeypatch.setattr(Evaluation, "no_grad_target", lambda self, call: (self.collected.contexts[call].loops[0],))
    script = tmp_path / "train.py"
    script.write_text(EPOCHS)
    result = CliRunner().invoke(main, ["--fix", "--unsafe-fixes", "--no-cache", "-j1", str(script)])
    assert script.read_text() == EPOCHS
    assert f"{script}:12:17: GL009 fix not applied: the fixed code would have a new finding: GL013" in result.output
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("scaler = torch.amp.GradScaler()\n", "scaler = make_scaler()\n"), "the scaler is not proven a GradScaler"),
        (("optimizer = torch.optim.AdamW(model.parameters())\n", "optimizer = build(model)\n"), "nor the optimizer"),
        (
            (
                "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
                "    for group in groups:\n        torch.nn.utils.clip_grad_norm_(group, 1.0)\n",
            ),
            "a clip per group: unscale_ in its loop would run twice and raise",
        ),
    ],
)
def test_gl007_no_fix_without_proof(change: tuple[str, str], why: str) -> None:
    source = GL007_AMP.replace(*change)
    assert any(d.code == "GL007" for d in lint_source(source, "train.py")), why
    assert fixed(source) == source, why


def test_gl011_no_fix_when_the_scaler_is_not_proven_a_grad_scaler() -> None:
    source = GL011_AMP.replace("scaler = torch.amp.GradScaler()\n", "scaler = make_scaler()\n")
    assert [(d.code, d.fix) for d in lint_source(source, "train.py")] == [("GL011", None)]


def test_gl002_no_fix_when_the_clear_would_not_run_exactly_when_the_step_does() -> None:
    source = LOOP.replace("        optimizer.zero_grad()\n", "").replace("        losses.append(loss)\n", "")
    source = source.replace("optimizer, criterion):", "optimizer: torch.optim.Optimizer, criterion):")
    source = source.replace("        optimizer.step()\n", "        if ready(x):\n            optimizer.step()\n")
    assert [d.fix for d in lint_source(source, "train.py") if d.code == "GL002"] == [None]


@pytest.mark.parametrize(
    ("signature", "safe"),
    [
        # A DataLoader yields fresh batches; an iterable of unknown kind may not, whatever it is called.
        ("def train(model, train_loader: torch.utils.data.DataLoader, optimizer, criterion):", True),
        ("def train(model, train_loader, optimizer, criterion):", False),
        ("def train(model, loader, optimizer, criterion, x):", False),  # `x` may carry a caller's graph
        ("def train(model, loader, optimizer, criterion, *batch):", False),
    ],
)
def test_gl005_retain_graph_removal_is_safe_only_when_no_caller_can_share_the_graph(signature: str, safe: bool) -> None:
    body = textwrap.indent(GL005_RETAIN.replace("import torch\n\n", ""), "    ")
    if "train_loader" in signature:
        body = body.replace("in loader", "in train_loader")
    else:
        body = body.replace("for x, y in loader:", "for _, y in loader:")
        body = body.replace("model(x)", "model(batch[0])") if "*batch" in signature else body
    source = f"import torch\n\n{signature}\n{body}"
    [finding] = lint_source(source, "train.py")
    assert finding.code == "GL005"
    assert finding.fix is not None and finding.fix.safe is safe


# What each fixable rule's fix writes, or removes, on the lines it changes.
FIX_SIGNS = {
    "GL001": (r"\.(detach|item)\(\)", True),
    "GL002": (r"\.zero_grad\(\)", True),
    "GL003": (r"with (torch\.)?no_grad\(\):", True),
    "GL005": (r"retain_graph=True", False),
    "GL007": (r"\.unscale_\(", True),
    "GL009": (r"with (torch\.)?no_grad\(\):", True),
    "GL011": (r"\.step\(", False),
}


@pytest.mark.parametrize("code", sorted(FIX_SIGNS))
def test_every_fix_a_rule_offers_on_its_fixtures_removes_its_finding_and_writes_the_fix(code: str) -> None:
    import re

    from gradlint.fix import verify_fix
    from gradlint.rule import all_rules

    rule = all_rules()[code]
    folder = Path(__file__).parent.parent / "fixtures" / rule.__module__.rsplit(".", 1)[-1]
    sign, added = FIX_SIGNS[code]
    checked = 0
    for path in sorted(folder.glob("*.py")):
        text = path.read_text()
        before = lint_source(text, str(path))
        for diagnostic in (d for d in before if d.code == code and d.fix is not None):
            assert verify_fix(text, diagnostic.fix, str(path), before=before) is None, (path, diagnostic.line)
            after = apply_edits(text, diagnostic.fix.edits)
            still = [(d.code, d.message) for d in lint_source(after, str(path)) if d.code == code]
            assert len(still) < sum(d.code == code for d in before), (path, diagnostic.line)
            old, new = (len(re.findall(sign, t)) for t in (text, after))
            assert new > old if added else new < old, (path, diagnostic.line)
            checked += 1
    assert checked >= 1, f"no fix of {code} is exercised by its fixtures"


def test_gl009_an_environment_step_in_a_greedy_evaluation_loop_is_not_training() -> None:
    source = textwrap.dedent(
        """\
        import torch

        def evaluate(q_network, envs, episodes):
            q_network.eval()
            obs = envs.reset()
            returns = []
            while len(returns) < episodes:
                actions = q_network(torch.as_tensor(obs)).argmax(dim=1)
                obs, reward, done, info = envs.step(actions.numpy())
                returns.extend(reward[done])
            return returns
        """
    )
    [finding] = lint_source(source, "eval.py")
    assert finding.code == "GL009" and finding.fix is not None
    assert "    with torch.no_grad():\n        while len(returns) < episodes:\n" in fixed(source, unsafe=True)
    trains = source.replace("envs.step(actions.numpy())", "agent.step(actions.numpy())")
    assert [d.fix for d in lint_source(trains, "eval.py") if d.code == "GL009"] in ([None], [])
