"""Jupyter notebooks: cells joined for context, findings mapped to cells, magics, noqa, --fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint import Config, Diagnostic
from gradlint.cli import main
from gradlint.engine import lint_notebook
from gradlint.notebook import read_notebook

SETUP = """\
%matplotlib inline
!pip install torch
import torch
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)"""
# GL001 at line 7 (`total_loss += loss`); the optimizer comes from the cell above.
LEAKY_LOOP = """\
total_loss = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total_loss += loss
    if total_loss > 100:
        %time pass"""
BASH = "%%bash\nfor f in *.csv; do\n  echo $f\ndone"
OUTPUTS = [{"name": "stdout", "output_type": "stream", "text": ["step 1 loss 0.25\n"]}]


def notebook(*sources: str, markdown_first: bool = True) -> bytes:
    """An nbformat 4 notebook, written as Jupyter writes it, with outputs on every code cell."""
    cells: list[dict[str, object]] = [{"cell_type": "markdown", "metadata": {}, "source": ["# Training"]}]
    cells = cells if markdown_first else []
    for count, source in enumerate(sources, start=1):
        cells.append(
            {
                "cell_type": "code",
                "execution_count": count,
                "metadata": {"scrolled": True},
                "outputs": OUTPUTS,
                "source": source.splitlines(keepends=True),
            }
        )
    document = {"cells": cells, "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    return (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode()


def findings(data: bytes, config: Config | None = None) -> list[tuple[int | None, int, int, str]]:
    return [(d.cell, d.line, d.column, d.code) for d in lint_notebook(data, "nb.ipynb", config or Config())]


def test_findings_carry_their_cell_and_line_within_it() -> None:
    # Cell 1 is markdown; the loop in cell 3 uses the optimizer built in cell 2.
    assert findings(notebook(SETUP, LEAKY_LOOP)) == [(3, 7, 5, "GL001")]


def test_cells_share_context_like_one_module() -> None:
    # The loop clears gradients through a helper of another cell: linted alone it looks
    # like a missing zero_grad (GL002), joined with its cells it is a correct loop.
    helper = "import torch\ndef reset():\n    optimizer.zero_grad()"
    loop = "for x, y in loader:\n    reset()\n    criterion(model(x), y).backward()\n    optimizer.step()"
    assert findings(notebook("import torch", loop)) == [(3, 3, 5, "GL002")]
    assert findings(notebook(helper, loop)) == []


def test_ipython_syntax_is_masked_but_percent_in_python_is_kept() -> None:
    python_percent = (
        "period = (step\n    % 10)\nshell = !ls\nmodel?\n?create_dataset\npip install -U -q matplotlib\npip = 3\n"
    )
    data = notebook(SETUP, BASH, python_percent, LEAKY_LOOP)
    assert findings(data) == [(5, 7, 5, "GL001")]
    source = read_notebook(data).source
    assert "    % 10)" in source and "echo" not in source and "!ls" not in source
    assert "matplotlib" not in source and "pip = 3" in source  # an automagic is masked, a Python name is not


def test_noqa_works_in_a_cell() -> None:
    quiet = LEAKY_LOOP.replace("total_loss += loss", "total_loss += loss  # noqa: GL001")
    assert findings(notebook(SETUP, quiet)) == []


def test_a_syntax_error_is_reported_in_its_cell() -> None:
    [(cell, _, _, code)] = findings(notebook(SETUP, "x = 1\ndef broken(:\n    pass", "y = 2"))
    assert (cell, code) == (3, "GL000")


def test_a_finding_reported_at_the_top_of_the_source_lands_in_the_first_cell() -> None:
    # GL999 and file-level GL000 are reported at 1:1, which is the first cell's marker line.
    top = Diagnostic("nb.ipynb", 1, 1, "GL999", end_line=1, end_column=1, name="internal-error", message="m")
    located = read_notebook(notebook(SETUP, LEAKY_LOOP)).locate(top)
    assert (located.cell, located.line, located.end_line) == (2, 1, 1)


@pytest.mark.parametrize("data", [b"{not json", b'{"nbformat": 3, "worksheets": []}', b"[]"])
def test_a_file_that_is_not_a_notebook_is_gl000(data: bytes) -> None:
    [diagnostic] = lint_notebook(data, "nb.ipynb", Config())
    assert diagnostic.code == "GL000" and diagnostic.cell is None and "cannot read notebook" in diagnostic.message


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.ipynb").write_bytes(notebook(SETUP, LEAKY_LOOP))
    # Jupyter's autosave copies are skipped by the default excludes.
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "train-checkpoint.ipynb").write_bytes(notebook(SETUP, LEAKY_LOOP))
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--quiet", *args])
    return result.exit_code, result.stdout


def test_directories_include_notebooks_and_text_names_the_cell(project: Path) -> None:
    code, out = run(".")
    assert code == 1
    assert out == (
        "train.ipynb:cell 3:7:5: GL001 `total_loss` keeps `loss`, a tensor with autograd history, across iterations:"
        " every step's graph stays alive\n"
    )


def test_show_source_prints_the_cell_line(project: Path) -> None:
    _, out = run("--show-source", "train.ipynb")
    lines = out.splitlines()
    assert lines[1:3] == ["        total_loss += loss", "        ^^^^^^^^^^^^^^^^^^"]
    # Related places name their own cell and line, and show that cell's line.
    assert lines[3] == "  train.ipynb:cell 3:4:5: note: `loss` gets its autograd graph here"
    assert lines[4].strip() == "loss = criterion(model(x), y)"


def test_json_and_sarif_carry_the_cell(project: Path) -> None:
    [finding] = json.loads(run("--format", "json", "train.ipynb")[1])
    assert (finding["cell"], finding["line"]) == (3, 7)
    [result] = json.loads(run("--format", "sarif", "train.ipynb")[1])["runs"][0]["results"]
    # SARIF regions count the file's (JSON) lines: the place in the cell goes in properties.
    assert result["properties"] == {"cell": 3, "startLine": 7, "startColumn": 5, "endLine": 7, "endColumn": 23}
    assert "region" not in result["locations"][0]["physicalLocation"]
    assert result["message"]["text"].startswith("cell 3, line 7: `total_loss` keeps `loss`")
    assert result["relatedLocations"][0]["message"]["text"] == "cell 3, line 4: `loss` gets its autograd graph here"
    assert finding["related"][0] == {
        "path": "train.ipynb",
        "cell": 3,
        "line": 4,
        "column": 5,
        "end_line": 4,
        "end_column": 34,
        "note": "`loss` gets its autograd graph here",
    }


def test_fix_changes_code_cells_only_and_is_idempotent(project: Path) -> None:
    path = project / "train.ipynb"
    before = json.loads(path.read_bytes())
    assert run("--fix", "train.ipynb") == (0, "")
    after = json.loads(path.read_bytes())
    fixed_loop = LEAKY_LOOP.replace("total_loss += loss", "total_loss += loss.item()")
    assert "".join(after["cells"][2]["source"]) == fixed_loop  # the magic line is back, unchanged
    after["cells"][2]["source"] = before["cells"][2]["source"]
    assert after == before  # outputs, execution counts, metadata and other cells untouched
    fixed_bytes = path.read_bytes()
    assert run("--fix", "train.ipynb") == (0, "")
    assert path.read_bytes() == fixed_bytes


def test_diff_shows_the_fix_without_writing(project: Path) -> None:
    original = (project / "train.ipynb").read_bytes()
    code, out = run("--diff", "train.ipynb")
    assert code == 1
    assert '-    "    total_loss += loss\\n",' in out and '+    "    total_loss += loss.item()\\n",' in out
    assert (project / "train.ipynb").read_bytes() == original


def test_rebuilding_unchanged_source_gives_back_the_same_bytes() -> None:
    data = notebook(SETUP, BASH, LEAKY_LOOP, "x = 1\r\ny = 2\r\n")
    parsed = read_notebook(data)
    assert parsed.rebuild(parsed.source) == data


@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("indent", [1, 2, None])
def test_the_json_layout_of_other_writers_is_kept(indent: int | None, ascii_only: bool) -> None:
    document = json.loads(notebook(LEAKY_LOOP))
    document["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["étape 1 ✓\n"]}]
    data = json.dumps(document, indent=indent, ensure_ascii=ascii_only).encode()
    parsed = read_notebook(data)
    assert parsed.rebuild(parsed.source) == data


def test_a_placeholder_moved_by_a_fix_keeps_the_new_indentation() -> None:
    parsed = read_notebook(notebook("for step in range(3):\n    %time train(step)"))
    wrapped = parsed.source.replace("    pass", "    with torch.no_grad():\n        pass")
    cell = json.loads(parsed.rebuild(wrapped))["cells"][1]
    assert "".join(cell["source"]).splitlines()[-1] == "        %time train(step)"
