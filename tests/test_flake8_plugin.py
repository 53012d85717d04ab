"""Real flake8 with the `GL` plugin reports exactly what the gradlint command reports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradlint.engine import lint_source
from gradlint.flake8_plugin import Plugin, to_flake8
from gradlint.rule import Diagnostic

FIXTURES = Path(__file__).parent.parent / "fixtures"
LOOP = """\
import torch

for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss{comment}
"""
# Each file puts a different spelling of noqa (or none) on the one line GL001 reports.
NOQA_VARIANTS = {
    "plain.py": "",
    "bare.py": "  # noqa",
    "coded.py": "  # noqa: GL001",
    "prefix.py": "  # noqa:GL",
    "digit_prefix.py": "  # noqa: GL00",  # a prefix of GL001: silences it
    "other_prefix.py": "  # noqa: GL01",  # not a prefix of GL001
    "other_code.py": "  # noqa: GL002",
    "no_space.py": "  #noqa",
    "upper.py": "  # NOQA: GL001, E501",
}
CONTINUED = """\
import torch

for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss + \\
        0  # noqa: GL001
    notes += loss * len('''
    ''')  # noqa: GL001
"""


def run(*command: str, cwd: Path) -> list[str]:
    """The sorted output lines of a command run in `cwd`."""
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode in (0, 1), result.stderr
    return sorted(result.stdout.splitlines())


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rule fixtures plus noqa variants, in a directory without any flake8 or gradlint config."""
    root = tmp_path_factory.mktemp("flake8")
    version = subprocess.run(
        [sys.executable, "-m", "flake8", "--version"], cwd=root, capture_output=True, text=True, check=False
    )
    if "gradlint" not in version.stdout:
        pytest.skip("flake8 does not list the gradlint plugin: run `pip install -e .` to register its entry point")
    shutil.copytree(FIXTURES, root / "src", ignore=shutil.ignore_patterns("runtime", "__pycache__"))
    for name, comment in NOQA_VARIANTS.items():
        (root / "src" / "noqa" / name).parent.mkdir(exist_ok=True)
        (root / "src" / "noqa" / name).write_text(LOOP.format(comment=comment))
    (root / "src" / "noqa" / "continued.py").write_text(CONTINUED)
    return root


def test_flake8_reports_what_gradlint_reports(project: Path) -> None:
    flake8 = run(sys.executable, "-m", "flake8", "--isolated", "--select", "GL", "src", cwd=project)
    gradlint = run(sys.executable, "-m", "gradlint", "--quiet", "src", cwd=project)
    assert flake8 == gradlint
    assert len(gradlint) > 20  # the fixtures are full of findings, so the comparison means something


def test_noqa_is_honoured_the_same_way(project: Path) -> None:
    flake8 = run(sys.executable, "-m", "flake8", "--isolated", "--select", "GL", "src/noqa", cwd=project)
    reported = {Path(line.split(":")[0]).name for line in flake8}
    assert reported == {"plain.py", "other_code.py", "no_space.py", "other_prefix.py"}
    assert flake8 == run(sys.executable, "-m", "gradlint", "--quiet", "src/noqa", cwd=project)


def test_noqa_on_the_last_line_of_a_continued_statement_covers_it() -> None:
    # flake8 reads a noqa comment anywhere on a backslash-continued line or multi-line string
    # as covering all its lines; the engine does the same, so the variant above is silent.
    assert [(d.line, d.code) for d in lint_source(CONTINUED.replace("  # noqa: GL001", ""))] == [
        (8, "GL001"),
        (10, "GL001"),
    ]
    assert lint_source(CONTINUED) == []


def test_columns_become_zero_based_only_for_flake8() -> None:
    diagnostic = Diagnostic("a.py", 3, 5, "GL001", end_line=3, end_column=9, name="n", message="m")
    assert to_flake8(diagnostic, Plugin) == (3, 4, "GL001 m", Plugin)
