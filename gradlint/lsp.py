"""The language server behind `gradlint lsp`: an adapter from pygls to the engine.

Findings are published on open, change and save; code actions offer each finding's fix
and a `# noqa` comment; hovering a finding shows its rule's documentation. Each
document uses the `[tool.gradlint]` table of the nearest pyproject.toml above it, read
again whenever that file changes. A document is judged with the modules of its project
(the whole-program model), reading open documents as the editor holds them; when a
module changes (typed, saved, or changed on disk), the open documents whose findings
used it are linted again.

Linting runs in one worker thread, so the server keeps answering while it lints; a lint
whose document changed before it started is skipped, and findings are published only
for the version they were computed for while it is still the current one. Each open
document keeps its last parse, and a change re-parses only the top-level statements it
touched (`gradlint.incremental`).
"""

from __future__ import annotations

import asyncio
import io
import os
import tokenize
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path as uri_to_path
from pygls.workspace import PositionCodec, TextDocument

from gradlint import __version__, pytest_layout
from gradlint.cache import MemoryStore
from gradlint.config import Config, ConfigError, find_pyproject, load_config
from gradlint.decoding import LINE_BREAK
from gradlint.engine import lint_source_and_uses, whole_program
from gradlint.fix import fix_source, verify_fix
from gradlint.incremental import IncrementalParser
from gradlint.noqa import noqa_edits
from gradlint.rule import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, Fix, Related, Rule, all_rules

if TYPE_CHECKING:
    from gradlint.engine import Program

SOURCE = "gradlint"
# How long typing must pause before a lint starts. Latency is counted from the pause, so
# this is spent from the budget (300 ms for a 2,000-line module); it still has to cover
# the gap between two keystrokes, or a lint started mid-word delays the one that counts
# (a lint that has started runs to its end).
SETTLE_SECONDS = 0.1
# Set to 0 to parse every version in full: only `benchmarks/lsp_latency.py` does, to compare.
INCREMENTAL = os.environ.get("GRADLINT_LSP_INCREMENTAL", "1") != "0"
FIX_ALL = f"{types.CodeActionKind.SourceFixAll.value}.gradlint"
PYTHON_SUFFIXES = (".py", ".pyi")
Result = TypeVar("Result")


