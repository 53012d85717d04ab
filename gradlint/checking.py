"""Parse a module and run rules over it: the part of linting that needs LibCST and the analysis.

The engine imports this module only when a file has to be parsed, so that a run whose files
are all cache hits, or that no enabled rule could fire on, never loads LibCST or the rules.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from gradlint.analysis import ModuleAnalysis, analyze
from gradlint.analysis.project.program import ModuleProgram, Program
from gradlint.analysis.project.summaries import ModuleSummary, summarize
from gradlint.analysis.syntax.positions import WrittenStatements
from gradlint.cache import SummaryStore
from gradlint.catalog import could_fire
from gradlint.decoding import decode_source, unparsable
from gradlint.index import Outlines
from gradlint.pytest_layout import layout_for
from gradlint.rule import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, Related, Reported, Rule, tool_diagnostic

ParserSyntaxError = cst.ParserSyntaxError  # what `parse` raises for code LibCST cannot read


def parse(text: str) -> cst.Module:
    """The module `text` holds; raises what LibCST raises for code it cannot parse."""
    return cst.parse_module(text)  # text, not bytes: LibCST would reject a cookie decode_source overrode


def summarize_module(text: str) -> ModuleSummary | None:
    """The summary of the module `text` holds, or None when it cannot be parsed or analysed."""
    try:
        return summarize(analyze(parse(text)))
    except Exception:  # noqa: BLE001  (a module that cannot be summarized is unknown, as outside code is)
        return None


def run_rules(
    module: cst.Module,
    rules: list[type[Rule]],
    path: str,
    program: ModuleProgram | None = None,
    more: list[type[Rule]] | None = None,
    source: bytes = b"",
    written: WrittenStatements | None = None,
) -> list[Diagnostic]:
    """The sorted findings of `rules` on `module`; a failing rule gives GL999 and the others still run.

    With `program`, calls into the project's other modules are judged by their summaries,
    and the rules of `more` (which the file's own text gave no reason to run) run too when
    the module's `source` and the code its calls run in other modules hold what they need
    (`requires`). `written`: the top-level statements of the file's previous version,
    written out (`gradlint.incremental`).
    """
    more = more or []
    wanted = frozenset(
        name[len("visit_") :] for rule in (*rules, *more) for name in dir(rule) if name.startswith("visit_")
    )
    try:
        analysis = analyze(module, wanted, program, written, layout_for(path))
    except RecursionError:
        return [tool_diagnostic(PARSE_ERROR, path, 1, 1, "cannot lint: the file is nested too deeply")]
    if more and program is not None:
        rules = [*rules, *_firing_through_calls(source, more, program, analysis)]
    diagnostics: list[Diagnostic] = []
    for rule_class in rules:
        rule = rule_class(analysis)
        try:
            _run_rule(rule, analysis)
        except Exception as error:  # noqa: BLE001  (one failing rule must not hide the others)
            message = f"internal error in {rule.code}, please report: {type(error).__name__}: {error}"
            diagnostics.append(tool_diagnostic(INTERNAL_ERROR, path, 1, 1, message))
            continue
        diagnostics.extend(_at(analysis, rule, path, reported) for reported in rule.reported)
    return sorted(set(diagnostics))


def _firing_through_calls(
    source: bytes, more: list[type[Rule]], program: ModuleProgram, analysis: ModuleAnalysis
) -> list[type[Rule]]:
    """The rules of `more` that could fire once the code the module's calls run elsewhere is counted."""
    wanted = frozenset(
        token
        for rule in more
        for clause in rule.requires
        for token in ((clause,) if isinstance(clause, bytes) else clause)
    )
    reached = program.reached_tokens(analysis.collected, analysis.events, wanted)
    if not reached:
        return []
    text = source + b"\0" + b"\0".join(sorted(reached))
    return [rule for rule in more if could_fire(rule, text)]


def _run_rule(rule: Rule, analysis: ModuleAnalysis) -> None:
    rule.check_module()
    if type(rule).check_step is not Rule.check_step:
        for step in analysis.training_steps:
            rule.check_step(step)
    for name in dir(type(rule)):
        if name.startswith("visit_"):
            visit = getattr(rule, name)
            for node in analysis.collected.by_type.get(name[len("visit_") :], []):
                visit(node)


def _at(analysis: ModuleAnalysis, rule: Rule, path: str, reported: Reported) -> Diagnostic:
    position = analysis.positions[reported.node]
    related = []
    for node, note in reported.related:
        where = analysis.positions[node]
        start, end = where.start, where.end
        related.append(Related(path, start.line, start.column + 1, end.line, end.column + 1, note))
    return Diagnostic(
        path=path,
        line=position.start.line,
        column=position.start.column + 1,
        code=rule.code,
        end_line=position.end.line,
        end_column=position.end.column + 1,
        name=rule.name,
        message=reported.message,
        fix=reported.fix,
        related=tuple(dict.fromkeys(related)),  # each place once, in the order given
    )


def module_program(program: Program, path: str) -> ModuleProgram:
    """The view of `program` from the module file `path`."""
    return ModuleProgram(program, program.project.add_file(Path(path)))


def new_program(outlines: Outlines, store: SummaryStore | None) -> Program:
    """A whole-program model over `outlines` whose summaries are computed by parsing with LibCST (kept in `store`)."""
    return Program(outlines, _summarize_file, store=store)


def _summarize_file(data: bytes, path: str) -> ModuleSummary | None:
    try:
        text = decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None
    if unparsable(data, text) is not None:
        return None
    return summarize_module(text)
