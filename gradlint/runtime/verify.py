"""`gradlint trace --fix`: each fix judged by tracing the script and its fixed copy side by side."""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from gradlint.formats.json import as_dict
from gradlint.rule import Diagnostic
from gradlint.runtime.report import CONFIRMED, NOT_CHECKED, NOT_REACHED, RUNTIME_ONLY, TracedFinding, TraceReport

Span = tuple[int, int]  # first and last line, 1-based, inclusive
Loss = float | list[float | None] | None  # as the tracer records it: one scalar, several tensors, or none
EXIT_VERIFIED, EXIT_NOT_VERIFIED, EXIT_ERROR = 0, 1, 2


class LineMap:
    """The lines of a text mapped onto the lines of its fixed version (difflib over lines)."""

    def __init__(self, before: str, after: str) -> None:
        matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
        self._opcodes = matcher.get_opcodes()
        self._length = len(after.splitlines())

    def span(self, first: int, last: int) -> Span:
        """The fixed lines that stand for original lines `first` to `last`, with what a fix inserted next to them."""
        start, end = self._start(first - 1), self._end(last)
        return start + 1, max(start + 1, end)

    def _start(self, index: int) -> int:
        """Fixed index of the boundary before original line `index` (0-based), before any insertion there."""
        for tag, i1, i2, j1, _ in self._opcodes:
            if i1 <= index < i2 or (tag == "insert" and i1 == index):
                return j1 + (index - i1 if tag == "equal" else 0)
        return self._length

    def _end(self, index: int) -> int:
        """Fixed index of the boundary after `index` original lines, after any insertion there."""
        for tag, i1, i2, j1, j2 in reversed(self._opcodes):
            if i1 < index <= i2 or (tag == "insert" and i1 == index):
                return j1 + index - i1 if tag == "equal" else j2
        return 0


def fixed_findings(
    static: list[Diagnostic], remaining: list[Diagnostic], lines: LineMap, unsafe: bool
) -> list[tuple[Diagnostic, Span]]:
    """The findings with an applicable fix that the fixed text no longer has, each with its fixed lines."""
    fixed = []
    for diagnostic in sorted(static):
        if diagnostic.fix is None or not (diagnostic.fix.safe or unsafe):
            continue
        span = lines.span(diagnostic.line, max(diagnostic.line, diagnostic.end_line))
        if not any(r.code == diagnostic.code and span[0] <= r.line <= span[1] for r in remaining):
            fixed.append((diagnostic, span))
    return fixed


@dataclass(frozen=True)
class StepValues:
    """What one run recorded at one optimizer step: the loss backpropagated and the total gradient norm."""

    loss: Loss
    grad_norm: float | None

    def as_dict(self) -> dict[str, object]:
        """The JSON object of the step."""
        return {"loss": self.loss, "grad_norm": self.grad_norm}


@dataclass(frozen=True)
class StepPair:
    """One optimizer step of both runs; None where a run recorded no such step."""

    step: int
    original: StepValues | None
    fixed: StepValues | None

    def as_text(self) -> str:
        """`step 2: loss 0.5 = 0.5, grad norm 1.2 -> 0.8` (`=` same value, `->` changed)."""
        loss = _pair([v.loss if v else None for v in (self.original, self.fixed)])
        norm = _pair([v.grad_norm if v else None for v in (self.original, self.fixed)])
        return f"step {self.step}: loss {loss}, grad norm {norm}"

    def as_dict(self) -> dict[str, object]:
        """The JSON object of the pair."""
        return {"step": self.step, "original": _values(self.original), "fixed": _values(self.fixed)}

    def regression(self) -> str | None:
        """What turned non-finite in the fixed run at this step while the original stayed finite."""
        if self.original is None or self.fixed is None:
            return None
        for name, before, after in (
            ("loss", self.original.loss, self.fixed.loss),
            ("gradient norm", self.original.grad_norm, self.fixed.grad_norm),
        ):
            if before is not None and _finite(before) and not _finite(after):
                return f"the fixed run's {name} is {_shown(after)} at step {self.step}, the original's {_shown(before)}"
        return None


