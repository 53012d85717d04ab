"""The language server, driven over stdio by pygls's own LSP client, as an editor would."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("pygls")

from lsprotocol import types
from pygls.exceptions import JsonRpcMethodNotFound
from pygls.lsp.client import LanguageClient
from pygls.workspace import PositionCodec, Workspace

from gradlint import lsp
from gradlint.cli import main
from gradlint.engine import lint_source
from gradlint.lsp import GradlintServer, code_action, did_open, hover, publish, to_range
from gradlint.rules.loss_accumulation import LossAccumulation

REPOSITORY = Path(__file__).parent.parent
TIMEOUT = 30.0
BUGGY = """\
import torch

def train(model, loader, optimizer, criterion):
    total = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss  # running sum
    return total
"""
LEAK_LINE = 9  # 0-based line of `total += loss`


class Editor:
    """A pygls client with the server started, collecting what the server publishes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client = LanguageClient("gradlint-tests", "1")
        self.published: asyncio.Queue[types.PublishDiagnosticsParams] = asyncio.Queue()
        self.versions: dict[str, int] = {}

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_publish(params: types.PublishDiagnosticsParams) -> None:
            self.published.put_nowait(params)

        @self.client.feature(types.CLIENT_REGISTER_CAPABILITY)
        def on_register(params: types.RegistrationParams) -> None:
            """Accept the server's request to watch pyproject.toml files."""

    async def start(self) -> None:
        environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
        await self.client.start_io(sys.executable, "-m", "gradlint", "lsp", cwd=self.root, env=environment)
        folder = types.WorkspaceFolder(uri=self.root.as_uri(), name="project")
        capabilities = types.ClientCapabilities(
            workspace=types.WorkspaceClientCapabilities(
                did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)
            )
        )
        await asyncio.wait_for(
            self.client.initialize_async(
                types.InitializeParams(
                    capabilities=capabilities, root_uri=self.root.as_uri(), workspace_folders=[folder]
                )
            ),
            TIMEOUT,
        )
        self.client.initialized(types.InitializedParams())

    def open(self, name: str, text: str) -> str:
        path = self.root / name
        path.write_text(text)
        uri = path.as_uri()
        self.versions[uri] = 1
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        return uri

    def change(self, uri: str, text: str, where: types.Range | None = None) -> None:
        self.versions[uri] += 1
        change: types.TextDocumentContentChangeEvent = (
            types.TextDocumentContentChangeWholeDocument(text=text)
            if where is None
            else types.TextDocumentContentChangePartial(range=where, text=text)
        )
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                content_changes=[change],
            )
        )

    async def diagnostics(self, uri: str, version: int | None = None) -> list[types.Diagnostic]:
        """The diagnostics published for `uri` at `version` (default: the latest sent)."""
        wanted = self.versions.get(uri) if version is None else version
        while True:
            params = await asyncio.wait_for(self.published.get(), TIMEOUT)
            if params.uri == uri and params.version == wanted:
                return list(params.diagnostics)

    async def send_raw(self, body: bytes) -> None:
        """Write one JSON-RPC frame to the server's stdin, whatever the body holds."""
        process = self.client._server  # pygls keeps the server process private
        assert process is not None and process.stdin is not None
        process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await process.stdin.drain()

    async def stop(self) -> None:
        await asyncio.wait_for(self.client.shutdown_async(None), TIMEOUT)
        self.client.exit(None)
        await asyncio.wait_for(self.client.stop(), TIMEOUT)


def run_editor(root: Path, session: Callable[[Editor], Awaitable[None]]) -> None:
    async def main() -> None:
        editor = Editor(root)
        await editor.start()
        await session(editor)

    asyncio.run(main())


def point(line: int, character: int = 0) -> types.Range:
    return types.Range(start=types.Position(line, character), end=types.Position(line, character))


