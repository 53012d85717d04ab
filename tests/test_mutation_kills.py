"""Behaviours that mutation testing found untested: each test kills the mutants listed in benchmarks/mutation.md."""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import libcst as cst
import pytest

import gradlint.checking
import gradlint.decoding
import gradlint.engine
import gradlint.fix
from gradlint import Config, Diagnostic, lint_paths, lint_source
from gradlint.cache import ResultCache
from gradlint.engine import default_jobs, lint_bytes, lint_file, lint_notebook
from gradlint.fix import (
    FileFix,
    FixedSource,
    RejectedFix,
    _non_overlapping,
    fix_file,
    fix_notebook,
    fix_paths,
    fix_source,
    line_mapping,
    verify_fix,
    write_atomically,
)
from gradlint.formats import github, sarif, text
from gradlint.formats import json as json_format
from gradlint.notebook import Notebook, NotebookError
from gradlint.rule import Edit, Fix, Related, Rule, all_rules


def finding(**changes: object) -> Diagnostic:
    """A GL001 finding in src/train.py at 9:5-9:23, with `changes` applied."""
    fields: dict[str, object] = {
        "path": "src/train.py",
        "line": 9,
        "column": 5,
        "code": "GL001",
        "end_line": 9,
        "end_column": 23,
        "name": "loss-accumulation",
        "message": "a tensor with autograd history is accumulated",
    }
    return Diagnostic(**{**fields, **changes})  # type: ignore[arg-type]  # keys are Diagnostic's fields


NOTE = Related("src/train.py", 6, 5, 6, 35, "`loss` gets its autograd graph here")


# Output formats


def test_text_carets_cover_only_the_span_and_pad_with_spaces() -> None:
    line = "avg = total_loss / n"
    rendered = text.render([finding(column=7, end_column=17)], source_line=lambda _: line)
    assert rendered.splitlines()[1:] == [f"    {line}", "          ^^^^^^^^^^"]


def test_text_marks_an_empty_span_with_one_caret() -> None:
    rendered = text.render([finding(column=3, end_column=3)], source_line=lambda _: "x = 1")
    assert rendered.splitlines()[2] == "      ^"


def test_text_prints_only_the_header_when_a_line_cannot_be_read() -> None:
    rendered = text.render([finding(related=(NOTE,))], source_line=lambda _: None)
    assert rendered == (
        "src/train.py:9:5: GL001 a tensor with autograd history is accumulated\n"
        "  src/train.py:6:5: note: `loss` gets its autograd graph here\n"
    )


def test_github_writes_one_annotation_per_line() -> None:
    lines = github.render([finding(), finding(line=12)]).split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert lines[0].startswith("::error file=src/train.py,line=9,")
    assert lines[1].startswith("::error file=src/train.py,line=12,")


def test_github_escapes_a_carriage_return_in_the_message() -> None:
    assert github.render([finding(message="a\rb")]).endswith("::a%0Db\n")


def test_github_notes_name_the_file_and_cell_of_a_place_elsewhere() -> None:
    elsewhere = replace(NOTE, path="src/model.py", cell=2)
    rendered = github.render([finding(related=(elsewhere,))])
    assert rendered.endswith("%0Asrc/model.py:cell 2, line 6: `loss` gets its autograd graph here\n")


def test_json_notebook_finding_has_exactly_the_documented_keys_path_first() -> None:
    [found] = json.loads(json_format.render([finding(path="nb.ipynb", cell=2)]))
    keys = ["path", "cell", "line", "column", "end_line", "end_column", "code", "name", "message", "related"]
    assert list(found) == keys
    assert found["path"] == "nb.ipynb" and found["cell"] == 2


def test_json_and_sarif_are_indented_by_two_spaces() -> None:
    findings = [finding()]
    assert json_format.render(findings) == json.dumps(json.loads(json_format.render(findings)), indent=2) + "\n"
    assert sarif.render(findings) == json.dumps(json.loads(sarif.render(findings)), indent=2) + "\n"


def sarif_run(*findings: Diagnostic) -> Any:
    [run] = json.loads(sarif.render(list(findings)))["runs"]
    return run


def test_sarif_names_the_tool_gradlint() -> None:
    assert sarif_run()["tool"]["driver"]["name"] == "gradlint"


def test_sarif_rules_carry_their_docstring_and_tags_sorted_by_id() -> None:
    rules = sarif_run()["tool"]["driver"]["rules"]
    ids = [rule["id"] for rule in rules]
    assert ids == sorted(ids) and ids[0] == "GL000" and ids[-1] == "GL999"
    for rule in rules:
        if rule["id"] in all_rules():
            assert rule["fullDescription"]["text"].startswith("Checks for")
            assert rule["properties"] == {"tags": ["pytorch", "correctness"]}


def test_sarif_code_flow_steps_are_the_related_locations_without_their_ids() -> None:
    [result] = sarif_run(finding(related=(NOTE,)))["results"]
    [related] = result["relatedLocations"]
    first_step = result["codeFlows"][0]["threadFlows"][0]["locations"][0]["location"]
    assert first_step == {key: value for key, value in related.items() if key != "id"}
    assert "id" in related


# The result cache


def test_cache_keys_a_file_name_that_is_not_utf8() -> None:
    cache = ResultCache(Path("unused"), Config())
    undecodable = os.fsdecode(b"caf\xe9.py")  # how a Latin-1 file name reaches Python on Linux
    assert cache.key(undecodable, b"") != cache.key("caf\xe9.py", b"")


def test_cache_writes_its_temporary_file_beside_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Beside the entry, so that the rename is atomic even when $TMPDIR is another file system.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    cache = ResultCache(tmp_path / "cache", Config())
    cache.put("ab" * 32, [finding()])
    assert cache.get("ab" * 32) == [finding()]


def test_cache_entry_that_cannot_be_renamed_into_place_is_skipped_without_leftovers(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, Config())
    key = "cd" * 32
    (tmp_path / key[:2] / key[2:] / "occupied").mkdir(parents=True)  # a directory where the entry goes
    cache.put(key, [finding()])
    assert cache.get(key) is None
    assert sorted(path.name for path in (tmp_path / key[:2]).iterdir()) == [key[2:]]