@dataclass(frozen=True)
class FixCheck:
    """One fixed finding: how the original run saw it, and what the fixed run did at its lines."""

    finding: TracedFinding
    fixed_lines: Span
    fixed_evidence: str | None  # what the fixed run still observed at the fixed lines
    new_exception: dict[str, object] | None
    steps: list[StepPair]

    @property
    def problem(self) -> str | None:
        """Why the fix is not verified, or None when it is."""
        d = self.finding.diagnostic
        if self.new_exception is not None:
            raised = f"{self.new_exception['type']} at line {self.new_exception['line']}"
            return f"the fixed copy raised {raised}, which the original did not"
        if self.fixed_evidence is not None:
            return f"the fixed run still confirms {d.code} at {_lines(self.fixed_lines)}"
        regression = next((found for pair in self.steps if (found := pair.regression())), None)
        if regression is not None:
            return regression
        return _unverifiable(self.finding)

    @property
    def verdict(self) -> str:
        """`fix verified` or `fix NOT verified: <why>`."""
        problem = self.problem
        return "fix verified" if problem is None else f"fix NOT verified: {problem}"

    def as_text(self) -> str:
        """A few indented lines: the finding, both runs, the exception, the verdict."""
        d = self.finding.diagnostic
        original = self.finding.status.upper() + (f": {self.finding.evidence}" if self.finding.evidence else "")
        fixed = f"CONFIRMED: {self.fixed_evidence}" if self.fixed_evidence else "not confirmed"
        exception = "none new"
        if self.new_exception is not None:
            exception = f"{self.new_exception['type']} at line {self.new_exception['line']} (the original did not)"
        return (
            f"{d.path}:{d.line}:{d.column}: {d.code} {d.message}\n"
            f"  original run: {original}\n"
            f"  fixed run:    {fixed} ({_lines(self.fixed_lines)} of the fixed copy)\n"
            f"  exception:    {exception}\n"
            f"  {self.verdict}\n"
        )

    def as_dict(self) -> dict[str, object]:
        """The JSON object of one fix."""
        return {
            "finding": as_dict(self.finding.diagnostic),
            "original_status": self.finding.status,
            "original_evidence": self.finding.evidence,
            "fixed_lines": list(self.fixed_lines),
            "still_confirmed": self.fixed_evidence is not None,
            "fixed_evidence": self.fixed_evidence,
            "new_exception": self.new_exception,
            "steps": [pair.as_dict() for pair in self.steps],
            "verified": self.problem is None,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class FixVerification:
    """The outcome of one `gradlint trace --fix`."""

    path: str
    checks: list[FixCheck]
    original: TraceReport
    fixed: TraceReport
    steps: list[StepPair]

    def exit_code(self) -> int:
        """2 when either trace failed, 1 when a fix is not verified, else 0."""
        if EXIT_ERROR in (self.original.exit_code(), self.fixed.exit_code()):
            return EXIT_ERROR
        return EXIT_NOT_VERIFIED if any(check.problem for check in self.checks) else EXIT_VERIFIED

    def as_text(self) -> str:
        """A block per fix, then the first steps of both runs side by side."""
        fixes = len(self.checks)
        rows = "".join(f"  {pair.as_text()}\n" for pair in self.steps) or "  no optimizer step was recorded\n"
        applied = "1 fix applied" if fixes == 1 else f"{fixes} fixes applied together"
        heading = f"First steps, original -> fixed copy ({applied}):\n"
        return "\n".join([*(check.as_text() for check in self.checks), heading + rows])

    def as_json(self) -> str:
        """The documented JSON object: `fixes`, and the `original` and `fixed` runs."""
        document = {
            "fixes": [check.as_dict() for check in self.checks],
            "original": self.original.as_dict(),
            "fixed": self.fixed.as_dict(),
        }
        return json.dumps(document, indent=2) + "\n"

    def summary(self) -> str:
        """Both runs' summaries and a count of the verdicts."""
        verified = sum(check.problem is None for check in self.checks)
        return (
            f"Original: {self.original.summary()}\nFixed copy: {self.fixed.summary()}\n"
            f"{verified} of {len(self.checks)} fix(es) verified; {self.path} was not modified."
        )


def verify_fixes(
    fixed: list[tuple[Diagnostic, Span]], lines: LineMap, original: TraceReport, after: TraceReport, steps: int
) -> FixVerification:
    """Judge each fixed finding from the traces of the original script and of its fixed copy."""
    pairs = _step_pairs(original, after, steps)
    exception = _new_exception(original, after, lines)
    checks = [
        FixCheck(_traced(original, diagnostic), span, _still_confirmed(after, diagnostic.code, span), exception, pairs)
        for diagnostic, span in fixed
    ]
    return FixVerification(original.path, checks, original, after, pairs)


def _traced(report: TraceReport, diagnostic: Diagnostic) -> TracedFinding:
    return next(f for f in report.findings if f.diagnostic == diagnostic)


def _still_confirmed(report: TraceReport, code: str, span: Span) -> str | None:
    """The fixed run's evidence of `code` on the fixed lines, whether the fixed text still flags them or not."""
    seen = [
        f.evidence or ""
        for f in report.findings
        if f.status in (CONFIRMED, RUNTIME_ONLY)
        and f.diagnostic.code == code
        and f.diagnostic.path == report.path
        and span[0] <= f.diagnostic.line <= span[1]
    ]
    return "; ".join(seen) if seen else None


def _new_exception(original: TraceReport, fixed: TraceReport, lines: LineMap) -> dict[str, object] | None:
    """The exception that ended the fixed run, unless the original ended with the same one at the same line."""
    after = fixed.exception
    if after is None:
        return None
    before = original.exception
    if before is not None and before["type"] == after["type"] and before["path"] == after["path"]:
        line = int(str(before["line"]))
        first, last = lines.span(line, line) if before["path"] == str(Path(original.path).resolve()) else (line, line)
        if first <= int(str(after["line"])) <= last:
            return None
    return {"type": after["type"], "line": after["line"], "path": after["path"], "message": after["message"]}


def _step_pairs(original: TraceReport, fixed: TraceReport, count: int) -> list[StepPair]:
    before, after = _step_values(original), _step_values(fixed)
    shown = sorted(step for step in {*before, *after} if step <= count)
    return [StepPair(step, before.get(step), after.get(step)) for step in shown]


def _step_values(report: TraceReport) -> dict[int, StepValues]:
    """What the run's "step" events recorded, by step number."""
    values = {}
    for event in report.run.of_kind("step"):
        norms = event.get("grad_norms")
        found = [float(n) for n in norms.values() if n is not None] if isinstance(norms, dict) else []
        total = math.sqrt(sum(n * n for n in found)) if found else None
        values[int(str(event["step"]))] = StepValues(_loss(event.get("loss")), total)
    return values


def _loss(value: object) -> Loss:
    """The event's `loss` with its JSON types checked."""
    if isinstance(value, list):
        return [float(item) if isinstance(item, (int, float)) else None for item in value]
    return float(value) if isinstance(value, (int, float)) else None


def _values(values: StepValues | None) -> dict[str, object] | None:
    return None if values is None else values.as_dict()


def _unverifiable(finding: TracedFinding) -> str | None:
    """Why the original run gives nothing to compare the fix against, if so."""
    d = finding.diagnostic
    if finding.status == NOT_REACHED:
        return f"line {d.line} never ran in the original run"
    if finding.status == NOT_CHECKED:
        return f"the tracer has no runtime check for {d.code}"
    if finding.status != CONFIRMED:
        return f"the original run did not show {d.code} at line {d.line}, so there is nothing to compare"
    return None


def _lines(span: Span) -> str:
    return f"line {span[0]}" if span[0] == span[1] else f"lines {span[0]}-{span[1]}"


def _pair(values: list[Loss]) -> str:
    before, after = values
    return f"{_shown(before)} {'=' if before == after else '->'} {_shown(after)}"


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return "n/a" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _finite(value: object) -> bool:
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return not isinstance(value, float) or math.isfinite(value)