def test_positions_convert_to_zero_based_utf16_units() -> None:
    lines = ["x = '🔥' + y", ""]
    utf16 = PositionCodec(types.PositionEncodingKind.Utf16)
    # `y` is at 1-based column 11 (code points); the emoji before it takes two UTF-16 units.
    assert to_range(lines, utf16, (1, 11, 1, 12)) == types.Range(
        start=types.Position(line=0, character=11), end=types.Position(line=0, character=12)
    )
    utf32 = PositionCodec(types.PositionEncodingKind.Utf32)
    assert to_range(lines, utf32, (1, 11, 2, 1)).start == types.Position(line=0, character=10)
    assert to_range(lines, utf32, (1, 11, 2, 1)).end == types.Position(line=1, character=0)


class FakeServer(GradlintServer):
    """The server without a client: a workspace of its own; what it sends is recorded."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.own_workspace = Workspace(root.as_uri())
        self.published: list[types.PublishDiagnosticsParams] = []
        self.messages: list[str] = []

    @property
    def workspace(self) -> Workspace:
        return self.own_workspace

    def text_document_publish_diagnostics(self, params: types.PublishDiagnosticsParams) -> None:
        self.published.append(params)

    def window_show_message(self, params: types.ShowMessageParams) -> None:
        self.messages.append(params.message)


def open_in(ls: FakeServer, path: Path, text: str) -> str:
    item = types.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1, text=text)
    ls.workspace.put_text_document(item)  # what pygls does before calling did_open
    asyncio.run(did_open(ls, types.DidOpenTextDocumentParams(item)))
    return item.uri


def test_did_open_publishes_the_engine_findings(tmp_path: Path) -> None:
    ls = FakeServer(tmp_path)
    uri = open_in(ls, tmp_path / "train.py", BUGGY)
    [published] = ls.published
    assert (published.uri, published.version) == (uri, 1)
    assert [(d.code, d.range.start.line) for d in published.diagnostics] == [("GL001", LEAK_LINE)]


def test_a_document_declaring_latin1_is_linted_with_exact_columns(tmp_path: Path) -> None:
    text = "# -*- coding: latin-1 -*-\n" + BUGGY.replace("        total += loss", "        é = 1; total += loss")
    ls = FakeServer(tmp_path)
    open_in(ls, tmp_path / "train.py", text)
    [diagnostic] = ls.published[0].diagnostics
    assert diagnostic.range.start == types.Position(line=LEAK_LINE + 1, character=len("        é = 1; "))


def test_a_broken_config_is_shown_once_and_lints_nothing(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.gradlint]\nselect = 3\n")
    ls = FakeServer(tmp_path)
    uri = open_in(ls, tmp_path / "train.py", BUGGY)
    asyncio.run(publish(ls, uri))
    assert [p.diagnostics for p in ls.published] == [[], []]
    [message] = ls.messages
    assert "'select' must be a list of strings" in message


def test_a_quick_fix_is_offered_only_when_it_passes_the_check_fix_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_fix import EPOCHS

    from gradlint.analysis.training.evaluation import Evaluation

    def titles(ls: FakeServer, uri: str) -> list[str]:
        [diagnostic] = ls.published[-1].diagnostics
        context = types.CodeActionContext(diagnostics=[diagnostic])
        params = types.CodeActionParams(types.TextDocumentIdentifier(uri), diagnostic.range, context)
        return [action.title for action in asyncio.run(code_action(ls, params)) if isinstance(action, types.CodeAction)]

    ls = FakeServer(tmp_path)
    uri = open_in(ls, tmp_path / "train.py", EPOCHS)
    assert "GL009: run the evaluation code under `torch.no_grad()` (unsafe: review the change)" in titles(ls, uri)
    # A fix that would put the training loop under no_grad brings GL013: it is not offered.
    monkeypatch.setattr(Evaluation, "no_grad_target", lambda self, call: (self.collected.contexts[call].loops[0],))
    uri = open_in(ls, tmp_path / "other.py", EPOCHS)
    assert titles(ls, uri) == ["GL009: add `# noqa: GL009`"]


def test_open_change_code_action_hover_and_shutdown(tmp_path: Path) -> None:
    async def session(editor: Editor) -> None:
        uri = editor.open("train.py", BUGGY)
        [diagnostic] = await editor.diagnostics(uri)
        assert diagnostic.code == "GL001"
        assert diagnostic.source == "gradlint"
        assert diagnostic.range == types.Range(
            start=types.Position(line=LEAK_LINE, character=8), end=types.Position(line=LEAK_LINE, character=21)
        )
        # The places that explain the finding, clickable in the editor.
        related = diagnostic.related_information or []
        assert [info.message for info in related] == [
            "`loss` gets its autograd graph here",
            "each iteration of this loop adds another graph",
            "backward frees the step's buffers, but the graph stays referenced",
        ]
        assert {info.location.uri for info in related} == {uri}
        assert [info.location.range.start.line for info in related] == [LEAK_LINE - 3, LEAK_LINE - 5, LEAK_LINE - 2]
        # A link only where [project.urls] says where the docs are published (test_formats covers both).
        link = diagnostic.code_description.href if diagnostic.code_description else None
        assert link == LossAccumulation.docs_url()

        actions = await editor.client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=point(LEAK_LINE),
                context=types.CodeActionContext(diagnostics=[diagnostic]),
            )
        )
        assert actions is not None
        edits = {
            action.title: edit
            for action in actions
            if isinstance(action, types.CodeAction) and action.edit and action.edit.changes
            for edit in action.edit.changes[uri]
        }
        fix = edits["GL001: use `.detach()` to drop the graph"]  # `total` is returned: it stays a tensor
        assert fix == types.TextEdit(range=point(LEAK_LINE, 21), new_text=".detach()")
        noqa = edits["GL001: add `# noqa: GL001`"]
        assert noqa == types.TextEdit(
            range=point(LEAK_LINE, len(BUGGY.splitlines()[LEAK_LINE])), new_text="  # noqa: GL001"
        )

        hover = await editor.client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=LEAK_LINE, character=10),
            )
        )
        assert hover is not None and isinstance(hover.contents, types.MarkupContent)
        assert hover.contents.value.startswith("GL001 loss-accumulation")
        assert "Why is this bad?" in hover.contents.value

        fix_all = await editor.client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=point(0),
                context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.SourceFixAll]),
            )
        )
        assert fix_all is not None and [action.kind for action in fix_all] == ["source.fixAll.gradlint"]
        assert isinstance(fix_all[0], types.CodeAction) and fix_all[0].edit and fix_all[0].edit.changes
        [whole] = fix_all[0].edit.changes[uri]
        assert whole.new_text == BUGGY.replace("total += loss ", "total += loss.detach() ")

        editor.change(uri, fix.new_text, where=fix.range)
        assert await editor.diagnostics(uri) == []
        await editor.stop()

    run_editor(tmp_path, session)


def test_workspace_config_is_used_and_reloaded_when_pyproject_changes(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.gradlint]\nignore = ["GL001"]\n')

    async def session(editor: Editor) -> None:
        uri = editor.open("train.py", BUGGY)
        assert await editor.diagnostics(uri) == []
        pyproject.write_text("[tool.gradlint]\nignore = []\n")
        editor.client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[types.FileEvent(uri=pyproject.as_uri(), type=types.FileChangeType.Changed)]
            )
        )
        assert [d.code for d in await editor.diagnostics(uri)] == ["GL001"]
        await editor.stop()

    run_editor(tmp_path, session)


def test_survives_malformed_requests_unknown_methods_deleted_files_and_edit_bursts(tmp_path: Path) -> None:
    async def session(editor: Editor) -> None:
        uri = editor.open("train.py", BUGGY)
        await editor.diagnostics(uri)
        with pytest.raises(JsonRpcMethodNotFound):
            await asyncio.wait_for(editor.client.protocol.send_request_async("gradlint/noSuchMethod", {}), TIMEOUT)
        # Malformed input goes straight to the pipe: pygls's client would refuse to encode it.
        await editor.send_raw(b"{not json")
        await editor.send_raw(
            b'{"jsonrpc": "2.0", "id": "bad-1", "method": "textDocument/hover", "params": {"textDocument": 3}}'
        )
        await editor.send_raw(b'{"jsonrpc": "2.0", "id": "bad-2", "params": {}}')

        (tmp_path / "train.py").unlink()  # deleted on disk while open in the editor
        for _ in range(60):  # a burst of keystrokes: remove the comment one character at a time
            end = len(BUGGY.splitlines()[LEAK_LINE])
            editor.change(
                uri,
                "",
                where=types.Range(
                    start=types.Position(line=LEAK_LINE, character=end - 1),
                    end=types.Position(line=LEAK_LINE, character=end),
                ),
            )
        [diagnostic] = await editor.diagnostics(uri)
        assert diagnostic.code == "GL001"
        editor.client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
        assert [d.code for d in await editor.diagnostics(uri)] == ["GL001"]

        hover = await editor.client.text_document_hover_async(
            types.HoverParams(types.TextDocumentIdentifier(uri=uri), types.Position(line=LEAK_LINE, character=10))
        )
        assert hover is not None  # still answering correctly
        await editor.stop()

    run_editor(tmp_path, session)


def test_shutdown_without_exit_ends_the_server_when_the_editor_goes_away(tmp_path: Path) -> None:
    async def session(editor: Editor) -> None:
        await asyncio.wait_for(editor.client.shutdown_async(None), TIMEOUT)
        process = editor.client._server
        assert process is not None and process.stdin is not None
        process.stdin.close()  # the editor quits without sending `exit`
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0  # shut down cleanly, so exits with 0
        await asyncio.wait_for(editor.client.stop(), TIMEOUT)

    run_editor(tmp_path, session)


def test_lsp_command_without_pygls_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pygls.lsp.server", None)  # as if pygls were not installed
    monkeypatch.delitem(sys.modules, "gradlint.lsp")
    result = CliRunner().invoke(main, ["lsp"])
    assert result.exit_code == 2
    assert "pip install 'gradlint[lsp]'" in result.output


def test_the_noqa_quick_fix_goes_where_the_engine_looks_for_it(tmp_path: Path) -> None:
    # A finding on a backslash-continued statement: the comment must go on its last line,
    # the one flake8 and the engine read (a comment on the first line would be a syntax error).
    source = BUGGY.replace("        total += loss  # running sum\n", "        total += loss + \\\n            0\n")
    ls = FakeServer(tmp_path)
    uri = open_in(ls, tmp_path / "train.py", source)
    [diagnostic] = ls.published[-1].diagnostics
    context = types.CodeActionContext(diagnostics=[diagnostic])
    params = types.CodeActionParams(types.TextDocumentIdentifier(uri), diagnostic.range, context)
    actions = asyncio.run(code_action(ls, params))
    [noqa] = [a for a in actions if isinstance(a, types.CodeAction) and "noqa" in a.title]
    assert noqa.edit is not None and noqa.edit.changes is not None
    [edit] = noqa.edit.changes[uri]
    continued = diagnostic.range.start.line + 1
    assert edit.range.start == types.Position(line=continued, character=len("            0"))
    assert edit.new_text == "  # noqa: GL001"


HELPER = """\
import torch.nn.functional as F


