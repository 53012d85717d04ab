"""Slow tests over large real corpora: the installed torch package and all of site-packages.

Run by `.ci/run`; select them alone with `pytest -m slow -s` (-s shows the counts).
"""

from __future__ import annotations

import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from gradlint import Config, lint_source
from gradlint.engine import default_jobs, lint_paths
from gradlint.rule import Diagnostic

pytestmark = pytest.mark.slow
TORCH = Path(torch.__file__).parent
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def both_ways(path: Path) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """The findings for one file with the prefilter, and with every rule forced to run."""
    data = path.read_bytes()
    return lint_source(data, str(path)), lint_source(data, str(path), prefilter=False)


def test_prefilter_hides_no_finding_on_torch_source() -> None:
    files = sorted(path for pattern in ("*.py", "*.pyi") for path in TORCH.rglob(pattern))
    assert len(files) > 1000
    hidden = []
    with ProcessPoolExecutor(default_jobs()) as pool:
        for path, (filtered, forced) in zip(files, pool.map(both_ways, files, chunksize=8), strict=True):
            # A file no rule can fire on is not parsed, so it cannot report a syntax error (GL000).
            if [d for d in filtered if d.code != "GL000"] != [d for d in forced if d.code != "GL000"]:
                hidden.append(path)
            assert {d for d in filtered if d.code == "GL000"} <= set(forced)
    print(f"\nprefilter checked on {len(files)} files of {TORCH}")
    assert hidden == []


def test_site_packages_lint_without_internal_errors() -> None:
    files = sorted(SITE_PACKAGES.rglob("*.py"))
    start = time.perf_counter()
    found = list(lint_paths(files, Config(exclude=())))
    seconds = time.perf_counter() - start
    internal = [f"{d.path}: {d.message}" for d in found if d.code == "GL999"]
    print(f"\nlinted {len(files)} files of {SITE_PACKAGES} in {seconds:.0f} s: {len(files) / seconds:.0f} files/s")
    unparsable = sum(d.code == "GL000" for d in found)
    print(f"findings: {len(found) - unparsable - len(internal)}, files gradlint could not parse (GL000): {unparsable}")
    assert len(files) > 5000
    assert internal == []
