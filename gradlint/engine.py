"""The only place that parses, runs rules, applies suppressions and sorts findings."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from gradlint import notebook, pytest_layout, screens
from gradlint.cache import ResultCache, SummaryStore, Uses
from gradlint.catalog import RuleInfo, could_fire, rule_infos
from gradlint.config import Config, resolve
from gradlint.decoding import decode_source, undecodable, unknown_codec, unparsable
from gradlint.files import Missing, discover
from gradlint.index import Outlines, imported_modules, imports_torch, standard_tree
from gradlint.project import Project
from gradlint.rule import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, tool_diagnostic

if TYPE_CHECKING:
    # The front-ends name the whole-program model through the engine, never the analysis.
    from gradlint.analysis.project.program import Program as Program
    from gradlint.incremental import IncrementalParser

# flake8's own pattern (flake8.defaults.NOQA_INLINE_REGEXP), so a comment means the same in both tools.
NOQA = re.compile(r"# noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.IGNORECASE)
_FILE_NOQA = re.compile(rb"^\s*#\s*gradlint\s*[:=]\s*noqa\s*$", re.IGNORECASE | re.MULTILINE)
_ERROR_AT = re.compile(r"error at (\d+):(\d+)")


def enabled_rules(config: Config, path: str) -> list[RuleInfo]:
    """The rules whose findings `config` reports for `path`, as data (see `gradlint.catalog`).

    A rule in preview (`gradlint.measured`) runs only with `preview`, or when `select` names its code.
    """
    return [
        rule
        for code, rule in rule_infos().items()
        if config.is_enabled(code, path) and (not rule.preview or config.runs_preview(code))
    ]


def _chosen(config: Config, data: bytes, path: str, outlines: Outlines | None) -> tuple[list[RuleInfo], list[RuleInfo]]:
    """The prefilter: (the enabled rules that could fire on the file, the others).

    A rule could fire when the file holds its `requires` tokens; where every rule that could
    fire has a screen, only those whose shape the file has (`gradlint.screens`). The others may still
    fire through a call into another project module that affects gradients: a file that
    is parsed anyway runs them once its analysis shows such a call (`checking.run_rules`);
    a file none of whose rules could fire is parsed only when its outline shows one.
    """
    enabled = enabled_rules(config, path)
    chosen = [rule for rule in enabled if could_fire(rule, data)]
    if chosen and all(rule.screen for rule in chosen):
        # Only rules with a screen could fire: parse with LibCST only where one of their shapes is there.
        passed = _screens_passed(tuple(sorted({rule.screen for rule in chosen})), data)
        chosen = [rule for rule in chosen if rule.screen in passed]
    rest = [rule for rule in enabled if rule not in chosen]
    if not chosen and rest and outlines is not None and outlines.calls_effects(Path(path), data):
        return enabled, []
    return chosen, rest


@lru_cache(maxsize=8)
def _screens_passed(names: tuple[str, ...], data: bytes) -> frozenset[str]:
    """The screens of `names` that the file holding `data` passes (all of them when CPython cannot parse it:
    the LibCST parse then reports what it can). Kept for a few files only, as the key holds their bytes: a file
    the prefilter settles without a parse is linted for its decoding right after, which asks the same."""
    tree = standard_tree(data)
    return frozenset(name for name in names if tree is None or screens.SCREENS[name](tree))


def lint_source(
    source: str | bytes,
    path: str = "<string>",
    config: Config | None = None,
    *,
    noqa: bool = True,
    prefilter: bool = True,
    program: Program | None = None,
) -> list[Diagnostic]:
    """Lint one module's source; never raises for bad input (GL000) or a failing rule (GL999).

    With `noqa=False`, `# noqa` comments are left to the caller: flake8 applies its own.
    Rules whose `requires` tokens are absent are not run (`prefilter=False` runs them
    anyway; the tests use it to prove the prefilter hides nothing). With `program` (see
    `whole_program`), calls into the project's other modules are judged by their
    summaries; without it, the module is judged alone.
    """
    return _lint(source, path, config, noqa=noqa, prefilter=prefilter, program=program)[0]


def _lint(
    source: str | bytes,
    path: str,
    config: Config | None,
    *,
    noqa: bool,
    prefilter: bool,
    program: Program | None,
    parser: IncrementalParser | None = None,
) -> tuple[list[Diagnostic], Uses]:
    """`lint_source`, and the other project modules its findings were judged with."""
    if program is None:
        return _lint_alone_or_whole(source, path, config, noqa=noqa, prefilter=prefilter, program=None), {}
    reads = program.outlines.record()
    try:
        found = _lint_alone_or_whole(
            source, path, config, noqa=noqa, prefilter=prefilter, program=program, parser=parser
        )
    finally:
        program.outlines.stop(reads)
    return found, program.used(reads - {program.project.add_file(Path(path))})


def _lint_alone_or_whole(
    source: str | bytes,
    path: str,
    config: Config | None,
    *,
    noqa: bool,
    prefilter: bool,
    program: Program | None,
    parser: IncrementalParser | None = None,
) -> list[Diagnostic]:
    config = config or Config()
    data = source.encode("utf-8") if isinstance(source, str) else source
    if _FILE_NOQA.search(data):
        return []
    outlines = program.outlines if program is not None else None
    rules, rest = _chosen(config, data, path, outlines) if prefilter else (enabled_rules(config, path), [])
    unread = _unknown_codec(data, path)  # cheap: a cookie in the first two lines
    # Torch scope reads the imports of other modules: asked only where it decides something.
    in_scope = (bool(rules) or bool(unread)) and in_torch_scope(data, path, outlines)
    unread = unread if in_scope else []
    if not rules or not in_scope:
        # No enabled rule could fire on this file, or torch does not reach it: skip the
        # parse, but still report a file that cannot even be decoded (cheap, and always worth knowing).
        problem = undecodable(data)
        return _filter([tool_diagnostic(PARSE_ERROR, path, 1, 1, problem)] if problem else unread, "", config, noqa)
    try:
        text = decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        return _filter([tool_diagnostic(PARSE_ERROR, path, 1, 1, f"cannot parse: {error}")], "", config, noqa)
    problem = unparsable(data, text)
    if problem:
        return _filter([tool_diagnostic(PARSE_ERROR, path, 1, 1, problem)], "", config, noqa)
    from gradlint import checking  # here: LibCST and the rules load only when a file needs them

    try:
        module = parser.parse(text) if parser is not None else checking.parse(text)
    except Exception as error:  # noqa: BLE001  (any parser failure is reported, not raised)
        return _filter([_parse_error(path, text, error)], text, config, noqa)
    view = checking.module_program(program, path) if program is not None else None
    try:
        loaded, more = [rule.load() for rule in rules], [rule.load() for rule in rest] if view is not None else []
        written = parser.written if parser is not None else None
        diagnostics = checking.run_rules(module, loaded, path, view, more, data, written)
    except RecursionError:  # LibCST's metadata recurses once per level of nesting, too
        diagnostics = [tool_diagnostic(PARSE_ERROR, path, 1, 1, "cannot lint: the file is nested too deeply")]
    return _filter(sorted([*unread, *diagnostics]), text, config, noqa)


def whole_program(
    paths: Iterable[Path],
    cache: Path | None = None,
    overlay: dict[Path, bytes] | None = None,
    summaries: SummaryStore | None = None,
) -> Program:
    """The whole-program model of the project the files `paths` belong to (see `gradlint.analysis.project.program`).

    Other modules are read from disk on demand (`overlay`: unsaved contents by path, for
    an editor); their summaries are kept in `summaries`, or in the cache directory `cache`.
    """
    project = Project()
    for path in paths:
        project.add_file(path)
    store = summaries if summaries is not None else SummaryStore(cache) if cache is not None else None
    return _new_program(Outlines(project, overlay), store)


def _new_program(outlines: Outlines, store: SummaryStore | None) -> Program:
    from gradlint import checking  # LibCST loads only when a file needs a parse

    return checking.new_program(outlines, store)


def lint_source_and_uses(
    source: str | bytes, path: str, config: Config | None, program: Program, parser: IncrementalParser | None = None
) -> tuple[list[Diagnostic], Uses]:
    """`lint_source` with `program`, and the other project modules its findings were judged with.

    `parser` (default: `libcst.parse_module` each time) parses successive versions of one
    file, reusing what an edit left alone, parse and positions (`gradlint.incremental`);
    it gives what a full parse gives. Which files are parsed stays decided here.
    """
    return _lint(source, path, config, noqa=True, prefilter=True, program=program, parser=parser)


def lint_file(path: Path, config: Config | None = None, program: Program | None = None) -> list[Diagnostic]:
    """Lint one file on disk, with the modules of its project (or `program`); an unreadable file yields GL000."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return [_unreadable(path, error)]
    return lint_bytes(path, data, config, program or whole_program([path]))


