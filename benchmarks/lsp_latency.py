"""How long the language server takes to publish diagnostics after a one-line edit of a long module.

Generates a training module of about 2,000 lines (180 small training functions, some with
bugs the rules catch), or takes `--file`. For each mode it starts the real server
(`python -m gradlint lsp`), speaks JSON-RPC to it over stdio as an editor does, opens the
module, then makes one-line edits (commenting out or restoring an `optimizer.zero_grad()`
at spread-out places), each after a pause, and times each from sending `didChange` to
receiving the `publishDiagnostics` of that version. The debounce is included: latency
is counted from the pause in typing. Modes: incremental (as shipped) and full parse
(`GRADLINT_LSP_INCREMENTAL=0`, an environment variable only this script sets), so the
gain is a ratio within one run. Also prints the engine's own time for one full lint.

    python benchmarks/lsp_latency.py [--edits 7] [--functions 180] [--distinct-names] [--file PATH]

`--distinct-names` gives each function's optimizer its own name: the module-wide lookup
of what a name was built from then finds one constructor instead of 180.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gradlint.engine import lint_source

OPTIMIZERS = ("SGD(model.parameters(), lr=0.1, momentum=0.9)", "Adam(model.parameters(), lr=1e-3)")
LOSSES = ("F.cross_entropy(model(x), y)", "F.mse_loss(model(x), y)", "criterion(model(x), y)")
CLEAR = "        optimizer.zero_grad()\n"
TIMEOUT = 120.0


def training_function(index: int, chooser: random.Random, *, distinct: bool) -> str:
    """One small training function: clean, or with a bug (no clear, a running loss sum, a step before backward)."""
    bug = chooser.choice(("clean", "clean", "clean", "no_clear", "running_sum", "step_first"))
    backward, step = "        loss.backward()\n", "        optimizer.step()\n"
    body = (
        f"def train_{index}(model, loader, criterion):\n"
        f"    optimizer = torch.optim.{chooser.choice(OPTIMIZERS)}\n"
        "    model.train()\n"
        + ("    total = 0.0\n" if bug == "running_sum" else "")
        + "    for x, y in loader:\n"
        + ("" if bug == "no_clear" else CLEAR)
        + f"        loss = {chooser.choice(LOSSES)}\n"
        + (step + backward if bug == "step_first" else backward + step)
        + ("        total += loss\n    return total\n" if bug == "running_sum" else "    return loss.item()\n")
    )
    return body.replace("optimizer", f"optimizer_{index}") if distinct else body


def training_module(functions: int, *, distinct: bool) -> str:
    """A module of `functions` training functions after a docstring and imports."""
    chooser = random.Random(0)
    header = '"""Training variants."""\n\nimport torch\nimport torch.nn.functional as F\n'
    return header + "".join(f"\n\n{training_function(i, chooser, distinct=distinct)}" for i in range(functions))


class Server:
    """The language server in a child process, and the messages it sends, read by a thread."""

    def __init__(self, root: Path, incremental: bool) -> None:
        environment = {**os.environ, "GRADLINT_LSP_INCREMENTAL": "1" if incremental else "0"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gradlint", "lsp"],
            cwd=root,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = 0
            while (line := stream.readline().strip()) != b"":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not length:
                return  # the server closed its output
            self.received.put(json.loads(stream.read(length)))

    def send(self, method: str, params: dict[str, Any], *, request: bool = False) -> int:
        """Send a notification (or a request, whose id is returned)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            message["id"] = self.next_id
        body = json.dumps(message).encode()
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        stdin.flush()
        return self.next_id

    def wait_for(self, wanted: Any) -> dict[str, Any]:
        """The first message received for which `wanted(message)` holds; the others are dropped."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self.received.get(timeout=max(deadline - time.monotonic(), 0.001))
            if wanted(message):
                return message

    def published(self, uri: str, version: int) -> dict[str, Any]:
        """The diagnostics published for `uri` at `version`."""
        return self.wait_for(
            lambda message: (
                message.get("method") == "textDocument/publishDiagnostics"
                and message["params"]["uri"] == uri
                and message["params"].get("version") == version
            )
        )

    def start(self, root: Path) -> None:
        """Initialize the session for the workspace `root`."""
        asked = self.send(
            "initialize", {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {}}, request=True
        )
        self.wait_for(lambda message: message.get("id") == asked)
        self.send("initialized", {})

    def stop(self) -> None:
        asked = self.send("shutdown", {}, request=True)
        self.wait_for(lambda message: message.get("id") == asked)
        self.send("exit", {})
        self.process.wait(TIMEOUT)


def edited_lines(text: str, count: int) -> list[int]:
    """`count` lines clearing gradients, spread over the module, to comment out and restore."""
    clears = [number for number, line in enumerate(text.splitlines()) if line.strip() == "optimizer.zero_grad()"]
    clears = clears or [number for number, line in enumerate(text.splitlines()) if "zero_grad()" in line]
    return [clears[(index * len(clears)) // count + len(clears) // (2 * count)] for index in range(count)]


def measure(root: Path, path: Path, text: str, edits: int, *, incremental: bool) -> tuple[float, list[float]]:
    """Seconds to the first diagnostics after opening, and after each one-line edit."""
    server = Server(root, incremental)
    server.start(root)
    uri = path.as_uri()
    item = {"uri": uri, "languageId": "python", "version": 1, "text": text}
    started = time.perf_counter()
    server.send("textDocument/didOpen", {"textDocument": item})
    server.published(uri, 1)
    opened = time.perf_counter() - started
    lines = text.splitlines()
    latencies = []
    for version, number in enumerate(edited_lines(text, edits), start=2):
        time.sleep(1.0)  # the pause: nothing of the server's is still running
        line = lines[number]
        indent = len(line) - len(line.lstrip())
        commented = line.lstrip().startswith("#")
        # Ex) `        optimizer.zero_grad()` <-> `        # optimizer.zero_grad()`
        change = {
            "range": {
                "start": {"line": number, "character": indent},
                "end": {"line": number, "character": indent + (2 if commented else 0)},
            },
            "text": "" if commented else "# ",
        }
        lines[number] = line[:indent] + (line[indent + 2 :] if commented else "# " + line[indent:])
        started = time.perf_counter()
        server.send(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
        )
        server.published(uri, version)
        latencies.append(time.perf_counter() - started)
    server.stop()
    return opened, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=7, help="one-line edits per mode (default 7)")
    parser.add_argument("--functions", type=int, default=180, help="training functions generated (default 180)")
    parser.add_argument("--distinct-names", action="store_true", help="a differently named optimizer per function")
    parser.add_argument("--file", type=Path, help="time this module instead of a generated one")
    arguments = parser.parse_args()
    text = (
        arguments.file.read_text()
        if arguments.file
        else training_module(arguments.functions, distinct=arguments.distinct_names)
    )
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory).resolve()
        path = root / "training.py"
        path.write_text(text)
        started = time.perf_counter()
        findings = lint_source(text, str(path))
        alone = time.perf_counter() - started
        print(
            f"{datetime.date.today()}, {platform.python_version()}, {os.cpu_count()} cores: {path.name}, "
            f"{len(text.splitlines())} lines, {len(findings)} findings; one full lint in the engine: {alone:.2f} s"
        )
        medians = {}
        for incremental in (True, False):
            opened, latencies = measure(root, path, text, arguments.edits, incremental=incremental)
            label = "incremental" if incremental else "full parse"
            medians[label] = statistics.median(latencies)
            shown = ", ".join(f"{seconds * 1000:.0f}" for seconds in latencies)
            median = medians[label] * 1000
            print(f"{label:>11}: open {opened:.2f} s; edit to diagnostics median {median:.0f} ms ({shown} ms)")
    print(f"full parse / incremental: {medians['full parse'] / medians['incremental']:.2f}x")


if __name__ == "__main__":
    main()