class GradlintServer(LanguageServer):
    """A pygls server that keeps each workspace's config and each document's last findings."""

    def __init__(self) -> None:
        super().__init__("gradlint", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.configs: dict[Path, tuple[int, Config]] = {}  # pyproject.toml -> (mtime_ns, its config)
        self.findings: dict[str, tuple[int | None, list[Diagnostic]]] = {}  # uri -> (version, findings)
        self.uses: dict[str, set[Path]] = {}  # uri -> the files of other modules its findings used
        self.summaries = MemoryStore()  # module summaries by content, for every lint of the session
        self.last_error: str | None = None  # shown once, not on every keystroke
        self.parsers: dict[str, IncrementalParser] = {}  # uri -> its last parse, kept by the worker
        self.linting: dict[str, tuple[int | None, asyncio.Task[list[Diagnostic] | None]]] = {}  # uri -> latest lint
        # One worker: lints queue rather than share two cores, and the parsers need no lock.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradlint-lint")

    def config_for(self, path: Path) -> Config:
        """The config of the nearest pyproject.toml with [tool.gradlint] above `path`, re-read when it changes."""
        pyproject = find_pyproject(path.parent)
        if pyproject is None:
            return Config(root=path.parent)
        mtime = pyproject.stat().st_mtime_ns
        cached = self.configs.get(pyproject)
        if cached is None or cached[0] != mtime:
            cached = (mtime, load_config(path, pyproject))
            self.configs[pyproject] = cached
        return cached[1]


server = GradlintServer()


def to_range(lines: Sequence[str], codec: PositionCodec, diagnostic_span: tuple[int, int, int, int]) -> types.Range:
    """The LSP range of a (line, column, end_line, end_column) span of the engine."""
    # The engine counts as flake8, SARIF and LibCST do: lines and columns from 1, columns in
    # code points. LSP counts both from 0, and columns in the client's code units (UTF-16
    # unless it negotiated another encoding). This function is the only conversion.
    line, column, end_line, end_column = diagnostic_span

    def position(line: int, column: int) -> types.Position:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return types.Position(line=max(line - 1, 0), character=codec.client_num_units(text[: max(column - 1, 0)]))

    return types.Range(start=position(line, column), end=position(end_line, end_column))


def _lines(document: TextDocument) -> list[str]:
    return LINE_BREAK.split(document.source)


def _span(diagnostic: Diagnostic | Related) -> tuple[int, int, int, int]:
    return diagnostic.line, diagnostic.column, diagnostic.end_line, diagnostic.end_column


def _is_python(document: TextDocument) -> bool:
    return document.language_id == "python" or document.uri.endswith(PYTHON_SUFFIXES)


def _path(document: TextDocument) -> Path:
    return Path(document.path or document.uri)  # an unsaved `untitled:` document has no path


@dataclass(frozen=True)
class Snapshot:
    """One version of a document and of the other open documents, taken on the event loop, where pygls edits them."""

    uri: str
    version: int | None
    path: Path
    source: str
    overlay: dict[Path, bytes]


def snapshot(ls: GradlintServer, document: TextDocument) -> Snapshot:
    """What linting the document's current version reads."""
    return Snapshot(document.uri, document.version, _path(document), document.source, _open_documents(ls))


def lint_snapshot(ls: GradlintServer, taken: Snapshot) -> tuple[list[Diagnostic], set[Path]] | None:
    """The findings of a snapshot and the other files they used; None if the document changed since (skipped).

    Runs in the worker thread; raises ConfigError or OSError.
    """
    if ls.workspace.get_text_document(taken.uri).version != taken.version:
        return None
    config = ls.config_for(taken.path)  # first: a broken config raises before any module is read
    pytest_layout.forget()  # a pytest.ini made since the last lint decides which functions are tests
    program = _program(ls, taken)
    parser = ls.parsers.setdefault(taken.uri, IncrementalParser()) if INCREMENTAL else None
    data = taken.source.encode(declared_encoding(taken.source))
    found, uses = lint_source_and_uses(data, str(taken.path), config, program, parser)
    return found, {Path(used).resolve() for used, _, _ in uses.values()}


async def in_worker(ls: GradlintServer, function: Callable[..., Result], *arguments: object) -> Result:
    """`function(*arguments)`, run in the lint worker so that the event loop keeps answering."""
    return await asyncio.get_running_loop().run_in_executor(ls.worker, function, *arguments)


def _program(ls: GradlintServer, taken: Snapshot) -> Program:
    """The whole-program model for a snapshot's document, reading the open documents as the snapshot holds them."""
    return whole_program([taken.path], overlay=taken.overlay, summaries=ls.summaries)


def _open_documents(ls: GradlintServer) -> dict[Path, bytes]:
    """The open Python documents with a path, as the editor holds them."""
    return {
        Path(document.path): document.source.encode(declared_encoding(document.source))
        for document in ls.workspace.text_documents.values()
        if document.path and _is_python(document)
    }


async def publish_dependents(ls: GradlintServer, changed: Sequence[Path]) -> None:
    """Lint again the open documents whose findings used one of the `changed` files."""
    paths = {path.resolve() for path in changed}
    for uri in list(ls.workspace.text_documents):
        if ls.uses.get(uri, set()) & paths:
            await publish(ls, uri)


def declared_encoding(source: str) -> str:
    """The encoding a PEP 263 cookie declares (else UTF-8), so the engine decodes the text it was given."""
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source.encode("utf-8")).readline)[0]
        source.encode(encoding)
    except (SyntaxError, UnicodeEncodeError):  # an unknown cookie, or text the file could not hold
        return "utf-8"
    return "utf-8" if encoding == "utf-8-sig" else encoding


async def findings(ls: GradlintServer, uri: str) -> list[Diagnostic]:
    """The findings of the open document's current version, waiting for its lint if it changed."""
    while True:  # the document may change while it is linted: then its new version is wanted
        found = await current_findings(ls, uri)
        if found is not None:
            return found


