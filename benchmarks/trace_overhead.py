"""How much slower a training loop runs under `gradlint trace` than on its own.

Runs a small MLP loop and a small conv net, each untraced (`python script`) and traced
(`gradlint trace script`), alternating, several times in one run. The scripts time their
own loop (after a warm-up), so interpreter and torch start-up are not counted. Prints
the median seconds of each and the traced/untraced ratio (goal: at most 1.5x).

    python benchmarks/trace_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOOP = """
import sys, time
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = {model}
optimizer = torch.optim.{optimizer}(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
data = [(torch.randn({shape}), torch.randint(0, 10, ({batch},))) for _ in range(8)]
running = 0.0


def step(x, y):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


for i in range({warmup}):
    running += step(*data[i % 8])
start = time.perf_counter()
for i in range({steps}):
    running += step(*data[i % 8])
elapsed = time.perf_counter() - start
open(sys.argv[1], "w").write(str(elapsed))
"""

WORKLOADS = {
    "mlp": {
        "model": "nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))",
        "optimizer": "Adam",
        "shape": "64, 64",
        "batch": 64,
        "warmup": 20,
        "steps": 400,
    },
    "conv": {
        "model": (
            "nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), "
            "nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))"
        ),
        "optimizer": "SGD",
        "shape": "32, 3, 32, 32",
        "batch": 32,
        "warmup": 10,
        "steps": 100,
    },
}


def timed(command: list[str], output: Path) -> float:
    """Run one command that writes its loop time to `output`; return that time."""
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(output.read_text())


def measure(name: str, folder: Path, repeats: int) -> tuple[float, float]:
    """Median loop seconds of one workload, untraced and traced."""
    settings = WORKLOADS[name]
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(LOOP).format(**settings))
    output = folder / f"{name}.time"
    steps = str(int(settings["warmup"]) + int(settings["steps"]) + 1)
    plain = [sys.executable, str(script), str(output)]
    traced = [sys.executable, "-m", "gradlint", "trace", "--quiet-script", "--steps", steps, "--timeout", "600"]
    traced += [str(script), "--", str(output)]
    untraced_times, traced_times = [], []
    for _ in range(repeats):
        untraced_times.append(timed(plain, output))
        traced_times.append(timed(traced, output))
    return statistics.median(untraced_times), statistics.median(traced_times)


def main() -> None:
    """Measure every workload and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print(f"{'workload':<8} {'untraced s':>11} {'traced s':>9} {'ratio':>6}   (medians of {repeats} runs)")
    with tempfile.TemporaryDirectory() as folder:
        for name in WORKLOADS:
            untraced, traced = measure(name, Path(folder), repeats)
            print(f"{name:<8} {untraced:>11.3f} {traced:>9.3f} {traced / untraced:>5.2f}x")


if __name__ == "__main__":
    main()