def lint_bytes(
    path: Path, data: bytes, config: Config | None = None, program: Program | None = None
) -> list[Diagnostic]:
    """Lint the content `data` of the file `path`: a notebook or a module."""
    return _lint_bytes(path, data, config, program)[0]


def _lint_bytes(
    path: Path, data: bytes, config: Config | None, program: Program | None
) -> tuple[list[Diagnostic], Uses]:
    if path.suffix == notebook.SUFFIX:
        return lint_notebook(data, str(path), config, program), {}
    return _lint(data, str(path), config, noqa=True, prefilter=True, program=program)


def lint_notebook(
    data: bytes, path: str, config: Config | None = None, program: Program | None = None
) -> list[Diagnostic]:
    """Lint a Jupyter notebook's code cells as one module; findings carry their cell."""
    try:
        cells = notebook.read_notebook(data)
    except notebook.NotebookError as error:
        return [tool_diagnostic(PARSE_ERROR, path, 1, 1, f"cannot read notebook: {error}")]
    found = lint_source(cells.source, path, config, program=program)
    return sorted(cells.locate(diagnostic) for diagnostic in found)


def default_jobs() -> int:
    """How many worker processes `lint_paths` starts by default: one per usable core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows have no affinity mask
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Targets:
    """What a run lints: the files under the paths it was given, and those paths that hold none."""

    files: tuple[Path | Missing, ...]
    empty: tuple[Path, ...]  # given, existing, but every file under it is excluded or not Python

    @property
    def checked(self) -> int:
        """How many files there are to lint (a missing path is no file)."""
        return sum(not isinstance(item, Missing) for item in self.files)


def find_targets(paths: Iterable[Path], config: Config) -> Targets:
    """The files to lint under `paths`, each once, in discovery order (see `files.discover`)."""
    files: dict[Path | str, Path | Missing] = {}
    empty = []
    for path in paths:
        found = list(discover([path], config))
        if not found:
            empty.append(path)
        for item in found:  # a file that an earlier path also holds is linted once
            files.setdefault(item.path if isinstance(item, Missing) else resolve(item), item)
    return Targets(tuple(files.values()), tuple(empty))


def lint_paths(
    paths: Iterable[Path], config: Config | None = None, *, jobs: int | None = None, cache: Path | None = None
) -> Iterator[Diagnostic]:
    """Lint files and directories, yielding each file's sorted findings in discovery order."""
    config = config or Config()
    yield from lint_targets(find_targets(paths, config), config, jobs=jobs, cache=cache)