def test_cached_findings_keep_their_fix(tmp_path: Path) -> None:
    fix = Fix("detach the loss", (Edit(9, 19, 9, 23, "loss.detach()"),), safe=False)
    cache = ResultCache(tmp_path, Config())
    cache.put("ef" * 32, [finding(fix=fix)])
    [cached] = cache.get("ef" * 32) or []
    assert cached.fix == fix


# Fixing files

TRAIN = """\
import torch

def train(model, loader: torch.utils.data.DataLoader, optimizer, criterion):
    total = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward(retain_graph=True)
        optimizer.step()
        total += loss
    return total
"""
# TRAIN's two findings, both with safe fixes: GL005 at line 8 and GL001 at line 10.
WITHOUT_RETAIN = TRAIN.replace("backward(retain_graph=True)", "backward()")
DETACHED = TRAIN.replace("total += loss", "total += loss.detach()")
NO_GL005 = Config(ignore=("GL005",), preview=True)  # made at import, before conftest sets GRADLINT_PREVIEW
# A step whose only fix is unsafe: GL002's clear, for an optimizer its annotation proves.
UNCLEARED = """\
import torch

def train(model, loader, optimizer: torch.optim.Optimizer, criterion):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""


def notebook_of(*sources: str) -> bytes:
    """An nbformat 4 notebook with one code cell per source."""
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}
        for source in sources
    ]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def cell_sources(path: Path) -> list[str]:
    return [cell["source"] for cell in json.loads(path.read_bytes())["cells"]]


def test_diff_has_file_headers_and_marks_a_missing_final_newline() -> None:
    assert FileFix("t.py", "a\nb", "a\nc").diff() == (
        "--- a/t.py\n+++ b/t.py\n@@ -1,2 +1,2 @@\n a\n"
        "-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    )


def test_diff_of_a_file_with_carriage_return_line_endings_has_no_newline_markers() -> None:
    assert FileFix("t.py", "a\rb\r", "a\rc\r").diff() == "--- a/t.py\n+++ b/t.py\n@@ -1,2 +1,2 @@\n a\r-b\r+c\r"


def test_fixing_leaves_findings_the_config_turns_off_alone(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    [result] = fix_paths([path], NO_GL005)
    assert path.read_text() == DETACHED
    assert (result.path, result.applied, result.remaining) == (str(path), 1, [])
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(TRAIN))
    result = fix_file(book, NO_GL005)
    assert cell_sources(book) == [DETACHED]
    assert (result.path, result.applied, result.remaining) == (str(book), 1, [])


def test_fix_paths_skips_files_whose_findings_the_config_turns_off(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(WITHOUT_RETAIN)
    assert list(fix_paths([path], Config(ignore=("GL001",)), write=False)) == []


def test_fix_paths_reports_a_file_without_fixes_with_its_findings(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(UNCLEARED.replace(": torch.optim.Optimizer", ""))  # no proof of an optimizer: no fix
    [result] = fix_paths([path], Config(), write=False)
    assert result.path == str(path) and not result.changed
    assert [(d.code, d.line) for d in result.remaining] == [("GL002", 6)]


def test_fix_paths_lints_through_the_cache(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    list(fix_paths([tmp_path / "train.py"], Config(), write=False, cache=tmp_path / "cache"))
    assert [path.name for path in (tmp_path / "cache").rglob("*") if path.is_file() and path.name != ".gitignore"]


def test_unsafe_fixes_are_applied_only_when_asked_for_files_and_notebooks(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(UNCLEARED)
    [result] = fix_paths([path], Config())
    assert result.applied == 0
    assert fix_file(path, Config()).applied == 0
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(UNCLEARED))
    assert fix_notebook(book, Config()).applied == 0
    assert fix_file(book, Config()).applied == 0
    assert fix_file(book, Config(), unsafe=True).applied == 1
    assert "optimizer.zero_grad()" in cell_sources(book)[0]


def test_fix_notebook_writes_unless_told_not_to(tmp_path: Path) -> None:
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(WITHOUT_RETAIN))
    fix_notebook(book, Config())
    assert cell_sources(book) == [WITHOUT_RETAIN.replace("total += loss", "total += loss.detach()")]


def test_fix_lands_after_non_ascii_text_on_the_line_of_a_latin1_file(tmp_path: Path) -> None:
    source = "# -*- coding: latin-1 -*-\n" + WITHOUT_RETAIN.replace("total", "total_é")
    path = tmp_path / "train.py"
    path.write_bytes(source.encode("latin-1"))
    assert fix_file(path, Config()).applied == 1
    assert path.read_bytes() == source.replace("+= loss", "+= loss.detach()").encode("latin-1")


def test_an_undecodable_file_is_left_alone_with_its_gl000(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_bytes(TRAIN.encode() + b"# \xff\n")
    result = fix_file(path, Config())
    assert (result.path, result.changed, [(d.path, d.line, d.code) for d in result.remaining]) == (
        str(path),
        False,
        [(str(path), 1, "GL000")],
    )
    assert fix_file(path, Config(ignore=("GL000",))).remaining == []


def test_an_unreadable_notebook_is_left_alone_with_its_gl000(tmp_path: Path) -> None:
    book = tmp_path / "broken.ipynb"
    book.write_text("{not json")
    result = fix_notebook(book, Config())
    assert (result.path, result.changed, [(d.path, d.code) for d in result.remaining]) == (
        str(book),
        False,
        [(str(book), "GL000")],
    )
    assert fix_notebook(book, Config(extend_exclude=("broken.ipynb",), root=tmp_path)).remaining == []


def test_a_notebook_whose_fixed_source_no_longer_splits_into_cells_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: object, fixed: str) -> bytes:
        raise NotebookError("a cell marker was edited")

    monkeypatch.setattr(Notebook, "rebuild", refuse)
    book = tmp_path / "train.ipynb"
    data = notebook_of(TRAIN)
    book.write_bytes(data)
    result = fix_notebook(book, NO_GL005)
    assert book.read_bytes() == data
    assert (result.path, result.skipped) == (str(book), "a cell marker was edited")
    assert [(d.path, d.cell, d.line, d.code) for d in result.remaining] == [(str(book), 1, 10, "GL001")]


def test_a_file_that_cannot_be_written_is_reported_as_it_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    result = fix_file(path, NO_GL005)
    assert (result.path, result.before, result.after, result.applied) == (str(path), TRAIN, TRAIN, 0)
    assert result.skipped == "cannot write: No space left on device"
    assert [(d.path, d.line, d.code) for d in result.remaining] == [(str(path), 10, "GL001")]
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(TRAIN))
    result = fix_notebook(book, NO_GL005)
    assert (result.applied, result.skipped) == (0, "cannot write: No space left on device")
    assert [(d.path, d.cell, d.line, d.code) for d in result.remaining] == [(str(book), 1, 10, "GL001")]


def test_fixing_reports_the_fixes_it_dropped_whether_it_writes_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped = RejectedFix(finding(), "the fixed code would not parse")
    original = gradlint.fix.fix_source

    def with_a_rejection(*args: Any, **kwargs: Any) -> FixedSource:
        return replace(original(*args, **kwargs), rejected=(dropped,))

    monkeypatch.setattr(gradlint.fix, "fix_source", with_a_rejection)
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(TRAIN))
    assert fix_notebook(book, Config()).rejected == (dropped,)
    monkeypatch.setattr(gradlint.fix, "write_atomically", lambda *args: "cannot write: Read-only file system")
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    assert fix_file(path, Config()).rejected == (dropped,)


def test_a_fixed_notebook_reports_the_findings_left_in_it_by_cell(tmp_path: Path) -> None:
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of("import torch", UNCLEARED.replace(": torch.optim.Optimizer", "")))
    result = fix_notebook(book, Config())
    assert [(d.path, d.cell, d.line, d.code) for d in result.remaining] == [(str(book), 2, 6, "GL002")]


def test_the_file_is_written_through_a_temporary_file_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside it, so that the rename is atomic even when $TMPDIR is another file system.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    path = tmp_path / "a.py"
    path.write_bytes(b"x = 1\n")
    assert write_atomically(path, b"x = 2\n", b"x = 1\n") is None
    assert path.read_bytes() == b"x = 2\n"


def test_a_path_that_cannot_be_read_back_is_not_written_and_says_why(tmp_path: Path) -> None:
    assert write_atomically(tmp_path, b"x = 2\n", b"x = 1\n") == "cannot write: Is a directory"


def test_a_fix_dropped_in_a_later_pass_is_reported_at_its_original_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    header = Fix("insert two lines", (Edit(1, 1, 1, 1, "x = 0\ny = 0\n"),))
    breaking = Fix("break", (Edit(4, 1, 4, 2, "("),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        if not data.startswith(b"x = 0"):  # before the first pass: the spanning finding has no fix yet
            return [finding(line=1, end_line=1, fix=header), finding(line=2, end_line=3)]
        return [finding(line=4, end_line=5, fix=breaking)]

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("a = 1\nb = (1,\n2)\n")
    assert result.text == "x = 0\ny = 0\na = 1\nb = (1,\n2)\n"
    [rejected] = result.rejected
    assert (rejected.diagnostic.line, rejected.diagnostic.end_line) == (2, 3)


# The engine

LEAK = """\
import torch
total = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss
"""
# LEAK's one finding: GL001 at 8:5.


def test_a_notebook_is_linted_with_the_config_given(tmp_path: Path) -> None:
    data = notebook_of(LEAK)
    assert [(d.cell, d.line, d.code) for d in lint_bytes(Path("nb.ipynb"), data, Config())] == [(1, 8, "GL001")]
    assert lint_bytes(Path("nb.ipynb"), data, Config(ignore=("GL001",))) == []


def test_an_unreadable_notebook_is_one_gl000_at_its_start() -> None:
    [found] = lint_notebook(b"{not json", "nb.ipynb")
    assert (found.path, found.line, found.column, found.end_line, found.end_column) == ("nb.ipynb", 1, 1, 1, 1)
    assert (found.code, found.name) == ("GL000", "parse-error")


def test_default_jobs_falls_back_to_the_cpu_count_without_an_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert default_jobs() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert default_jobs() == 1


def test_a_file_that_cannot_be_read_does_not_stop_the_files_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a_locked.py").write_text(LEAK)
    (tmp_path / "b_train.py").write_text(LEAK)
    read_bytes = Path.read_bytes

    def locked(path: Path) -> bytes:
        if path.name == "a_locked.py":
            raise PermissionError(13, "Permission denied")
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", locked)
    found = list(lint_paths([tmp_path / "a_locked.py", tmp_path / "b_train.py"], jobs=1))
    assert [(Path(d.path).name, d.code) for d in found] == [("a_locked.py", "GL000"), ("b_train.py", "GL001")]
    assert found[0].message == "cannot read file: Permission denied"


def test_a_file_whose_linting_raises_is_one_gl999_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(path: Path, data: bytes, config: Config | None, program: object) -> list[Diagnostic]:
        raise ValueError("boom")

    monkeypatch.setattr(gradlint.engine, "_lint_bytes", explode)
    (tmp_path / "train.py").write_text(LEAK)
    [found] = lint_paths([tmp_path / "train.py"], jobs=1)
    assert (found.path, found.line, found.column, found.end_column) == (str(tmp_path / "train.py"), 1, 1, 1)
    assert (found.code, found.name) == ("GL999", "internal-error")
    assert found.message == "internal error, please report: ValueError: boom"


def test_lint_file_lints_a_file_on_disk_with_the_config_given(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(LEAK)
    assert [(d.path, d.line, d.code) for d in lint_file(path)] == [(str(path), 8, "GL001")]
    assert lint_file(path, Config(ignore=("GL001",))) == []
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(LEAK))
    assert [(d.cell, d.line, d.code) for d in lint_file(book)] == [(1, 8, "GL001")]


def test_lint_file_reports_a_file_it_cannot_read(tmp_path: Path) -> None:
    [found] = lint_file(tmp_path / "missing.py")
    assert (found.path, found.line, found.column, found.code) == (str(tmp_path / "missing.py"), 1, 1, "GL000")
    assert found.message == "cannot read file: No such file or directory"


class Recording(Rule):
    """Checks for nothing; notes which process linted each file; registered by the tests only."""

    code = "GL995"
    name = "recording-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"RECORD",)
    log: ClassVar[Path]

    def check_module(self) -> None:
        with Recording.log.open("a") as log:
            log.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough that every idle worker takes a file


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers must inherit the test's rule")
def test_jobs_lint_in_that_many_worker_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # more cores than jobs: the pool must still take `jobs`
    monkeypatch.setattr(Recording, "log", tmp_path / "pids.txt", raising=False)
    monkeypatch.setitem(Rule.registry, Recording.code, Recording)
    for index in range(4):
        (tmp_path / f"step_{index}.py").write_text(LEAK + "# RECORD\n")
    found = list(lint_paths([tmp_path], Config(select=("GL001", Recording.code)), jobs=2))
    assert [d.code for d in found] == ["GL001"] * 4
    pids = set(Recording.log.read_text().split())
    assert len(pids) == 2 and str(os.getpid()) not in pids


class Slow(Rule):
    """Checks for nothing, slowly, on files that say so; registered by the tests only."""

    code = "GL993"
    name = "slow-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"SLOW",)

    def check_module(self) -> None:
        time.sleep(1.5)


class Aborting(Rule):
    """Checks for nothing, and kills its process on files that say so; registered by the tests only."""

    code = "GL994"
    name = "aborting-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"CRASH",)

    def check_module(self) -> None:
        os.abort()  # what a crash in LibCST's native parser, or the OOM killer, does to a worker


del Rule.registry[Recording.code], Rule.registry[Slow.code], Rule.registry[Aborting.code]  # registered by tests


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers must inherit the test's rules")
def test_files_a_dying_worker_took_down_are_linted_again_with_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The slow file is still being linted when the other worker dies, so the pool loses it too.
    (tmp_path / "a_slow.py").write_text(LEAK.replace("loss.backward()", "loss.backward()  # SLOW"))
    (tmp_path / "b_crash.py").write_text("import torch  # CRASH\n")
    monkeypatch.setitem(Rule.registry, Slow.code, Slow)
    monkeypatch.setitem(Rule.registry, Aborting.code, Aborting)
    config = Config(select=("GL002", Slow.code, Aborting.code, "GL999"))
    found = list(lint_paths([tmp_path], config, jobs=2))
    assert [(Path(d.path).name, d.code) for d in found] == [("b_crash.py", "GL999")]


def test_a_parser_that_recurses_too_deep_gives_gl000_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def recurse(source: object) -> cst.Module:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(cst, "parse_module", recurse)
    [found] = lint_source(LEAK, "deep.py")
    assert (found.path, found.line, found.column, found.code) == ("deep.py", 1, 1, "GL000")
    assert found.message == "cannot parse: the file is nested too deeply"


def test_an_analysis_that_recurses_too_deep_gives_gl000_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def recurse(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(gradlint.checking, "analyze", recurse)
    [found] = lint_source(LEAK, "deep.py")
    assert (found.path, found.line, found.column, found.code) == ("deep.py", 1, 1, "GL000")
    assert found.message == "cannot lint: the file is nested too deeply"


def test_positions_that_recurse_too_deep_give_gl000_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # LibCST computes positions lazily, recursing once per level of nesting, after the analysis.
    def recurse(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(gradlint.checking, "_at", recurse)
    [found] = lint_source(LEAK, "deep.py")
    assert (found.path, found.line, found.column, found.code) == ("deep.py", 1, 1, "GL000")
    assert found.message == "cannot lint: the file is nested too deeply"


def test_a_null_byte_is_a_syntax_error_at_the_start() -> None:
    [found] = lint_source(LEAK.replace("total = 0", "total = 0\0"), "null.py")
    assert (found.line, found.column, found.code) == (1, 1, "GL000")
    assert found.message == "syntax error: source code string cannot contain null bytes"


def test_a_value_error_from_the_parser_is_a_syntax_error_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("source code string cannot contain null bytes")  # what Python 3.10 raises

    monkeypatch.setattr(gradlint.engine, "compile", refuse, raising=False)
    [found] = lint_source(LEAK.replace("total = 0", "total = 0\0"), "null.py")
    assert (found.line, found.column) == (1, 1)
    assert found.message == "syntax error: source code string cannot contain null bytes"


def test_a_syntax_error_on_the_first_line_is_reported_there() -> None:
    [found] = lint_source("x = = 1\n" + LEAK, "broken.py")
    assert (found.line, found.column, found.message) == (1, 5, "syntax error: invalid syntax")


@pytest.mark.parametrize(
    ("message", "position"),
    [
        ("parser error: error at 1:0: expected one of )", (1, 1)),
        ("parser error: error at 2:7: expected one of )", (2, 8)),
        ("tokenizer error: bad character", (3, 5)),  # no position in the message: LibCST's raw one
    ],
)
def test_code_only_libcst_rejects_is_reported_where_libcst_says(
    monkeypatch: pytest.MonkeyPatch, message: str, position: tuple[int, int]
) -> None:
    def reject(source: object) -> cst.Module:
        raise cst.ParserSyntaxError(message, lines=["x = 1234567\n"] * 3, raw_line=3, raw_column=4)

    monkeypatch.setattr(cst, "parse_module", reject)
    [found] = lint_source(LEAK, "train.py")
    assert (found.path, found.line, found.column) == ("train.py", *position)
    assert found.message.startswith("cannot parse: LibCST does not support this code, which CPython accepts: ")


def test_any_other_parser_failure_on_code_cpython_accepts_is_gl000_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(source: object) -> cst.Module:
        raise MemoryError("parser out of memory")

    monkeypatch.setattr(cst, "parse_module", fail)
    [found] = lint_source(LEAK, "train.py")
    assert (found.path, found.line, found.column, found.end_column) == ("train.py", 1, 1, 1)
    assert (found.code, found.name, found.message) == ("GL000", "parse-error", "cannot parse: parser out of memory")


def test_code_that_only_fails_to_compile_is_not_a_syntax_error_of_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPython is asked to parse, never to compile: `return` outside a function parses.
    def reject(source: object) -> cst.Module:
        raise cst.ParserSyntaxError("tokenizer error: bad", lines=["x\n"], raw_line=1, raw_column=0)

    monkeypatch.setattr(cst, "parse_module", reject)
    [found] = lint_source(LEAK + "return\n", "train.py")
    assert found.message.startswith("cannot parse: LibCST does not support this code")


def nested(depth: int) -> tuple[str, str]:
    """`depth` opening brackets of all three kinds, and the closing ones that match them."""
    opening = "".join("[{("[level % 3] for level in range(depth))
    return opening, "".join({"[": "]", "{": "}", "(": ")"}[bracket] for bracket in reversed(opening))


def test_brackets_nested_101_deep_are_refused_even_after_some_were_closed() -> None:
    opening, closing = nested(99)
    source = LEAK + "x = ((" + "(1), " + opening + "1" + closing + "))\n"  # 3 deep, back to 2, then 2 + 99
    [found] = lint_source(source, "deep.py")
    assert (found.path, found.line, found.column, found.code) == ("deep.py", 1, 1, "GL000")
    assert found.message == "cannot parse: brackets are nested more than 100 deep"
    opening, _ = nested(101)
    assert [d.message for d in lint_source(LEAK + "x = " + opening + "1\n", "open.py")] == [found.message]


def test_brackets_nested_100_deep_are_linted_whatever_comments_and_closed_pairs_hold() -> None:
    opening, closing = nested(100)
    source = LEAK + "y = ([{}])\n# (\nx = " + opening + "1" + closing + "\n"
    assert [(d.line, d.code) for d in lint_source(source, "deep.py")] == [(8, "GL001")]


def test_a_file_over_the_size_limit_says_how_big_it_is() -> None:
    source = LEAK + "#" * (5 * 2**19)  # 2.5 MB in all
    [found] = lint_source(source, "big.py")
    assert (found.line, found.column, found.code) == (1, 1, "GL000")
    assert found.message == "cannot lint: the file is 2.5 MB, over gradlint's limit of 2 MB"


def test_a_file_of_exactly_the_size_limit_is_linted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradlint.decoding, "MAX_FILE_BYTES", len(LEAK))
    assert [d.code for d in lint_source(LEAK, "train.py")] == ["GL001"]
    assert [d.code for d in lint_source(LEAK + "\n", "train.py")] == ["GL000"]


def test_a_failing_rule_is_one_gl999_at_the_start_and_the_rules_after_it_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gradlint.rules.loss_accumulation import LossAccumulation

    def explode(self: object, node: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(LossAccumulation, "visit_AugAssign", explode)
    source = LEAK.replace("    optimizer.zero_grad()\n", "")  # GL002 as well
    source = source.replace("import torch", "import torch  # noqa")  # no comment silences an internal error
    found = lint_source(source, "train.py")
    assert [(d.line, d.column, d.end_line, d.end_column, d.code) for d in found] == [
        (1, 1, 1, 1, "GL999"),
        (5, 5, 5, 20, "GL002"),
    ]


def test_a_file_no_rule_could_fire_on_is_not_parsed() -> None:
    assert lint_source("import torch\nx = = 1\n", "plain.py") == []
    assert [d.message for d in lint_source("import torch\nx = = 1\n", "plain.py", prefilter=False)] == [
        "syntax error: invalid syntax"
    ]


def test_a_file_every_rule_is_ignored_for_is_not_parsed(tmp_path: Path) -> None:
    config = Config(per_file_ignores=(("broken.py", tuple(all_rules())),), root=tmp_path)
    assert lint_source("x = = 1\n" + LEAK, str(tmp_path / "broken.py"), config) == []


def test_undecodable_bytes_are_one_gl000_at_the_start_whether_or_not_a_rule_could_fire() -> None:
    [unparsed] = lint_source(b"x = 1\n# \xff\n", "plain.py")
    assert (unparsed.line, unparsed.column, unparsed.end_column) == (1, 1, 1)
    assert unparsed.message == "cannot decode: 'utf-8' codec can't decode byte 0xff in position 8: invalid start byte"
    [parsed] = lint_source(LEAK.encode() + b"# \xff\n", "train.py")
    assert (parsed.line, parsed.column, parsed.end_column) == (1, 1, 1)
    assert parsed.message.startswith("cannot parse: 'utf-8' codec can't decode byte 0xff in position ")


def test_per_file_ignores_apply_to_gl000(tmp_path: Path) -> None:
    config = Config(per_file_ignores=(("broken.py", ("GL000",)),), root=tmp_path)
    broken = "x = = 1\n" + LEAK
    assert lint_source(broken, str(tmp_path / "broken.py"), config) == []
    assert [d.code for d in lint_source(broken, str(tmp_path / "other.py"), config)] == ["GL000"]


def test_without_noqa_the_comments_are_left_to_the_caller() -> None:
    source = LEAK.replace("total += loss", "total += loss  # noqa: GL001")
    assert lint_source(source, "train.py") == []
    assert [d.code for d in lint_source(source, "train.py", noqa=False)] == ["GL001"]


# Suppression comments


def test_a_noqa_on_another_line_does_not_silence_a_finding() -> None:
    source = LEAK.replace("optimizer.step()", "optimizer.step()  # noqa")
    assert [(d.line, d.code) for d in lint_source(source, "train.py")] == [(8, "GL001")]


@pytest.mark.parametrize(
    ("source", "silenced"),
    [
        ('x = """never closed  # noqa\n' + LEAK, True),
        (LEAK + 'x = """never closed  # noqa\n', True),
        ('x = """never closed\n# noqa\n' + LEAK, False),
    ],
    ids=["first-line", "last-line", "next-line"],
)
def test_a_file_that_cannot_be_tokenized_takes_noqa_from_each_physical_line(source: str, silenced: bool) -> None:
    found = lint_source(source, "broken.py")
    assert [d.code for d in found] == ([] if silenced else ["GL000"])