async def current_findings(ls: GradlintServer, uri: str, *, again: bool = False) -> list[Diagnostic] | None:
    """The findings of the document's version now; None if it changed before they were known.

    They come from the last lint, from the lint of this version under way, or from a new
    one (`again`: always a new one, after the config or a module it used changed).
    """
    document = ls.workspace.get_text_document(uri)
    cached = ls.findings.get(uri)
    if not again and cached is not None and cached[0] == document.version:
        return cached[1]
    if not _is_python(document):
        return []
    running = ls.linting.get(uri)
    if again or running is None or running[0] != document.version or running[1].cancelled():
        running = (document.version, asyncio.ensure_future(_lint(ls, snapshot(ls, document))))
        ls.linting[uri] = running
    # Shielded: a request the client cancels must not cancel the lint that others wait for too.
    return await asyncio.shield(running[1])


async def _lint(ls: GradlintServer, taken: Snapshot) -> list[Diagnostic] | None:
    """Lint a snapshot in the worker; keep its findings if its version is still the document's."""
    try:
        result = await in_worker(ls, lint_snapshot, ls, taken)
    except (ConfigError, OSError) as error:  # a broken config, or a document neither open nor on disk
        if str(error) != ls.last_error:
            ls.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"gradlint: {error}"))
        ls.last_error = str(error)
        result = [], set()
    else:
        if result is not None:
            ls.last_error = None
    # A document closed meanwhile reads from disk, with no version.
    if result is None or ls.workspace.get_text_document(taken.uri).version != taken.version:
        return None  # changed or closed meanwhile: these findings are for no version the editor shows
    found, ls.uses[taken.uri] = result
    ls.findings[taken.uri] = (taken.version, found)
    return found


def to_lsp(
    diagnostic: Diagnostic, lines: Sequence[str], codec: PositionCodec, uri: str | None = None
) -> types.Diagnostic:
    """The LSP form of a finding in the document `uri` of `lines`: code, docs link, source, related places."""
    rule = all_rules().get(diagnostic.code)
    failed = diagnostic.code in (PARSE_ERROR[0], INTERNAL_ERROR[0])
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri, range=to_range(lines, codec, _span(place))), message=place.note
        )
        for place in diagnostic.related
        if uri is not None and place.path == diagnostic.path  # places in this document, which `lines` hold
    ]
    return types.Diagnostic(
        related_information=related or None,
        range=to_range(lines, codec, _span(diagnostic)),
        message=diagnostic.message,
        severity=types.DiagnosticSeverity.Error if failed else types.DiagnosticSeverity.Warning,
        code=diagnostic.code,
        code_description=_code_description(rule),
        source=SOURCE,
    )


def _code_description(rule: type[Rule] | None) -> types.CodeDescription | None:
    """The link to the rule's documentation, where `[project.urls]` says where it is published."""
    url = rule.docs_url() if rule else None
    return None if url is None else types.CodeDescription(href=url)


async def publish(ls: GradlintServer, uri: str) -> None:
    """Lint the document's current version and send its findings, unless it changes before they are known."""
    found = await current_findings(ls, uri, again=True)
    document = ls.workspace.text_documents.get(uri)
    if found is None or document is None:
        return  # the lint of the newer version publishes
    lines = _lines(document) if found else []
    diagnostics = [to_lsp(diagnostic, lines, document.position_codec, uri) for diagnostic in found]
    ls.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=document.version)
    )


async def publish_all(ls: GradlintServer) -> None:
    """Lint every open document again, after its config may have changed."""
    for uri in list(ls.workspace.text_documents):
        await publish(ls, uri)