def lint_targets(
    targets: Targets, config: Config, *, jobs: int | None = None, cache: Path | None = None
) -> list[Diagnostic]:
    """Lint the files `find_targets` found: each file's sorted findings, in discovery order.

    Files no enabled rule could fire on are settled here from their bytes, without a
    parse. The others are looked up in the result cache kept in the directory `cache`
    (None: no cache): an entry is reused while the file and the summaries of the other
    modules its findings used are unchanged. The misses are linted by `jobs` worker
    processes (None: one per core; 1: in this process), each with the whole-program
    model of the project. The order of the output never depends on `jobs`.
    """
    project = Project()
    for item in targets.files:  # every root first: a module is found wherever the run's files are
        if not isinstance(item, Missing):
            project.add_file(item)
    whole = Whole(tuple(project.roots), cache)
    # The run's files are where the callers of a function are looked for.
    _MEMBERS[whole] = tuple(item for item in targets.files if not isinstance(item, Missing))
    outlines = _OUTLINES[whole] = Outlines(project, members=_MEMBERS[whole])  # read afresh: files change between runs
    pytest_layout.forget()  # and so do the configuration files that say which functions are tests
    _PROGRAMS.pop(whole, None)

    def interface(module: str, recorded: str) -> str | None:
        # Only for a used module that changed; a summary needs LibCST, loaded here if at all.
        return _program(whole).interface_now(module, recorded)

    store = ResultCache(cache, config, interface, outlines.members_digest) if cache is not None else None
    results: list[list[Diagnostic]] = []
    misses: list[tuple[int, Path, bytes, str | None]] = []
    for item in targets.files:
        if isinstance(item, Missing):
            results.append([tool_diagnostic(PARSE_ERROR, item.path, 1, 1, f"cannot lint: {item.reason}")])
            continue
        try:
            data = item.read_bytes()
        except OSError as error:
            results.append([_unreadable(item, error)])
            continue
        key = store.key(str(item), data) if store is not None else None
        cached = store.get(key) if store is not None and key is not None else None
        if cached is not None:  # looked up first: a hit needs no prefilter either
            results.append(cached)
        elif item.suffix != notebook.SUFFIX and not (decided := _needs_parse_reading(data, item, config, outlines))[0]:
            found = lint_source(data, str(item), config)  # no parse: decoding problems only
            results.append(found)
            if store is not None and key is not None:
                # Remembered with what decided it: the modules its calls and imports reach.
                store.put(key, found, _outline_uses(outlines, decided[1], item))
        else:
            results.append([])
            misses.append((len(results) - 1, item, data, key))
    linted = _lint_in_pool([(path, data) for _, path, data, _ in misses], config, jobs or default_jobs(), whole)
    for (index, _, _, key), (found, uses) in zip(misses, linted, strict=True):
        results[index] = found
        if store is not None and key is not None and all(d.code != INTERNAL_ERROR[0] for d in found):
            store.put(key, found, uses)  # an internal error is retried next run, not remembered
    return [diagnostic for found in results for diagnostic in found]


