"""The command line: `gradlint [PATHS]`, `gradlint check`, `gradlint rule CODE`, `gradlint rules`."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from gradlint import __version__
from gradlint.cache import CACHE_DIR
from gradlint.catalog import rule_infos
from gradlint.config import Config, ConfigError, load_config
from gradlint.formats import formats, text
from gradlint.rule import INTERNAL_ERROR, Diagnostic, all_rules

if TYPE_CHECKING:  # the engine imports LibCST: only commands that lint load it (`--version` stays fast)
    from gradlint.engine import Targets
    from gradlint.fix import FileFix

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class DefaultToCheck(click.Group):
    """A group that runs `check` when the first argument is not a subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["check", *args]
        return super().parse_args(ctx, args)


def _codes(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(code.strip().upper() for code in value.split(",") if code.strip())


def _patterns(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(p.strip() for p in value.split(",") if p.strip())


@click.group(cls=DefaultToCheck, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gradlint")
def main() -> None:
    """Find PyTorch gradient bugs. Run `gradlint PATH...` to lint (default: the current directory)."""


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "output_format", type=click.Choice(sorted(formats())), default="text", show_default=True)
@click.option("--select", help="Comma-separated codes or prefixes to report (replaces the config's select and ignore).")
@click.option("--ignore", help="Comma-separated codes or prefixes to skip (replaces the config's ignore).")
@click.option("--exclude", help="Comma-separated gitignore-style patterns to skip, replacing the defaults.")
@click.option("--extend-exclude", help="Comma-separated patterns to skip in addition to the defaults.")
@click.option(
    "--preview/--no-preview",
    default=None,
    help="Also run the rules in preview: not yet right four times in five on fresh code (see `gradlint rules`).",
)
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-q", "--quiet", is_flag=True, help="Print findings only, no summary or warnings.")
@click.option("--exit-zero", is_flag=True, help="Exit with 0 even when there are findings.")
@click.option("--show-source", is_flag=True, help="Text format: print each offending line with a caret under it.")
@click.option("--statistics", is_flag=True, help="Text format: print how many findings each code has instead.")
@click.option(
    "--output-file", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here, not stdout."
)
@click.option("--fix", "apply_fixes", is_flag=True, help="Apply safe fixes in place, then report what remains.")
@click.option("--diff", "show_diff", is_flag=True, help="Print the fixes as a unified diff instead; write nothing.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix or --diff, also apply fixes that need review.")
@click.option("--add-noqa", is_flag=True, help="Add `# noqa: CODE` comments that silence every current finding.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Worker processes (default: one per core; 1: none).")
@click.option("--no-cache", is_flag=True, help=f"Neither read nor write the result cache ({CACHE_DIR}/).")
def check(
    paths: tuple[Path, ...],
    output_format: str,
    select: str | None,
    ignore: str | None,
    exclude: str | None,
    extend_exclude: str | None,
    preview: bool | None,
    config_file: Path | None,
    quiet: bool,
    exit_zero: bool,
    show_source: bool,
    statistics: bool,
    output_file: Path | None,
    apply_fixes: bool,
    show_diff: bool,
    unsafe_fixes: bool,
    add_noqa: bool,
    jobs: int | None,
    no_cache: bool,
) -> None:
    """Lint files and directories (recursing into *.py and *.ipynb) and report findings."""
    from gradlint.engine import find_targets, lint_targets

    _check_usage(output_format, show_source, statistics, apply_fixes, show_diff, add_noqa)
    paths = paths or (Path("."),)
    try:
        config = load_config(paths[0], config_file).with_overrides(
            select=_codes(select),
            ignore=_codes(ignore),
            exclude=_patterns(exclude),
            extend_exclude=_patterns(extend_exclude),
            preview=preview,
        )
    except ConfigError as error:
        _fail(str(error))
    targets = find_targets(paths, config)
    if not quiet:
        _warn_about_empty(targets)
    cache = None if no_cache else config.root / CACHE_DIR
    if show_diff or apply_fixes:
        from gradlint.fix import fix_paths  # the fixer edits syntax trees: it imports LibCST

    if show_diff:
        sys.exit(
            _show_diff(fix_paths(paths, config, unsafe_fixes, write=False, jobs=jobs, cache=cache), quiet, output_file)
        )
    if apply_fixes:
        diagnostics = _apply_fixes(fix_paths(paths, config, unsafe_fixes, jobs=jobs, cache=cache), quiet)
    else:
        diagnostics = sorted(lint_targets(targets, config, jobs=jobs, cache=cache))
    if add_noqa:
        diagnostics = _add_noqa(diagnostics, config, quiet)
    _write(_renderer(output_format, show_source, statistics)(diagnostics), output_file)
    if not quiet:
        click.echo(_summary(diagnostics, targets.checked), err=True)
    sys.exit(exit_code(diagnostics, exit_zero))


def _check_usage(
    output_format: str, show_source: bool, statistics: bool, apply_fixes: bool, show_diff: bool, add_noqa: bool
) -> None:
    """Raise UsageError for options that cannot go together."""
    for flag, given in (("--show-source", show_source), ("--statistics", statistics)):
        if given and output_format != "text":
            raise click.UsageError(f"{flag} works with the text format only")
    if show_source and statistics:
        raise click.UsageError("--show-source cannot be combined with --statistics")
    if add_noqa and (apply_fixes or show_diff):
        raise click.UsageError("--add-noqa cannot be combined with --fix or --diff")
    if statistics and show_diff:
        raise click.UsageError("--statistics cannot be combined with --diff")


def _renderer(output_format: str, show_source: bool, statistics: bool) -> Callable[[list[Diagnostic]], str]:
    if statistics:
        return render_statistics
    if show_source:
        from gradlint.source import SourceLines

        return partial(text.render, source_line=SourceLines().line)
    return formats()[output_format]


def _write(report: str, output_file: Path | None) -> None:
    """Print the report, or write it to `output_file` (even when it is empty, for CI to pick up)."""
    if output_file is None:
        click.echo(report, nl=False)
        return
    try:
        output_file.parent.mkdir(parents=True, exist_ok=True)
        output_file.write_text(report, encoding="utf-8")
    except OSError as error:
        _fail(f"cannot write {output_file}: {error.strerror or error}")


def _fail(message: str) -> NoReturn:
    click.echo(f"gradlint: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def _warn_about_empty(targets: Targets) -> None:
    """Say which paths named on the command line hold nothing to lint."""
    for path in targets.empty:
        if path.is_dir():
            folder = str(path) if str(path).endswith("/") else f"{path}/"
            click.echo(f"gradlint: warning: {folder} holds no file to lint (excluded or no Python files)", err=True)
        else:
            click.echo(f"gradlint: warning: {path} is excluded by the configuration; not linted", err=True)


def _show_diff(fixing: Iterable[FileFix], quiet: bool, output_file: Path | None) -> int:
    """Print what --fix would change; 1 when it would change something."""
    results = list(fixing)
    _write("".join(result.diff() for result in results), output_file)
    _report_rejected(results)
    fixes = sum(result.applied for result in results)
    if not quiet:
        click.echo(f"Would fix {fixes} problem{'s' if fixes != 1 else ''}.", err=True)
    return EXIT_FINDINGS if any(result.changed for result in results) else EXIT_CLEAN


def _apply_fixes(fixing: Iterable[FileFix], quiet: bool) -> list[Diagnostic]:
    """Fix files in place; the findings that remain."""
    results = list(fixing)
    for result in results:
        if result.skipped:
            click.echo(f"gradlint: {result.path}: not fixed: {result.skipped}", err=True)
    _report_rejected(results)
    fixes = sum(result.applied for result in results)
    if not quiet and fixes:
        click.echo(f"Fixed {fixes} problem{'s' if fixes != 1 else ''}.", err=True)
    return sorted(diagnostic for result in results for diagnostic in result.remaining)


def _add_noqa(diagnostics: list[Diagnostic], config: Config, quiet: bool) -> list[Diagnostic]:
    """Silence every finding with a `# noqa` comment; the findings no comment silences."""
    from gradlint.noqa import add_noqa

    results = list(add_noqa(diagnostics, config))
    for result in results:
        if result.skipped:
            click.echo(f"gradlint: {result.path}: no noqa comment added: {result.skipped}", err=True)
    if not quiet:
        added = sum(result.added for result in results)
        click.echo(f"Added {added} noqa comment{'s' if added != 1 else ''}.", err=True)
    return sorted(diagnostic for result in results for diagnostic in result.remaining)


def _report_rejected(results: list[FileFix]) -> None:
    """Say which fixes were dropped because their result did not verify; their findings remain."""
    for result in results:
        for rejected in result.rejected:
            d = rejected.diagnostic
            click.echo(f"gradlint: {d.path}:{d.line}:{d.column}: {d.code} fix not applied: {rejected.reason}", err=True)


@main.command()
def lsp() -> None:
    """Run the language server over stdio (needs the `lsp` extra: pip install 'gradlint[lsp]')."""
    try:
        from gradlint.lsp import server
    except ImportError as error:
        if (error.name or "").split(".")[0] not in ("pygls", "lsprotocol"):
            raise
        click.echo("gradlint: error: the language server needs pygls: pip install 'gradlint[lsp]'", err=True)
        sys.exit(EXIT_ERROR)
    server.start_io()


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", required=False, type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "module", help="Run a module, as `python -m MODULE`, instead of SCRIPT.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(min=1), help="Optimizer steps to run.")
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds before the script is stopped (SIGTERM, then SIGKILL).",
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--report", "html", type=click.Path(dir_okay=False, path_type=Path), help="Write an HTML report.")
@click.option("--quiet-script", is_flag=True, help="Hide the script's own output.")
@click.option("--fix", "verify_fixes", is_flag=True, help="Also trace a fixed copy (never written) and compare.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix, also apply fixes that need review.")
def trace(
    script: Path | None,
    args: tuple[str, ...],
    module: str | None,
    steps: int,
    timeout: float,
    output_format: str,
    html: Path | None,
    quiet_script: bool,
    verify_fixes: bool,
    unsafe_fixes: bool,
) -> None:
    """EXECUTE a training script for a few steps under PyTorch instrumentation to confirm findings.

    Script arguments go after `--`: gradlint trace train.py --steps 5 -- --lr 0.1
    """
    from gradlint.runtime.command import module_target, run_trace, run_trace_fix
    from gradlint.runtime.runner import Target

    if module is None and script is None:
        raise click.UsageError("give a SCRIPT or -m MODULE")
    if unsafe_fixes and not verify_fixes:
        raise click.UsageError("--unsafe-fixes works with --fix only")
    if verify_fixes and html is not None:
        raise click.UsageError("--report cannot be combined with --fix; trace the script without --fix for it")
    if module is not None:
        target = module_target(module, (*([str(script)] if script else []), *args))
        if target is None:
            click.echo(f"gradlint: error: no module named {module!r} found on the path", err=True)
            sys.exit(EXIT_ERROR)
    else:
        target = Target(Path(str(script)), None, args)
    try:
        config = load_config(target.script)
    except ConfigError as error:
        click.echo(f"gradlint: error: {error}", err=True)
        sys.exit(EXIT_ERROR)
    if verify_fixes:
        sys.exit(run_trace_fix(target, config, steps, timeout, output_format, unsafe_fixes, quiet_script))
    sys.exit(run_trace(target, config, steps, timeout, output_format, html, quiet_script))


def exit_code(diagnostics: list[Diagnostic], exit_zero: bool = False) -> int:
    """2 when gradlint itself failed, else 1 for findings (0 with --exit-zero), else 0."""
    if any(d.code == INTERNAL_ERROR[0] for d in diagnostics):
        return EXIT_ERROR
    return EXIT_FINDINGS if diagnostics and not exit_zero else EXIT_CLEAN


def _summary(diagnostics: list[Diagnostic], checked: int) -> str:
    if not diagnostics and not checked:
        return "No Python files found to check."
    if not diagnostics:
        return f"All checks passed ({checked} file{'s' if checked != 1 else ''})."
    files = len({d.path for d in diagnostics})
    problems = "problem" if len(diagnostics) == 1 else "problems"
    return f"Found {len(diagnostics)} {problems} in {files} file{'s' if files != 1 else ''}{_fixable(diagnostics)}."


def _fixable(diagnostics: list[Diagnostic]) -> str:
    """`; 2 fixable with --fix (1 more with --unsafe-fixes)`, or nothing when no finding has a fix."""
    safe = sum(1 for d in diagnostics if d.fix is not None and d.fix.safe)
    unsafe = sum(1 for d in diagnostics if d.fix is not None and not d.fix.safe)
    parts = [f"{safe} fixable with --fix"] if safe else []
    if unsafe:
        parts.append(f"({unsafe} more with --unsafe-fixes)" if safe else f"{unsafe} fixable with --unsafe-fixes")
    return "; " + " ".join(parts) if parts else ""


def render_statistics(diagnostics: Sequence[Diagnostic]) -> str:
    """How many findings each code has, most first, then the total, as Ruff's --statistics."""
    counts = Counter((d.code, d.name) for d in diagnostics)
    if not counts:
        return ""
    width = len(str(len(diagnostics)))
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    rows = [f"{count:>{width}}  {code}  {name}" for (code, name), count in ordered]
    return "".join(f"  {row}\n" for row in [*rows, f"{len(diagnostics):>{width}}  total"])


@main.command()
@click.argument("code")
def rule(code: str) -> None:
    """Print the documentation of one rule (by code or name)."""
    for info in rule_infos().values():
        if code.upper() == info.code or code == info.name:
            click.echo(info.documentation(), nl=False)
            return
    click.echo(f"gradlint: error: unknown rule '{code}' (see `gradlint rules`)", err=True)
    sys.exit(EXIT_ERROR)


@main.command(name="rules")
@click.option("--markdown", is_flag=True, help="Print the table the README shows.")
@click.option("--docs", is_flag=True, help="Print every rule's documentation as Markdown (docs/rules.md).")
def list_rules(markdown: bool, docs: bool) -> None:
    """List every rule: code, name and summary."""
    if docs:
        click.echo(rules_markdown(), nl=False)
        return
    click.echo(
        rule_table()
        if markdown
        else "".join(
            f"{r.code}  {r.name:<28} {'(preview) ' if r.preview else ''}{r.summary}\n" for r in rule_infos().values()
        ),
        nl=False,
    )


def rules_markdown() -> str:
    """docs/rules.md: every rule's documentation, generated from the rules themselves."""
    sections = [rule_class.markdown() for rule_class in all_rules().values()]
    return "# gradlint rules\n\nGenerated by `gradlint rules --docs`; do not edit by hand.\n\n" + "\n".join(sections)


def rule_table() -> str:
    """The Markdown rule table of the README, generated from the rules themselves."""
    rows = [
        f"| [{r.code}](docs/rules.md#{r.anchor()}) | `{r.name}` | {'preview' if r.in_preview() else 'on'} "
        f"| {r.summary()} |"
        for r in all_rules().values()
    ]
    return "\n".join(["| Code | Name | Default | What it finds |", "| --- | --- | --- | --- |", *rows]) + "\n"


__all__ = ["Config", "main"]
