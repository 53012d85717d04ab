"""Hostile inputs: each gets a clear message and the right exit code, and none hangs.

Every file holds a training step with a GL002 finding where it can, so that the
prefilter does not skip it and the parser and the rules really see the odd input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint import Config, lint_source
from gradlint.cli import main

STEP = "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n"
FINDING = "4:5: GL002"  # the finding STEP has, line 4 column 5


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--no-cache", "-j1", *args])
    return result.exit_code, result.stdout


def run_bounded(cwd: Path, *args: str, seconds: float = 120) -> tuple[int, str, float]:
    """Run the CLI in a process that is killed (and the test failed) if it hangs."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gradlint", "--no-cache", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds,
        check=False,
    )
    return done.returncode, done.stdout, time.monotonic() - start


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (STEP.encode() + b"def broken(:\n", "GL000 syntax error: invalid syntax"),
        (STEP.encode().replace(b"model(x)", b"model(x)\x00"), "GL000 syntax error: source code string cannot"),
        (STEP.encode() + b"# \xff\xfe\n", "GL000 cannot parse: 'utf-8' codec can't decode byte 0xff"),
        (b"# -*- coding: klingon -*-\n# \xff\n" + STEP.encode(), "GL000 cannot parse: unknown encoding: klingon"),
        (b"# coding: ascii\n# caf\xc3\xa9\n" + STEP.encode(), "GL000 cannot parse: 'ascii' codec can't decode"),
        (STEP.replace("    opt", "\topt").encode(), "GL000 syntax error: inconsistent use of tabs and spaces"),
    ],
    ids=["syntax-error", "null-byte", "invalid-utf8", "unknown-cookie", "wrong-cookie", "mixed-tabs"],
)
def test_unparsable_files_get_gl000_and_exit_1(content: bytes, message: str) -> None:
    Path("bad.py").write_bytes(content)
    Path("good.py").write_text(STEP)
    code, out = run(".")
    assert code == 1
    assert message in out.splitlines()[0] and out.startswith("bad.py:")
    assert f"good.py:{FINDING}" in out  # the run goes on past the bad file


@pytest.mark.parametrize(
    "content",
    [
        b"\xef\xbb\xbf" + STEP.encode(),
        STEP.replace("\n", "\r\n").encode(),
        STEP.replace("\n", "\r").encode(),
        STEP.replace("    ", "\t").encode(),
        b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + STEP.replace("\n", "\r\n").encode(),
    ],
    ids=["bom", "crlf", "cr", "tabs", "latin1-crlf"],
)
def test_odd_but_valid_files_are_linted_at_the_right_line(content: bytes) -> None:
    Path("odd.py").write_bytes(content)
    code, out = run("odd.py")
    line = 6 if content.startswith(b"# -*-") else 4
    column = 2 if b"\tloss" in content else 5  # a tab is one character
    assert code == 1 and out.startswith(f"odd.py:{line}:{column}: GL002")


def test_empty_file_is_clean() -> None:
    Path("empty.py").write_bytes(b"")
    assert run("empty.py") == (0, "")


def test_directory_named_like_a_module_is_walked() -> None:
    Path("x.py").mkdir()
    Path("x.py", "inner.py").write_text(STEP)
    for target in ("x.py", "."):
        code, out = run(target)
        assert code == 1 and out == f"x.py/inner.py:{FINDING} " + out.split(" ", 2)[2]
        assert out.count("\n") == 1


def test_nonexistent_path_is_reported() -> None:
    code, out = run("missing.py", "missing_dir/")
    assert code == 1
    assert out.splitlines() == [
        "missing.py:1:1: GL000 cannot lint: no such file or directory",
        "missing_dir:1:1: GL000 cannot lint: no such file or directory",
    ]


def test_unreadable_file_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    Path("locked.py").write_text(STEP)
    if os.geteuid() == 0:  # root reads a chmod 000 file anyway: make the read fail instead
        real = Path.read_bytes

        def read_bytes(path: Path) -> bytes:
            if path.name == "locked.py":
                raise PermissionError(13, "Permission denied")
            return real(path)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    else:
        Path("locked.py").chmod(0)
    code, out = run(".")
    assert (code, out) == (1, "locked.py:1:1: GL000 cannot read file: Permission denied\n")


def test_symlink_loops_are_reported_not_followed(tmp_path: Path) -> None:
    Path("a.py").symlink_to("b.py")
    Path("b.py").symlink_to("a.py")
    Path("sub").mkdir()
    Path("sub", "up").symlink_to("..")  # a directory loop
    Path("sub", "train.py").write_text(STEP)
    code, out, _ = run_bounded(tmp_path, ".", "a.py")
    assert code == 1
    assert out.splitlines() == [
        "a.py:1:1: GL000 cannot lint: too many levels of symbolic links",
        "b.py:1:1: GL000 cannot lint: too many levels of symbolic links",
        f"sub/train.py:{FINDING} the gradients that `opt` steps with are never cleared,"
        " so each step adds onto the last",
    ]


def test_a_pipe_is_not_read(tmp_path: Path) -> None:
    os.mkfifo("pipe.py")  # reading it would block forever
    code, out, _ = run_bounded(tmp_path, ".", seconds=60)
    assert (code, out) == (1, "pipe.py:1:1: GL000 cannot lint: not a regular file\n")


def test_ten_megabyte_file_is_refused_quickly(tmp_path: Path) -> None:
    Path("huge.py").write_text(STEP + "x = [1, 2, 3]\n" * 750_000)
    assert Path("huge.py").stat().st_size > 10_000_000
    code, out, seconds = run_bounded(tmp_path, ".")
    assert (code, out) == (1, "huge.py:1:1: GL000 cannot lint: the file is 10.0 MB, over gradlint's limit of 2 MB\n")
    assert seconds < 60


