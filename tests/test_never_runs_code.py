"""gradlint reads code and configuration; it never imports, executes or evaluates them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint.cli import main

MARKER = "ran.marker"


def payload(marker: Path) -> str:
    """Python that leaves `marker` behind if anything runs it."""
    return f"open({str(marker)!r}, 'w').write('executed')\n"


@pytest.fixture
def booby_trapped(tmp_path: Path) -> Path:
    """A project every file of which writes the marker when imported, run or evaluated."""
    marker = tmp_path / MARKER
    package = tmp_path / "pkg"
    package.mkdir()
    step = "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"
    (package / "__init__.py").write_text(payload(marker) + step)
    (package / "train.py").write_text(f"import pkg\n{payload(marker)}if __name__ == '__main__':\n    {payload(marker)}")
    (package / "__main__.py").write_text(payload(marker) + step)
    (tmp_path / "setup.py").write_text(payload(marker) + step)
    (tmp_path / "conftest.py").write_text(payload(marker) + step)
    (tmp_path / "sitecustomize.py").write_text(payload(marker))
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": payload(marker)}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebook.ipynb").write_text(json.dumps(notebook))
    # TOML strings that would run the payload if anything evaluated them.
    evaluated = f"__import__('os').system('touch {marker}')"
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.gradlint]\nexclude = ["{evaluated}"]\nper-file-ignores = {{ "{evaluated}" = ["GL001"] }}\n'
    )
    return tmp_path


def test_linting_a_project_never_runs_it(booby_trapped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(booby_trapped)
    result = CliRunner().invoke(main, ["--no-cache", "-j1", "."])
    assert result.exit_code == 1 and "GL002" in result.stdout  # it was really linted
    assert CliRunner().invoke(main, ["-j2", "--format", "json", "."]).exit_code == 1
    assert not (booby_trapped / MARKER).exists()


def test_the_command_line_from_inside_the_project_never_runs_it(booby_trapped: Path) -> None:
    # As a console script: the project's directory is not put on sys.path.
    code = "from gradlint.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "pkg", "setup.py"], cwd=booby_trapped, capture_output=True, check=False
    )
    assert done.returncode == 1
    assert not (booby_trapped / MARKER).exists()
