"""The incremental parse of the language server: each result equals a full parse, and so do the findings."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import libcst as cst
import pytest

from gradlint.engine import lint_source_and_uses, whole_program
from gradlint.incremental import IncrementalParser

REPOSITORY = Path(__file__).parent.parent
MODULE = '''\
"""Train two models."""

import torch


def make(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, loader, criterion):
    optimizer = make(model)
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()


class Trainer:
    def __init__(self, model):
        self.model = model

    def step(self, x, y):
        loss = self.model(x).sum()
        loss.backward()


@torch.no_grad()
def evaluate(model, loader):
    return [model(x) for x, _ in loader]


def last(model):
    return model
'''


def parse_twice(before: str, after: str) -> tuple[cst.Module, cst.Module]:
    """The modules an IncrementalParser gives for `before`, then `after` (checked against a full parse)."""
    parser = IncrementalParser()
    first = parser.parse(before)
    second = parser.parse(after)
    assert second.code == after
    assert second.deep_equals(cst.parse_module(after))
    return first, second


def reused(first: cst.Module, second: cst.Module) -> int:
    """How many top-level statements `second` took from `first` unparsed."""
    kept = {id(statement) for statement in first.body}
    return sum(id(statement) in kept for statement in second.body)


def test_a_one_line_edit_reparses_only_around_the_changed_statement() -> None:
    first, second = parse_twice(MODULE, MODULE.replace("lr=0.1", "lr=0.01"))
    # `make` changed; its neighbours (the import and `train`) are parsed again with it.
    assert reused(first, second) == len(first.body) - 3
    assert second.body[2] is not first.body[2]


def test_the_same_text_gives_the_same_module() -> None:
    parser = IncrementalParser()
    module = parser.parse(MODULE)
    assert parser.parse(MODULE) is module


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("        self.model = model\n", "        self.model = model\n        self.steps = 0\n"),  # in a class body
        ("@torch.no_grad()\n", "@torch.no_grad()\n@staticmethod\n"),  # a decorator added
        ("@torch.no_grad()\n", ""),  # a decorator removed
        ("        optimizer.step()\n", "optimizer.step()\n"),  # dedented: a new top-level statement
        ("\n\nclass Trainer:", "\n\nclass Trainer:  # the trainer"),
        ("def last(model):\n    return model\n", "def last(model):\n    return model\n\n\nx = 1\n"),  # at the end
        ("def last(model):\n    return model\n", "def last(model):\n    return model\n    # trailing\n"),
        ("    return model\n", "    return (model\n"),  # a bracket that the next statement... does not close
        ("def last(model):", "x = 1; y = 2\ndef last(model):"),
        ("\n\ndef last(model):", "\n    # an indented comment: the block before it owns it\ndef last(model):"),
        ("        loss.backward()\n\n\n@torch", "        loss.backward()\n@torch"),  # blank lines removed
        ('"""Train two models."""', '"""Train three models."""'),  # in the first statement: a full parse
    ],
)
def test_edits_give_what_a_full_parse_gives(old: str, new: str) -> None:
    assert MODULE.count(old) == 1
    after = MODULE.replace(old, new)
    try:
        cst.parse_module(after)
    except cst.ParserSyntaxError:
        with pytest.raises(cst.ParserSyntaxError):
            parse_twice(MODULE, after)
        return
    parse_twice(MODULE, after)


def test_statements_merged_and_split_by_an_edit() -> None:
    split = MODULE.replace("def last(model):\n    return model\n", "values = [\n    1,\n]\nz = 3\n")
    merged = split.replace("]\nz = 3\n", "] + [z := 3]\n")
    parse_twice(split, merged)
    parse_twice(merged, split)
    # An opened bracket swallows the next statement, which the file then closes later.
    parse_twice(MODULE, MODULE.replace("def last(model):\n    return model\n", "x = (\n1)\n"))


def test_a_file_that_stops_parsing_and_parses_again() -> None:
    parser = IncrementalParser()
    parser.parse(MODULE)
    broken = MODULE.replace("def last(model):", 's = """\ndef last(model):')  # an unterminated string
    with pytest.raises(cst.ParserSyntaxError):
        parser.parse(broken)
    with pytest.raises(cst.ParserSyntaxError):
        parser.parse(MODULE.replace("        loss.backward()\n\n", "        loss.backward(\n\n"))
    fixed = MODULE.replace("lr=0.1", "lr=0.2")
    assert parser.parse(fixed).deep_equals(cst.parse_module(fixed))


def test_indentation_changes_and_a_module_indented_by_two() -> None:
    two = MODULE.replace("    ", "  ")
    parse_twice(two, two.replace("  return model\n", "  if model:\n    return model\n"))
    parse_twice(MODULE, MODULE.replace("        self.model = model\n", "      self.model = model\n"))
    # The first indented block sets the module's default indent: an edit there re-reads it.
    parse_twice(MODULE, MODULE.replace("    return torch.optim", "  return torch.optim"))


