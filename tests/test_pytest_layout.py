"""Tests by their place: a function is a test when pytest (or unittest) would collect it, not by its name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gradlint import Config, lint_paths, lint_source
from gradlint.pytest_layout import DEFAULT, TestLayout, layout_for

# GL001 (a loss kept across iterations) stays quiet in tests: the probe of every case here.
LOOP = """\
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    total = 0
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        optimizer.step()
        total += loss
"""


def _function(name: str) -> str:
    return f"import torch\n\n\ndef {name}():\n{LOOP}"


def _codes(source: str, path: Path | str) -> list[str]:
    return [d.code for d in lint_source(source, str(path), Config(select=("GL001",)))]


@pytest.mark.parametrize(
    ("name", "collected"),
    [
        ("test_model.py", True),
        ("model_test.py", True),
        ("test.py", False),  # the evaluation script of many research repositories
        ("tests.py", False),
        ("conftest.py", False),
        ("train.py", False),
        ("test_data.txt", False),
    ],
)
def test_default_file_patterns(name: str, collected: bool) -> None:
    assert DEFAULT.collects_file(f"pkg/{name}") is collected


def test_class_and_function_patterns_are_prefixes_or_globs() -> None:
    layout = TestLayout(classes=("Check", "*Suite"), functions=("check_", "*_spec"))
    assert layout.collects_class("CheckModel") and layout.collects_class("ModelSuite")
    assert not layout.collects_class("TestModel")
    assert layout.collects_function("check_grads") and layout.collects_function("grads_spec")
    assert not layout.collects_function("test_grads")


def test_a_function_named_test_in_a_script_is_not_a_test(tmp_path: Path) -> None:
    for name in ("test", "test_epoch"):
        assert _codes(_function(name), tmp_path / "main.py") == ["GL001"]
        assert _codes(_function(name), tmp_path / "test_main.py") == []


def test_a_source_without_a_file_has_no_tests() -> None:
    assert _codes(_function("test_loop"), "<string>") == ["GL001"]


def test_pytest_classes_and_their_bases(tmp_path: Path) -> None:
    method = textwrap.indent(f"def test_loop(self):\n{textwrap.indent(textwrap.dedent(LOOP), '    ')}", "    ")
    collected = f"import torch\n\n\nclass TestLoop:\n{method}"
    with_init = f"import torch\n\n\nclass TestLoop:\n    def __init__(self):\n        pass\n\n{method}"
    mixin = f"import torch\n\n\nclass _Checks:\n{method}\n\nclass TestCPU(_Checks):\n    pass\n"
    path = tmp_path / "test_loop.py"
    assert _codes(collected, path) == []
    assert _codes(with_init, path) == ["GL001"]  # pytest cannot collect a class with __init__
    assert _codes(mixin, path) == []  # its tests run in the collected subclass
    assert _codes(collected, tmp_path / "loops.py") == ["GL001"]  # the file is not collected


def test_unittest_cases_are_tests_in_any_file(tmp_path: Path) -> None:
    method = textwrap.indent(f"def test_loop(self):\n{textwrap.indent(textwrap.dedent(LOOP), '    ')}", "    ")
    header = "import unittest\n\nimport torch\n\n\nclass Base(unittest.TestCase):\n    pass\n\n\n"
    base = f"{header}class Loop(Base):\n{method}"
    assert _codes(base, tmp_path / "checks.py") == []
    helper = base.replace("def test_loop(self)", "def run_loop(self)")
    assert _codes(helper, tmp_path / "checks.py") == ["GL001"]  # unittest runs only test* methods


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pytest.ini", "[pytest]\npython_files = check_*.py\npython_functions = check_\n"),
        ("pyproject.toml", '[tool.pytest.ini_options]\npython_files = ["check_*.py"]\npython_functions = "check_"\n'),
        ("pyproject.toml", '[tool.pytest]\npython_files = ["check_*.py"]\npython_functions = ["check_"]\n'),
        ("tox.ini", "[pytest]\npython_files = check_*.py\npython_functions = check_\n"),
        ("setup.cfg", "[tool:pytest]\npython_files =\n    check_*.py\npython_functions = check_\n"),
    ],
)
def test_the_projects_own_patterns(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    package = tmp_path / "pkg"
    package.mkdir()
    assert _codes(_function("check_loop"), package / "check_model.py") == []
    assert _codes(_function("test_loop"), package / "check_model.py") == ["GL001"]
    assert _codes(_function("check_loop"), package / "test_model.py") == ["GL001"]


def test_the_nearest_configuration_wins_and_a_bare_pytest_ini_counts(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\npython_files = ["check_*.py"]\n')
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = other\n")  # no pytest section: passed over
    inner = tmp_path / "inner"
    inner.mkdir()
    assert layout_for(str(inner / "check_a.py")) is not None
    (inner / "pytest.ini").write_text("")  # pytest takes it even without a [pytest] section: the defaults
    sub = inner / "sub"
    sub.mkdir()
    assert layout_for(str(sub / "check_a.py")) is None
    assert layout_for(str(sub / "test_a.py")) == DEFAULT


def test_a_broken_configuration_means_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options\n")
    assert layout_for(str(tmp_path / "test_a.py")) == DEFAULT


def test_cached_results_follow_the_patterns(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    module = project / "check_loop.py"
    module.write_text(_function("check_loop"))
    cache = tmp_path / "cache"
    config = Config(select=("GL001",), root=project)
    assert [d.code for d in lint_paths([project], config, jobs=1, cache=cache)] == ["GL001"]
    (project / "pytest.ini").write_text("[pytest]\npython_files = check_*.py\npython_functions = check_\n")
    assert list(lint_paths([project], config, jobs=1, cache=cache)) == []
