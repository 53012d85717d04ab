"""The traced process: `python -m gradlint.runtime.child CONFIG.json` runs the script under the tracer.

It behaves like `python SCRIPT ARGS` (or `python -m MODULE ARGS`): `sys.argv`, `__main__`,
the script's directory first on `sys.path`, the working directory unchanged. With a
`source` entry in the config (`gradlint trace --fix`), that text runs in the script's place,
under the script's own file name, so nothing has to be written next to it.
"""

from __future__ import annotations

import json
import linecache
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, NoReturn

from gradlint.runtime.events import EventWriter

if TYPE_CHECKING:
    from gradlint.runtime.tracer import Tracer

_STOP_GRACE_SECONDS = 2.0


def main(config_path: str) -> None:
    """Run the script described by the config file, then write the end of the event stream."""
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    _restore_environment(config)
    events = EventWriter(config["events"])
    try:
        from gradlint.runtime.tracer import Hint, StopTrace, Tracer
    except ImportError as error:  # torch missing or broken in the interpreter that runs the script
        events.emit("end", reason="no-torch", detail=str(error))
        os._exit(0)
    hints = [
        Hint(h["code"], h["line"], h["end_line"], h.get("column", 0), h.get("end_column", 0)) for h in config["hints"]
    ]
    tracer = Tracer(config["script"], hints, config["steps"], events)
    ending = threading.Lock()
    tracer.on_stop = lambda: _start_watchdog(tracer, events, ending)
    signal.signal(signal.SIGTERM, lambda signum, frame: tracer.request_stop("timeout"))
    reason, detail = "finished", ""
    tracer.install()
    try:
        _run(config)
    except StopTrace as stop:
        reason = str(stop) or "steps"
    except SystemExit as exit_:
        reason, detail = "exit", str(exit_.code if exit_.code is not None else 0)
    except BaseException as error:  # noqa: BLE001  (whatever the script raises ends up in the report)
        reason = "exception"
        _report_exception(tracer, events, error, config["script"])
    finally:
        tracer.uninstall()
    _end(tracer, events, ending, reason, detail)


def _end(tracer: Tracer, events: EventWriter, ending: threading.Lock, reason: str, detail: str) -> NoReturn:
    """Write the end of the event stream once, then leave at once.

    Interpreter shutdown is skipped: leftover non-daemon threads or DataLoader workers of
    the script must not keep the process alive; the parent kills its process group.
    """
    with ending:
        tracer.finish()
        events.emit("end", reason=reason, detail=detail, steps=tracer.steps, backwards=tracer.backwards)
        events.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _start_watchdog(tracer: Tracer, events: EventWriter, ending: threading.Lock) -> None:
    """End the process if the script catches the stop and keeps running."""

    def watch() -> None:
        time.sleep(_STOP_GRACE_SECONDS)
        reason = tracer.stop_reason or "steps"
        _end(tracer, events, ending, reason, "the script caught the stop and kept running")

    threading.Thread(target=watch, daemon=True).start()


def _restore_environment(config: dict[str, object]) -> None:
    """Undo what the parent changed to start this module, so the script sees its usual environment."""
    python_path = config["pythonpath"]
    if python_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = str(python_path)
    injected = str(config["injected_path"])
    if injected in sys.path:
        sys.path.remove(injected)
    first = str(Path(str(config["script"])).parent) if config["module"] is None else os.getcwd()
    sys.path.insert(0, first)


def _run(config: dict[str, object]) -> None:
    args = [str(arg) for arg in config["args"]]  # type: ignore[attr-defined]  # a JSON list
    if config.get("source") is not None:
        sys.argv = [str(config["script"]), *args]
        _run_source(str(config["source"]), str(config["script"]), config["module"])
    elif config["module"] is not None:
        sys.argv = [str(config["script"]), *args]
        runpy.run_module(str(config["module"]), run_name="__main__", alter_sys=True)
    else:
        sys.argv = [str(config["argv0"]), *args]
        runpy.run_path(str(config["script"]), run_name="__main__")


def _run_source(source: str, script: str, module: object) -> None:
    """Run `source` as `__main__` the way runpy runs the file `script`: same `__file__`, same globals."""
    # The script's lines in tracebacks and in the tracer's `linecache` reads are the text
    # that runs, not the file; an entry without a modification time is never reloaded.
    linecache.cache[script] = (len(source), None, source.splitlines(keepends=True), script)
    code = compile(source, script, "exec", dont_inherit=True)  # not this module's __future__ flags
    main_module = ModuleType("__main__")
    main_module.__dict__.update(
        __file__=script,
        __cached__=None,
        __loader__=None,
        __spec__=None,
        __package__=_package(script, module),
    )
    previous = sys.modules["__main__"]
    sys.modules["__main__"] = main_module
    try:
        exec(code, main_module.__dict__)
    finally:
        sys.modules["__main__"] = previous


def _package(script: str, module: object) -> str:
    """`__package__` as runpy sets it: empty for a script, the parent package for `-m a.b`."""
    if module is None:
        return ""
    return str(module) if Path(script).name == "__main__.py" else str(module).rpartition(".")[0]


def _report_exception(tracer: Tracer, events: EventWriter, error: BaseException, script: str) -> None:
    path, line = _user_frame(error.__traceback__, script)
    if isinstance(error, SyntaxError) and error.filename == script:
        path, line = script, error.lineno or 0
    events.emit(
        "exception",
        type=type(error).__name__,
        message=str(error).strip(),
        path=path,
        line=line,
        traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)[-12:]),
    )
    if path == script:
        tracer.report_exception(error, line)


def _user_frame(tb: TracebackType | None, script: str) -> tuple[str, int]:
    """The innermost traceback entry in the script (else the innermost of all)."""
    found: tuple[str, int] = ("", 0)
    innermost: tuple[str, int] = ("", 0)
    while tb is not None:
        frame: FrameType = tb.tb_frame
        innermost = (frame.f_code.co_filename, tb.tb_lineno)
        if frame.f_code.co_filename == script:
            found = innermost
        tb = tb.tb_next
    return found if found[0] else innermost


if __name__ == "__main__":
    main(sys.argv[1])