@dataclass(frozen=True)
class Whole:
    """What a worker process needs to build the whole-program model: the project's roots and the cache."""

    roots: tuple[Path, ...]
    cache: Path | None


_PROGRAMS: dict[Whole, Program] = {}
_OUTLINES: dict[Whole, Outlines] = {}
_MEMBERS: dict[Whole, tuple[Path, ...]] = {}  # the files of the run, handed to each worker once


def _program(whole: Whole) -> Program:
    """The model for `whole`, one per process: summaries computed once serve every file it lints."""
    if whole not in _PROGRAMS:
        outlines = _OUTLINES.setdefault(whole, Outlines(Project(whole.roots), members=_MEMBERS.get(whole, ())))
        _PROGRAMS[whole] = _new_program(outlines, SummaryStore(whole.cache) if whole.cache is not None else None)
    return _PROGRAMS[whole]


def _needs_parse_reading(data: bytes, path: Path, config: Config, outlines: Outlines) -> tuple[bool, set[str]]:
    """`_needs_parse`, and the modules whose outlines were read to decide it."""
    reads = outlines.record()
    try:
        return _needs_parse(data, str(path), config, outlines), reads
    finally:
        outlines.stop(reads)


def _outline_uses(outlines: Outlines, reads: set[str], path: Path) -> Uses:
    """What a decision made from outlines depends on: the other project modules read, with their interfaces."""
    own = outlines.project.add_file(path)
    return {
        module: (where, digest, outlines.outline_interface(module))
        for module, (where, digest) in outlines.used(reads - {own}).items()
    }


