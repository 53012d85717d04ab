"""The pre-commit hook, run by real `pre-commit try-repo` (it builds a virtualenv: slow, needs pip's index)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
BUGGY = """\
import torch

total_loss = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total_loss += loss
"""
CLEAN = BUGGY.replace("total_loss += loss", "total_loss += loss.item()")
NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": BUGGY}],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}

IDENTITY = ("-c", "user.name=gradlint", "-c", "user.email=tests@gradlint.invalid", "-c", "commit.gpgsign=false")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]


def git(*args: str, cwd: Path) -> str:
    command = ["git", *IDENTITY, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository's files on disk (tracked and new, not ignored), committed in a scratch repository.

    try-repo commits only tracked changes of a dirty checkout, so a module that is new and
    not yet added would be missing from the environment it builds.
    """
    pytest.importorskip("pre_commit")
    snapshot = tmp_path_factory.mktemp("gradlint-repo")
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO).split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, snapshot / name)
    git("init", "-q", cwd=snapshot)
    git("add", ".", cwd=snapshot)
    git("commit", "-q", "-m", "snapshot", cwd=snapshot)
    return snapshot


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "buggy.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "train.ipynb").write_text(json.dumps(NOTEBOOK, indent=1))
    git("init", "-q", cwd=tmp_path)
    git("add", ".", cwd=tmp_path)
    return tmp_path


def try_repo(hook_repo: Path, project: Path, *files: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "PRE_COMMIT_HOME": str(project.parent / "pre-commit-home"),
        "PRE_COMMIT_COLOR": "never",
    }
    command = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "gradlint", "--files", *files]
    return subprocess.run(command, cwd=project, env=environment, capture_output=True, text=True, check=False)


def test_hook_fails_on_gradient_bugs_in_files_and_notebooks(hook_repo: Path, project: Path) -> None:
    result = try_repo(hook_repo, project, "buggy.py", "train.ipynb")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gradlint" in result.stdout and "Failed" in result.stdout
    assert "buggy.py:9:5: GL001" in result.stdout
    assert "train.ipynb:cell 1:9:5: GL001" in result.stdout


def test_hook_passes_on_clean_files(hook_repo: Path, project: Path) -> None:
    result = try_repo(hook_repo, project, "clean.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout
