"""`gradlint trace`: lint the script, run it traced (with `--fix`, its fixed copy too), and print the report."""

from __future__ import annotations

import importlib.util
import json
import tokenize
from pathlib import Path

import click

from gradlint.config import Config
from gradlint.engine import lint_file
from gradlint.fix import fix_source
from gradlint.rule import Diagnostic
from gradlint.runtime.html import render_html
from gradlint.runtime.report import TraceReport, build_report
from gradlint.runtime.runner import Target, resolve_module, run_traced
from gradlint.runtime.verify import LineMap, fixed_findings, verify_fixes

EXIT_ERROR = 2


def torch_available() -> bool:
    """Whether torch can be found by this interpreter (the traced child is started with it)."""
    return importlib.util.find_spec("torch") is not None


def run_trace(
    target: Target, config: Config, steps: int, timeout: float, output_format: str, html: Path | None, quiet: bool
) -> int:
    """Trace one script and print the report; returns the exit code."""
    if not _can_trace(target):
        return EXIT_ERROR
    static = lint_file(target.script, config)
    report = _traced(target, config, static, steps, timeout, quiet)
    click.echo(report.as_json() if output_format == "json" else report.as_text(), nl=False)
    click.echo(report.summary(), err=True)
    if html is not None:
        html.write_text(render_html(report), encoding="utf-8")
        click.echo(f"Wrote {html}", err=True)
    return report.exit_code()


def run_trace_fix(
    target: Target, config: Config, steps: int, timeout: float, output_format: str, unsafe: bool, quiet: bool
) -> int:
    """Trace the script and its fixed copy (never written), print how each fix fared; returns the exit code."""
    if not _can_trace(target):
        return EXIT_ERROR
    static = lint_file(target.script, config)
    text = _source(target.script)
    fixed = fix_source(text, str(target.script), config, unsafe)
    lines = LineMap(text, fixed.text)
    found = fixed_findings(static, fixed.remaining, lines, unsafe)
    if not found:
        return _report_nothing_fixed(_nothing_fixed(str(target.script), static, unsafe), output_format)
    original = _traced(target, config, static, steps, timeout, quiet)
    after = _traced(target, config, fixed.remaining, steps, timeout, quiet, fixed.text)
    verification = verify_fixes(found, lines, original, after, steps)
    click.echo(verification.as_json() if output_format == "json" else verification.as_text(), nl=False)
    click.echo(verification.summary(), err=True)
    return verification.exit_code()


def _can_trace(target: Target) -> bool:
    """Whether torch and the script are there; says why not."""
    if not torch_available():
        click.echo(
            "gradlint: error: `gradlint trace` needs torch, which is not installed; "
            "install it with `pip install 'gradlint[runtime]'`",
            err=True,
        )
        return False
    if not target.script.is_file():
        click.echo(f"gradlint: error: cannot trace {target.script}: no such file", err=True)
        return False
    return True


def _source(path: Path) -> str:
    """The script's text, decoded as Python decodes it; empty when it cannot be (GL000 says why)."""
    try:
        with tokenize.open(path) as handle:
            return handle.read()
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""


def _traced(
    target: Target,
    config: Config,
    static: list[Diagnostic],
    steps: int,
    timeout: float,
    quiet: bool,
    source: str | None = None,
) -> TraceReport:
    """Run the script (or `source` under its name) traced, with `static` as hints, and join the two."""
    run = run_traced(target, static, steps, timeout, quiet, source)
    return build_report(str(target.script), static, run, lambda code: config.is_enabled(code, str(target.script)))


def _report_nothing_fixed(message: str, output_format: str) -> int:
    """Say that nothing was fixed, so nothing was traced; that is no failure: returns 0."""
    if output_format == "json":
        click.echo(json.dumps({"fixes": [], "original": None, "fixed": None}, indent=2))
        click.echo(message, err=True)
    else:
        click.echo(message)
    return 0


def _nothing_fixed(path: str, static: list[Diagnostic], unsafe: bool) -> str:
    """Why no finding was fixed."""
    applicable = sum(d.fix is not None and (d.fix.safe or unsafe) for d in static)
    if applicable:
        return f"{path}: nothing fixed: none of the {applicable} applicable fix(es) removed its finding; nothing traced"
    if not static:
        return f"{path}: nothing to fix: no findings; nothing traced"
    unsafe_only = sum(d.fix is not None and not d.fix.safe for d in static)
    hint = f" ({unsafe_only} fixable with --unsafe-fixes)" if unsafe_only else ""
    return f"{path}: nothing to fix: no fix applies to its {len(static)} finding(s){hint}; nothing traced"


def module_target(module: str, args: tuple[str, ...]) -> Target | None:
    """The target of `-m module`, or None when no file on the path provides it."""
    path = resolve_module(module)
    return None if path is None else Target(path, module, args)
