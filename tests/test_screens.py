"""Screens: the shapes some rules need, read with CPython's parser before a file is parsed with LibCST.

A screen is a necessary condition: it may pass a file the analysis then finds clean, it must never
fail one the analysis reports (every fixture is also linted with and without the prefilter, in
test_prefilter_pool_cache.py). Here: what GL009's screen lets through and what it keeps out, and
that a file only screened rules could fire on is parsed only when the screen passes.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from gradlint import lint_source
from gradlint.catalog import rule_infos
from gradlint.index import standard_tree
from gradlint.screens import SCREENS, evaluation_code

PASSES = {
    "a switch to eval mode in the loop's scope": """
        model.eval()
        for x in items:
            print(model(x))
    """,
    "a flag-driven switch in a function": """
        def run(model, items, train):
            model.train(train)
            for x in items:
                model(x)
    """,
    "a function's loop over a loader by name": """
        def predict(model, test_loader):
            for x, _ in tqdm(test_loader):
                model(x)
    """,
    "a loader bound to a local name first": """
        def predict(model, files):
            stream = iter(make(files))
            it = stream
            batches = it
            for x in enumerate(batches):
                model(x)
    """,
    "a DataLoader under an alias, built in the loop": """
        from torch.utils.data import DataLoader as DL
        def predict(model, dataset_):
            for x in DL(dataset_):
                model(x)
    """,
    "one pass after a switch, its output detached": """
        model.eval()
        print(model(x).detach())
    """,
    "a loop in an async function over `ds`": """
        async def predict(model, ds):
            async for x in ds:
                model(x)
    """,
}
FAILS = {
    "no loop and nothing detached": """
        model.eval()
        model(x)
    """,
    "a module-level loop over a loader, no switch": """
        for x in val_loader:
            model(x)
    """,
    "a function's loop over a parameter named for nothing": """
        def run(model, items):
            for x in items:
                model(x)
    """,
    "a while loop and no switch": """
        def run(model, loader):
            while True:
                model(next(loader))
    """,
    "the switch is in another function than the loop": """
        def setup(model):
            model.eval()
        def run(model, items):
            for x in items:
                model(x)
    """,
    "a loop over a call that builds no loader": """
        def run(model, n):
            for i in range(n):
                model(i)
    """,
}


@pytest.mark.parametrize("name", PASSES)
def test_evaluation_code_lets_through_what_may_be_evaluation_code(name: str) -> None:
    tree = standard_tree(textwrap.dedent(PASSES[name]).encode())
    assert tree is not None and evaluation_code(tree)


@pytest.mark.parametrize("name", FAILS)
def test_evaluation_code_keeps_out_what_cannot_be(name: str) -> None:
    tree = standard_tree(textwrap.dedent(FAILS[name]).encode())
    assert tree is not None and not evaluation_code(tree)


def test_every_screen_a_rule_names_exists() -> None:
    named = {rule.screen for rule in rule_infos().values() if rule.screen}
    assert named == {"evaluation_code"} and named <= set(SCREENS)


def test_a_file_only_a_screened_rule_could_fire_on_is_parsed_only_when_its_screen_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []
    parse = cst.parse_module

    def counting(source: str) -> cst.Module:
        parsed.append(source)
        return parse(source)

    monkeypatch.setattr(cst, "parse_module", counting)
    loops = "import torch\n\ndef run(model, items):\n    for x in items:\n        print(model(x))\n"
    assert lint_source(loops, "plain.py") == [] and parsed == []  # only GL009 could fire: screened out
    evaluation = loops.replace("items", "val_loader").replace("    for", "    model.eval()\n    for")
    [finding] = lint_source(evaluation, "evaluate.py")
    assert finding.code == "GL009" and len(parsed) == 1


def test_a_file_cpython_cannot_parse_is_left_to_the_libcst_parse() -> None:
    assert standard_tree(b"def broken(:\n") is None
    [finding] = lint_source("import torch\nfor x in loader:\n    model(x)\ndef broken(:\n", "broken.py")
    assert finding.code == "GL000"
