"""`gradlint trace`: lint the script, run it traced, and print the joined report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from gradlint.config import Config
from gradlint.engine import lint_file
from gradlint.runtime.html import render_html
from gradlint.runtime.report import build_report
from gradlint.runtime.runner import Target, resolve_module, run_traced

EXIT_ERROR = 2


def torch_available() -> bool:
    """Whether torch can be found by this interpreter (the traced child is started with it)."""
    return importlib.util.find_spec("torch") is not None


def run_trace(
    target: Target, config: Config, steps: int, timeout: float, output_format: str, html: Path | None, quiet: bool
) -> int:
    """Trace one script and print the report; returns the exit code."""
    if not torch_available():
        click.echo(
            "gradlint: error: `gradlint trace` needs torch, which is not installed; "
            "install it with `pip install 'gradlint[runtime]'`",
            err=True,
        )
        return EXIT_ERROR
    if not target.script.is_file():
        click.echo(f"gradlint: error: cannot trace {target.script}: no such file", err=True)
        return EXIT_ERROR
    static = lint_file(target.script, config)
    run = run_traced(target, static, steps, timeout, quiet)
    report = build_report(str(target.script), static, run, lambda code: config.is_enabled(code, str(target.script)))
    click.echo(report.as_json() if output_format == "json" else report.as_text(), nl=False)
    click.echo(report.summary(), err=True)
    if html is not None:
        html.write_text(render_html(report), encoding="utf-8")
        click.echo(f"Wrote {html}", err=True)
    return report.exit_code()


def module_target(module: str, args: tuple[str, ...]) -> Target | None:
    """The target of `-m module`, or None when no file on the path provides it."""
    path = resolve_module(module)
    return None if path is None else Target(path, module, args)
