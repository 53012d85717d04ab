"""The event stream between the traced child and `gradlint trace`: one JSON object a line.

The child appends and flushes each event as it happens, so a child killed at the
timeout still leaves everything it saw up to then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO


class EventWriter:
    """Appends events to the stream file (child side)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115  (open for the child's lifetime)

    def emit(self, kind: str, **data: object) -> None:
        """Write one event and flush it to disk."""
        self._file.write(json.dumps({"kind": kind, **data}) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the stream."""
        self._file.close()


def read_events(path: Path) -> list[dict[str, object]]:
    """Every complete event in the stream file (parent side); a torn last line is dropped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
