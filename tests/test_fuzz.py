"""Fuzzing: `lint_source` never raises and never fails internally, whatever program it is given.

Three generators, each bounded to run in seconds: hypothesmith's valid Python from the
grammar; training-loop programs assembled from the statements the rules reason about;
and mutants of the fixtures (lines and tokens deleted, duplicated and swapped), which
are mostly invalid. The prefilter is off, so every rule sees every program.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradlint import Config, lint_source
from gradlint.rule import Diagnostic

FIXTURES = sorted(path for path in (Path(__file__).parent.parent / "fixtures").glob("*/*.py"))


def fuzz(examples: int) -> settings:
    """Bounded, reproducible runs: the same programs every time, no time limit per example."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def lint_everything(source: str | bytes) -> list[Diagnostic]:
    """Lint with every rule run on every program, and check the result's shape."""
    diagnostics = lint_source(source, "fuzzed.py", Config(), prefilter=False)
    assert isinstance(diagnostics, list)
    internal = [d.message for d in diagnostics if d.code == "GL999"]
    assert not internal, internal
    return diagnostics


@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # hypothesmith compiles what it generates
@fuzz(60)
@given(hypothesmith.from_grammar())
def test_grammar_generated_programs_never_crash(source: str) -> None:
    lint_everything(source)


NAMES = st.sampled_from(["loss", "out", "model", "optimizer", "opt", "scaler", "x", "p", "total", "self.net"])
EXPRESSIONS = st.one_of(
    NAMES,
    st.builds("{}({})".format, NAMES, NAMES),
    st.builds("criterion(model({}), y)".format, NAMES),
    st.builds("{}.{}()".format, NAMES, st.sampled_from(["item", "detach", "sum", "mean", "clone", "parameters"])),
    st.builds("{} + {}".format, NAMES, NAMES),
    st.builds("torch.tensor({}, requires_grad=True)".format, NAMES),
    st.sampled_from(["torch.optim.SGD(model.parameters(), lr=0.1)", "torch.cuda.amp.GradScaler()", "nn.Linear(2, 2)"]),
)
SIMPLE = st.one_of(
    st.builds("{} = {}".format, NAMES, EXPRESSIONS),
    st.builds("{} += {}".format, NAMES, EXPRESSIONS),
    st.builds("{}.backward({})".format, NAMES, st.sampled_from(["", "retain_graph=True", "create_graph=True"])),
    st.builds(
        "{}.{}()".format, NAMES, st.sampled_from(["step", "zero_grad", "add_(1)", "requires_grad_()", "retain_grad"])
    ),
    st.builds("scaler.scale({}).backward()".format, NAMES),
    st.builds("scaler.step({})".format, NAMES),
    st.builds("scaler.unscale_({})".format, NAMES),
    st.builds("torch.nn.utils.clip_grad_norm_({}, 1.0)".format, EXPRESSIONS),
    st.builds("{}.grad = None".format, NAMES),
    st.builds("torch.autograd.grad({}, {})".format, NAMES, NAMES),
    st.builds("return {}".format, EXPRESSIONS),
    st.sampled_from(["pass", "break", "continue", "del loss", "yield loss", "import torch", "from torch import nn"]),
)
HEADERS = st.sampled_from(
    [
        "for x, y in loader:",
        "for step, batch in enumerate(loader):",
        "while True:",
        "with torch.no_grad():",
        "with torch.set_grad_enabled(train):",
        "with torch.autocast('cuda'):",
        "if step % 4 == 0:",
        "else:",
        "try:",
        "except Exception:",
        "def train(model, loader):",
        "def training_step(self, batch):",
        "@torch.no_grad()\ndef evaluate(model):",
        "class Trainer(nn.Module):",
        "def forward(self, x):",
        "def closure():",
    ]
)


@st.composite
def training_programs(draw: st.DrawFn) -> str:
    """A program of nested blocks and statements, indented as drawn (often invalid)."""
    lines = ["import torch", "from torch import nn"]
    depth = 0
    for _ in range(draw(st.integers(1, 25))):
        depth = draw(st.integers(0, depth))  # dedent any number of levels
        if draw(st.booleans()):
            for header in draw(HEADERS).splitlines():
                lines.append("    " * depth + header)
            depth += 1
        lines.append("    " * depth + draw(SIMPLE))
    return "\n".join(lines) + "\n"


