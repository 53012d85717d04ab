"""The speed machinery never changes a result: the prefilter, the worker pool and the cache."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gradlint import Config, lint_source
from gradlint import engine as engine_module
from gradlint.cache import Uses
from gradlint.engine import could_fire, lint_paths
from gradlint.rule import Diagnostic, Rule

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures").glob("*/*.py"))
STEP = "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"
ACCUMULATE = "import torch\ntotal = 0\nfor x in loader:\n    loss = model(x)\n    total += loss\n" + (
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_prefilter_hides_no_finding_on_fixtures(path: Path) -> None:
    data = path.read_bytes()
    assert lint_source(data, str(path)) == lint_source(data, str(path), prefilter=False)


def test_requires_tokens_all_of_and_any_of(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Quiet, "requires", (b"backward", b"step"))
    assert could_fire(Quiet, b"loss.backward(); opt.step()")
    assert not could_fire(Quiet, b"loss.backward()")
    monkeypatch.setattr(Quiet, "requires", ((b"backward", b"training_step"), b"loss"))
    assert could_fire(Quiet, b"def training_step(self): return loss")
    assert not could_fire(Quiet, b"def training_step(self): return 1")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dozen files: findings, clean files, a syntax error, files no rule can fire on."""
    monkeypatch.chdir(tmp_path)
    for index in range(4):
        (tmp_path / f"step_{index}.py").write_text(STEP)
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / f"accumulate_{index}.py").write_text(ACCUMULATE)
        (tmp_path / f"plain_{index}.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text(STEP + "def broken(:\n")
    return tmp_path


def keys(diagnostics: Iterator[Diagnostic] | list[Diagnostic]) -> list[tuple[str, int, int, str, str]]:
    return [(d.path, d.line, d.column, d.code, d.message) for d in diagnostics]


def test_output_order_does_not_depend_on_jobs(project: Path) -> None:
    serial = keys(lint_paths([Path(".")], jobs=1))
    assert {code for _, _, _, code, _ in serial} >= {"GL000", "GL001", "GL002"}
    assert keys(lint_paths([Path(".")], jobs=2)) == serial
    assert keys(lint_paths([Path(".")], jobs=5)) == serial
    assert serial == sorted(serial)  # discovery order is path order


@pytest.fixture
def lint_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the engine parses and lints in this process (run with jobs=1)."""
    calls: list[str] = []
    real = engine_module._lint_bytes

    def counting(path: Path, data: bytes, config: Config | None, program: object) -> tuple[list[Diagnostic], Uses]:
        calls.append(path.as_posix())
        return real(path, data, config, program)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "_lint_bytes", counting)
    return calls


# Two rules whose `requires` tokens plain files lack, so that the counts below are fixed.
TWO_RULES = Config(select=("GL001", "GL002"))


def test_warm_cache_lints_nothing_and_returns_the_same(project: Path, lint_calls: list[str]) -> None:
    cache = project / ".gradlint_cache"
    cold = keys(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache))
    parsed = len(lint_calls)
    assert parsed == 9  # the four plain files never reach the parser
    assert keys(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache)) == cold
    assert len(lint_calls) == parsed
    assert (cache / ".gitignore").read_text().endswith("*\n")


def test_cache_key_follows_content_config_and_rules(project: Path, lint_calls: list[str]) -> None:
    cache = project / ".gradlint_cache"
    list(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache))
    lint_calls.clear()
    (project / "step_0.py").write_text(STEP + "# changed\n")
    list(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache))
    assert lint_calls == ["step_0.py"]
    lint_calls.clear()
    only = Config(select=("GL002",))
    assert {d.code for d in lint_paths([Path(".")], only, jobs=1, cache=cache)} == {"GL002"}
    assert len(lint_calls) == 9  # another configuration: every entry is new
    lint_calls.clear()
    with registered(Quiet):
        list(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache))
    assert len(lint_calls) == 9


def test_corrupt_and_foreign_entries_are_misses(project: Path, lint_calls: list[str]) -> None:
    cache = project / ".gradlint_cache"
    cold = keys(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache))
    entries = sorted(cache.glob("??/*"))
    assert len(entries) == 13  # the 9 files linted, and the 4 that no rule could fire on (decided without a parse)
    garbage = [b"", b"{not json", b"\xff\xfe", json.dumps([{"path": 1}]).encode(), b"[1, 2]", b"null"]
    for entry, content in zip(entries, garbage * 3, strict=False):
        entry.write_bytes(content)
    lint_calls.clear()
    assert keys(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache)) == cold
    assert len(lint_calls) == 9
    lint_calls.clear()
    assert keys(lint_paths([Path(".")], TWO_RULES, jobs=1, cache=cache)) == cold  # the entries were rewritten
    assert lint_calls == []


def test_unwritable_cache_only_costs_time(project: Path) -> None:
    blocker = project / "not_a_directory"
    blocker.write_text("")
    assert keys(lint_paths([Path(".")], jobs=1, cache=blocker)) == keys(lint_paths([Path(".")], jobs=1))


def test_runs_sharing_a_cache_agree(project: Path) -> None:
    command = [sys.executable, "-m", "gradlint", "-q", "."]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    alone = subprocess.run([*command, "--no-cache"], capture_output=True, text=True, check=False).stdout
    warm = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    assert outputs == [alone] * 4 and warm == alone
    # No half-written entry left: every file is the .gitignore or an entry named for its key.
    files = [path for path in (project / ".gradlint_cache").rglob("*") if path.is_file()]
    entries = [path for path in files if path.name != ".gitignore"]
    assert entries and all(re.fullmatch(r"[0-9a-f]{2}/[0-9a-f]{62}", f"{e.parent.name}/{e.name}") for e in entries)


def test_no_cache_writes_nothing(project: Path) -> None:
    subprocess.run([sys.executable, "-m", "gradlint", "--no-cache", "."], capture_output=True, check=False)
    assert not (project / ".gradlint_cache").exists()


class Quiet(Rule):
    """Checks for nothing; registered by the tests only."""

    code = "GL990"
    name = "quiet-test-rule"
    message = "never reported"
    example = use_instead = ""


class Exploding(Rule):
    """Checks for nothing, and fails on every file; registered by the tests only."""

    code = "GL991"
    name = "exploding-test-rule"
    message = "never reported"
    example = use_instead = ""

    def check_module(self) -> None:
        raise ZeroDivisionError("deliberate")


class Crashing(Rule):
    """Checks for nothing, and kills its process on files that say so; registered by the tests only."""

    code = "GL992"
    name = "crashing-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"CRASH",)

    def check_module(self) -> None:
        # The worker inherited pytest's faulthandler, which would print this deliberate
        # crash's traceback on the terminal of a green run; a real crash still prints its own.
        faulthandler.disable()
        os.abort()  # what a crash in LibCST's native parser, or the OOM killer, does to a worker


del Rule.registry[Quiet.code], Rule.registry[Exploding.code], Rule.registry[Crashing.code]  # see `registered`


@contextmanager
def registered(rule: type[Rule]) -> Iterator[None]:
    """Register `rule` for the duration of a `with` block."""
    Rule.registry[rule.code] = rule
    try:
        yield
    finally:
        del Rule.registry[rule.code]


def test_internal_error_is_isolated_to_its_rule_and_never_cached(project: Path, lint_calls: list[str]) -> None:
    cache = project / ".gradlint_cache"
    with_exploding = Config(select=("GL001", "GL002", Exploding.code))
    with registered(Exploding):
        found = list(lint_paths([Path(".")], with_exploding, jobs=1, cache=cache))
    internal = [d for d in found if d.code == "GL999"]
    assert len(internal) == 8  # every file torch reaches (not the plain ones) but the one that does not parse
    assert all(d.message == "internal error in GL991, please report: ZeroDivisionError: deliberate" for d in internal)
    assert {d.code for d in found} == {"GL001", "GL002", "GL999"}  # the other rules still ran
    lint_calls.clear()
    with registered(Exploding):
        list(lint_paths([Path(".")], with_exploding, jobs=1, cache=cache))
    assert len(lint_calls) == 8  # the failures were not remembered; the syntax error was


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers must inherit the test's rule")
def test_a_worker_that_dies_costs_only_its_file(project: Path) -> None:
    (project / "crash.py").write_text(STEP + "# CRASH\n")
    with registered(Crashing):
        found = keys(lint_paths([Path(".")], Config(select=("GL002", Crashing.code, "GL999")), jobs=2))
    assert (
        "crash.py",
        1,
        1,
        "GL999",
        "internal error: the process linting this file died (out of memory?), please report",
    ) in found
    assert sum(code == "GL002" for _, _, _, code, _ in found) == 4  # the other files were still linted


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers must inherit the test's rule")
def test_internal_error_in_a_worker_exits_2(project: Path) -> None:
    from click.testing import CliRunner

    from gradlint.cli import main

    with registered(Exploding):
        result = CliRunner().invoke(main, ["--no-cache", "-j2", "."])
    assert result.exit_code == 2
    assert "GL999 internal error in GL991, please report" in result.stdout
    assert "GL002" in result.stdout


def test_editing_any_source_file_of_gradlint_changes_the_cache_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of the package stands in for it, so that a rule can be "edited" without touching the real one.
    from gradlint import cache

    package = tmp_path / "gradlint"
    shutil.copytree(cache._PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "_PACKAGE", package)

    def digest() -> str:
        cache._source_digest.cache_clear()
        return cache._source_digest()

    before = digest()
    assert digest() == before  # stable while nothing changes
    rule = package / "rules" / "loss_accumulation.py"
    rule.write_text(rule.read_text().replace("CONTAINER_METHODS", "CONTAINER_METHOD_NAMES"))
    edited = digest()
    assert edited != before  # same file names, new content: a different fingerprint
    (package / "rules" / "loss_accumulation.py").rename(package / "rules" / "loss_accumulation_renamed.py")
    assert digest() != edited
    cache._source_digest.cache_clear()