async def publish_with_dependents(ls: GradlintServer, uri: str) -> None:
    """Publish a document's findings, then those of the open documents that used it."""
    path = ls.workspace.get_text_document(uri).path
    await publish(ls, uri)
    if path:
        await publish_dependents(ls, [Path(path)])


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: GradlintServer, params: types.DidOpenTextDocumentParams) -> None:
    """Lint a document when it is opened."""
    await publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: GradlintServer, params: types.DidChangeTextDocumentParams) -> None:
    """Lint a document once its changes pause (pygls has applied each one already)."""
    # A burst of keystrokes is linted once, at its last version, instead of once per keystroke.
    await asyncio.sleep(SETTLE_SECONDS)
    uri = params.text_document.uri
    if ls.workspace.get_text_document(uri).version == params.text_document.version:
        await publish_with_dependents(ls, uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
async def did_save(ls: GradlintServer, params: types.DidSaveTextDocumentParams) -> None:
    """Lint a saved document; a saved pyproject.toml re-lints every open document."""
    if params.text_document.uri.endswith("/pyproject.toml"):
        await publish_all(ls)
    else:
        await publish_with_dependents(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: GradlintServer, params: types.DidCloseTextDocumentParams) -> None:
    """Forget a closed document and clear its findings in the client."""
    uri = params.text_document.uri
    for state in (ls.findings, ls.uses, ls.linting, ls.parsers):
        state.pop(uri, None)  # a lint under way finds the document gone and keeps nothing
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
async def did_change_watched_files(ls: GradlintServer, params: types.DidChangeWatchedFilesParams) -> None:
    """A pyproject.toml changed: re-lint everything; a module changed on disk: re-lint the documents that used it."""
    if any(change.uri.endswith("/pyproject.toml") for change in params.changes):
        await publish_all(ls)
        return
    changed = [
        Path(path) for change in params.changes if change.uri.endswith(".py") and (path := uri_to_path(change.uri))
    ]
    if changed:
        await publish_dependents(ls, changed)


@server.feature(types.INITIALIZED)
def initialized(ls: GradlintServer, params: types.InitializedParams) -> None:
    """Ask the client to report pyproject.toml changes, when it can watch files for us."""
    workspace = ls.client_capabilities.workspace
    watched = workspace.did_change_watched_files if workspace else None
    if not (watched and watched.dynamic_registration):
        return
    options = types.DidChangeWatchedFilesRegistrationOptions(
        watchers=[
            types.FileSystemWatcher(glob_pattern="**/pyproject.toml"),
            types.FileSystemWatcher(glob_pattern="**/*.py"),
        ]
    )
    registration = types.Registration(
        id="gradlint-pyproject", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options
    )
    ls.client_register_capability(types.RegistrationParams(registrations=[registration]))


def _overlaps(first: types.Range, second: types.Range) -> bool:
    def key(position: types.Position) -> tuple[int, int]:
        return position.line, position.character

    return key(first.start) <= key(second.end) and key(second.start) <= key(first.end)


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]),
)
async def code_action(ls: GradlintServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """Quick fixes for the findings in the range, and applying every safe fix of the document."""
    only = params.context.only
    actions = await _quick_fixes(ls, params) if _wanted(only, types.CodeActionKind.QuickFix.value) else []
    if _wanted(only, FIX_ALL):
        actions.extend(await _fix_all(ls, params.text_document.uri))
    return actions


def _wanted(only: Sequence[types.CodeActionKind | str] | None, kind: str) -> bool:
    # Ex) only=["source"] asks for every source action, ours (`source.fixAll.gradlint`) too.
    prefixes = [getattr(wanted, "value", wanted) for wanted in only or ()]
    return only is None or any(kind == prefix or kind.startswith(f"{prefix}.") for prefix in prefixes)


async def _quick_fixes(ls: GradlintServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """For each finding in the range: its fix, if it has one, and a `# noqa` comment."""
    uri = params.text_document.uri
    # The client names the diagnostics the action is for; the cursor's range finds the rest.
    named = {(d.code, d.range.start.line, d.range.start.character) for d in params.context.diagnostics}
    found = await findings(ls, uri)
    document = ls.workspace.get_text_document(uri)
    lines = _lines(document) if found else []
    wanted = []
    for diagnostic in found:
        lsp_diagnostic = to_lsp(diagnostic, lines, document.position_codec, uri)
        start = lsp_diagnostic.range.start
        if (diagnostic.code, start.line, start.character) in named or _overlaps(lsp_diagnostic.range, params.range):
            wanted.append((diagnostic, lsp_diagnostic))
    taken = snapshot(ls, document)
    fixes = [diagnostic.fix for diagnostic, _ in wanted if diagnostic.fix is not None]
    safe = await in_worker(ls, _verified_fixes, ls, taken, found, fixes) if fixes else []
    if ls.workspace.get_text_document(uri).version != taken.version:
        return []  # changed while the fixes were checked: the client asks again
    actions = []
    for diagnostic, lsp_diagnostic in wanted:
        if diagnostic.fix is not None and safe[fixes.index(diagnostic.fix)]:
            actions.append(_fix_action(document, lines, diagnostic.fix, lsp_diagnostic))
        if diagnostic.code not in (PARSE_ERROR[0], INTERNAL_ERROR[0]):
            actions.append(_noqa_action(document, lines, diagnostic, lsp_diagnostic))
    return actions


def _verified_fixes(ls: GradlintServer, taken: Snapshot, found: list[Diagnostic], fixes: list[Fix]) -> list[bool]:
    """For each fix, whether it passes the check `--fix` makes: the result parses and has no new finding."""
    try:
        config = ls.config_for(taken.path)
    except (ConfigError, OSError):
        return [False] * len(fixes)
    path, encoding = str(taken.path), declared_encoding(taken.source)
    return [
        verify_fix(taken.source, fix, path, config, encoding, before=found, program=_program(ls, taken)) is None
        for fix in fixes
    ]


def _fixed_text(ls: GradlintServer, taken: Snapshot) -> str | None:
    """The snapshot's text with every safe fix applied; None if none applies."""
    try:
        config = ls.config_for(taken.path)
        program = _program(ls, taken)
        fixed = fix_source(
            taken.source, str(taken.path), config, encoding=declared_encoding(taken.source), program=program
        )
    except (ConfigError, OSError):
        return None  # reported when the document was linted
    return fixed.text if fixed.applied else None


async def _fix_all(ls: GradlintServer, uri: str) -> list[types.CodeAction]:
    """One action replacing the document by its text with every safe fix applied, if any applies."""
    document = ls.workspace.get_text_document(uri)
    if not _is_python(document):
        return []
    taken = snapshot(ls, document)
    fixed = await in_worker(ls, _fixed_text, ls, taken)
    if fixed is None or ls.workspace.get_text_document(uri).version != taken.version:
        return []
    lines = _lines(document)
    whole = to_range(lines, document.position_codec, (1, 1, len(lines), len(lines[-1]) + 1))
    return [
        types.CodeAction(
            title="gradlint: apply all safe fixes",
            kind=FIX_ALL,
            edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(range=whole, new_text=fixed)]}),
        )
    ]