def test_a_noqa_on_the_first_of_two_lines_silences_it() -> None:
    assert lint_source("x = = 1  # noqa\nloss.backward()\n", "broken.py") == []
    assert [d.code for d in lint_source("x = = 1\nloss.backward()\nimport torch\n", "broken.py")] == ["GL000"]


def test_a_noqa_on_the_last_line_of_a_statement_after_a_dedent_covers_it() -> None:
    source = LEAK.replace(
        "    optimizer.zero_grad()\n", "    if x is None:\n        continue\n    optimizer.zero_grad()\n"
    ).replace("total += loss", "total += \\\n        loss  # noqa: GL001")
    assert [d.code for d in lint_source(source.replace("  # noqa: GL001", ""), "train.py")] == ["GL001"]
    assert lint_source(source, "train.py") == []


# Fix passes and their verification


def gl001(line: int, fix: Fix | None = None) -> Diagnostic:
    return finding(line=line, end_line=line, fix=fix)


def test_a_fix_that_overlaps_another_is_applied_in_a_later_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    first = Fix("first", (Edit(1, 1, 1, 2, "y"),))
    second = Fix("second", (Edit(1, 1, 1, 1, "# two\n"),))  # an insertion where `first` starts: a clash

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        found = [] if data.startswith(b"y") or b"# two" in data else [gl001(1, first)]
        return found + ([] if b"# two" in data else [gl001(1, second)])

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("x = 1\n")
    assert (result.text, result.applied) == ("# two\ny = 1\n", 2)


