"""The only place that parses, runs rules, applies suppressions and sorts findings."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from gradlint import notebook
from gradlint.analysis import ModuleAnalysis, analyze
from gradlint.config import Config
from gradlint.files import Missing, discover
from gradlint.rule import Diagnostic, Rule, all_rules

PARSE_ERROR = ("GL000", "parse-error")
INTERNAL_ERROR = ("GL999", "internal-error")
# flake8's own pattern (flake8.defaults.NOQA_INLINE_REGEXP), so a comment means the same in both tools.
_NOQA = re.compile(r"# noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.IGNORECASE)
_FILE_NOQA = re.compile(rb"^\s*#\s*gradlint\s*[:=]\s*noqa\s*$", re.IGNORECASE | re.MULTILINE)
_ERROR_AT = re.compile(r"error at (\d+):(\d+)")


def enabled_rules(config: Config, path: str) -> list[type[Rule]]:
    """The rule classes whose findings `config` reports for `path`."""
    return [rule for code, rule in all_rules().items() if config.is_enabled(code, path)]


def lint_source(
    source: str | bytes, path: str = "<string>", config: Config | None = None, *, noqa: bool = True
) -> list[Diagnostic]:
    """Lint one module's source; never raises for bad input (GL000) or a failing rule (GL999).

    With `noqa=False`, `# noqa` comments are left to the caller: flake8 applies its own.
    """
    config = config or Config()
    data = source.encode("utf-8") if isinstance(source, str) else source
    if _FILE_NOQA.search(data):
        return []
    rules = enabled_rules(config, path)
    if not any(all(token in data for token in rule.requires) for rule in rules):
        # No enabled rule could fire on this file: skip the parse, but still report
        # a file that cannot even be decoded (cheap, and always worth knowing).
        problem = _undecodable(data)
        return _filter([_diagnostic(PARSE_ERROR, path, 1, 1, problem)], "", config, noqa) if problem else []
    try:
        module = cst.parse_module(data)
    except Exception as error:  # noqa: BLE001  (any parser failure is reported, not raised)
        return _filter([_parse_error(path, error)], data.decode("utf-8", "replace"), config, noqa)
    return _filter(_run_rules(module, rules, path), module.code, config, noqa)


def lint_file(path: Path, config: Config | None = None) -> list[Diagnostic]:
    """Lint one file on disk; a file that cannot be read yields GL000."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return [_diagnostic(PARSE_ERROR, str(path), 1, 1, f"cannot read file: {error.strerror or error}")]
    if path.suffix == notebook.SUFFIX:
        return lint_notebook(data, str(path), config)
    return lint_source(data, str(path), config)


def lint_notebook(data: bytes, path: str, config: Config | None = None) -> list[Diagnostic]:
    """Lint a Jupyter notebook's code cells as one module; findings carry their cell."""
    try:
        cells = notebook.read_notebook(data)
    except notebook.NotebookError as error:
        return [_diagnostic(PARSE_ERROR, path, 1, 1, f"cannot read notebook: {error}")]
    return sorted(cells.locate(diagnostic) for diagnostic in lint_source(cells.source, path, config))


def lint_paths(paths: Iterable[Path], config: Config | None = None) -> Iterator[Diagnostic]:
    """Lint files and directories, yielding findings sorted by path, line and column."""
    config = config or Config()
    for item in discover(list(paths), config):
        if isinstance(item, Missing):
            yield _diagnostic(PARSE_ERROR, item.path, 1, 1, f"cannot lint: {item.reason}")
        else:
            yield from lint_file(item, config)


