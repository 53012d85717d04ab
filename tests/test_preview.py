"""Preview: rules not yet right four times in five on fresh code run only when asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint import Config, lint_source
from gradlint.cli import main
from gradlint.config import PREVIEW_VARIABLE, ConfigError, parse_table
from gradlint.measured import DRAWS, FRESH, SAMPLE, Measured, in_preview, newest, total

# GL003 (in preview) and GL010 (on by default) in one file.
SOURCE = textwrap.dedent(
    """\
    import torch

    index = torch.zeros(3, dtype=torch.long, requires_grad=True)

    w = torch.randn(3, requires_grad=True)
    for x, y in data:
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        w -= 0.1 * w.grad
        w.grad.zero_()
    """
)


@pytest.fixture
def default_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of a user who has not asked for preview."""
    monkeypatch.delenv(PREVIEW_VARIABLE)


def codes(config: Config) -> list[str]:
    return sorted({d.code for d in lint_source(SOURCE, "train.py", config)})


@pytest.mark.usefixtures("default_gate")
def test_rules_in_preview_run_only_with_preview_or_their_code_selected() -> None:
    assert in_preview("GL003") and not in_preview("GL010")
    assert codes(Config()) == ["GL010"]
    assert codes(Config(preview=True)) == ["GL003", "GL010"]
    assert codes(Config(select=("GL003",))) == ["GL003"]  # an exact code is explicit consent
    assert codes(Config(select=("GL0",))) == ["GL010"]  # a prefix is not


@pytest.mark.usefixtures("default_gate")
def test_preview_comes_from_the_config_the_command_line_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_table({"preview": True}, Path("pyproject.toml")).preview
    with pytest.raises(ConfigError, match="'preview' must be true or false"):
        parse_table({"preview": "yes"}, Path("pyproject.toml"))
    monkeypatch.setenv(PREVIEW_VARIABLE, "1")
    assert Config().preview and not parse_table({"preview": False}, Path("pyproject.toml")).preview
    monkeypatch.setenv(PREVIEW_VARIABLE, "0")
    assert not Config().preview


@pytest.mark.usefixtures("default_gate")
def test_the_command_line_runs_preview_rules_with_preview(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(SOURCE)
    default = CliRunner().invoke(main, ["check", "--no-cache", "-q", "train.py"]).output
    preview = CliRunner().invoke(main, ["check", "--no-cache", "-q", "--preview", "train.py"]).output
    assert "GL010" in default and "GL003" not in default
    assert "GL010" in preview and "GL003" in preview
    listed = CliRunner().invoke(main, ["rules"]).output
    assert "GL003  update-outside-no-grad       (preview) Checks for" in listed
    assert "GL010  int-requires-grad            Checks for" in listed
    assert "GL009  eval-without-no-grad         Checks for" in listed  # draw 18: 45 of 56
    assert "GL016  eval-mode-not-restored       (preview) Checks for" in listed
    assert "GL007  clip-order                   Checks for" in listed  # draws 14 to 18: 13 of 14
    assert "GL004  inplace-on-grad-tensor       Checks for" in listed  # draws 17 and 18: 5 of 6
    assert "GL001  loss-accumulation            (preview) Checks for" in listed  # draws 17 and 18: 3 of 5
    assert "GL002  missing-zero-grad            (preview) Checks for" in listed
    stated = "Right 45 of 56 times on fresh code in the latest draw"
    assert stated in CliRunner().invoke(main, ["rule", "GL009"]).output


@pytest.mark.usefixtures("default_gate")
def test_flake8_runs_preview_rules_with_its_own_option(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SOURCE)
    command = [sys.executable, "-m", "flake8", "--select", "GL", "train.py"]
    default = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True).stdout
    preview = subprocess.run([*command, "--gradlint-preview"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert "GL010" in default and "GL003" not in default
    assert "GL010" in preview and "GL003" in preview


def test_a_rule_is_judged_by_its_newest_draws_of_at_least_five_findings() -> None:
    for code in FRESH:
        counted, draws = newest(code)
        earlier = sum(FRESH[code][: len(DRAWS) - draws], Measured(0, 0))
        assert counted + earlier == total(code)
        assert counted.findings >= SAMPLE or draws == len(DRAWS)
        assert in_preview(code) == (counted.right * 5 < counted.findings * 4)
    assert newest("GL009") == (Measured(56, 45), 1) and not in_preview("GL009")  # draw 18: 45 of 56
    assert newest("GL004") == (Measured(6, 5), 2) and not in_preview("GL004")  # draws 17 and 18: 5 of 6
    assert newest("GL005") == (Measured(5, 4), 1) and not in_preview("GL005")  # draw 18: 4 of 5
    assert newest("GL001") == (Measured(5, 3), 2) and in_preview("GL001")  # draws 17 and 18: 3 of 5
    assert newest("GL007") == (Measured(14, 13), 5) and not in_preview("GL007")  # draws 14 to 18: 13 of 14
    assert newest("GL002") == (Measured(6, 1), 1) and in_preview("GL002")  # draw 18: 1 of 6
    assert newest("GL020") == (Measured(6, 2), 4) and in_preview("GL020")  # draws 15 to 18: 2 of 6
    assert newest("GL010") == (Measured(3, 3), 18) and not in_preview("GL010")  # fewer than five, all right
    assert not in_preview("GL012")  # never fired on fresh code: not measured, on by default