def test_a_fix_that_overlaps_a_dropped_fix_is_applied_in_the_next_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    breaking = Fix("break", (Edit(1, 1, 1, 2, "("),))
    good = Fix("rename", (Edit(1, 1, 1, 2, "y"),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        return [] if data.startswith(b"y") else [gl001(1, breaking), gl001(1, good)]

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("x = 1\n")
    assert (result.text, result.applied) == ("y = 1\n", 1)
    assert [rejected.reason for rejected in result.rejected] == ["the fixed code would not parse"]


def test_fixes_that_verify_alone_but_clash_together_go_in_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    one = Fix("one", (Edit(1, 1, 1, 2, "a"),))
    two = Fix("two", (Edit(2, 1, 2, 2, "b"),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        text = data.decode()
        found = [] if text.startswith("a") else [gl001(1, one)]
        found += [] if "\nb" in text else [gl001(2, two)]
        if text.startswith("a") and "\nb" in text:  # both changes together bring a new finding
            found.append(finding(code="GL013", line=3, end_line=3))
        return found

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    result = fix_source("x = 1\ny = 2\nz = 3\n")
    assert (result.text, result.applied) == ("a = 1\ny = 2\nz = 3\n", 1)
    [rejected] = result.rejected
    assert (rejected.diagnostic.line, rejected.reason) == (
        2,
        "the fixed code would have a new finding: GL013 at line 3 (a tensor with autograd history is accumulated)",
    )


@pytest.mark.parametrize(("before", "after", "verifies"), [(1, 1, True), (2, 2, True), (1, 2, False)])
def test_a_fix_may_keep_as_many_equal_findings_as_there_were_but_not_more(
    monkeypatch: pytest.MonkeyPatch, before: int, after: int, verifies: bool
) -> None:
    rename = Fix("rename", (Edit(1, 1, 1, 2, "y"),))

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        same = [gl001(2)] * (after if data.startswith(b"y") else before)
        return same if data.startswith(b"y") else [gl001(1, rename), *same]

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    assert (fix_source("x = 1\nz = 2\n").applied == 1) is verifies


def test_verify_fix_says_why_a_fix_must_not_be_offered() -> None:
    [retain, detach] = lint_source(TRAIN, "train.py")
    assert retain.fix is not None and detach.fix is not None
    assert verify_fix(TRAIN, detach.fix) is None
    assert verify_fix(TRAIN, detach.fix, before=[retain, detach]) is None
    assert verify_fix(TRAIN, Fix("break", (Edit(1, 1, 1, 1, "("),))) == "the fixed code would not parse"
    new = f"the fixed code would have a new finding: GL005 at line 8 ({retain.message})"
    assert verify_fix(TRAIN, detach.fix, before=[]) == new


def test_fixing_honours_per_file_ignores(tmp_path: Path) -> None:
    config = Config(per_file_ignores=(("train.py", ("GL005",)),), root=tmp_path)
    path = tmp_path / "train.py"
    detach = next(d.fix for d in lint_source(TRAIN, str(path)) if d.code == "GL001")
    assert detach is not None
    assert verify_fix(TRAIN, detach, str(path), config) is None
    result = fix_source(TRAIN, str(path), config)
    assert (result.text, result.applied) == (DETACHED, 1)
    book = tmp_path / "train.ipynb"
    book.write_bytes(notebook_of(TRAIN))
    notebook_config = Config(per_file_ignores=(("train.ipynb", ("GL005",)),), root=tmp_path)
    assert fix_notebook(book, notebook_config).applied == 1
    assert cell_sources(book) == [DETACHED]


def test_fix_source_names_findings_like_lint_source_when_given_no_path() -> None:
    assert [d.path for d in lint_source(LEAK)] == ["<string>"]
    assert [d.path for d in fix_source(UNCLEARED).remaining] == ["<string>"]


def test_line_mapping_shifts_lines_after_a_removal_and_an_insertion() -> None:
    lines = line_mapping([Edit(1, 1, 2, 1, ""), Edit(4, 1, 4, 1, "x\n")])
    assert [lines(line) for line in range(1, 6)] == [2, 3, 4, 4, 5]


def test_two_insertions_at_one_point_clash() -> None:
    here, there = (finding(fix=Fix(text, (Edit(1, 3, 1, 3, text),))) for text in ("a", "b"))
    assert _non_overlapping([here, there], "x = 1\n") == [here]


def test_a_clash_skips_only_the_clashing_fix_not_the_ones_after_it() -> None:
    first, clashing, later = (finding(fix=Fix(str(line), (Edit(line, 1, line, 2, "y"),))) for line in (1, 1, 2))
    assert _non_overlapping([first, clashing, later], "x = 1\nx = 2\n") == [first, later]


# Rules

# The finding of each rule's `example`: its message, the notes of its related places, its fix.
EXAMPLE_FINDINGS = {
    "GL001": (
        "`total_loss` keeps `loss`, a tensor with autograd history, across iterations: every step's graph stays alive",
        (
            "`loss` gets its autograd graph here",
            "each iteration of this loop adds another graph",
            "backward frees the step's buffers, but the graph stays referenced",
        ),
        "use `.item()` to drop the graph",
    ),
    "GL002": (
        "the gradients that `optimizer` steps with are never cleared, so each step adds onto the last",
        ("nothing in this loop clears the gradients", "steps with the gradients of every backward so far"),
        None,
    ),
    "GL003": (
        "`w`, a leaf that requires grad, is updated in place outside torch.no_grad(), which raises",
        ("`w` requires grad from here",),
        "wrap the update in `with torch.no_grad():`",
    ),
    "GL004": (
        "`x`, a leaf that requires grad, is modified in place outside torch.no_grad(), which raises",
        ("`x` requires grad from here",),
        None,
    ),
    "GL005": (
        "retain_graph=True keeps `loss`'s graph alive but nothing backpropagates through it again",
        ("the retained graph is built here", "nothing in this loop backpropagates through it again"),
        "remove `retain_graph=True`",
    ),
    "GL006": (
        "`loss` reaches the model output only through `logits.argmax(dim=1)`, which has no gradient, so nothing learns",
        ("`loss` is backpropagated here",),
        None,
    ),
    "GL007": (
        "gradients are clipped before `loss.backward()`, so the new gradients are not clipped",
        ("the gradients are computed only here",),
        None,
    ),
    "GL008": (
        "`loss.backward()` runs through a graph that `loss.backward()` already freed; this raises at runtime",
        ("this earlier backward frees the graph",),
        None,
    ),
    "GL009": (
        "`model` runs outside torch.no_grad() in evaluation code, recording a graph that is never used",
        ("every iteration records a graph",),
        "run the loop under `torch.no_grad()`",
    ),
    "GL010": (
        "`torch.tensor([1, 2, 3], requires_grad=T…` is an integer or bool tensor, "
        "which cannot require gradients; this raises",
        (),
        None,
    ),
    "GL011": (
        "`optimizer` is stepped directly and by `scaler.step(optimizer)`, so the parameters are updated twice",
        ("the GradScaler steps the same optimizer here",),
        "remove the direct `optimizer.step()`",
    ),
    "GL012": (
        "backward() is called without a gradient on `loss`, which is not a scalar, "
        "so it raises 'grad can be implicitly created only for scalar outputs'",
        ("`loss` keeps one value per element here",),
        None,
    ),
    "GL013": (
        "backward() is called on `loss`, computed with autograd off, "
        "so it raises 'element 0 of tensors does not require grad'",
        ("`loss` is computed with autograd off here",),
        None,
    ),
    "GL014": (
        "`torch.optim.Adam` is built inside the training loop, "
        "so its state (momentum, Adam moments, loss scale) restarts",
        ("every pass through this training step builds it again",),
        None,
    ),
    "GL015": (
        "`hidden.retain_grad()` is called after the backward pass, so `hidden.grad` stays None",
        ("the backward pass already ran here",),
        None,
    ),
}


@pytest.mark.parametrize("code", sorted(EXAMPLE_FINDINGS))
def test_each_rule_says_what_it_found_in_its_example_why_each_place_matters_and_what_its_fix_does(code: str) -> None:
    source = "import torch\n" + textwrap.dedent(all_rules()[code].example)
    [found] = [d for d in lint_source(source, "example.py") if d.code == code]
    notes = tuple(place.note for place in found.related)
    assert (found.message, notes, found.fix and found.fix.description) == EXAMPLE_FINDINGS[code]


AMP = """\
import torch

scaler = torch.amp.GradScaler()
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    scaler.scale(criterion(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    scaler.step(optimizer)\n", "    if ready:\n        scaler.step(optimizer)\n"),
        ("    optimizer.step()\n", "    loss = optimizer.step(closure)\n"),
        ("    scaler.step(optimizer)\n", "    scaled_step()\n"),
    ],
    ids=["scaler-step-conditional", "direct-step-value-used", "scaler-step-in-a-helper"],
)
def test_gl011_removes_the_direct_step_only_where_the_scaler_step_stands_in_for_it(old: str, new: str) -> None:
    assert [(d.code, d.fix is not None) for d in lint_source(AMP, "train.py")] == [("GL011", True)]
    helper = "def scaled_step():\n    scaler.step(optimizer)\n\n\n"
    source = AMP.replace(old, new).replace("for x, y in loader:", helper + "for x, y in loader:")
    assert [(d.code, d.fix) for d in lint_source(source, "train.py")] == [("GL011", None)]


EVALUATION = """\
import torch

def fit(model, train_loader, val_x, optimizer, criterion):
    for epoch in range(10):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        model.eval()
        preds = model(val_x)
        print(epoch, preds.argmax(1))
"""


def test_gl009_fix_says_it_wraps_evaluation_code_that_is_not_one_loop() -> None:
    for source in (EVALUATION, EVALUATION.replace("        print(epoch, preds.argmax(1))\n", "")):
        [found] = lint_source(source, "train.py")
        assert found.fix is not None and found.fix.safe is False
        assert (found.code, found.fix.description) == ("GL009", "run the evaluation code under `torch.no_grad()`")


def test_gl009_evaluation_code_that_may_need_gradients_is_reported_without_a_fix() -> None:
    source = EVALUATION.replace("print(epoch, preds.argmax(1))", "agent.update(preds)")
    assert [(d.code, d.fix) for d in lint_source(source, "train.py")] == [("GL009", None)]


UNREDUCED = """\
import torch

criterion = torch.nn.CrossEntropyLoss(reduction="none")
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    {backward}
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("backward", "lines"),
    [
        ("torch.autograd.backward(loss, torch.ones_like(loss))", []),  # the gradient is the second argument
        ("loss.backward(retain_graph=True)", [7]),  # a keyword that is no gradient
        ("loss.backward(torch.ones_like(loss))\n    loss.backward()", [8]),  # the one after a checked call
    ],
    ids=["autograd-backward-with-gradient", "keyword-is-no-gradient", "after-a-call-with-gradient"],
)
def test_gl012_reports_each_backward_of_a_vector_that_gets_no_gradient(backward: str, lines: list[int]) -> None:
    found = lint_source(UNREDUCED.format(backward=backward), "train.py")
    assert [d.line for d in found if d.code == "GL012"] == lines


def test_gl012_a_lightning_step_returning_a_vector_names_it_and_where_it_keeps_its_elements() -> None:
    source = """\
import torch
import lightning as L


class Classifier(L.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        return loss
"""
    [found] = lint_source(source, "model.py")
    assert (found.code, found.line) == ("GL012", 9)
    assert found.message == (
        "training_step returns `loss`, which is not a scalar; Lightning calls backward() on it, "
        "which raises 'grad can be implicitly created only for scalar outputs'"
    )
    assert [(place.line, place.note) for place in found.related] == [(8, "`loss` keeps one value per element here")]


def test_gl004_an_in_place_change_of_a_saved_tensor_names_where_it_is_saved_and_the_next_backward() -> None:
    source = """\
import torch
x = torch.randn(3, requires_grad=True)
first = x.exp()
first.sum().backward()
y = x.sigmoid()
y.mul_(2)
optimizer.step()
y.sum().backward()
y.mean().backward()
"""
    [found] = lint_source(source, "saved.py")
    assert (found.code, found.line) == ("GL004", 6)
    assert found.message == (
        "`y`, saved for backward, is modified in place, so backward raises 'modified by an inplace operation'"
    )
    assert [(place.line, place.note) for place in found.related] == [
        (5, "`y` is computed here and saved for backward"),
        (8, "backward needs the saved value here"),  # the first backward after it, and only that
    ]


def test_gl004_an_in_place_change_in_a_helper_counts_when_its_caller_backpropagates_later() -> None:
    source = """\
import torch

def squash(x):
    y = x.sigmoid()
    y.mul_(2)
    return y

x = torch.randn(3, requires_grad=True)
out = squash(x)
out.sum().backward()
"""
    assert [(d.code, d.line) for d in lint_source(source, "helper.py")] == [("GL004", 5)]


def test_gl004_an_in_place_change_after_the_last_backward_is_not_reported() -> None:
    source = """\
import torch
x = torch.randn(3, requires_grad=True)
first = x.exp()
first.sum().backward()
y = x.sigmoid()
y.mul_(2)
"""
    assert lint_source(source, "after.py") == []


GL003_LOOP = """\
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    for p in model.parameters():
        p -= 0.1 * p.grad
"""


def test_gl003_in_a_loop_names_where_the_tensor_requires_grad_and_nothing_else() -> None:
    [found] = lint_source(GL003_LOOP, "train.py", Config(select=("GL003",)))  # GL002 too: nothing clears
    assert [(place.line, place.note) for place in found.related] == [(5, "`p` requires grad from here")]


def test_gl003_rebinding_gets_an_unsafe_fix_that_says_it_updates_in_place() -> None:
    source = GL003_LOOP.replace("p -= 0.1 * p.grad", "p = p - 0.1 * p.grad")
    [found] = lint_source(source, "train.py")
    assert found.message.startswith("the parameter is rebound to a value computed with autograd on")
    assert found.fix is not None and found.fix.safe is False
    assert found.fix.description == "update the parameter in place under `torch.no_grad()`, then drop its gradient"
    [edit] = found.fix.edits
    assert edit.text == "with torch.no_grad():\n            p -= 0.1 * p.grad\n            p.grad = None"


WRAPPED_STEP = """\
import torch

def train_step(batch):
    optimizer.zero_grad()
    loss = criterion(model(batch), batch)
    loss.backward()
    optimizer.step()

for batch in loader:
    with torch.no_grad():
        train_step(batch)
"""


def test_gl013_a_training_step_called_under_no_grad_names_the_call_and_the_helpers_backward() -> None:
    [found] = lint_source(WRAPPED_STEP, "train.py")
    assert (found.code, found.line) == ("GL013", 11)
    assert found.message == (
        "`train_step(batch)` runs inside torch.no_grad(), so the backward() in it raises 'does not require grad'"
    )
    assert [(place.line, place.note) for place in found.related] == [(6, "the helper backpropagates here")]
    inline = WRAPPED_STEP.replace(
        "    loss = criterion(model(batch), batch)\n    loss.backward()",
        "    criterion(model(batch), batch).backward()",
    )
    assert [(d.code, d.line) for d in lint_source(inline, "train.py")] == [("GL013", 10)]


@pytest.mark.parametrize("enable", ["torch.enable_grad()", "torch.set_grad_enabled(True)"])
def test_gl013_a_helper_that_turns_autograd_back_on_is_not_reported(enable: str) -> None:
    body = "".join(f"{line}\n" for line in WRAPPED_STEP.split("\n")[3:7])  # the helper's four lines
    source = WRAPPED_STEP.replace(body, f"    with {enable}:\n" + body.replace("    ", "        "))
    assert lint_source(source, "train.py") == []


@pytest.mark.parametrize("backward", ["outputs[0].backward()", "loss = outputs\n    loss.backward()"])
def test_gl013_a_helper_backpropagating_a_loss_computed_before_no_grad_is_not_reported(backward: str) -> None:
    source = f"""\
import torch

def train_step(batch, outputs):
    optimizer.zero_grad()
    {backward}
    optimizer.step()

for batch in loader:
    outputs = model(batch)
    with torch.no_grad():
        train_step(batch, outputs)
"""
    assert lint_source(source, "train.py") == []


def test_gl013_a_backward_without_a_loss_does_not_stop_the_backwards_after_it() -> None:
    source = "import torch\ntorch.autograd.backward()\n" + textwrap.dedent(all_rules()["GL013"].example)
    assert [(d.code, d.line) for d in lint_source(source, "train.py")] == [("GL013", 8)]


def test_gl013_a_lightning_step_returning_a_loss_computed_under_no_grad_names_it() -> None:
    source = """\
import torch
import lightning as L


class Classifier(L.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(self(x), y)
        return loss
"""
    [found] = lint_source(source, "model.py")
    assert (found.code, found.line) == ("GL013", 10)
    assert found.message == (
        "training_step returns `loss`, computed with autograd off; "
        "Lightning's backward() on it raises 'element 0 of tensors does not require grad'"
    )
    assert [(place.line, place.note) for place in found.related] == [(9, "`loss` is computed with autograd off here")]