def _run_rules(module: cst.Module, rules: list[type[Rule]], path: str) -> list[Diagnostic]:
    wanted = frozenset(name[len("visit_") :] for rule in rules for name in dir(rule) if name.startswith("visit_"))
    try:
        analysis = analyze(module, wanted)
    except RecursionError:
        return [_diagnostic(PARSE_ERROR, path, 1, 1, "cannot lint: the file is nested too deeply")]
    if not analysis.is_torch_code:
        return []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    diagnostics: list[Diagnostic] = []
    for rule_class in rules:
        rule = rule_class(analysis)
        try:
            _run_rule(rule, analysis)
        except Exception as error:  # noqa: BLE001  (one failing rule must not hide the others)
            message = f"internal error in {rule.code}, please report: {type(error).__name__}: {error}"
            diagnostics.append(_diagnostic(INTERNAL_ERROR, path, 1, 1, message))
            continue
        if rule.reported:
            positions = wrapper.resolve(PositionProvider)
            for node, message, fix in rule.reported:
                diagnostics.append(_at(positions[node], rule, path, message, fix))
    return sorted(set(diagnostics))


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


def _at(position: CodeRange, rule: Rule, path: str, message: str, fix: object) -> Diagnostic:
    return Diagnostic(
        path=path,
        line=position.start.line,
        column=position.start.column + 1,
        code=rule.code,
        end_line=position.end.line,
        end_column=position.end.column + 1,
        name=rule.name,
        message=message,
        fix=fix,  # type: ignore[arg-type]  # Rule.reported holds Fix | None
    )


def _diagnostic(kind: tuple[str, str], path: str, line: int, column: int, message: str) -> Diagnostic:
    code, name = kind
    return Diagnostic(path, line, column, code, end_line=line, end_column=column, name=name, message=message)


def _undecodable(data: bytes) -> str | None:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        return f"cannot decode: {error}"
    return None


def _parse_error(path: str, error: Exception) -> Diagnostic:
    if isinstance(error, cst.ParserSyntaxError):
        found = _ERROR_AT.search(str(error))
        line, column = (int(found[1]), int(found[2]) + 1) if found else (error.raw_line, error.raw_column + 1)
        return _diagnostic(PARSE_ERROR, path, max(line, 1), max(column, 1), f"syntax error: {error.message}")
    if isinstance(error, RecursionError):
        return _diagnostic(PARSE_ERROR, path, 1, 1, "cannot parse: the file is nested too deeply")
    return _diagnostic(PARSE_ERROR, path, 1, 1, f"cannot parse: {error}")


def _filter(diagnostics: list[Diagnostic], text: str, config: Config, noqa: bool) -> list[Diagnostic]:
    enabled = [d for d in diagnostics if d.code == INTERNAL_ERROR[0] or config.is_enabled(d.code, d.path)]
    if not noqa or not enabled or not _NOQA.search(text):
        return enabled
    lines = _noqa_lines(text)
    return [d for d in enabled if d.code == INTERNAL_ERROR[0] or not _suppressed(d, lines.get(d.line, ""))]


def _noqa_lines(text: str) -> dict[int, str]:
    """For each line, the text searched for `# noqa`, as flake8 builds it.

    A token spanning lines (a triple-quoted string) or a backslash continuation makes
    its lines one: a `# noqa` on any of them covers all of them.
    """
    lines = io.StringIO(text).readlines()
    mapping = dict(enumerate(lines, start=1))
    first, last = len(lines) + 2, -1
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.ENDMARKER, tokenize.DEDENT):
                continue
            first, last = min(first, token.start[0]), max(last, token.end[0])
            if token.type in (tokenize.NL, tokenize.NEWLINE):
                mapping.update(dict.fromkeys(range(first, last + 1), "".join(lines[first - 1 : last])))
                first, last = len(lines) + 2, -1
    except (tokenize.TokenError, SyntaxError):
        return dict(enumerate(lines, start=1))  # flake8 falls back to the physical lines too
    return mapping


def _suppressed(diagnostic: Diagnostic, line: str) -> bool:
    """flake8's semantics: bare `# noqa` silences the line, `# noqa: GL001` those codes (prefixes)."""
    match = _NOQA.search(line)
    if match is None:
        return False
    codes = match.group("codes")
    if codes is None:
        return True
    return any(diagnostic.code.startswith(code) for code in re.split(r"[,\s]+", codes.strip()) if code)