def _needs_parse(data: bytes, path: str, config: Config, outlines: Outlines) -> bool:
    return (
        not _FILE_NOQA.search(data)
        and bool(_chosen(config, data, path, outlines)[0])
        and in_torch_scope(data, path, outlines)
    )


def in_torch_scope(data: bytes, path: str, outlines: Outlines | None) -> bool:
    """Whether torch reaches the module `data` (at `path`): only such a file gets gradient findings.

    It does when it imports torch or a package built on it (`gradlint.frameworks`), or,
    with the whole program's `outlines`, a project module that torch reaches. Code of
    other array frameworks, and plain Python, is out of scope.
    """
    if outlines is None or path.startswith("<"):
        return imports_torch(imported_modules(data))
    return outlines.torch_reaches(Path(path), data)


Linted = tuple[list[Diagnostic], Uses]


def _lint_in_pool(files: list[tuple[Path, bytes]], config: Config, jobs: int, whole: Whole) -> list[Linted]:
    """Lint `files` in `jobs` processes; results come back in the order of `files`."""
    workers = min(jobs, len(files))
    if workers <= 1:
        return [_lint_guarded(path, data, config, whole) for path, data in files]
    # Biggest files first, so that no worker is left with a large file at the end.
    order = sorted(range(len(files)), key=lambda index: -len(files[index][1]))
    with _pool(workers, whole) as pool:
        futures = {index: pool.submit(_lint_guarded, *files[index], config, whole) for index in order}
        results: list[Linted | None] = [_result(futures[index]) for index in range(len(files))]
    # A worker that died (out of memory, a crash in the native parser) breaks the whole pool:
    # lint each file it took down alone, so that only the file that kills a worker says so.
    return [
        found if found is not None else _lint_alone(*files[index], config, whole) for index, found in enumerate(results)
    ]


def _pool(workers: int, whole: Whole) -> ProcessPoolExecutor:
    """Worker processes that know the run's files (`_MEMBERS`), sent once to each rather than with every file."""
    return ProcessPoolExecutor(workers, initializer=_remember_members, initargs=(whole, _MEMBERS.get(whole, ())))


def _remember_members(whole: Whole, members: tuple[Path, ...]) -> None:
    _MEMBERS[whole] = members


def _result(future: Future[Linted]) -> Linted | None:
    try:
        return future.result()
    except BrokenProcessPool:
        return None


def _lint_guarded(path: Path, data: bytes, config: Config, whole: Whole) -> Linted:
    """`lint_bytes` with the whole program, with anything it raises despite its promise reported, not propagated."""
    try:
        return _lint_bytes(path, data, config, _program(whole))
    except Exception as error:  # noqa: BLE001  (one file must never stop the run)
        message = f"internal error, please report: {type(error).__name__}: {error}"
        return [tool_diagnostic(INTERNAL_ERROR, str(path), 1, 1, message)], {}


def _lint_alone(path: Path, data: bytes, config: Config, whole: Whole) -> Linted:
    with _pool(1, whole) as pool:
        found = _result(pool.submit(_lint_guarded, path, data, config, whole))
    if found is not None:
        return found
    message = "internal error: the process linting this file died (out of memory?), please report"
    return [tool_diagnostic(INTERNAL_ERROR, str(path), 1, 1, message)], {}


def _unreadable(path: Path, error: OSError) -> Diagnostic:
    return tool_diagnostic(PARSE_ERROR, str(path), 1, 1, f"cannot read file: {error.strerror or error}")


def _unknown_codec(data: bytes, path: str) -> list[Diagnostic]:
    found = unknown_codec(data)
    return [tool_diagnostic(PARSE_ERROR, path, found[0], 1, found[1])] if found is not None else []


