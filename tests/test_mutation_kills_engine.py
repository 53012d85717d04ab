"""Tests that kill surviving mutants of gradlint.engine (see benchmarks/mutation.md)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import ClassVar

import pytest

import gradlint.engine
from gradlint import Config, Diagnostic
from gradlint.cache import Uses
from gradlint.engine import lint_paths, noqa_lines
from gradlint.rule import Rule

STEP = "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"


class TakingTickets(Rule):
    """Checks for nothing; numbers the files in the order they start, two at a time; registered by the tests only.

    Each file takes the lowest free ticket, then waits until two files hold one. With two
    workers, the first two files the pool hands out therefore take tickets 0 and 1 (no worker
    is free before both started), and the third file takes ticket 2.
    """

    code = "GL980"
    name = "taking-tickets-test-rule"
    message = "never reported"
    example = use_instead = ""
    requires = (b"TICKET",)
    folder: ClassVar[Path]

    def check_module(self) -> None:
        label = self.analysis.lines[0].removeprefix("# TICKET ")
        for number in range(10):
            try:
                handle = os.open(TakingTickets.folder / str(number), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.write(handle, label.encode())
            os.close(handle)
            break
        deadline = time.monotonic() + 10  # the second file starts within milliseconds
        while len(list(TakingTickets.folder.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)


del Rule.registry[TakingTickets.code]  # registered by the tests


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers must inherit the test's rule")
def test_pool_hands_out_the_biggest_files_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    monkeypatch.setattr(TakingTickets, "folder", tickets, raising=False)
    monkeypatch.setitem(Rule.registry, TakingTickets.code, TakingTickets)
    source = tmp_path / "src"
    source.mkdir()
    # Discovery order is by name: smallest first, so only a sort by size puts `c_big.py` first.
    for name, padding in (("a_small", 0), ("b_medium", 200), ("c_big", 2000)):
        (source / f"{name}.py").write_text(f"# TICKET {name}\nimport torch\n" + "#" * padding + "\n")
    found = list(lint_paths([source], Config(select=(TakingTickets.code,)), jobs=2))
    assert found == []
    started = {ticket.name: ticket.read_text() for ticket in tickets.iterdir()}
    assert {started["0"], started["1"]} == {"c_big", "b_medium"}
    assert started["2"] == "a_small"


@pytest.fixture
def lint_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the engine parses and lints in this process (run with jobs=1)."""
    calls: list[str] = []
    real = gradlint.engine._lint_bytes

    def counting(path: Path, data: bytes, config: Config | None, program: object) -> tuple[list[Diagnostic], Uses]:
        calls.append(path.name)
        return real(path, data, config, program)  # type: ignore[arg-type]

    monkeypatch.setattr(gradlint.engine, "_lint_bytes", counting)
    return calls


def test_file_whose_rules_per_file_ignores_turn_off_is_never_parsed(tmp_path: Path, lint_calls: list[str]) -> None:
    (tmp_path / "ignored.py").write_text(STEP)
    (tmp_path / "kept.py").write_text(STEP)
    config = Config(per_file_ignores=(("ignored.py", ("ALL",)),), root=tmp_path)
    found = list(lint_paths([tmp_path], config, jobs=1))
    assert found and {Path(d.path).name for d in found} == {"kept.py"}
    assert lint_calls == ["kept.py"]


def test_noqa_lines_maps_exactly_the_lines_of_the_text_to_their_groups() -> None:
    text = 'x = 1\ns = """a\nb"""\ny = 2\n'
    assert noqa_lines(text) == {1: range(1, 2), 2: range(2, 4), 3: range(2, 4), 4: range(4, 5)}


def test_noqa_lines_of_a_text_tokenize_rejects_are_its_physical_lines() -> None:
    assert noqa_lines("x = (\ny = 2\n") == {1: range(1, 2), 2: range(2, 3)}
