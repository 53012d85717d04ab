"""`gradlint trace --fix`: the script and its fixed copy traced side by side, on tiny real scripts.

The traces run once, in parallel, at the start of the module (each is a child process
that imports torch, which dominates its time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from gradlint.cli import main  # noqa: E402  (after the skip: these tests need torch)
from gradlint.rule import Diagnostic, Edit, Fix  # noqa: E402
from gradlint.runtime.events import EventWriter  # noqa: E402
from gradlint.runtime.report import build_report  # noqa: E402
from gradlint.runtime.runner import TraceRun  # noqa: E402
from gradlint.runtime.tracer import Tracer  # noqa: E402
from gradlint.runtime.verify import LineMap, fixed_findings, verify_fixes  # noqa: E402

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "fixtures" / "runtime"
# A GL001 leak at module level that also shows what it runs as: its name, file, path,
# working directory and arguments, a sibling import and a data file found through __file__.
CONTEXT_SCRIPT = """\
import os
import sys
from pathlib import Path

import torch
from torch import nn

from helper import WIDTH

with open(Path(__file__).with_name("seen.txt"), "a") as log:
    log.write(f"{__name__} {__file__} {sys.path[0]} {os.getcwd()} {sys.argv[1:]}\\n")
scale = float(Path(__file__).with_name("data.txt").read_text())
torch.manual_seed(0)
model = nn.Linear(WIDTH, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
running = 0.0
for _ in range(10):
    optimizer.zero_grad()
    loss = model(torch.randn(8, WIDTH)).pow(2).mean() * scale
    loss.backward()
    optimizer.step()
    running += loss
"""
# GL002 with an optimizer the fix can prove (fixtures/runtime/gl002_bug.py passes its
# optimizers in, so its zero_grad fix is not offered): no clear in the loop.
MISSING_CLEAR_SCRIPT = """\
import torch
from torch import nn


def train(model, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()


torch.manual_seed(0)
train(nn.Linear(4, 1), 10)
"""


@dataclass(frozen=True)
class Verified:
    """One `gradlint trace --fix --format json` run."""

    returncode: int
    report: dict[str, Any]  # the documented JSON object
    stderr: str

    def fix_at(self, line: int, code: str) -> dict[str, Any]:
        fixes: list[dict[str, Any]] = self.report["fixes"]
        [found] = [f for f in fixes if (f["finding"]["line"], f["finding"]["code"]) == (line, code)]
        return found


def verify(*args: str) -> Verified:
    result = subprocess.run(
        [sys.executable, "-m", "gradlint", "trace", "--fix", "--format", "json", "--quiet-script", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    return Verified(result.returncode, json.loads(result.stdout), result.stderr)


@pytest.fixture(scope="module")
def context_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scripts")
    (folder / "helper.py").write_text("WIDTH = 4\n")
    (folder / "data.txt").write_text("2.0\n")
    (folder / "missing_clear.py").write_text(MISSING_CLEAR_SCRIPT)
    script = folder / "train.py"
    script.write_text(CONTEXT_SCRIPT)
    return script


def files(context_script: Path) -> dict[Path, bytes]:
    """The fixture traced, and every file in the folder of the scripts written here."""
    paths = [FIXTURES / "gl001_bug.py", *context_script.parent.iterdir()]
    return {path: path.read_bytes() for path in paths if path.is_file()}


@pytest.fixture(scope="module")
def before(context_script: Path) -> dict[Path, bytes]:
    return files(context_script)


@pytest.fixture(scope="module")
def verified(context_script: Path, before: dict[Path, bytes]) -> dict[str, Verified]:
    runs = {
        "gl001": ("fixtures/runtime/gl001_bug.py",),
        "gl002": ("--unsafe-fixes", str(context_script.with_name("missing_clear.py"))),
        "context": (str(context_script), "--", "--flag"),
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {key: pool.submit(verify, *args) for key, args in runs.items()}
        return {key: future.result() for key, future in futures.items()}


def test_gl001_leak_fixed_is_no_longer_confirmed_and_losses_are_identical(verified: dict[str, Verified]) -> None:
    fix = verified["gl001"].fix_at(18, "GL001")
    assert fix["original_status"] == "confirmed"
    assert fix["still_confirmed"] is False and fix["new_exception"] is None
    assert fix["verified"] is True and fix["verdict"] == "fix verified"
    steps = fix["steps"]
    assert [pair["step"] for pair in steps] == [1, 2, 3]
    for pair in steps:
        assert isinstance(pair["original"]["loss"], float)
        assert pair["original"] == pair["fixed"]  # `.item()` changes no number of the training
    fixed_run = verified["gl001"].report["fixed"]
    assert [f for f in fixed_run["findings"] if f["status"] in ("confirmed", "runtime-only")] == []


def test_fix_on_a_line_that_never_ran_is_not_verified(verified: dict[str, Verified]) -> None:
    fix = verified["gl001"].fix_at(30, "GL001")
    assert fix["original_status"] == "not-reached"
    assert fix["verdict"] == "fix NOT verified: line 30 never ran in the original run"
    assert verified["gl001"].returncode == 1


def test_gl002_unsafe_zero_grad_fix_changes_grad_norms_and_the_finding_is_gone(
    verified: dict[str, Verified],
) -> None:
    run = verified["gl002"]
    fix = run.fix_at(10, "GL002")
    assert fix["original_status"] == "confirmed"
    assert fix["still_confirmed"] is False and fix["verified"] is True
    assert fix["fixed_lines"] == [10, 11]  # the inserted optimizer.zero_grad() and the backward
    norms = [(pair["original"]["grad_norm"], pair["fixed"]["grad_norm"]) for pair in fix["steps"]]
    assert norms[0][0] == norms[0][1]  # the first step starts from no gradients in both
    assert norms[1][0] != norms[1][1]  # then the original adds onto the last step's gradients
    assert run.report["fixed"]["findings"] == []
    assert run.returncode == 0


def test_clean_script_has_nothing_to_fix_and_exits_0() -> None:
    result = CliRunner().invoke(main, ["trace", "--fix", str(FIXTURES / "gl001_clean.py")])
    assert result.exit_code == 0
    assert "nothing to fix: no findings; nothing traced" in result.stdout
    result = CliRunner().invoke(main, ["trace", "--fix", "--format", "json", str(FIXTURES / "gl001_clean.py")])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"fixes": [], "original": None, "fixed": None}
    assert "nothing to fix" in result.stderr


def test_users_files_are_byte_identical_and_nothing_is_written_next_to_them(
    verified: dict[str, Verified], before: dict[Path, bytes], context_script: Path
) -> None:
    written = context_script.parent / "seen.txt"  # by the script itself, once per run
    assert {path: data for path, data in files(context_script).items() if path != written} == before


def test_fixed_copy_runs_with_the_same_file_path_argv_and_cwd(
    verified: dict[str, Verified], context_script: Path
) -> None:
    run = verified["context"]
    assert run.fix_at(22, "GL001")["verified"] is True, run.stderr
    assert run.returncode == 0
    seen = (context_script.parent / "seen.txt").read_text().splitlines()
    assert seen == [f"__main__ {context_script.resolve()} {context_script.parent.resolve()} {ROOT} ['--flag']"] * 2


def test_unsafe_fixes_needs_fix_and_report_refuses_fix() -> None:
    script = str(FIXTURES / "gl001_bug.py")
    assert CliRunner().invoke(main, ["trace", "--unsafe-fixes", script]).exit_code == 2
    result = CliRunner().invoke(main, ["trace", "--fix", "--report", "out.html", script])
    assert result.exit_code == 2 and "--report cannot be combined with --fix" in result.stderr


def test_line_map_keeps_inserted_lines_with_their_neighbours() -> None:
    before = "a\nb\nc\nd\n"
    after = "a\nnew\nb\nC1\nC2\nd\n"  # a line inserted before b, c replaced by two lines
    lines = LineMap(before, after)
    assert lines.span(1, 1) == (1, 2)
    assert lines.span(2, 2) == (2, 3)
    assert lines.span(3, 3) == (4, 5)
    assert lines.span(4, 4) == (6, 6)


def test_fixed_findings_are_matched_by_code_and_mapped_line() -> None:
    def finding(line: int, safe: bool | None) -> Diagnostic:
        fix = None if safe is None else Fix("clear", (Edit(line, 1, line, 1, ""),), safe)
        return Diagnostic("t.py", line, 1, "GL002", end_line=line, end_column=2, name="n", message="m", fix=fix)

    lines = LineMap("a\nb\nc\nd\n", "new\na\nb\nc\nd\n")
    static = [finding(1, True), finding(3, True), finding(4, False), finding(2, None)]
    remaining = [finding(4, None)]  # line 3, moved down by the insertion
    assert [(d.line, span) for d, span in fixed_findings(static, remaining, lines, unsafe=False)] == [(1, (1, 2))]
    assert [d.line for d, _ in fixed_findings(static, remaining, lines, unsafe=True)] == [1, 4]


def test_an_exception_only_the_fixed_copy_raises_fails_the_fix() -> None:
    script = str((FIXTURES / "gl001_bug.py").resolve())
    static = [Diagnostic("gl001_bug.py", 18, 9, "GL001", end_line=18, end_column=24, name="n", message="m", fix=None)]
    seen = {"kind": "finding", "code": "GL001", "line": 18, "path": script, "message": "leak"}
    step = {"kind": "step", "step": 1, "loss": 0.5, "grad_norms": {"w": 3.0, "b": 4.0}}
    original = TraceRun(events=[seen, step, {"kind": "coverage", "lines": [18]}], reason="steps")
    raised = {"kind": "exception", "type": "ValueError", "message": "boom", "path": script, "line": 12}
    fixed = TraceRun(events=[{**step, "loss": float("nan")}, raised], reason="exception")
    lines = LineMap("x\n" * 30, "x\n" * 30)
    verification = verify_fixes(
        [(static[0], (18, 18))],
        lines,
        build_report("gl001_bug.py", static, original),
        build_report("gl001_bug.py", [], fixed),
        3,
    )
    [check] = verification.checks
    assert check.verdict == "fix NOT verified: the fixed copy raised ValueError at line 12, which the original did not"
    assert check.steps[0].as_text() == "step 1: loss 0.5 -> nan, grad norm 5 = 5"
    assert check.steps[0].regression() == "the fixed run's loss is nan at step 1, the original's 0.5"
    assert verification.exit_code() == 1


def test_step_events_carry_the_loss_and_the_gradient_norms(tmp_path: Path) -> None:
    events = tmp_path / "events"
    tracer = Tracer(str(tmp_path / "script.py"), [], 3, EventWriter(str(events)))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer.install()
    try:
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        optimizer.step()
    finally:
        tracer.uninstall()
    [step] = [event for event in map(json.loads, events.read_text().splitlines()) if event["kind"] == "step"]
    assert step["loss"] == loss.item()
    assert len(step["grad_norms"]) == 2 and all(norm > 0 for norm in step["grad_norms"].values())
