"""Tests that kill surviving mutants of gradlint.fix (see benchmarks/mutation.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_mutation_kills import TRAIN

import gradlint.engine
import gradlint.fix
from gradlint import Config, Diagnostic, lint_source
from gradlint.fix import fix_paths, fix_source, verify_fix, write_atomically
from gradlint.rule import Edit, Fix, Rule


def detach_fix(path: str = "train.py", config: Config | None = None) -> Fix:
    """The fix of TRAIN's GL001 finding: `total += loss` becomes `total += loss.detach()`."""
    fix = next(d.fix for d in lint_source(TRAIN, path, config) if d.code == "GL001")
    assert fix is not None
    return fix


class FailingOnTorch(Rule):
    """Checks for nothing, and fails on every torch file; registered by the tests only."""

    code = "GL996"
    name = "failing-on-torch-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"torch",)

    def check_module(self) -> None:
        raise ZeroDivisionError("deliberate")


class FailingOnDetach(Rule):
    """Checks for nothing, and fails on files that call `.detach()`; registered by the tests only."""

    code = "GL997"
    name = "failing-on-detach-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b".detach()",)

    def check_module(self) -> None:
        raise ZeroDivisionError("deliberate")


del Rule.registry[FailingOnTorch.code], Rule.registry[FailingOnDetach.code]  # registered by the tests


def test_fix_paths_lints_in_this_process_when_given_one_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pool(*args: object) -> None:
        raise AssertionError("a worker pool was started although jobs=1")

    monkeypatch.setattr(gradlint.engine, "default_jobs", lambda: 4)  # what jobs=None would use
    monkeypatch.setattr(gradlint.engine, "ProcessPoolExecutor", no_pool)
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(TRAIN)
    results = list(fix_paths([tmp_path], Config(), write=False, jobs=1))
    assert [(Path(r.path).name, r.applied) for r in results] == [("a.py", 2), ("b.py", 2)]


def test_verify_fix_without_a_path_checks_the_text_under_lint_sources_default_name() -> None:
    config = Config(per_file_ignores=(("<string>", ("GL005",)),))
    assert [d.code for d in lint_source(TRAIN, config=config)] == ["GL001"]  # lint_source's name: "<string>"
    detach = detach_fix()
    # The fixed text keeps TRAIN's GL005, new when `before` is empty unless per-file-ignores drop it.
    assert verify_fix(TRAIN, detach, config=config, before=[]) is None
    assert verify_fix(TRAIN, detach, "train.py", config, before=[]) is not None


def test_verify_fix_lints_the_text_before_with_the_path_and_config_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "train.py")
    config = Config(per_file_ignores=(("train.py", (FailingOnTorch.code,)),), root=tmp_path)
    detach = detach_fix(path, config)
    monkeypatch.setitem(Rule.registry, FailingOnTorch.code, FailingOnTorch)
    monkeypatch.setitem(Rule.registry, FailingOnDetach.code, FailingOnDetach)
    # The fix makes an enabled rule fail: a new GL999. A failure of the rule that the config
    # turns off for this file, had the text before been linted without them, would hide it.
    problem = verify_fix(TRAIN, detach, path, config)
    assert problem is not None
    assert problem.startswith("the fixed code would have a new finding: GL999 at line 1 (internal error in GL997")


def test_a_pass_applies_every_fix_that_verifies_when_another_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    fixes = {
        1: (b"x =", Fix("break", (Edit(1, 1, 1, 1, "("),))),
        2: (b"y =", Fix("rename y", (Edit(2, 1, 2, 2, "b"),))),
        3: (b"z =", Fix("rename z", (Edit(3, 1, 3, 2, "c"),))),
    }

    def lint(data: bytes, *args: object, **kwargs: object) -> list[Diagnostic]:
        return [
            Diagnostic("t.py", line, 1, "GL001", line, 2, "loss-accumulation", "m", fix)
            for line, (marker, fix) in fixes.items()
            if marker in data
        ]

    monkeypatch.setattr(gradlint.fix, "lint_source", lint)
    monkeypatch.setattr(gradlint.fix, "MAX_PASSES", 1)
    result = fix_source("x = 1\ny = 2\nz = 3\n")
    assert (result.text, result.applied) == ("x = 1\nb = 2\nc = 3\n", 2)
    assert [(r.diagnostic.line, r.reason) for r in result.rejected] == [(1, "the fixed code would not parse")]


def test_the_temporary_file_is_hidden_beside_the_file_and_named_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A write cut short by a kill leaves it behind: it must say what it was, and stay out of sight.
    renamed: list[Path] = []
    real_replace = os.replace

    def spy(source: str, target: str) -> None:
        renamed.append(Path(source))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", spy)
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\n")
    assert write_atomically(path, b"x = 2\n", b"x = 1\n") is None
    assert path.read_bytes() == b"x = 2\n"
    [temporary] = renamed
    assert temporary.parent == path.resolve().parent
    assert temporary.name.startswith(".train.py.") and temporary.name.endswith(".tmp")
    assert not temporary.exists()
