"""Tests that kill surviving mutants of gradlint.cache and gradlint.formats.sarif (see benchmarks/mutation.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mutation_kills import finding, sarif_run

import gradlint
from gradlint import Config
from gradlint.cache import ResultCache
from gradlint.rule import Rule

# The result cache

# Stores one finding in the cache directory argv[1] and prints, as JSON, the messages of the
# EncodingWarnings the write raised: with -X warn_default_encoding, Python raises one for every
# text file opened without an explicit encoding, that is, in the locale's encoding.
PUT_AND_LIST_ENCODING_WARNINGS = """
import json, sys, warnings
from pathlib import Path
from gradlint import Config
from gradlint.cache import ResultCache
from test_mutation_kills import finding

cache = ResultCache(Path(sys.argv[1]), Config())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", EncodingWarning)
    cache.put("ab" * 32, [finding(message="ein Tensor mit Autograd-Verlauf wird aufsummiert")])
print(json.dumps([str(warning.message) for warning in caught if warning.category is EncodingWarning]))
"""


def encoding_warnings_of_a_put(directory: Path) -> list[str]:
    """The EncodingWarnings of one `ResultCache.put` into `directory`, in a Python that reports them.

    The same put runs in this process first, into a sibling directory: mutmut runs a test only
    for the functions it saw the test call in-process, and the subprocess inherits the mutant.
    """
    ResultCache(directory.parent / f"{directory.name}-in-process", Config()).put("ab" * 32, [finding()])
    paths = [str(Path(gradlint.__file__).parent.parent), str(Path(__file__).parent)]  # this gradlint, these tests
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-X", "warn_default_encoding", "-c", PUT_AND_LIST_ENCODING_WARNINGS, str(directory)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=60)
    warnings: list[str] = json.loads(done.stdout)
    return warnings


def test_cache_entry_is_written_in_utf8_not_the_locale_encoding(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*\n", encoding="utf-8")  # already there: only the entry is written
    assert encoding_warnings_of_a_put(tmp_path) == []
    assert ResultCache(tmp_path, Config()).get("ab" * 32) == [
        finding(message="ein Tensor mit Autograd-Verlauf wird aufsummiert")
    ]


def test_new_cache_directory_is_set_up_without_the_locale_encoding(tmp_path: Path) -> None:
    assert encoding_warnings_of_a_put(tmp_path / "cache") == []
    assert (tmp_path / "cache" / ".gitignore").is_file()


def test_cache_directory_gitignore_says_gradlint_created_it_and_ignores_everything(tmp_path: Path) -> None:
    ResultCache(tmp_path / "cache", Config()).put("ab" * 32, [finding()])
    assert (tmp_path / "cache" / ".gitignore").read_bytes() == b"# Created by gradlint automatically.\n*\n"


# SARIF


class Undocumented(Rule):
    code = "GL989"
    name = "undocumented-test-rule"
    message = "never reported"
    example = use_instead = ""

    @classmethod
    def summary(cls) -> str:
        return "Checks for nothing; has a summary but no docstring; registered by the tests only."


del Rule.registry[Undocumented.code]  # registered by the test that needs it


def test_sarif_full_description_of_a_rule_without_a_docstring_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(Rule.registry, Undocumented.code, Undocumented)
    [descriptor] = [rule for rule in sarif_run()["tool"]["driver"]["rules"] if rule["id"] == Undocumented.code]
    assert descriptor["shortDescription"] == {"text": Undocumented.summary()}
    assert descriptor["fullDescription"] == {"text": ""}


def test_a_rule_without_a_docstring_has_an_empty_summary() -> None:
    class Bare(Rule):
        code = "GL988"
        name = "bare-test-rule"
        message = "never reported"
        example = use_instead = ""

    del Rule.registry[Bare.code]
    assert Bare.summary() == ""
