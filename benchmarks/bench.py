"""Time gradlint against the LibCST parse floor, flake8+TorchFix and Ruff on one corpus or several.

    python benchmarks/bench.py                     # 400 files of the installed torch package
    python benchmarks/bench.py --limit 0           # all of them (about 2,300; long)
    python benchmarks/bench.py path/to/project --repeat 5
    python benchmarks/bench.py --baseline ae3a3ac   # also time gradlint as it was at a commit
    python benchmarks/bench.py --limit 0 --repeat 1 TORCH_DIR TRANSFORMERS_DIR   # the scaling table

The corpus's Python files are copied to a temporary directory first, so that every
tool sees the same files with no configuration, .gitignore or site-packages exclusion
of its own. Each command runs in a fresh process, timed from outside (interpreter start
included) together with the peak resident memory of its largest process. A row is
repeated `--repeat` times, or fewer once it has taken a minute; the table shows the
median. Ratios are only meaningful within one run of this script.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gradlint.files import SOURCE_SUFFIXES

# Runs COMMAND..., then prints its wall time, the peak RSS (KiB) of its process tree and its exit status.
MEASURE = """
import resource, subprocess, sys, time
start = time.perf_counter()
status = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, status)
"""
# The floor of any LibCST linter: parse every file, nothing else.
PARSE = """
import sys
import libcst
for name in open(sys.argv[1]).read().splitlines():
    try:
        libcst.parse_module(open(name, "rb").read())
    except Exception:
        pass