@pytest.mark.parametrize("opening", ["(", "[", "{", "f("])
def test_thousand_deep_nesting_is_refused_quickly(tmp_path: Path, opening: str) -> None:
    closing = {"(": ")", "[": "]", "{": "}", "f(": ")"}[opening]
    Path("deep.py").write_text(STEP + "y = " + opening * 1000 + closing * 1000 + "\n")
    code, out, seconds = run_bounded(tmp_path, ".", "-j1")
    assert (code, out) == (1, "deep.py:1:1: GL000 cannot parse: brackets are nested more than 100 deep\n")
    assert seconds < 60


# Each level hides a closing bracket from a plain count of the bytes: in a string, a comment,
# a multi-line string, or a string nested in an f-string as Python 3.12 allows. 2,500 levels
# crash LibCST's parser (SIGSEGV), so they must be refused before it sees them.
HIDDEN_CLOSERS = {
    "string": '(")" + ',
    "comment": "(  # )\n",
    "multi-line string": '("""\n)\n""" + ',
    "f-string": '(f"{")"}" + ',
}


@pytest.mark.parametrize("level", list(HIDDEN_CLOSERS.values()), ids=list(HIDDEN_CLOSERS))
def test_deep_nesting_behind_closing_brackets_in_strings_is_refused(tmp_path: Path, level: str) -> None:
    Path("hidden.py").write_text(STEP + "y = " + level * 2500 + "x" + ")" * 2500 + "\n")
    code, out, seconds = run_bounded(tmp_path, ".", "-j1")
    assert (code, out) == (1, "hidden.py:1:1: GL000 cannot parse: brackets are nested more than 100 deep\n")
    assert seconds < 60


def test_a_tree_too_deep_for_python_recursion_is_gl000(tmp_path: Path) -> None:
    Path("chain.py").write_text(STEP + "y = " + " + ".join(["a"] * 3000) + "\n")  # no brackets, 3,000 levels
    code, out, seconds = run_bounded(tmp_path, ".", "-j1")
    assert (code, out) == (1, "chain.py:1:1: GL000 cannot lint: the file is nested too deeply\n")
    assert seconds < 60


def test_deep_indentation_is_a_syntax_error() -> None:
    lines = [STEP, *(" " * depth + "if x:\n" for depth in range(1000)), " " * 1000 + "pass\n"]
    Path("deep.py").write_text("".join(lines))
    code, out = run("deep.py")
    assert code == 1 and out.startswith("deep.py:") and "GL000 syntax error" in out


def test_many_brackets_and_undecodable_bytes() -> None:
    Path("bad.py").write_bytes(STEP.encode() + b"s = '" + b"(" * 200 + b"'\n\xff\n")
    code, out = run("bad.py")
    assert code == 1 and "GL000 cannot parse: 'utf-8' codec can't decode byte 0xff" in out


@pytest.mark.parametrize(
    "literal",
    ["'" + "(" * 1000 + "'", '"""\n' + "[" * 1000 + '\n"""', 'f"{{' + "(" * 1000 + '"', "0  # " + "{" * 1000],
    ids=["string", "multi-line string", "f-string text", "comment"],
)
def test_brackets_inside_strings_do_not_count_as_nesting(literal: str) -> None:
    Path("strings.py").write_text(STEP + "s = " + literal + "\n")
    code, out = run("strings.py")
    assert code == 1 and out.startswith(f"strings.py:{FINDING}")


def test_a_backward_used_as_a_context_manager_breaks_no_rule() -> None:
    # nnsight's tracing API: `with loss.backward():` is a block, not a statement of its own.
    source = (
        "import torch\n\n\n"
        "def probe(model, x):\n"
        "    hidden = model.layer(x)\n"
        "    loss = model(x).sum()\n"
        "    with loss.backward():\n"
        "        grad = hidden.grad.clone()\n"
        "    return grad\n"
    )
    codes = {d.code for d in lint_source(source, "probe.py", Config(preview=True))}
    assert "GL999" not in codes


def test_a_recursive_walk_handing_down_its_parameter_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function that passes its parameter on to itself at many calls (fastestimator's traceability walk): what the
    parameter holds is worked out once per parameter, not once per path through the calls, which grew exponentially
    and never finished on a 1,300-line file of draw 11."""
    from gradlint.analysis.facts import leaves

    calls = 0
    original = leaves.Leaves._passed_to_parameter

    def counted(self: leaves.Leaves, name: str, function: object) -> leaves.Held:
        nonlocal calls
        calls += 1
        return original(self, name, function)  # type: ignore[arg-type]

    monkeypatch.setattr(leaves.Leaves, "_passed_to_parameter", counted)
    walk = "\n".join(f"        tables = walk(item{n}, tables, depth + 1)" for n in range(12))
    source = (
        "import torch\n\n\n"
        "def walk(obj, tables, depth):\n"
        "    if depth > 3:\n"
        "        tables.add_(1)\n"
        "        return tables\n"
        "    for item0, item1, item2, item3, item4, item5, item6, item7, item8, item9, item10, item11 in obj:\n"
        f"{walk}\n"
        "    return tables\n\n\n"
        "def main(model, opt):\n"
        "    tables = walk(model.parameters(), torch.zeros(3), 0)\n"
        "    model(tables).sum().backward()\n"
        "    opt.step()\n"
    )
    lint_source(source, "walk.py", Config(preview=True))
    assert 0 < calls <= 10
