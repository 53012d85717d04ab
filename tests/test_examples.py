"""The bundled examples: what the README's first command prints, exactly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint.cli import main
from gradlint.config import PREVIEW_VARIABLE
from gradlint.rule import all_rules

ROOT = Path(__file__).parent.parent
# One finding of every rule; each line is what `gradlint --preview examples/` prints, less the message
# (the suite runs with GRADLINT_PREVIEW set, see conftest.py).
EXPECTED = """\
examples/accumulate_language_model.py:35:13: GL018
examples/amp_finetune.py:37:9: GL007
examples/amp_finetune.py:48:27: GL006
examples/distill_student.py:29:21: GL014
examples/distill_student.py:38:9: GL013
examples/distill_student.py:50:9: GL012
examples/dqn_cartpole.py:35:19: GL017
examples/evaluate_and_probe.py:40:18: GL009
examples/evaluate_and_probe.py:46:17: GL010
examples/finetune_frozen_backbone.py:37:5: GL022
examples/gan_amp_training.py:41:13: GL011
examples/gan_amp_training.py:47:13: GL008
examples/invert_generator.py:16:12: GL020
examples/manual_updates.py:29:13: GL003
examples/manual_updates.py:46:13: GL004
examples/manual_updates.py:60:9: GL005
examples/numpy_style_regression.py:21:9: GL021
examples/saliency_map.py:23:5: GL015
examples/train_classifier.py:43:13: GL001
examples/train_classifier.py:53:9: GL002
examples/vae_beta_warmup.py:39:18: GL019
examples/validate_every_n_steps.py:48:48: GL016
"""


def lint_examples() -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["--no-cache", "-j1", "--quiet", "examples"], catch_exceptions=False)
    return result.exit_code, result.stdout.splitlines()


def test_the_examples_show_exactly_one_finding_of_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    code, lines = lint_examples()
    assert code == 1
    assert [" ".join(line.split(" ")[:2]) for line in lines] == EXPECTED.splitlines()
    assert sorted(line.split(" ")[1] for line in lines) == sorted(all_rules())


def test_the_readme_shows_what_the_examples_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(PREVIEW_VARIABLE)  # the README's command: the default gate, no preview
    _, lines = lint_examples()
    block = re.search(r"```\n(examples/.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block is not None
    shown = block.group(1).splitlines()
    assert shown and set(shown) <= set(lines)
