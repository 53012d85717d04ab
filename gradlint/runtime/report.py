"""Static findings joined with what the traced run observed: statuses, evidence, output, exit code."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gradlint.formats.json import as_dict
from gradlint.rule import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, all_rules
from gradlint.runtime.runner import TraceRun

CONFIRMED = "confirmed"
NOT_REPRODUCED = "not-reproduced"
NOT_REACHED = "not-reached"
RUNTIME_ONLY = "runtime-only"
NOT_TRACED = "not-traced"  # GL000/GL999: about gradlint reading the file, nothing to observe
NOT_CHECKED = "not-checked"  # the line ran, but the tracer has no check for this rule (a newer rule)
# The rules the tracer observes (tracer.py); a finding of another rule whose line ran is
# NOT_CHECKED, never "not reproduced".
CHECKED_CODES = frozenset(f"GL{n:03d}" for n in range(1, 20))  # GL020 and GL021 have no runtime check

_REASONS = {
    "steps": "stopped after the requested number of steps",
    "finished": "the script finished",
    "exit": "the script called sys.exit",
    "exception": "the script raised an exception",
    "timeout": "stopped at the timeout",
    "crashed": "the traced process died without a report",
    "no-torch": "torch could not be imported in the traced process",
}


@dataclass(frozen=True)
class TracedFinding:
    """A finding with its runtime status and what the tracer saw."""

    diagnostic: Diagnostic
    status: str
    evidence: str | None


@dataclass(frozen=True)
class TraceReport:
    """The outcome of one `gradlint trace`."""

    path: str
    findings: list[TracedFinding]
    run: TraceRun

    @property
    def exception(self) -> dict[str, object] | None:
        """The exception that ended the script, if any."""
        exceptions = self.run.of_kind("exception")
        return exceptions[-1] if exceptions else None

    def exit_code(self) -> int:
        """2 when the trace itself failed, 1 when something was confirmed, found or raised, else 0."""
        if self.run.reason in ("crashed", "no-torch") or self.run.of_kind("internal-error"):
            return 2
        found = any(f.status in (CONFIRMED, RUNTIME_ONLY) for f in self.findings)
        return 1 if found or self.exception is not None else 0

    def summary(self) -> str:
        """One paragraph on how the run went and what it found."""
        counts = {status: sum(f.status == status for f in self.findings) for status in _STATUSES}
        end = self.run.of_kind("end")
        steps = end[-1].get("steps", 0) if end else len(self.run.of_kind("step"))
        lines = [
            f"Traced {self.path}: {steps} {self._step_unit()} in {self.run.seconds:.1f} s; "
            f"{_REASONS.get(self.run.reason, self.run.reason)}{': ' + self.run.detail if self.run.detail else ''}.",
            ", ".join(f"{counts[s]} {s.replace('-', ' ')}" for s in _STATUSES) + ".",
        ]
        for error in self.run.of_kind("internal-error"):
            lines.append(
                f"gradlint: internal error in the tracer ({error['where']}: {error['message']}), please report"
            )
        if self.exception is not None:
            where = f"{self._display(str(self.exception['path']))}:{self.exception['line']}"
            lines.append(f"The script raised {self.exception['type']} at {where}: {self.exception['message']}")
        return "\n".join(lines)

    def _step_unit(self) -> str:
        # A script without an optimizer: the tracer counts its backward passes as its steps.
        if any(step.get("manual") for step in self.run.of_kind("step")):
            return "step(s) (backward passes: the script builds no optimizer)"
        return "optimizer step(s)"

    def _display(self, path: str) -> str:
        return self.path if path == str(Path(self.path).resolve()) else path

    def as_json(self) -> str:
        """The report as the documented JSON object."""
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def as_dict(self) -> dict[str, object]:
        """The documented JSON object, as Python data: `findings` and `run`."""
        findings = [
            {**as_dict(f.diagnostic), "status": f.status, "evidence": f.evidence, "observed": self.observed(f)}
            for f in self.findings
        ]
        end = self.run.of_kind("end")
        run = {
            "reason": self.run.reason,
            "detail": self.run.detail,
            "steps": end[-1].get("steps", 0) if end else len(self.run.of_kind("step")),
            "seconds": round(self.run.seconds, 3),
            "exception": None if self.exception is None else {k: v for k, v in self.exception.items() if k != "kind"},
        }
        return {"findings": findings, "run": run}

    def observed(self, finding: TracedFinding) -> dict[str, object]:
        """What the run measured that bears on a confirmed finding, step by step.

        GL001: the autograd nodes the script's variables held after each step, and their
        growth per step (a leak grows by about one step's graph each step). GL002: the total
        gradient norm at each step, and its last-to-first ratio (without a clear, gradients
        add up and the norm grows). Other rules: their evidence sentence says what was seen.
        """
        if finding.status != CONFIRMED:
            return {}
        steps = self.run.of_kind("step")
        if finding.diagnostic.code == "GL001":
            held = [nodes for step in steps if isinstance(nodes := step.get("graph_nodes"), int)]
            growth = [after - before for before, after in itertools.pairwise(held)]
            return {"graph_nodes_per_step": held, "growth_per_step": statistics.median(growth) if growth else None}
        if finding.diagnostic.code == "GL002":
            norms = [_total_norm(step.get("grad_norms")) for step in steps]
            known = [norm for norm in norms if norm is not None]
            ratio = known[-1] / known[0] if len(known) > 1 and known[0] else None
            return {"grad_norm_per_step": norms, "ratio_last_to_first": ratio}
        return {}

    def as_text(self) -> str:
        """One line per finding: `path:line:col: CODE message [STATUS] evidence`."""
        lines = []
        for finding in self.findings:
            d = finding.diagnostic
            shown = finding.evidence and finding.status != RUNTIME_ONLY  # its message is the evidence
            evidence = f": {finding.evidence}" if shown else ""
            lines.append(f"{d.path}:{d.line}:{d.column}: {d.code} {d.message} [{finding.status.upper()}{evidence}]\n")
        return "".join(lines)


_STATUSES = (CONFIRMED, NOT_REPRODUCED, NOT_REACHED, RUNTIME_ONLY, NOT_CHECKED)


def _total_norm(norms: object) -> float | None:
    """The global L2 norm of a step's per-parameter gradient norms (None when there were none)."""
    if not isinstance(norms, dict):
        return None
    values = [float(norm) for norm in norms.values() if isinstance(norm, (int, float))]
    return math.sqrt(sum(value * value for value in values)) if values else None


def build_report(
    path: str, static: list[Diagnostic], run: TraceRun, enabled: Callable[[str], bool] = lambda code: True
) -> TraceReport:
    """Give each static finding its status and add what only the run found (of the `enabled` codes)."""
    script = str(Path(path).resolve())
    observed = run.of_kind("finding")
    reached = {int(line) for event in run.of_kind("coverage") for line in event["lines"]}  # type: ignore[attr-defined]
    used: set[int] = set()
    findings = []
    for diagnostic in sorted(static):
        if diagnostic.code in (PARSE_ERROR[0], INTERNAL_ERROR[0]) or run.reason in ("crashed", "no-torch"):
            findings.append(TracedFinding(diagnostic, NOT_TRACED, None))
            continue
        span = range(diagnostic.line, max(diagnostic.line, diagnostic.end_line) + 1)
        matches = [
            index
            for index, event in enumerate(observed)
            if event["code"] == diagnostic.code and event["path"] == script and event["line"] in span
        ]
        used.update(matches)
        if matches:
            evidence = "; ".join(str(observed[index]["message"]) for index in matches)
            findings.append(TracedFinding(diagnostic, CONFIRMED, evidence))
        else:
            checked = NOT_REPRODUCED if diagnostic.code in CHECKED_CODES else NOT_CHECKED
            status = checked if reached.intersection(span) else NOT_REACHED
            findings.append(TracedFinding(diagnostic, status, None))
    for index, event in enumerate(observed):
        if index not in used and enabled(str(event["code"])):
            findings.append(_runtime_only(event, path if event["path"] == script else str(event["path"])))
    return TraceReport(path, sorted(findings, key=lambda f: f.diagnostic), run)


def _runtime_only(event: dict[str, object], path: str) -> TracedFinding:
    code = str(event["code"])
    rule = all_rules().get(code)
    line = int(event["line"])  # type: ignore[call-overload]  # an int in the event stream
    evidence = str(event["message"])
    diagnostic = Diagnostic(
        path,
        line,
        1,
        code,
        end_line=line,
        end_column=1,
        name=rule.name if rule else "runtime",
        message=evidence,  # what was seen; the rule's own message may describe another form of the bug
    )
    return TracedFinding(diagnostic, RUNTIME_ONLY, evidence)
