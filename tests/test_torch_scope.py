"""Torch scope: only files that torch reaches through their imports get gradient findings."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gradlint import Config, lint_paths, lint_source
from gradlint.frameworks import FRAMEWORKS, TORCH_MODULES
from gradlint.index import imported_modules, imports_torch

# A training step that misses its zero_grad (GL002), with no import of its own.
STEP = textwrap.dedent(
    """\
    def train(model, optimizer, loader):
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            optimizer.step()
    """
)


def codes(found: object) -> list[tuple[str, int, str]]:
    return [(Path(d.path).name, d.line, d.code) for d in found]  # type: ignore[attr-defined]


@pytest.mark.parametrize("header", ["import torch\n", "from torch import nn\n", "import lightning as L\n"])
def test_a_file_that_imports_torch_or_a_package_built_on_it_is_linted(header: str) -> None:
    assert [d.code for d in lint_source(header + STEP, "train.py")] == ["GL002"]


@pytest.mark.parametrize(
    "header",
    [
        "",  # plain Python: nothing says its `backward` and `step` are torch's
        "import numpy as np\n",
        "import mxnet as mx\nfrom mxnet import autograd\n",
        "import jax\n",
        "# import torch\n",  # a comment
        '"""\nimport torch\n"""\n',  # a docstring
    ],
)
def test_a_file_torch_does_not_reach_gets_no_finding(header: str) -> None:
    assert lint_source(header + STEP, "train.py") == []


def test_an_import_anywhere_in_the_file_counts() -> None:
    inside = STEP.replace("    for x, y", "    import torch\n\n    for x, y")
    assert [d.code for d in lint_source(inside, "train.py")] == ["GL002"]


def test_torch_reaches_through_project_modules_however_many_imports_away(tmp_path: Path) -> None:
    package = tmp_path / "lib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tensors.py").write_text("import torch\n")
    (package / "meters.py").write_text("from .tensors import zeros\n")  # reaches torch through tensors
    (package / "cycle_a.py").write_text("from . import cycle_b\n")
    (package / "cycle_b.py").write_text("from . import cycle_a\n")  # a cycle that never reaches torch
    (package / "loop.py").write_text("from lib.meters import Meter\n" + STEP)
    (package / "numeric.py").write_text("from . import cycle_a\nimport numpy\n" + STEP)
    (package / "kernels.py").write_text("import warp as wp\nfrom lib.meters import Meter\n" + STEP)  # Warp's own
    found = codes(lint_paths([tmp_path], Config(), jobs=1))
    assert found == [("loop.py", 5, "GL002")]


def test_a_module_that_starts_to_import_torch_is_judged_again_from_the_cache(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("import numpy\n")
    (tmp_path / "loop.py").write_text("import helpers\n" + STEP)
    cache = tmp_path / ".cache"
    assert list(lint_paths([tmp_path], Config(), jobs=1, cache=cache)) == []
    (tmp_path / "helpers.py").write_text("import numpy\nimport torch\n")
    assert codes(lint_paths([tmp_path], Config(), jobs=1, cache=cache)) == [("loop.py", 5, "GL002")]
    (tmp_path / "helpers.py").write_text("import numpy\n")
    assert list(lint_paths([tmp_path], Config(), jobs=1, cache=cache)) == []


def test_imports_are_read_from_the_text_without_strings_and_comments() -> None:
    refs = imported_modules(b'import os, torch.nn as nn\nfrom . import utils as u\nx = "import jax"\n')
    assert {(ref.kind, ref.name, ref.level) for ref in refs} == {
        ("absolute", "os", 0),
        ("absolute", "torch.nn", 0),
        ("relative", "", 1),
        ("relative", "utils", 1),
    }
    assert imports_torch(refs)
    assert not imports_torch(imported_modules(b"import torchy\nfrom jax import numpy\n"))


def test_the_frameworks_docs_list_the_packages_that_bring_torch_and_a_section_per_contract() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "frameworks.md").read_text()
    rows = [
        f"| {framework.name} | {', '.join(f'`{module}`' for module in framework.modules)} | "
        f"{'yes' if framework.on_torch else 'no: out of scope'} | {'yes, below' if framework.contract else ''} |"
        for framework in FRAMEWORKS
    ]
    table = "\n".join(["| Package | Imported as | Built on torch | Contract |", "| --- | --- | --- | --- |", *rows])
    assert f"<!-- frameworks:start -->\n{table}\n<!-- frameworks:end -->" in docs
    assert all(f"\n## {framework.name}\n" in docs for framework in FRAMEWORKS if framework.contract)
    assert {module for framework in FRAMEWORKS if framework.on_torch for module in framework.modules} == TORCH_MODULES


def test_each_contracts_hooks_are_in_its_section_of_the_frameworks_docs() -> None:
    """The hooks gradlint knows (`Framework.hooks`, as data) are what docs/frameworks.md says about each framework."""
    docs = (Path(__file__).parents[1] / "docs" / "frameworks.md").read_text()
    for framework in FRAMEWORKS:
        if framework.hooks is None:
            continue
        section = docs.split(f"\n## {framework.name}\n", 1)[1].split("\n## ", 1)[0]
        hooks = framework.hooks
        names = {*hooks.bases, *hooks.backpropagated, *hooks.without_grad, *hooks.after_backward, *(hooks.manual or ())}
        missing = sorted(name for name in names if not re.search(rf"`[^`]*\b{name}\b[^`]*`", section))
        assert missing == [], (framework.name, missing)


def test_a_file_decided_without_a_parse_is_decided_again_when_a_module_it_calls_changes(tmp_path: Path) -> None:
    # main.py holds no rule's tokens: whether it needs a parse depends on what lib.update does.
    (tmp_path / "lib.py").write_text("import torch\n\n\ndef update(model, batch):\n    return model(batch)\n")
    (tmp_path / "main.py").write_text(
        "import torch\nimport lib\n\n\ndef fit(model, loader):\n    for batch in loader:\n"
        "        lib.update(model, batch)\n"
    )
    cache = tmp_path / ".cache"
    assert list(lint_paths([tmp_path], Config(preview=True), jobs=1, cache=cache)) == []
    assert len(list(cache.glob("??/*"))) == 2  # both decisions remembered
    (tmp_path / "lib.py").write_text(
        "import torch\n\n\ndef update(model, batch):\n    loss = model(batch)\n    loss.backward()\n"
        "    model.optimizer.step()\n"
    )
    found = codes(lint_paths([tmp_path], Config(preview=True), jobs=1, cache=cache))
    assert ("main.py", 7, "GL002") in found
