"""Line events of the traced script: which finding lines ran, and which line changed a watched name."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

_MISSING = object()


def lookup(frame: FrameType, name: str) -> object:
    """The value of `name` (`x` or `self.x`) in `frame`, or a sentinel when unbound."""
    owner, _, attribute = name.partition(".")
    value = frame.f_locals.get(owner, _MISSING)
    if attribute and value is not _MISSING:
        value = getattr(value, attribute, _MISSING)
    return value


def _snapshot(value: object) -> tuple[object, ...]:
    # The objects that change when the name is rebound, a tensor gets a new grad_fn, or a
    # container gets a new item. They are compared by identity and held so ids stay valid.
    grad_fn = getattr(value, "grad_fn", None)
    if isinstance(value, list):
        return (value, len(value), value[-1] if value else None)
    if isinstance(value, dict):
        return (value, len(value), *list(value.values())[:50])
    return (value, grad_fn)


def _same(old: tuple[object, ...], new: tuple[object, ...]) -> bool:
    return len(old) == len(new) and all(a is b or (type(a) is int and a == b) for a, b in zip(old, new, strict=True))


class Watch:
    """A name in one frame whose next change is reported, with the line that made it."""

    def __init__(self, frame: FrameType, name: str, on_change: Callable[[object, object, int], bool]) -> None:
        self.frame = frame
        self.name = name
        self.on_change = on_change  # (old value, new value, line) -> keep watching?
        self.last_line = frame.f_lineno
        self.snapshot = _snapshot(lookup(frame, name))

    def changed(self) -> object:
        """The new value when the name changed since the snapshot, else the sentinel."""
        value = lookup(self.frame, self.name)
        return _MISSING if _same(self.snapshot, _snapshot(value)) else value


class LineTracker:
    """A `sys.settrace` tracer restricted to the script's own file.

    Tracing slows all Python code down, so it runs only while it is needed: when some
    static finding's lines must be watched, or once a name is watched.
    """

    def __init__(self, script: str, interesting: set[int], recent: set[int]) -> None:
        self.script = script
        self.interesting = interesting
        self.recent = recent  # lines whose last run matters, not only whether they ran
        self.hits: dict[int, tuple[int, int]] = {}  # line -> (backward count, step count) when it last ran
        self.stamp = (0, 0)
        self.watches: list[Watch] = []
        self.listeners: dict[int, Callable[[FrameType], None]] = {}  # line -> called each time it is about to run
        self._pending: dict[CodeType, set[int]] = {}  # per code object: lines still to see (or always, if recent)
        self._previous: Callable[..., Any] | None = None
        self._installed = False

    def install(self) -> None:
        """Start tracing new frames of the script, if any line of it is of interest."""
        if self.interesting:
            self._start()

    def uninstall(self) -> None:
        """Stop tracing and give the previous trace function (a debugger, coverage) back."""
        if self._installed:
            sys.settrace(self._previous)
            self._installed = False

    def watch(self, watch: Watch) -> None:
        """Report the next change of a name, tracing its frame from now on."""
        self.watches.append(watch)
        self._start()
        watch.frame.f_trace = self._local
        watch.frame.f_trace_lines = True

    def _start(self) -> None:
        if not self._installed:
            self._previous = sys.gettrace()
            sys.settrace(self._global)
            self._installed = True

    def ran_since(self, line: int, end_line: int, backwards: int | None = None, steps: int | None = None) -> bool:
        """Whether a line of `line..end_line` ran after the given backward or step count was reached."""
        for number in range(line, end_line + 1):
            hit = self.hits.get(number)
            if hit and (backwards is None or hit[0] >= backwards) and (steps is None or hit[1] >= steps):
                return True
        return False

    def watching(self, frame: FrameType, name: str) -> bool:
        """Whether `name` in `frame` is watched already."""
        return any(watch.frame is frame and watch.name == name for watch in self.watches)

    def _global(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        code = frame.f_code
        if code.co_filename != self.script:
            return None
        pending = self._pending.get(code)
        if pending is None:
            pending = self._pending[code] = {line for _, _, line in code.co_lines() if line in self.interesting}
        return self._local if pending or self.watches else None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "line":
            line = frame.f_lineno
            if line in self.interesting:
                self.hits[line] = self.stamp
                self._seen(frame, line)
                if line in self.listeners:
                    self.listeners[line](frame)
            if self.watches:
                self._check(frame, line)
        elif event == "return" and self.watches:
            self._check(frame, None)
        return self._local

    def _seen(self, frame: FrameType, line: int) -> None:
        """Stop line events in a frame once all its lines of interest ran and none needs its last run."""
        pending = self._pending.get(frame.f_code)
        if pending is None or line in self.recent:
            return
        pending.discard(line)
        if not pending and not any(watch.frame is frame for watch in self.watches):
            frame.f_trace_lines = False

    def _check(self, frame: FrameType, line: int | None) -> None:
        for watch in [watch for watch in self.watches if watch.frame is frame]:
            value = watch.changed()
            if value is not _MISSING:
                keep = watch.on_change(watch.snapshot[0], value, watch.last_line)
                watch.snapshot = _snapshot(value)
                if not keep:
                    self.watches.remove(watch)
                    continue
            if line is None:
                self.watches.remove(watch)  # the frame returns; its names are gone
            else:
                watch.last_line = line
