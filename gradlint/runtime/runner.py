"""The parent side of `gradlint trace`: start the traced child, relay its output, stop it, read its events."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gradlint.rule import Diagnostic
from gradlint.runtime.events import read_events

_GRACE_SECONDS = 5.0  # between SIGTERM (the tracer stops the script cleanly) and SIGKILL


@dataclass(frozen=True)
class Target:
    """What to run: a script path, or a module (`-m`) with the file it resolves to."""

    script: Path
    module: str | None
    args: tuple[str, ...]


@dataclass
class TraceRun:
    """Everything the child reported, plus how it ended."""

    events: list[dict[str, object]] = field(default_factory=list)
    reason: str = "crashed"
    detail: str = ""
    seconds: float = 0.0
    returncode: int | None = None

    def of_kind(self, kind: str) -> list[dict[str, object]]:
        """The events of one kind, in order."""
        return [event for event in self.events if event.get("kind") == kind]


def resolve_module(module: str) -> Path | None:
    """The file `python -m module` would run, found on the path without importing anything."""
    parts = module.split(".")
    for entry in [os.getcwd(), *sys.path[1:]]:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def run_traced(
    target: Target, hints: list[Diagnostic], steps: int, timeout: float, quiet: bool, source: str | None = None
) -> TraceRun:
    """Run the target (or `source` in its place, under its name) under the tracer.

    Always returns, with the child and its process group gone.
    """
    with tempfile.TemporaryDirectory(prefix="gradlint-trace-") as folder:
        events = Path(folder) / "events.jsonl"
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(_config(target, hints, steps, events, source)), encoding="utf-8")
        run = _supervise(_start(config, quiet), timeout, quiet)
        run.events = read_events(events)
    end = run.of_kind("end")
    if end:
        run.reason = str(end[-1].get("reason", run.reason))
        run.detail = str(end[-1].get("detail", ""))
    return run


def _config(target: Target, hints: list[Diagnostic], steps: int, events: Path, source: str | None) -> dict[str, object]:
    return {
        "script": str(target.script.resolve()),
        "source": source,  # None: run the file; else this text, compiled as the file
        "argv0": str(target.script),
        "module": target.module,
        "args": list(target.args),
        "steps": steps,
        "events": str(events),
        "hints": [
            {
                "code": d.code,
                "line": d.line,
                "end_line": max(d.line, d.end_line),
                "column": d.column,
                "end_column": d.end_column,
            }
            for d in hints
        ],
        "pythonpath": os.environ.get("PYTHONPATH"),
        "injected_path": _package_root(),
    }


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


def _start(config: Path, quiet: bool) -> subprocess.Popen[bytes]:
    environment = dict(os.environ)
    existing = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = os.pathsep.join([_package_root(), *([existing] if existing else [])])
    output = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-m", "gradlint.runtime.child", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        env=environment,
        start_new_session=True,  # its own process group: DataLoader workers die with it
    )


def _supervise(child: subprocess.Popen[bytes], timeout: float, quiet: bool) -> TraceRun:
    relays = [] if quiet else [_relay(stream) for stream in (child.stdout, child.stderr) if stream is not None]
    started = time.monotonic()
    run = TraceRun()
    try:
        run.returncode = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.reason = "timeout"
        run.returncode = _stop(child)
    finally:
        _kill_group(child.pid, signal.SIGKILL)
        child.wait()
        for relay in relays:
            relay.join(timeout=2.0)
    run.seconds = time.monotonic() - started
    return run


def _stop(child: subprocess.Popen[bytes]) -> int:
    """SIGTERM first (the tracer stops the script and writes its report), SIGKILL after a grace period."""
    _kill_group(child.pid, signal.SIGTERM)
    try:
        return child.wait(timeout=_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        _kill_group(child.pid, signal.SIGKILL)
        return child.wait()


def _kill_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _relay(stream: IO[bytes]) -> threading.Thread:
    """Copy the script's output to our stderr as it comes, so the report on stdout stays parseable."""

    def copy() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span two chunks
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]  # a BufferedReader
            sys.stderr.write(decoder.decode(chunk))
            sys.stderr.flush()
        stream.close()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