def train_step(model, optimizer, batch):
    inputs, targets = batch
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
"""
CALLER = """\
import torch
from helper import train_step


def fit(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        train_step(model, optimizer, batch)
"""
CLEARED = HELPER.replace("    loss.backward()", "    optimizer.zero_grad()\n    loss.backward()")


def test_an_open_document_is_linted_again_when_a_module_it_imports_is_edited(tmp_path: Path) -> None:
    async def session(editor: Editor) -> None:
        helper = editor.open("helper.py", HELPER)
        await editor.diagnostics(helper)
        caller = editor.open("train.py", CALLER)
        assert [(d.code, d.range.start.line) for d in await editor.diagnostics(caller)] == [("GL002", 7)]
        editor.change(helper, CLEARED)  # typed, not saved: the server reads the editor's text
        assert await editor.diagnostics(caller, version=1) == []
        editor.change(helper, HELPER)
        assert [d.code for d in await editor.diagnostics(caller, version=1)] == ["GL002"]
        await editor.stop()

    run_editor(tmp_path, session)


def test_an_open_document_is_linted_again_when_a_module_it_imports_changes_on_disk(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text(HELPER)

    async def session(editor: Editor) -> None:
        caller = editor.open("train.py", CALLER)
        assert [d.code for d in await editor.diagnostics(caller)] == ["GL002"]
        (tmp_path / "helper.py").write_text(CLEARED)
        change = types.FileEvent(uri=(tmp_path / "helper.py").as_uri(), type=types.FileChangeType.Changed)
        editor.client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[change]))
        assert await editor.diagnostics(caller, version=1) == []
        await editor.stop()

    run_editor(tmp_path, session)


def edit_in(ls: FakeServer, uri: str, version: int, text: str) -> None:
    """What pygls does on didChange before calling the handler."""
    identifier = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
    ls.workspace.update_text_document(identifier, types.TextDocumentContentChangeWholeDocument(text=text))


def test_a_lint_overtaken_by_an_edit_publishes_nothing_and_hover_is_answered_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ls = FakeServer(tmp_path)
    uri = open_in(ls, tmp_path / "train.py", BUGGY)
    other = open_in(ls, tmp_path / "other.py", BUGGY)
    started, release = threading.Event(), threading.Event()
    lint = lsp.lint_source_and_uses

    def held(*arguments: Any, **options: Any) -> Any:
        started.set()  # the lint is running in the worker, and stays there until released
        assert release.wait(TIMEOUT)
        return lint(*arguments, **options)

    monkeypatch.setattr(lsp, "lint_source_and_uses", held)
    fixed = BUGGY.replace("total += loss ", "total += loss.item() ")

    async def session() -> None:
        edit_in(ls, uri, 2, BUGGY.replace("# running sum", "# a running sum"))
        overtaken = asyncio.ensure_future(publish(ls, uri))
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        position = types.Position(line=LEAK_LINE, character=10)
        answered = await asyncio.wait_for(
            hover(ls, types.HoverParams(types.TextDocumentIdentifier(other), position)), 5
        )
        assert answered is not None  # the event loop answers while the worker lints
        waiting = asyncio.ensure_future(hover(ls, types.HoverParams(types.TextDocumentIdentifier(uri), position)))
        edit_in(ls, uri, 3, fixed)
        latest = asyncio.ensure_future(publish(ls, uri))
        release.set()
        await asyncio.wait_for(asyncio.gather(overtaken, latest), TIMEOUT)
        assert await asyncio.wait_for(waiting, TIMEOUT) is None  # the findings of version 3: none

    asyncio.run(session())
    assert [(p.uri, p.version, p.diagnostics) for p in ls.published[2:]] == [(uri, 3, [])]


def test_a_burst_of_edits_never_publishes_an_older_version_after_a_newer_one(tmp_path: Path) -> None:
    text = (REPOSITORY / "examples" / "gan_amp_training.py").read_text()
    lines = text.splitlines(keepends=True)

    async def session(editor: Editor) -> None:
        uri = editor.open("train.py", text)
        await editor.diagnostics(uri)
        for burst in range(4):
            for keystroke in range(8):  # back to back, then a pause about as long as a lint
                line = (burst * 8 + keystroke) % len(lines)
                lines[line] = lines[line].rstrip("\n") + " \n"
                editor.change(uri, "".join(lines))
            await asyncio.sleep(lsp.SETTLE_SECONDS + 0.05 * burst)
        final = editor.versions[uri]
        versions = []
        while not versions or versions[-1] != final:
            params = await asyncio.wait_for(editor.published.get(), TIMEOUT)
            versions.append(params.version)
            found = params.diagnostics
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
        expected = lint_source("".join(lines), str(editor.root / "train.py"))
        assert [(d.code, d.range.start.line + 1) for d in found] == [(f.code, f.line) for f in expected]
        await editor.stop()

    run_editor(tmp_path, session)
