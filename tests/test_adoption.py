"""Adopting gradlint on existing code: --add-noqa puts each comment where the engine honours it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint import Diagnostic, lint_source
from gradlint.cli import main
from gradlint.engine import noqa_lines
from gradlint.fix import apply_edits
from gradlint.noqa import noqa_edits

LEAK = """\
import torch
total = 0
for x in loader:
    optimizer.zero_grad()
    loss = model(x)
    loss.backward()
    optimizer.step()
    total += loss
"""
STEP = "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"


def silenced(source: str) -> str:
    """`source` with a noqa comment for each of its findings, as --add-noqa writes it."""
    return apply_edits(source, noqa_edits(source, lint_source(source, "train.py")))


def finding(line: int, code: str = "GL001") -> Diagnostic:
    return Diagnostic("train.py", line, 1, code, end_line=line, end_column=2, name="loss-accumulation", message="")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--no-cache", "-j1", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_comment_is_appended_to_the_reported_line() -> None:
    assert silenced(LEAK) == LEAK.replace("total += loss\n", "total += loss  # noqa: GL001\n")


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("  # noqa: GL007", "  # noqa: GL007, GL001"),
        ("  # noqa:GL007,", "  # noqa:GL007, GL001"),
        ("  # NOQA: E501 long line", "  # NOQA: E501, GL001 long line"),
        ("  # running sum, for the log", "  # running sum, for the log  # noqa: GL001"),
        ("   ", "  # noqa: GL001"),
    ],
    ids=["noqa", "trailing-comma", "other-tool-and-text", "other-comment", "trailing-spaces"],
)
def test_codes_join_a_noqa_comment_already_on_the_line(comment: str, expected: str) -> None:
    source = LEAK.replace("total += loss\n", f"total += loss{comment}\n")
    assert silenced(source) == LEAK.replace("total += loss\n", f"total += loss{expected}\n")


def test_the_comment_goes_after_a_multi_line_string_never_inside_it() -> None:
    source = LEAK.replace("total += loss\n", 'total += loss * len("""\na line of the string\n""")\n')
    assert noqa_lines(source)[8] == range(8, 11)
    assert silenced(source) == source.replace('""")\n', '""")  # noqa: GL001\n')
    assert lint_source(silenced(source), "train.py") == []


def test_the_comment_goes_after_a_backslash_continuation() -> None:
    source = LEAK.replace("total += loss\n", "total += \\\n        loss\n")
    assert silenced(source) == source.replace("        loss\n", "        loss  # noqa: GL001\n")
    assert lint_source(silenced(source), "train.py") == []


def test_findings_of_one_line_share_one_comment_and_internal_errors_get_none() -> None:
    edits = noqa_edits(LEAK, [finding(8, "GL002"), finding(8), finding(8, "GL999"), finding(1, "GL000")])
    assert apply_edits(LEAK, edits) == LEAK.replace("total += loss\n", "total += loss  # noqa: GL001, GL002\n")


def test_line_endings_stay_as_they_were() -> None:
    crlf = LEAK.replace("\n", "\r\n")
    assert silenced(crlf) == crlf.replace("total += loss\r\n", "total += loss  # noqa: GL001\r\n")


def test_add_noqa_writes_counts_and_a_second_run_changes_nothing(project: Path) -> None:
    Path("leak.py").write_text(LEAK)
    Path("step.py").write_text(STEP)
    Path("clean.py").write_text("import torch\n")
    code, out, err = run("--add-noqa", ".")
    assert (code, out) == (0, "")
    assert err.splitlines() == ["Added 2 noqa comments.", "All checks passed (3 files)."]
    assert Path("leak.py").read_text() == LEAK.replace("total += loss\n", "total += loss  # noqa: GL001\n")
    assert Path("step.py").read_text() == STEP.replace("backward()\n", "backward()  # noqa: GL002\n")
    before = {path: path.read_bytes() for path in project.iterdir()}
    assert run("--add-noqa", ".")[2].splitlines()[0] == "Added 0 noqa comments."
    assert {path: path.read_bytes() for path in project.iterdir()} == before
    assert run(".")[0] == 0


def test_add_noqa_keeps_encoding_cookie_bom_and_mode(project: Path) -> None:
    cookie = "# -*- coding: future_fstrings -*-\n# café\n"
    Path("old.py").write_bytes((cookie + LEAK).encode())
    Path("latin.py").write_bytes(("# -*- coding: latin-1 -*-\n# café\n" + LEAK).encode("latin-1"))
    Path("bom.py").write_bytes(b"\xef\xbb\xbf" + LEAK.encode())
    Path("bom.py").chmod(0o750)
    code, out, _ = run("--add-noqa", ".")
    assert code == 1 and "old.py:1:1: GL000 unknown encoding" in out  # a cookie is no place for a noqa
    marked = LEAK.replace("total += loss\n", "total += loss  # noqa: GL001\n")
    assert Path("old.py").read_bytes() == (cookie + marked).encode()
    assert Path("latin.py").read_bytes() == ("# -*- coding: latin-1 -*-\n# café\n" + marked).encode("latin-1")
    assert Path("bom.py").read_bytes() == b"\xef\xbb\xbf" + marked.encode()
    assert Path("bom.py").stat().st_mode & 0o777 == 0o750


def test_what_no_comment_silences_is_still_reported(project: Path) -> None:
    Path("leak.py").write_text(LEAK)
    Path("broken.py").write_text(STEP + "loss.backward(\n")
    code, out, err = run("--add-noqa", "--statistics", ".")
    assert code == 1
    assert out == "  1  GL000  parse-error\n  1  total\n"
    assert "Added 1 noqa comment." in err


def test_add_noqa_in_a_notebook_keeps_its_cells_and_outputs(project: Path) -> None:
    cells = ["import torch\nmodel = torch.nn.Linear(2, 1)", LEAK.split("\n", 1)[1].rstrip("\n")]
    document = {
        "cells": [
            {"cell_type": "code", "execution_count": n, "metadata": {}, "outputs": [], "source": source}
            for n, source in enumerate(cells, start=1)
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    Path("train.ipynb").write_text(json.dumps(document, indent=1) + "\n")
    assert run("--add-noqa", "train.ipynb")[0] == 0
    written = json.loads(Path("train.ipynb").read_text())
    assert written["cells"][0] == document["cells"][0]
    assert written["cells"][1]["source"].endswith("total += loss  # noqa: GL001")
    assert run("train.ipynb")[0] == 0