@fuzz(300)
@given(training_programs())
def test_generated_training_programs_never_crash(source: str) -> None:
    lint_everything(source)


def _tokens(source: str) -> list[tuple[int, int]]:
    """Character spans of the tokens of `source` (as far as it tokenizes)."""
    offsets = [0]
    for line in io.StringIO(source).readlines():
        offsets.append(offsets[-1] + len(line))
    spans = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.string.strip():
                start = offsets[token.start[0] - 1] + token.start[1]
                spans.append((start, offsets[token.end[0] - 1] + token.end[1]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return spans


def mutate(source: str, operation: str, first: int, second: int) -> str:
    """Delete, duplicate or swap lines (`*_line`) or tokens (`*_token`) picked by two indexes."""
    if operation.endswith("_line"):
        units = source.splitlines(keepends=True)
        if not units:
            return source
        i, j = sorted((first % len(units), second % len(units)))
        if operation == "delete_line":
            del units[i]
        elif operation == "duplicate_line":
            units.insert(j, units[i])
        else:
            units[i], units[j] = units[j], units[i]
        return "".join(units)
    spans = _tokens(source)
    if not spans:
        return source
    (a, b), (c, d) = sorted((spans[first % len(spans)], spans[second % len(spans)]))
    if operation == "delete_token":
        return source[:a] + source[b:]
    if operation == "duplicate_token":
        return source[:b] + " " + source[a:b] + source[b:]
    if (a, b) == (c, d):
        return source
    return source[:a] + source[c:d] + source[b:c] + source[a:b] + source[d:]


OPERATIONS = st.sampled_from(
    ["delete_line", "duplicate_line", "swap_line", "delete_token", "duplicate_token", "swap_token"]
)


@fuzz(300)
@given(
    st.sampled_from(FIXTURES),
    st.lists(st.tuples(OPERATIONS, st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=4),
)
def test_mutated_fixtures_end_in_diagnostics_or_gl000(fixture: Path, mutations: list[tuple[str, int, int]]) -> None:
    source = fixture.read_text(encoding="utf-8")
    for operation, first, second in mutations:
        source = mutate(source, operation, first, second)
    diagnostics = lint_everything(source)
    assert all(d.line >= 1 and d.column >= 1 and d.code.startswith("GL") for d in diagnostics)


@fuzz(200)
@given(st.sampled_from(FIXTURES), st.integers(0, 100_000), st.binary(min_size=1, max_size=64))
def test_fixtures_with_bytes_spliced_in_never_crash(fixture: Path, position: int, garbage: bytes) -> None:
    data = fixture.read_bytes()
    position %= len(data) + 1
    lint_everything(data[:position] + garbage + data[position:])


def test_mutations_change_the_source() -> None:
    source = "a = 1\nb = f(a)\n"
    assert mutate(source, "delete_line", 0, 0) == "b = f(a)\n"
    assert mutate(source, "duplicate_line", 0, 1) == "a = 1\na = 1\nb = f(a)\n"
    assert mutate(source, "swap_line", 0, 1) == "b = f(a)\na = 1\n"
    assert mutate(source, "delete_token", 0, 0) == " = 1\nb = f(a)\n"
    assert mutate(source, "swap_token", 0, 2) == "1 = a\nb = f(a)\n"
    assert mutate(source, "duplicate_token", 5, 5) == "a = 1\nb = f f(a)\n"


@pytest.mark.parametrize(
    "source",
    [
        # torch/_inductor/codegen/cpp_micro_gemm.py: a helper called from a class decorator,
        # whose call site is the `class` statement itself (GL003, GL004: KeyError).
        "def update(w, lr):\n    w = w - lr * w.grad\n    return w\n@update(p, 0.1)\nclass A:\n    pass\n",
        "def update(w):\n    w.add_(1)\n@update(torch.nn.Parameter(torch.zeros(1)))\ndef f():\n    pass\n",
        "def clip(w=torch.zeros(3, requires_grad=True)):\n    w.add_(1)\n"
        "match clip(x):\n    case _:\n        loss.backward()\n",
    ],
    ids=["class-decorator", "function-decorator", "match-subject"],
)
def test_internal_errors_found_by_the_corpus_runs_stay_fixed(source: str) -> None:
    lint_everything("import torch\n" + source)
