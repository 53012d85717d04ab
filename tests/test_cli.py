"""The command line through click's CliRunner: exit codes, formats, config, noqa, excludes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint.cli import main

BUGGY = """\
import torch

for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
CLEAN = """\
import torch

for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "buggy.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_clean_file_exits_zero(project: Path) -> None:
    code, out, err = run("clean.py")
    assert (code, out) == (0, "")
    assert err.strip() == "All checks passed (1 file)."


def test_findings_exit_one_in_flake8_format(project: Path) -> None:
    code, out, err = run("buggy.py")
    assert code == 1
    message = "the gradients that `optimizer` steps with are never cleared, so each step adds onto the last"
    assert out == f"buggy.py:5:5: GL002 {message}\n"
    # `optimizer` only looks like an optimizer: GL002 offers no fix without proof.
    assert err.strip() == "Found 1 problem in 1 file."


def test_no_path_lints_the_current_directory_sorted(project: Path) -> None:
    (project / "a_buggy.py").write_text(BUGGY)
    code, out, _ = run()
    assert code == 1
    assert [line.split(":")[0] for line in out.splitlines()] == ["a_buggy.py", "buggy.py"]


def test_check_subcommand_is_the_same(project: Path) -> None:
    assert run("check", "buggy.py")[:2] == run("buggy.py")[:2]


def test_json_format(project: Path) -> None:
    code, out, _ = run("--format", "json", "buggy.py")
    assert code == 1
    [finding] = json.loads(out)
    assert finding == {
        "path": "buggy.py",
        "line": 5,
        "column": 5,
        "end_line": 5,
        "end_column": 20,
        "code": "GL002",
        "name": "missing-zero-grad",
        "message": "the gradients that `optimizer` steps with are never cleared, so each step adds onto the last",
        "related": [
            {
                "path": "buggy.py",
                "line": 3,
                "column": 1,
                "end_line": 6,
                "end_column": 21,
                "note": "nothing in this loop clears the gradients",
            },
            {
                "path": "buggy.py",
                "line": 6,
                "column": 5,
                "end_line": 6,
                "end_column": 21,
                "note": "steps with the gradients of every backward so far",
            },
        ],
    }


def test_quiet_and_exit_zero(project: Path) -> None:
    code, out, err = run("--quiet", "--exit-zero", "buggy.py")
    assert code == 0 and "GL002" in out and err == ""


def test_select_and_ignore(project: Path) -> None:
    assert run("--select", "GL001", "buggy.py")[0] == 0
    assert run("--ignore", "GL002", "buggy.py")[0] == 0
    assert run("--ignore", "GL00", "buggy.py")[0] == 0
    assert run("--select", "GL0", "buggy.py")[0] == 1


def test_command_line_select_replaces_the_configured_selection_and_its_ignores(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.gradlint]\nselect = ["GL001"]\nignore = ["GL002"]\n'
        '[tool.gradlint.per-file-ignores]\n"tests/*" = ["GL002"]\n'
    )
    (project / "tests").mkdir()
    (project / "tests" / "train.py").write_text(BUGGY)
    assert run("buggy.py")[0] == 0
    code, out, _ = run("--select", "GL002", ".")
    assert code == 1 and out.startswith("buggy.py:5:5: GL002")
    assert "tests/train.py" not in out  # per-file-ignores still apply
    assert run("--select", "GL002", "--ignore", "GL002", "buggy.py")[0] == 0  # --ignore applies on top
    assert run("--select", "GL0", "--ignore", "GL00", "buggy.py")[0] == 0


def test_nothing_to_lint_is_said_and_each_empty_path_warned_about(project: Path) -> None:
    (project / "build").mkdir()
    (project / "build" / "train.py").write_text(BUGGY)
    (project / "docs").mkdir()
    (project / "docs" / "notes.txt").write_text("no python here\n")
    (project / "pyproject.toml").write_text('[tool.gradlint]\nextend-exclude = ["generated.py", "build/"]\n')
    (project / "generated.py").write_text(BUGGY)
    code, out, err = run("docs/", "generated.py")
    assert (code, out) == (0, "")
    assert err.splitlines() == [
        "gradlint: warning: docs/ holds no file to lint (excluded or no Python files)",
        "gradlint: warning: generated.py is excluded by the configuration; not linted",
        "No Python files found to check.",
    ]
    code, _, err = run("clean.py", "docs")
    assert code == 0 and err.splitlines()[-1] == "All checks passed (1 file)."
    assert "docs/ holds no file" in err
    assert run("-q", "docs")[2] == ""  # --quiet: findings only


def test_statistics_count_findings_per_code_most_first(project: Path) -> None:
    leak = "import torch\ntotal = 0\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    total += loss\n"
    (project / "leak.py").write_text(leak)
    (project / "leak2.py").write_text(leak)
    code, out, err = run("--statistics", ".")
    assert code == 1
    assert out == "  2  GL001  loss-accumulation\n  1  GL002  missing-zero-grad\n  3  total\n"
    assert err.startswith("Found 3 problems in 3 files")
    assert run("--statistics", "clean.py")[:2] == (0, "")


def test_statistics_and_show_source_need_the_text_format(project: Path) -> None:
    for options in (["--statistics", "--format", "json"], ["--statistics", "--show-source"], ["--add-noqa", "--fix"]):
        code, _, err = run(*options, "buggy.py")
        assert code == 2 and "Usage" in err


@pytest.mark.parametrize("output_format", ["text", "json", "sarif"])
def test_output_file_holds_the_report_instead_of_stdout(project: Path, output_format: str) -> None:
    code, out, err = run("--format", output_format, "--output-file", "reports/gradlint.out", "buggy.py")
    assert (code, out) == (1, "")
    assert "Found 1 problem" in err
    assert (project / "reports" / "gradlint.out").read_text() == run("--format", output_format, "buggy.py")[1]


def test_output_file_is_written_when_clean_and_an_unwritable_one_is_an_error(project: Path) -> None:
    assert run("--output-file", "report.txt", "clean.py")[0] == 0
    assert (project / "report.txt").read_text() == ""
    (project / "blocker").write_text("")
    code, _, err = run("--output-file", "blocker/report.txt", "buggy.py")
    assert code == 2 and "gradlint: error: cannot write blocker/report.txt" in err


def test_fix_keeps_a_cookie_naming_a_codec_that_is_not_installed(project: Path) -> None:
    cookie = b"# -*- coding: future_fstrings -*-\n"
    leak = CLEAN.replace("step()\n", "step()\n    total += loss  # caf\u00e9\n") + "print(total)\n"
    (project / "old.py").write_bytes(cookie + leak.encode())
    code, out, _ = run("old.py")
    assert code == 1 and "GL001" in out and "old.py:1:1: GL000 unknown encoding: future_fstrings" in out
    code, out, _ = run("--fix", "old.py")
    assert code == 1 and "GL001" not in out and "GL000" in out  # the codec is still not installed
    fixed = leak.replace("total += loss ", "total += loss.detach() ")
    assert (project / "old.py").read_bytes() == cookie + fixed.encode()


def test_unknown_code_is_a_usage_error(project: Path) -> None:
    code, _, err = run("--select", "XY123", "buggy.py")
    assert code == 2 and "unknown rule code" in err


def test_pyproject_config_and_cli_override(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.gradlint]\nignore = ["GL002"]\n')
    assert run("buggy.py")[0] == 0
    assert run("--ignore", "GL001", "buggy.py")[0] == 1


def test_config_found_above_the_linted_path(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.gradlint]\nselect = ["GL001"]\n')
    (project / "pkg").mkdir()
    (project / "pkg" / "train.py").write_text(BUGGY)
    assert run("pkg")[0] == 0


def test_unknown_config_key_is_an_error(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.gradlint]\nselekt = ["GL001"]\n')
    code, _, err = run("buggy.py")
    assert code == 2 and "unknown key" in err and "selekt" in err


def test_invalid_toml_is_an_error(project: Path) -> None:
    (project / "pyproject.toml").write_text("[tool.gradlint\n")
    assert run("buggy.py")[0] == 2


def test_per_file_ignores(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.gradlint.per-file-ignores]\n"tests/*" = ["GL002"]\n')
    (project / "tests").mkdir()
    (project / "tests" / "train.py").write_text(BUGGY)
    code, out, _ = run(".")
    assert code == 1 and "tests/train.py" not in out and "buggy.py" in out


def test_explicit_config_file(project: Path) -> None:
    (project / "gradlint.toml").write_text('ignore = ["GL002"]\n')
    assert run("--config", "gradlint.toml", "buggy.py")[0] == 0


def test_noqa_comments(project: Path) -> None:
    lines = BUGGY.splitlines()
    (project / "bare.py").write_text("\n".join([*lines[:4], lines[4] + "  # noqa", *lines[5:]]) + "\n")
    (project / "coded.py").write_text("\n".join([*lines[:4], lines[4] + "  # noqa: GL002", *lines[5:]]) + "\n")
    (project / "other.py").write_text("\n".join([*lines[:4], lines[4] + "  # noqa: GL001", *lines[5:]]) + "\n")
    (project / "skipped.py").write_text("# gradlint: noqa\n" + BUGGY)
    assert run("bare.py", "coded.py", "skipped.py")[0] == 0
    assert run("other.py")[0] == 1


def test_excludes_gitignore_and_virtualenvs(project: Path) -> None:
    for folder in ("build", ".venv", "env_custom", "ignored", "kept"):
        (project / folder).mkdir()
        (project / folder / "train.py").write_text(BUGGY)
    (project / "env_custom" / "pyvenv.cfg").write_text("home = /usr\n")
    (project / ".gitignore").write_text("ignored/\n")
    out = run(".")[1]
    assert "kept/train.py" in out
    assert not any(name in out for name in ("build/", ".venv/", "env_custom/", "ignored/"))
    assert "kept/" not in run("--extend-exclude", "kept", ".")[1]


def test_a_gitignore_line_git_cannot_read_is_skipped_and_the_rest_applies(project: Path) -> None:
    # A trailing backslash escapes nothing: git ignores the pattern, and so does gradlint, without crashing.
    for folder in ("ignored", "kept"):
        (project / folder).mkdir()
        (project / folder / "train.py").write_text(BUGGY)
    (project / ".gitignore").write_text("configs/user_without_context.jsonnet\\\nignored/\n")
    code, out, _ = run(".")
    assert code == 1 and "kept/train.py" in out and "ignored/" not in out


def test_parse_errors_are_reported_and_the_run_goes_on(project: Path) -> None:
    (project / "broken.py").write_text("import torch\nfor x in loader:\n    loss.backward(\n")
    (project / "latin.py").write_bytes(b"import torch\nx = '\xff\xfe'\n")
    code, out, _ = run(".")
    assert code == 1
    assert "broken.py:" in out and "GL000" in out
    assert "latin.py:1:1: GL000" in out
    assert "buggy.py:5:5: GL002" in out


def test_nonexistent_path(project: Path) -> None:
    code, out, _ = run("missing.py")
    assert code == 1 and out.startswith("missing.py:1:1: GL000")


def test_rule_documentation_and_listing() -> None:
    code, out, _ = run("rule", "GL001")
    assert code == 0 and out.startswith("GL001 loss-accumulation") and "Why is this bad?" in out
    assert run("rule", "missing-zero-grad")[1].startswith("GL002")
    assert run("rule", "GL998")[0] == 2
    listing = run("rules")[1]
    assert "GL001  loss-accumulation" in listing and "GL002  missing-zero-grad" in listing


def test_python_dash_m_entry_point(project: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gradlint", "buggy.py"], capture_output=True, text=True)
    assert result.returncode == 1 and "GL002" in result.stdout


# The modules that make linting a file cost a third of a second before any work.
HEAVY_MODULES = (
    "sorted(m for m in sys.modules if m.split('.')[0] == 'libcst' "
    "or m.startswith(('gradlint.rules', 'gradlint.analysis', 'gradlint.checking', 'gradlint.fix')))"
)


def test_a_run_of_cache_hits_and_the_rule_docs_load_neither_libcst_nor_the_rules(project: Path) -> None:
    # A pre-commit run over unchanged files answers from the cache: it must not pay for the parser.
    assert run("check", "-j1", ".")[0] == 1  # fills the cache
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from gradlint.cli import main\n"
        "assert CliRunner().invoke(main, ['check', '-j1', '.']).exit_code == 1\n"
        "assert CliRunner().invoke(main, ['rules']).output.startswith('GL001  loss-accumulation')\n"
        "assert CliRunner().invoke(main, ['rule', 'GL005']).output.startswith('GL005 retain-graph-overuse')\n"
        f"print({HEAVY_MODULES})\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    (project / "buggy.py").write_text(BUGGY + "\n")  # a changed file is a miss, and is parsed
    result = subprocess.run(
        [sys.executable, "-c", probe.replace("print(", "print(bool(") + ")"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "True"


def test_version_and_help_load_neither_libcst_nor_the_engine_nor_the_rules() -> None:
    # Every pre-commit run and every editor start pays for what the command line imports.
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from gradlint.cli import main\n"
        "for args in (['--version'], ['--help'], ['check', '--help']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'libcst' or m.startswith(('gradlint.engine', "
        "'gradlint.rules', 'gradlint.analysis'))))\n"
    )
    root = Path(__file__).parent.parent
    result = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
