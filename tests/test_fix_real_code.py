"""Fixes on real code: the ecosystem projects and the runnable fixtures, fixed for real.

A safe fix must only ever touch a finding a person judged right (`benchmarks/ecosystem.md`),
and no fix, safe or unsafe, may leave code that does not compile or has a finding the
original did not. The runnable fixtures must still run after fixing.
Run by `.ci/run` (marked slow); the project wheels are downloaded once from the package index.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gradlint import Config, lint_paths
from gradlint.fix import fix_source
from gradlint.rule import Diagnostic

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parent.parent
RUNTIME_FIXTURES = ROOT / "fixtures" / "runtime"
RIGHT = ("real bug", "real waste", "nit")  # verdicts that make a finding right


def load_ecosystem() -> object:
    spec = importlib.util.spec_from_file_location("ecosystem", ROOT / "benchmarks" / "ecosystem.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def judged_right() -> set[tuple[str, int]]:
    """(path inside its project, line) of every finding `benchmarks/ecosystem.md` judges right."""
    right = set()
    for row in (ROOT / "benchmarks" / "ecosystem.md").read_text().splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) < 2 or not cells[1].startswith(RIGHT):
            continue
        # Ex) `pytorch_tabnet/multitask.py:117`, `:170` GL009
        path = None
        for found_path, line in re.findall(r"`([^`:]*):(\d+)`", cells[0]):
            path = found_path or path
            right.add((str(path), int(line)))
    return right


def changed_lines(before: str, after: str) -> set[int]:
    """The lines of `before` that fixing replaced or removed, or next to which it inserted."""
    lines = set()
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    for tag, start, end, _, _ in matcher.get_opcodes():
        if tag != "equal":
            lines.update(range(start + 1, max(end, start + 1) + 1))
    return lines


def test_fixes_on_the_ecosystem_projects_touch_only_findings_judged_right() -> None:
    ecosystem = load_ecosystem()
    right = judged_right()
    fixed_files = 0
    for name, version in ecosystem.PROJECTS.items():  # type: ignore[attr-defined]
        root = ecosystem.fetch(name, version)  # type: ignore[attr-defined]
        found: dict[str, list[Diagnostic]] = {}
        for diagnostic in lint_paths([root], Config(root=root)):
            found.setdefault(diagnostic.path, []).append(diagnostic)
        for path, diagnostics in found.items():
            if not any(d.fix is not None for d in diagnostics):
                continue
            relative = Path(path).relative_to(root).as_posix()
            text = Path(path).read_text(encoding="utf-8")
            fixed_files += 1
            for unsafe in (False, True):
                result = fix_source(text, path, Config(root=root), unsafe)
                compile(result.text, path, "exec")  # raises on a syntax error
                assert not Counter(d.code for d in result.remaining) - Counter(d.code for d in diagnostics), path
                if not unsafe:
                    for line in changed_lines(text, result.text):
                        touched = [d for d in diagnostics if d.line <= line + 1 and line - 1 <= d.end_line]
                        assert touched, f"{relative}:{line}: a safe fix changed a line no finding is on"
                        assert any((relative, d.line) in right for d in touched), (
                            f"{relative}:{line}: a safe fix on a finding not judged right in ecosystem.md"
                        )
    assert fixed_files > 0  # the check ran on something


def runnable_fixtures() -> list[Path]:
    return sorted(path for path in RUNTIME_FIXTURES.glob("gl*.py"))


def run(script: Path, source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / script.name
    copy.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(copy)], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("script", runnable_fixtures(), ids=lambda path: path.stem)
def test_runnable_fixtures_still_train_after_fixing(script: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    text = script.read_text(encoding="utf-8")
    result = fix_source(text, str(script), Config(), unsafe=True)
    if result.applied == 0:
        pytest.skip("nothing to fix")
    before, after = run(script, text, tmp_path), run(script, result.text, tmp_path)
    if after.returncode != 0:
        last = after.stderr.strip().splitlines()[-1]
        # A bug without a fix may still raise, as it did before; the fixes must add no error.
        assert before.returncode != 0 and last == before.stderr.strip().splitlines()[-1], after.stderr


def test_some_runnable_fixtures_have_fixes() -> None:
    fixable = [path for path in runnable_fixtures() if fix_source(path.read_text(), str(path), Config(), True).applied]
    assert len(fixable) >= 3
