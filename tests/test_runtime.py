"""`gradlint trace` on the tiny real scripts of fixtures/runtime, through the command line.

Markers in a fixture: `# trace: GL001` on a line the trace must confirm,
`# trace-not-reached: GL001` on a buggy line that never runs, and
`# trace-options: --steps 6` for options the script needs. A fixture without
`# trace:` markers is a clean look-alike: nothing may be confirmed or found in it.
All traces run once, in parallel, at the start of the module (each is a child
process that imports torch, which dominates its time).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from gradlint.cli import main  # noqa: E402  (after the skip: these tests need torch)
from gradlint.rule import Diagnostic, Related  # noqa: E402
from gradlint.runtime import command  # noqa: E402
from gradlint.runtime.errors import candidate_codes, default_code  # noqa: E402
from gradlint.runtime.events import EventWriter  # noqa: E402
from gradlint.runtime.report import build_report  # noqa: E402
from gradlint.runtime.runner import TraceRun  # noqa: E402
from gradlint.runtime.tracer import Hint, Tracer  # noqa: E402

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "fixtures" / "runtime"
MARKER = re.compile(r"#\s*trace(?P<kind>-not-reached)?:\s*(?P<codes>GL\d{3}(?:\s*,\s*GL\d{3})*)")
OPTIONS = re.compile(r"#\s*trace-options:\s*(?P<options>.*)")
LEAF_ERROR = "a leaf Variable that requires grad is being used in an in-place operation."
RULE_FIXTURES = sorted(path.name for path in FIXTURES.glob("gl*.py"))


@dataclass(frozen=True)
class Traced:
    """One `gradlint trace --format json` run."""

    returncode: int
    report: dict[str, object]
    stderr: str

    @property
    def findings(self) -> list[dict[str, object]]:
        return self.report["findings"]  # type: ignore[return-value]

    def at(self, line: int, code: str) -> list[dict[str, object]]:
        return [f for f in self.findings if f["line"] == line and f["code"] == code]

    def found(self) -> list[dict[str, object]]:
        return [f for f in self.findings if f["status"] in ("confirmed", "runtime-only")]


def markers(path: Path, kind: str) -> set[tuple[int, str]]:
    wanted = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.search(line)
        if match and (match["kind"] or "") == kind:
            wanted.update((number, code.strip()) for code in match["codes"].split(","))
    return wanted


def options(path: Path) -> list[str]:
    match = OPTIONS.search(path.read_text())
    return shlex.split(match["options"]) if match else []


def trace(temporary: Path, *args: str) -> Traced:
    quiet = [] if args[0] == "fixtures/runtime/robust_swallow.py" else ["--quiet-script"]  # its output is checked
    result = subprocess.run(
        [sys.executable, "-m", "gradlint", "trace", "--format", "json", *quiet, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temporary)},  # the children's files, to find any left running
        timeout=240,
        check=False,
    )
    return Traced(result.returncode, json.loads(result.stdout), result.stderr)


RUNS: dict[str, tuple[str, ...]] = {
    **{name: (*options(FIXTURES / name), f"fixtures/runtime/{name}") for name in RULE_FIXTURES},
    "module": ("-m", "fixtures.runtime.gl001_bug"),
    "swallow": ("fixtures/runtime/robust_swallow.py",),
    "hang": ("--timeout", "20", "fixtures/runtime/robust_hang.py"),
}


@pytest.fixture(scope="module")
def temporary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace")


@pytest.fixture(scope="module")
def traced(temporary: Path) -> dict[str, Traced]:
    runs = {**RUNS, "gl006_bug.py": ("--report", str(temporary / "report.html"), *RUNS["gl006_bug.py"])}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(trace, temporary, *args) for key, args in runs.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("name", [n for n in RULE_FIXTURES if markers(FIXTURES / n, "")])
def test_buggy_lines_are_confirmed(traced: dict[str, Traced], name: str) -> None:
    run = traced[name]
    for line, code in markers(FIXTURES / name, ""):
        statuses = [f["status"] for f in run.at(line, code)]
        assert statuses == ["confirmed"], (line, code, run.findings, run.stderr)
    assert run.returncode == 1


@pytest.mark.parametrize("name", [n for n in RULE_FIXTURES if markers(FIXTURES / n, "")])
def test_nothing_else_is_found(traced: dict[str, Traced], name: str) -> None:
    expected = markers(FIXTURES / name, "")
    unexpected = [f for f in traced[name].found() if (f["line"], f["code"]) not in expected]
    assert unexpected == []


@pytest.mark.parametrize("name", [n for n in RULE_FIXTURES if markers(FIXTURES / n, "-not-reached")])
def test_lines_that_never_ran_are_not_reached(traced: dict[str, Traced], name: str) -> None:
    run = traced[name]
    for line, code in markers(FIXTURES / name, "-not-reached"):
        assert [f["status"] for f in run.at(line, code)] == ["not-reached"], (line, code, run.findings)


@pytest.mark.parametrize("name", [n for n in RULE_FIXTURES if not markers(FIXTURES / n, "")])
def test_clean_look_alikes_confirm_nothing(traced: dict[str, Traced], name: str) -> None:
    run = traced[name]
    assert run.found() == [], run.findings
    assert run.returncode == 0
    assert run.report["run"]["reason"] in ("steps", "finished")  # type: ignore[index]


def test_targets_with_history_are_confirmed_and_one_without_is_refuted(tmp_path: Path) -> None:
    # GL017 reads the value at the finding's line: a name or arithmetic before the line runs,
    # an assigned value after it; the frozen target network of the clean script has no history.
    bug = trace(tmp_path, "fixtures/runtime/gl017_bug.py")
    confirmed = [f for f in bug.findings if f["code"] == "GL017" and f["status"] == "confirmed"]
    assert sorted(f["line"] for f in confirmed) == [14, 24, 35], bug.findings
    assert all("had a grad_fn" in str(f["evidence"]) for f in confirmed)
    clean = trace(tmp_path, "fixtures/runtime/gl017_clean.py")
    assert [(f["line"], f["status"]) for f in clean.findings] == [(32, "not-reproduced")]
    assert clean.returncode == 0


def test_every_rule_of_the_first_seven_has_buggy_clean_and_unreached_fixtures() -> None:
    for number in range(1, 8):
        code = f"GL{number:03d}"
        bug = [n for n in RULE_FIXTURES if (FIXTURES / n).read_text().count(f"# trace: {code}")]
        unreached = [n for n in RULE_FIXTURES if (FIXTURES / n).read_text().count(f"# trace-not-reached: {code}")]
        assert bug and unreached and (FIXTURES / f"gl{number:03d}_clean.py").is_file(), code


def test_script_exceptions_are_reported_with_their_user_line(traced: dict[str, Traced]) -> None:
    exception = traced["gl004_bug.py"].report["run"]["exception"]  # type: ignore[index]
    assert exception["type"] == "RuntimeError"
    assert exception["line"] == 18
    assert "inplace operation" in exception["message"]


def test_a_script_without_an_optimizer_steps_at_its_backward_passes(traced: dict[str, Traced]) -> None:
    # Issue 14: manual updates under no_grad; the step limit, the step count and GL001's
    # per-step confirmation all run on backward passes (before: "0 optimizer steps", not reproduced).
    for name in ("gl001_manual_bug.py", "gl001_manual_clean.py"):
        run = traced[name].report["run"]
        assert (run["reason"], run["steps"]) == ("steps", 3), run  # type: ignore[index]
    [leak] = traced["gl001_manual_bug.py"].at(19, "GL001")
    assert leak["observed"]["growth_per_step"] > 0  # type: ignore[index]


def test_html_report_is_self_contained(traced: dict[str, Traced], temporary: Path) -> None:
    assert traced["gl006_bug.py"].returncode == 1
    page = (temporary / "report.html").read_text()
    assert "<svg" in page and "confirmed" in page and "none of the 2 parameters" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_module_runs_like_python_dash_m(traced: dict[str, Traced]) -> None:
    run = traced["module"]
    assert [f["status"] for f in run.at(18, "GL001")] == ["confirmed"]


def test_script_that_swallows_the_stop_and_prints_a_lot_is_ended(traced: dict[str, Traced]) -> None:
    run = traced["swallow"]
    assert run.report["run"]["reason"] == "steps"  # type: ignore[index]
    assert "caught the stop" in run.report["run"]["detail"]  # type: ignore[index]
    assert run.stderr.count("x" * 20000) >= 3  # the script's output, relayed whole


def test_script_that_ignores_sigterm_is_killed_at_the_timeout(traced: dict[str, Traced]) -> None:
    run = traced["hang"]
    assert run.report["run"]["reason"] == "timeout"  # type: ignore[index]
    assert run.report["run"]["steps"] == 2  # type: ignore[index]  # streamed before the kill
    assert run.returncode == 0


def test_no_traced_process_is_left_behind(traced: dict[str, Traced], temporary: Path) -> None:
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(temporary) not in processes


def test_script_output_is_relayed_to_stderr_and_text_report_to_stdout() -> None:
    result = CliRunner().invoke(main, ["trace", str(FIXTURES / "robust_exit.py"), "--", "--lr", "0.5"])
    assert "argv: ['--lr', '0.5']" in result.stderr
    assert "the script called sys.exit: 3" in result.stderr
    assert result.stdout == ""
    assert result.exit_code == 0


def test_without_torch_trace_says_so_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "torch_available", lambda: False)
    result = CliRunner().invoke(main, ["trace", str(FIXTURES / "gl001_bug.py")])
    assert result.exit_code == 2
    assert "needs torch" in result.stderr


def test_missing_script_exits_2() -> None:
    result = CliRunner().invoke(main, ["trace", "no/such/script.py"])
    assert result.exit_code == 2


def test_every_patch_is_restored(tmp_path: Path) -> None:
    patched = [
        (torch.Tensor, "backward"),
        (torch.autograd, "backward"),
        (torch.autograd, "grad"),
        (torch.optim.Optimizer, "zero_grad"),
        (torch.optim.Optimizer, "__init__"),
        (torch.nn.Module, "zero_grad"),
        (torch.nn.utils, "clip_grad_norm_"),
        (torch.amp.GradScaler, "unscale_"),
    ]
    originals = [getattr(owner, name) for owner, name in patched]
    trace_function = sys.gettrace()
    tracer = Tracer(str(tmp_path / "script.py"), [], 3, EventWriter(str(tmp_path / "events")))
    tracer.install()
    try:
        assert [getattr(owner, name) for owner, name in patched] != originals
    finally:
        tracer.uninstall()
    assert [getattr(owner, name) for owner, name in patched] == originals
    assert sys.gettrace() is trace_function
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # the global optimizer hooks are gone too: no StopTrace, no events
    assert tracer.steps == 0


def test_statuses_from_events_alone() -> None:
    script = str((FIXTURES / "gl001_bug.py").resolve())

    def finding(line: int, code: str) -> Diagnostic:
        return Diagnostic("train.py", line, 1, code, end_line=line, end_column=9, name="n", message="m")

    run = TraceRun(
        events=[
            {"kind": "finding", "code": "GL001", "line": 18, "path": script, "message": "seen"},
            {"kind": "finding", "code": "GL006", "line": 7, "path": script, "message": "dead"},
            {"kind": "coverage", "lines": [18, 20]},
            {"kind": "end", "reason": "steps", "detail": "", "steps": 3},
        ],
        reason="steps",
    )
    static = [finding(18, "GL001"), finding(20, "GL002"), finding(30, "GL001")]
    report = build_report(str(FIXTURES / "gl001_bug.py"), static, run)
    statuses = [(f.diagnostic.line, f.diagnostic.code, f.status) for f in report.findings]
    assert statuses == [
        (7, "GL006", "runtime-only"),
        (18, "GL001", "confirmed"),
        (20, "GL002", "not-reproduced"),
        (30, "GL001", "not-reached"),
    ]
    assert report.exit_code() == 1
    crashed = build_report(str(FIXTURES / "gl001_bug.py"), static, TraceRun(reason="crashed"))
    assert {f.status for f in crashed.findings} == {"not-traced"}
    assert crashed.exit_code() == 2


@pytest.mark.parametrize(
    ("message", "line", "grad_enabled", "code"),
    [
        (
            "a leaf Variable that requires grad is being used in an in-place operation.",
            "w -= lr * w.grad",
            True,
            "GL003",
        ),
        ("a leaf Variable that requires grad is being used in an in-place operation.", "x.add_(1)", True, "GL004"),
        ("element 0 of tensors does not require grad and does not have a grad_fn", "loss.backward()", False, "GL013"),
        ("element 0 of tensors does not require grad and does not have a grad_fn", "loss.backward()", True, "GL006"),
        ("Trying to backward through the graph a second time", "loss.backward()", True, "GL008"),
    ],
)
def test_autograd_errors_map_to_rules(message: str, line: str, grad_enabled: bool, code: str) -> None:
    assert default_code(candidate_codes(message), line, grad_enabled) == code
    assert candidate_codes("CUDA out of memory") == ()


def test_a_failing_check_is_reported_and_the_script_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Tracer, *args: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(Tracer, "_update_ledger", broken)
    events = tmp_path / "events"
    tracer = Tracer(str(tmp_path / "script.py"), [], 3, EventWriter(str(events)))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer.install()
    try:
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    finally:
        tracer.uninstall()
    assert model.weight.grad is not None and tracer.steps == 1
    run = TraceRun(events=[json.loads(line) for line in events.read_text().splitlines()], reason="finished")
    report = build_report(str(tmp_path / "script.py"), [], run)
    assert "internal error in the tracer (_after_backward: ValueError: boom)" in report.summary()
    assert report.exit_code() == 2


def test_a_cut_loss_term_is_confirmed_only_while_it_has_no_graph(tmp_path: Path) -> None:
    # GL019: the term the hinted line binds is judged when a loss with a graph is backpropagated.
    source = (
        "import torch\n"
        "def step(model, x, cut):\n"
        "    out = model(x)\n"
        "    term = out.pow(2).mean().item() if cut else out.pow(2).mean()\n"
        "    (out.sum() + term).backward()\n"
        "model = torch.nn.Linear(2, 1)\n"
        "step(model, torch.ones(1, 2), CUT)\n"
    )
    messages = {}
    for cut in (False, True):
        script, events = tmp_path / f"script_{cut}.py", tmp_path / f"events_{cut}"
        script.write_text(source.replace("CUT", str(cut)))
        tracer = Tracer(str(script), [Hint("GL019", 4, 4)], 3, EventWriter(str(events)))
        tracer.install()
        try:
            exec(compile(script.read_text(), str(script), "exec"), {"__name__": "__main__"})
        finally:
            tracer.uninstall()
        found = [json.loads(line) for line in events.read_text().splitlines()]
        messages[cut] = [(event["line"], event["message"]) for event in found if event.get("code") == "GL019"]
    assert messages[False] == []
    [(line, message)] = messages[True]
    assert line == 4 and message.startswith("`term` is a Python number")


def test_every_rule_the_tracer_checks_has_a_clean_look_alike() -> None:
    from gradlint.runtime.report import CHECKED_CODES

    for code in sorted(CHECKED_CODES):
        clean = FIXTURES / f"gl{code[2:]}_clean.py"
        assert clean.is_file() and not markers(clean, ""), code


def test_confirmed_findings_carry_static_and_measured_evidence(traced: dict[str, Traced]) -> None:
    [leak] = [f for f in traced["gl001_bug.py"].findings if f["code"] == "GL001" and f["status"] == "confirmed"]
    assert "`loss` gets its autograd graph here" in [place["note"] for place in leak["related"]]
    held = leak["observed"]["graph_nodes_per_step"]
    assert held == sorted(held) and leak["observed"]["growth_per_step"] > 0  # the graph grows every step
    stale = [f for f in traced["gl002_bug.py"].findings if f["code"] == "GL002" and f["status"] == "confirmed"]
    assert stale and all(f["observed"]["ratio_last_to_first"] > 1 for f in stale)  # norms add up without a clear
    unconfirmed = [f for run in traced.values() for f in run.findings if f["status"] != "confirmed"]
    assert all(f["observed"] == {} for f in unconfirmed)


def test_the_html_report_shows_static_evidence_beside_what_was_observed() -> None:
    from gradlint.runtime.html import render_html
    from gradlint.runtime.report import CONFIRMED, TracedFinding, TraceReport

    related = (Related("t.py", 6, 5, 6, 9, "`loss` gets its graph"),)
    finding = Diagnostic(
        "t.py", 9, 5, "GL001", end_line=9, end_column=9, name="loss-accumulation", message="m", related=related
    )
    run = TraceRun(events=[{"kind": "step", "graph_nodes": n, "grad_norms": {}} for n in (5, 9, 13)], reason="steps")
    page = render_html(TraceReport("t.py", [TracedFinding(finding, CONFIRMED, "`total` holds 2 graphs")], run))
    assert "Static evidence" in page and "line 6: `loss` gets its graph" in page
    assert "growth per step: <code>4" in page and "`total` holds 2 graphs" in page


def test_accumulation_is_judged_by_the_factors_of_the_summed_losses(traced: dict[str, Traced]) -> None:
    # GL018: the losses summed into one step are confirmed unscaled (factor 1) or scaled unequally (a running
    # count); a loss divided by k where the linter cannot see it (a callable object) is not reproduced.
    bug = traced["gl018_bug.py"]
    [unscaled] = bug.at(13, "GL018")
    [counted] = bug.at(21, "GL018")
    assert "no loss divided" in unscaled["evidence"] and "different factors" in counted["evidence"]
    [averaged] = traced["gl018_clean.py"].at(31, "GL018")
    assert averaged["status"] == "not-reproduced"


def test_eval_mode_left_behind_is_confirmed_at_the_evaluation_call(traced: dict[str, Traced]) -> None:
    [left] = [f for f in traced["gl016_bug.py"].findings if f["code"] == "GL016"]
    assert left["status"] == "confirmed" and "still in eval mode since line 10" in str(left["evidence"])
    assert [f for f in traced["gl016_clean.py"].findings if f["code"] == "GL016"] == []