def test_crlf_and_mixed_line_breaks() -> None:
    crlf = MODULE.replace("\n", "\r\n")
    first, second = parse_twice(crlf, crlf.replace("lr=0.1", "lr=0.01"))
    assert reused(first, second) == len(first.body) - 3
    parse_twice(crlf, crlf.replace("def last(model):\r\n", "def last(model):\n"))
    parse_twice(crlf, crlf.replace("\r\n\r\n@torch", "\n\n@torch"))


def test_a_file_without_a_final_line_break() -> None:
    parse_twice(MODULE, MODULE.rstrip("\n"))
    parse_twice(MODULE.rstrip("\n"), MODULE.rstrip("\n") + "\n\nx = 1\n")


def mutate(lines: list[str], chooser: random.Random) -> list[str]:
    """`lines` after one edit of the kind typing makes: most are on the lines that matter to the rules."""
    interesting = [i for i, line in enumerate(lines) if any(word in line for word in ("grad", "backward", "step"))]
    index = chooser.choice(interesting) if interesting and chooser.random() < 0.7 else chooser.randrange(len(lines))
    line, new = lines[index], list(lines)
    match chooser.randrange(6):
        case 0:
            del new[index]
        case 1:
            new.insert(index, line)
        case 2:
            new[index] = "    " + line
        case 3:
            new[index] = line.removeprefix("    ")
        case 4:
            new[index] = line.rstrip("\r\n") + "  # note\n"
        case _:
            new[index] = line.replace("(", "(x, ", 1)
    return new


SAMPLES = [
    "fixtures/missing_zero_grad",
    "fixtures/loss_accumulation",
    "fixtures/eval_mode_not_restored",
    "examples/amp_finetune.py",
    "examples/gan_amp_training.py",
    "examples/train_classifier.py",
]


def samples() -> list[Path]:
    found = []
    for sample in SAMPLES:
        path = REPOSITORY / sample
        found.extend(sorted(path.glob("*.py"))[:2] if path.is_dir() else [path])
    return found


@pytest.mark.parametrize("path", samples(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_findings_after_a_series_of_edits_equal_a_full_lint(path: Path, tmp_path: Path) -> None:
    chooser = random.Random(path.name)
    target = tmp_path / path.name
    parsed: list[cst.Module] = []

    class Recording(IncrementalParser):
        def parse(self, text: str) -> cst.Module:
            parsed.append(super().parse(text))
            return parsed[-1]

    parser = Recording()

    lines = path.read_text().splitlines(keepends=True)
    for _ in range(12):
        edited = mutate(lines, chooser)
        data = "".join(edited).encode()
        program = whole_program([target], overlay={target: data})
        incremental = lint_source_and_uses(data, str(target), None, program, parser)
        full = lint_source_and_uses(data, str(target), None, whole_program([target], overlay={target: data}))
        assert incremental == full
        if not any(finding.code == "GL000" for finding in full[0]):
            lines = edited  # the next edit goes on from here; a broken file is typed back into shape
    assert any(reused(first, second) for first, second in pairwise(parsed))


def test_random_edits_of_every_example_give_a_full_parse() -> None:
    chooser = random.Random(0)
    spliced = 0
    for path in sorted((REPOSITORY / "examples").glob("*.py")):
        parser = IncrementalParser()
        lines = path.read_text().splitlines(keepends=True)
        module = parser.parse("".join(lines))
        for _ in range(30):
            edited = mutate(lines, chooser)
            text = "".join(edited)
            try:
                expected = cst.parse_module(text)
            except cst.ParserSyntaxError:
                with pytest.raises(cst.ParserSyntaxError):
                    parser.parse(text)
                continue  # typed back into shape: the next edit goes on from the last version that parses
            lines, previous, module = edited, module, parser.parse(text)
            assert module.code == text
            assert module.deep_equals(expected)
            spliced += reused(previous, module) > 0
    assert spliced > 200  # most edits are spliced, not parsed in full


def test_positions_reuse_the_statements_an_edit_left_and_equal_libcsts() -> None:
    from libcst.metadata import MetadataWrapper, PositionProvider

    from gradlint.analysis.syntax.positions import ModulePositions

    source = (REPOSITORY / "examples" / "train_classifier.py").read_text()
    parser = IncrementalParser()
    first = parser.parse(source)
    ModulePositions(first, parser.written)  # writes every statement out once
    style = (first.default_indent, first.default_newline)
    before = {statement: parser.written.get(statement, style) for statement in first.body}
    # An edit in the middle that adds two lines: the statements after it move down.
    middle = len(first.body) // 2
    anchor = first.code_for_node(first.body[middle])
    edited = source.replace(anchor, "# one\n# two\n" + anchor, 1)
    second = parser.parse(edited)
    positions = ModulePositions(second, parser.written)
    expected = MetadataWrapper(second, unsafe_skip_copy=True).resolve(PositionProvider)
    assert dict(positions) == dict(expected)
    assert positions.code == edited
    kept = [statement for statement in second.body if statement in before]
    assert kept and all(parser.written.get(statement, style) is before[statement] for statement in kept)
