"""How much slower a training loop runs under `gradlint trace` instrumentation than without it.

Measures a small MLP loop and a small conv net in one process, alternating untraced and
traced runs of the same loop, so that the load of the machine hits both alike. "Traced"
is exactly what the child of `gradlint trace` installs: the PyTorch hooks, plus line
tracing of the script when the static linter has findings in it (these workloads have
none, as a clean training script would; `--with-findings` makes every line of the loop a
finding's line, the worst case). Prints median seconds per loop and the traced/untraced
ratio (goal: at most 1.5x).

    python benchmarks/trace_overhead.py [--repeats 7] [--with-findings]
"""

from __future__ import annotations

import argparse
import runpy
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from gradlint.runtime.events import EventWriter
from gradlint.runtime.tracer import Hint, Tracer

WORKLOAD = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = {model}
optimizer = torch.optim.{optimizer}(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
data = [(torch.randn({shape}), torch.randint(0, 10, ({batch},))) for _ in range(8)]


def train(steps):
    running = 0.0
    for i in range(steps):
        x, y = data[i % 8]
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running += loss.item()
    return running
"""

WORKLOADS = {
    "mlp": {
        "model": "nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))",
        "optimizer": "Adam",
        "shape": "64, 64",
        "batch": 64,
        "steps": 500,
    },
    "conv": {
        "model": (
            "nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), "
            "nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))"
        ),
        "optimizer": "SGD",
        "shape": "32, 3, 32, 32",
        "batch": 32,
        "steps": 100,
    },
}


def seconds(train: Callable[[int], float], steps: int) -> float:
    """Wall time of one loop of `steps` training steps."""
    start = time.perf_counter()
    train(steps)
    return time.perf_counter() - start


def measure(name: str, folder: Path, repeats: int, with_findings: bool) -> tuple[float, float]:
    """Median loop seconds of one workload, untraced and traced, alternating."""
    settings = WORKLOADS[name]
    script = folder / f"{name}.py"
    source = textwrap.dedent(WORKLOAD).format(**settings)
    script.write_text(source)
    hints = [Hint("GL000", n, n) for n in range(1, source.count("\n") + 1)] if with_findings else []
    train = runpy.run_path(str(script), run_name="benchmark")["train"]
    steps = int(settings["steps"])
    train(steps // 10)  # warm-up: allocator, lazy initialisation, optimizer state
    untraced, traced = [], []
    for _ in range(repeats):
        untraced.append(seconds(train, steps))
        tracer = Tracer(str(script), hints, steps * repeats + 1, EventWriter(str(folder / f"{name}.events")))
        tracer.install()
        try:
            traced.append(seconds(train, steps))
        finally:
            tracer.uninstall()
    return statistics.median(untraced), statistics.median(traced)


def main() -> None:
    """Measure every workload and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--with-findings", action="store_true", help="trace every line, as with static findings")
    options = parser.parse_args()
    print(f"{'workload':<8} {'untraced s':>11} {'traced s':>9} {'ratio':>6}   (medians of {options.repeats} runs)")
    with tempfile.TemporaryDirectory() as folder:
        for name in WORKLOADS:
            untraced, traced = measure(name, Path(folder), options.repeats, options.with_findings)
            print(f"{name:<8} {untraced:>11.3f} {traced:>9.3f} {traced / untraced:>5.2f}x")


if __name__ == "__main__":
    main()