"""
BUDGET_SECONDS = 60.0


@dataclass
class Row:
    """One measured command: its label, its command line and its runs; `touch`, a file changed before each run."""

    label: str
    command: list[str]
    seconds: list[float] = field(default_factory=list)
    peak_kib: list[int] = field(default_factory=list)
    touch: Path | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def measure(row: Row, repeat: int, cwd: Path) -> None:
    """Run `row` up to `repeat` times (at least once), stopping when it has used the budget."""
    while len(row.seconds) < repeat and (not row.seconds or sum(row.seconds) < BUDGET_SECONDS):
        if row.touch is not None:  # a one-line edit, as between two commits
            row.touch.write_bytes(row.touch.read_bytes() + f"\n# edited {len(row.seconds)}\n".encode())
        output = subprocess.run(
            [sys.executable, "-c", MEASURE, *row.command], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.split()
        if output[2] != "0":  # every command runs with --exit-zero: anything else is a crash
            raise SystemExit(f"{row.label} failed with exit status {output[2]}: {' '.join(row.command)}")
        row.seconds.append(float(output[0]))
        row.peak_kib.append(int(output[1]))
        print(f"  {row.label}: {row.seconds[-1]:.2f} s, {row.peak_kib[-1] / 1024:.0f} MB", file=sys.stderr)


def copy_corpus(source: Path, target: Path, limit: int) -> list[Path]:
    """Copy `limit` of the Python files under `source` (evenly spread; 0: all)."""
    files = sorted(path for suffix in SOURCE_SUFFIXES for path in source.rglob(f"*{suffix}") if path.is_file())
    if limit and len(files) > limit:
        files = [files[index * len(files) // limit] for index in range(limit)]
    copies = []
    for path in files:
        copy = target / path.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        copies.append(copy)
    return copies


def default_corpus() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed: give a corpus directory")
    return Path(spec.origin).parent


BASELINE = "gradlint --no-cache -j1, at the baseline commit"
WARM = "gradlint, warm cache"


def rows_for(corpus: Path, file_list: Path, baseline: Path | None, touched: Path) -> list[Row]:
    gradlint = [sys.executable, "-m", "gradlint", "-q", "--exit-zero"]
    rows = [
        Row("libcst.parse_module, every file", [sys.executable, "-c", PARSE, str(file_list)]),
        Row("gradlint --no-cache -j1", [*gradlint, "--no-cache", "-j1", str(corpus)]),
        Row("gradlint --no-cache (all cores)", [*gradlint, "--no-cache", str(corpus)]),
        Row(WARM, [*gradlint, str(corpus)]),
        Row("gradlint, warm, one file edited", [*gradlint, str(corpus)], touch=touched),
        Row("gradlint --version", [sys.executable, "-m", "gradlint", "--version"]),
    ]
    if importlib.util.find_spec("torchfix") is not None and importlib.util.find_spec("flake8") is not None:
        rows.append(
            Row(
                "flake8 + TorchFix, one process",
                [sys.executable, "-m", "flake8", "--jobs", "1", "--exit-zero", str(corpus)],
            )
        )
    if baseline is not None:  # the same command, importing gradlint from a checkout of another commit
        rows.append(Row(BASELINE, ["env", f"PYTHONPATH={baseline}", *gradlint, "--no-cache", "-j1", str(corpus)]))
    ruff = shutil.which("ruff")
    if ruff is not None:
        rows.append(
            Row(
                "ruff check --select ALL --no-cache",
                [ruff, "check", "--isolated", "--select", "ALL", "--no-cache", "--exit-zero", "-q", str(corpus)],
            )
        )
    return rows


def ratio(rows: dict[str, Row], numerator: str, denominator: str) -> str:
    if numerator not in rows or denominator not in rows:
        return "n/a (not installed)"
    return f"{rows[numerator].median / rows[denominator].median:.3f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="*", type=Path, help="directories (default: the installed torch package)")
    parser.add_argument("--limit", type=int, default=400, help="files to copy, evenly spread (0: all; default 400)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row, for the median (default 3)")
    parser.add_argument("--json", type=Path, help="also write the measurements to this file")
    parser.add_argument("--baseline", metavar="COMMIT", help="also time cold -j1 with gradlint as of this commit")
    options = parser.parse_args()
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    measured = {}
    for source in options.corpus or [default_corpus()]:
        measured[str(source)] = bench(source.resolve(), options)
    if options.json:
        options.json.write_text(json.dumps(measured, indent=2))


def bench(source: Path, options: argparse.Namespace) -> dict[str, object]:
    """Measure every row on one corpus and print its tables; returns the measurements."""
    with tempfile.TemporaryDirectory(prefix="gradlint-bench-") as temporary:
        workdir = Path(temporary)
        baseline = workdir / "baseline" if options.baseline else None
        repository = Path(__file__).resolve().parent.parent
        if baseline is not None:
            subprocess.run(
                ["git", "-C", str(repository), "worktree", "add", "-q", "--detach", str(baseline), options.baseline],
                check=True,
            )
        corpus = workdir / source.name
        files = copy_corpus(source, corpus, options.limit)
        size = sum(path.stat().st_size for path in files)
        file_list = workdir / "files.txt"
        file_list.write_text("".join(f"{path}\n" for path in files))
        print(f"corpus: {len(files)} files, {size / 2**20:.1f} MB, copied from {source}", file=sys.stderr)
        rows = rows_for(corpus, file_list, baseline, files[len(files) // 2])
        try:
            for row in rows:
                if row.label == WARM:
                    subprocess.run(row.command, cwd=workdir, capture_output=True, check=False)  # fill the cache
                measure(row, options.repeat, workdir)
        finally:
            if baseline is not None:
                subprocess.run(
                    ["git", "-C", str(repository), "worktree", "remove", "--force", str(baseline)], check=False
                )
    by_label = {row.label: row for row in rows}
    floor = rows[0].median
    print(f"\n{len(files)} files ({size / 2**20:.1f} MB) of {source}\n")
    print("| Command | Median | vs. LibCST parse | Peak RSS | Runs |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        peak = max(row.peak_kib) / 1024
        print(f"| {row.label} | {row.median:.2f} s | {row.median / floor:.2f}x | {peak:.0f} MB | {len(row.seconds)} |")
    cold = "gradlint --no-cache -j1"
    print("\n| Target | Measured |")
    print("| --- | ---: |")
    print(f"| cold -j1 / LibCST parse (target <= 1.5x) | {ratio(by_label, cold, rows[0].label)} |")
    print(f"| flake8+TorchFix / cold -j1 (target >= 5x) | {ratio(by_label, 'flake8 + TorchFix, one process', cold)} |")
    print(f"| warm / cold -j1 (target <= 0.05x) | {ratio(by_label, WARM, cold)} |")
    print(f"| warm / Ruff (target <= 2x) | {ratio(by_label, WARM, 'ruff check --select ALL --no-cache')} |")
    if baseline is not None:
        measured = ratio(by_label, cold, BASELINE)
        print(f"| cold -j1 / cold -j1 at {options.baseline} (whole program, target <= 1.25x) | {measured} |")
    rows_data = {row.label: {"seconds": row.seconds, "peak_kib": row.peak_kib} for row in rows}
    return {"files": len(files), "bytes": size, "rows": rows_data}


if __name__ == "__main__":
    main()