def _parse_error(path: str, text: str, error: Exception) -> Diagnostic:
    """GL000 in CPython's words; LibCST's own only where CPython accepts the code."""
    too_deep = tool_diagnostic(PARSE_ERROR, path, 1, 1, "cannot parse: the file is nested too deeply")
    if isinstance(error, RecursionError):
        return too_deep
    try:
        rejected = _cpython_syntax_error(text, path)
    except (RecursionError, MemoryError):  # too deep for CPython's parser as well
        return too_deep
    if rejected is not None:
        line, column = rejected.lineno or 1, rejected.offset or 1
        return tool_diagnostic(PARSE_ERROR, path, max(line, 1), max(column, 1), f"syntax error: {rejected.msg}")
    from gradlint.checking import ParserSyntaxError  # loaded already: the parse that failed used it

    if isinstance(error, ParserSyntaxError):
        found = _ERROR_AT.search(str(error))
        line, column = (int(found[1]), int(found[2]) + 1) if found else (error.raw_line, error.raw_column + 1)
        message = f"cannot parse: LibCST does not support this code, which CPython accepts: {error.message}"
        return tool_diagnostic(PARSE_ERROR, path, max(line, 1), max(column, 1), message)
    return tool_diagnostic(PARSE_ERROR, path, 1, 1, f"cannot parse: {error}")


def _cpython_syntax_error(text: str, path: str) -> SyntaxError | None:
    """What CPython's parser says is wrong with `text`, or None if it accepts it.

    Parsing only: PyCF_ONLY_AST builds the syntax tree and never compiles or runs it.
    Raises RecursionError or MemoryError where the nesting is too deep for CPython too.
    """
    try:
        compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:  # IndentationError and TabError included
        return error
    except ValueError as error:  # Python 3.10 reports a null byte so
        return SyntaxError(str(error))
    return None


def _filter(diagnostics: list[Diagnostic], text: str, config: Config, noqa: bool) -> list[Diagnostic]:
    enabled = [d for d in diagnostics if d.code == INTERNAL_ERROR[0] or config.is_enabled(d.code, d.path)]
    if not noqa or not enabled or not NOQA.search(text):
        return enabled
    lines, groups = _physical_lines(text).readlines(), noqa_lines(text)
    searched = {line: "".join(lines[group.start - 1 : group.stop - 1]) for line, group in groups.items()}
    return [d for d in enabled if d.code == INTERNAL_ERROR[0] or not _suppressed(d, searched.get(d.line, ""))]


def noqa_lines(text: str) -> dict[int, range]:
    """For each line, the lines whose text is searched for its `# noqa`, as flake8 groups them.

    A token spanning lines (a triple-quoted string) or a backslash continuation makes
    its lines one: a `# noqa` on any of them covers all of them. The last line of a
    group ends outside any string, so a new `# noqa` comment goes there.
    """
    count = len(_physical_lines(text).readlines())
    physical = {line: range(line, line + 1) for line in range(1, count + 1)}
    groups = dict(physical)
    first, last = count + 2, -1
    try:
        for token in tokenize.generate_tokens(_physical_lines(text).readline):
            if token.type in (tokenize.ENDMARKER, tokenize.DEDENT):
                continue
            first, last = min(first, token.start[0]), max(last, token.end[0])
            if token.type in (tokenize.NL, tokenize.NEWLINE):
                groups.update(dict.fromkeys(range(first, last + 1), range(first, last + 1)))
                first, last = count + 2, -1
    except (tokenize.TokenError, SyntaxError):
        return physical  # flake8 falls back to the physical lines too
    return groups


def _physical_lines(text: str) -> io.StringIO:
    """`text` to read line by line, a line ending at `\\r\\n`, `\\r` or `\\n` as LibCST counts them."""
    return io.StringIO(text, newline=None)


def _suppressed(diagnostic: Diagnostic, line: str) -> bool:
    """flake8's semantics: bare `# noqa` silences the line, `# noqa: GL001` those codes (prefixes)."""
    match = NOQA.search(line)
    if match is None:
        return False
    codes = match.group("codes")
    if codes is None:
        return True
    return any(diagnostic.code.startswith(code) for code in re.split(r"[,\s]+", codes.strip()) if code)