def _fix_action(
    document: TextDocument, lines: Sequence[str], fix: Fix, diagnostic: types.Diagnostic
) -> types.CodeAction:
    edits = [
        types.TextEdit(
            range=to_range(lines, document.position_codec, (edit.line, edit.column, edit.end_line, edit.end_column)),
            new_text=edit.text,
        )
        for edit in fix.edits
    ]
    title = f"{diagnostic.code}: {fix.description}" + ("" if fix.safe else " (unsafe: review the change)")
    return types.CodeAction(
        title=title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=types.WorkspaceEdit(changes={document.uri: edits}),
        is_preferred=fix.safe,
    )


def _noqa_action(
    document: TextDocument, lines: Sequence[str], finding: Diagnostic, diagnostic: types.Diagnostic
) -> types.CodeAction:
    # The same edit as `--add-noqa`: on the line where the engine looks for the comment (the
    # last line of a multi-line string or continued statement), merged into an existing one.
    edits = [
        types.TextEdit(
            range=to_range(lines, document.position_codec, (edit.line, edit.column, edit.end_line, edit.end_column)),
            new_text=edit.text,
        )
        for edit in noqa_edits(document.source, [finding])
    ]
    return types.CodeAction(
        title=f"{finding.code}: add `# noqa: {finding.code}`",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=types.WorkspaceEdit(changes={document.uri: edits}),
    )


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: GradlintServer, params: types.HoverParams) -> types.Hover | None:
    """The documentation of the rules whose findings are under the cursor."""
    uri = params.text_document.uri
    here = types.Range(start=params.position, end=params.position)
    rules = all_rules()
    found = await findings(ls, uri)
    document = ls.workspace.get_text_document(uri)
    lines = _lines(document) if found else []
    documentation = [
        rules[finding.code].documentation()
        for finding in found
        if finding.code in rules and _overlaps(to_range(lines, document.position_codec, _span(finding)), here)
    ]
    if not documentation:
        return None
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.PlainText, value="\n\n".join(dict.fromkeys(documentation)))
    )
