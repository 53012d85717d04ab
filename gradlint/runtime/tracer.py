"""Instrumentation inside the traced process: PyTorch's gradient API, hooked and observed.

Every hook looks only at what PyTorch already holds (gradients, their version
counters, autograd graphs, the script's own variables) and reports what it saw as a
finding on the script's line. `install()` patches, `uninstall()` restores everything.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
import sysconfig
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.nn.utils.clip_grad

try:
    from torch.amp.grad_scaler import GradScaler
except ImportError:  # torch < 2.3 has it under torch.cuda.amp only
    from torch.cuda.amp import GradScaler  # type: ignore[assignment]  # the same class, older home
from torch.autograd.graph import Node
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from gradlint.runtime.errors import RECENCY_CODES, candidate_codes, default_code
from gradlint.runtime.events import EventWriter
from gradlint.runtime.graph import grad_tensors, is_accumulate, nodes
from gradlint.runtime.lines import LineTracker, Watch

_LIBRARY_DIRS = tuple(
    str(Path(path).resolve())
    for path in (Path(torch.__file__).parent, Path(__file__).parent.parent, sysconfig.get_paths()["stdlib"])
)
_ROOTS_KEPT = 16  # backpropagated roots remembered, to see which later variables still reach them
# Whole-step checks (variables, gradient norms) run on every one of the first steps, then
# on every 32nd: a long trace stays cheap, and leaks and dead gradients persist anyway.
_EVERY_STEP_UNTIL, _THEN_EVERY = 32, 32
_LOSSES_KEPT = 64  # backpropagated values held for one step's record: a script that never steps stays bounded


def _sampled(count: int) -> bool:
    return count < _EVERY_STEP_UNTIL or count % _THEN_EVERY == 0


P = ParamSpec("P")
R = TypeVar("R")


def _guarded(method: Callable[Concatenate[Tracer, P], R]) -> Callable[Concatenate[Tracer, P], R | None]:
    """An observation whose failure (a gradlint bug) is reported, never raised into the script."""

    @functools.wraps(method)
    def run(tracer: Tracer, /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return method(tracer, *args, **kwargs)
        except Exception as error:  # noqa: BLE001  (StopTrace is a BaseException and passes)
            tracer.internal_error(method.__name__, error)
            return None

    return run


class StopTrace(BaseException):
    """Raised from a hook to end the script once it ran enough steps or ran out of time."""


@dataclass(frozen=True)
class Hint:
    """A static finding of the script: its code and lines."""

    code: str
    line: int
    end_line: int
    column: int = 0  # 1-based, where the finding's expression starts on `line`
    end_column: int = 0  # 1-based and exclusive, on `end_line`


@dataclass
class _Retained:
    line: int
    kept: list[Node]  # held so that the ids below stay valid
    ids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _LeftInEval:
    module: weakref.ref[torch.nn.Module]
    params: set[int]
    lines: list[int]  # the script's lines on the stack when it called eval(), innermost first


@dataclass
class _ScalerState:
    scaled: bool = False
    unscaled: set[int] = field(default_factory=set)


class Tracer:
    """Hooks on PyTorch's gradient API that turn what happens into findings on the script's lines."""

    def __init__(self, script: str, hints: list[Hint], max_steps: int, events: EventWriter) -> None:
        self.script = script
        self.hints = hints
        self.max_steps = max_steps
        self.events = events
        self.lines = LineTracker(
            script,
            {n for h in hints for n in range(h.line, h.end_line + 1)},
            {n for h in hints if h.code in RECENCY_CODES | {"GL017"} for n in range(h.line, h.end_line + 1)},
        )
        self.pid = os.getpid()
        self.steps = 0
        self.backwards = 0
        self.stop_reason: str | None = None
        self.on_stop: Callable[[], None] | None = None  # the child's watchdog, for scripts that catch StopTrace
        self._depth = 0
        self._undo: list[Callable[[], None]] = []
        self._reported: set[tuple[str, int]] = set()
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._built_at: dict[int, weakref.ref[torch.optim.Optimizer]] = {}
        self._opt_steps: dict[int, int] = {}
        self._opt_backwards: dict[int, int] = {}
        self._stepped: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}  # param -> grad, version, line
        self._contributed: dict[int, int] = {}  # param -> backward line since the last step
        # param -> (backward line, step line, grad version): a backward added onto applied gradients
        self._contaminated: dict[int, tuple[int, int, int]] = {}
        self._discarded: dict[int, tuple[int, int]] = {}  # param -> (clear line, backward line)
        self._roots: deque[tuple[Node, int, int]] = deque(maxlen=_ROOTS_KEPT)  # node, step, line
        self._retained: dict[int, _Retained] = {}
        self._scalers: weakref.WeakKeyDictionary[GradScaler, _ScalerState] = weakref.WeakKeyDictionary()
        self._leaks: dict[tuple[int, str], tuple[int, str]] = {}  # watched (frame, name) -> (line, evidence)
        self._leaks_found: set[tuple[int, str]] = set()
        self._names: dict[int, str] = {}
        self._norms: dict[str, float | None] = {}
        self._losses: list[torch.Tensor] = []  # detached roots backpropagated since the last step
        self._loss: float | list[float | None] | None = None  # their values, fetched before the step
        self._last_backward_line = 0
        self._covered = 0  # lines in the last coverage event
        self._failed: set[str] = set()
        self._evaluating: dict[int, RemovableHandle] = {}  # modules put in eval mode -> their forward hook
        self._eval_graphs: dict[int, int] = {}  # line -> model calls in eval mode that recorded a graph
        self._eval_backward = False
        # GL018, only where a static finding asks: each backward's loss factor and the parameters it reached
        self._accumulating = any(hint.code == "GL018" for hint in hints)
        self._factors: list[float | None] = []  # of the backward running now, read before it frees its graph
        self._micro_batches: list[tuple[int, float | None, set[int]]] = []  # line, factor, params since the step
        self._scaled: dict[int, tuple[Node, Node]] = {}  # GradScaler output's grad_fn -> (it, the loss's grad_fn)
        self._with_grad: dict[int, str] = {}  # GL017 line -> the value there that had a grad_fn when it last ran
        for hint in hints:
            if hint.code == "GL017":
                self.lines.listeners[hint.line] = functools.partial(self._inspect_target, hint)
        self._train_since: dict[int, int] = {}  # module -> backward count when the script last set train mode
        self._left_in_eval: dict[int, _LeftInEval] = {}  # modules the script put in eval mode after training them

    # -- installing -----------------------------------------------------------------

    def install(self) -> None:
        """Patch PyTorch and start line tracing."""
        self._patch(torch.Tensor, "backward", self._tensor_backward)
        self._patch(torch.autograd, "backward", self._autograd_backward)
        self._patch(torch.autograd, "grad", self._autograd_grad)
        self._patch(torch.Tensor, "retain_grad", self._retain_grad)
        self._patch(torch.optim.Optimizer, "__init__", self._optimizer_init)
        self._patch(torch.optim.Optimizer, "zero_grad", self._optimizer_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", self._module_zero_grad)
        self._patch(torch.nn.Module, "train", self._module_train)
        for name in ("scale", "unscale_", "update"):
            self._patch(GradScaler, name, getattr(self, f"_scaler_{name.strip('_')}"))
        for module in (torch.nn.utils, torch.nn.utils.clip_grad):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                self._patch(module, name, self._clip)
        pre = register_optimizer_step_pre_hook(self._before_step)
        post = register_optimizer_step_post_hook(self._after_step)
        self._undo += [pre.remove, post.remove]
        self.lines.install()

    def uninstall(self) -> None:
        """Stop tracing and restore everything patched, in reverse order."""
        self.lines.uninstall()
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, hook: Callable[..., Any]) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth or os.getpid() != self.pid:
                return original(*args, **kwargs)  # nested inside another hook, or a forked worker
            return hook(original, *args, **kwargs)

        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def request_stop(self, reason: str) -> None:
        """Stop the script now and at every later hook (a signal handler calls this at the timeout)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            if self.on_stop is not None:
                self.on_stop()
        raise StopTrace(reason)

    def _check_stop(self) -> None:
        if self.stop_reason:
            raise StopTrace(self.stop_reason)

    # -- where ------------------------------------------------------------------------

    def _frames(self) -> Iterator[FrameType]:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == self.script:
                yield frame
            frame = frame.f_back

    def _where(self) -> tuple[str, int]:
        """The script's innermost line on the stack, else the innermost frame of user code."""
        frame = next(self._frames(), None)
        if frame is not None:
            return self.script, frame.f_lineno
        outer: FrameType | None = sys._getframe(1)
        while outer is not None:
            path = str(Path(outer.f_code.co_filename).resolve())
            if not path.startswith(_LIBRARY_DIRS) and not path.startswith("<"):
                return outer.f_code.co_filename, outer.f_lineno
            outer = outer.f_back
        return self.script, 0

    def _line(self) -> int:
        path, line = self._where()
        return line if path == self.script else 0

    def report(self, code: str, line: int, message: str, path: str | None = None) -> None:
        """Emit a finding once per code and line."""
        if (code, line) in self._reported:
            return
        self._reported.add((code, line))
        self.events.emit("finding", code=code, line=line, path=path or self.script, message=message)

    def internal_error(self, where: str, error: Exception) -> None:
        """Record a failure of the tracer itself, once per place; the script goes on."""
        if where not in self._failed:
            self._failed.add(where)
            self.events.emit("internal-error", where=where, message=f"{type(error).__name__}: {error}")

    # -- backward -----------------------------------------------------------------------

    def _tensor_backward(self, original: Callable[..., Any], tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # Tensor.backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None)
        retain = _retains(args, kwargs, 1)
        return self._gradient_call([tensor], retain, True, lambda: original(tensor, *args, **kwargs))

    def _autograd_backward(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # torch.autograd.backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, ...)
        roots = _tensors(args[0] if args else kwargs.get("tensors"))
        return self._gradient_call(roots, _retains(args, kwargs, 2), True, lambda: original(*args, **kwargs))

    def _autograd_grad(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # torch.autograd.grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, ...)
        roots = _tensors(args[0] if args else kwargs.get("outputs"))
        return self._gradient_call(roots, _retains(args, kwargs, 3), False, lambda: original(*args, **kwargs))

    def _gradient_call(
        self, roots: list[torch.Tensor], retain: bool, accumulates: bool, call: Callable[[], Any]
    ) -> Any:
        self._check_stop()
        if accumulates:
            self._end_manual_step()
        path, line = self._where()
        grad_enabled = torch.is_grad_enabled()
        self._depth += 1
        try:
            before = self._before_backward(roots, line, accumulates) or {}
            try:
                result = call()
            except RuntimeError as error:
                self._report_error(error, line, path, grad_enabled)
                raise
            self._after_backward(roots, retain, line, before, accumulates)
            self._eval_backward = bool(self._evaluating)
            return result
        finally:
            self._depth -= 1

    @_guarded
    def _before_backward(self, roots: list[torch.Tensor], line: int, accumulates: bool) -> dict[int, Any]:
        self._use_retained(roots, line)
        if not accumulates:
            return {}
        if self._accumulating:
            self._factors = [self._loss_factor(root) for root in roots]
        self._confirm_targets()
        for root in roots:
            if root.grad_fn is None and root.requires_grad:
                self._confirm_or_report(
                    "GL006", line, "backward ran on a tensor without autograd history: no parameter gets a gradient"
                )
        self._check_cut_terms(roots, line)
        return {id(p): (p, p.grad, _version(p.grad)) for p in self._params()}

    @_guarded
    def _after_backward(
        self, roots: list[torch.Tensor], retain: bool, line: int, before: dict[int, Any], accumulates: bool
    ) -> None:
        if accumulates:
            self._update_ledger(before, line)
            if self._accumulating:
                self._note_micro_batch(before, line)
            for root in roots:
                if root.grad_fn is not None:
                    self._roots.append((root.grad_fn, self.steps, line))
            self._check_training_in_eval(before, line)
            if _sampled(self.backwards):
                self._watch_leaves()
            if self.steps < _EVERY_STEP_UNTIL:
                self._losses += [root.detach() for root in roots][: _LOSSES_KEPT - len(self._losses)]
            self._last_backward_line = line
            self.backwards += 1
            self.lines.stamp = (self.backwards, self.steps)
        if retain:
            self._retain(roots, line)

    def _update_ledger(self, before: dict[int, Any], line: int) -> None:
        """Note which parameters this backward reached, and which of them held gradients a step already applied."""
        for param, old_grad, old_version in before.values():
            grad = param.grad
            if grad is None or (grad is old_grad and _version(grad) == old_version):
                continue
            self._contributed[id(param)] = line
            stepped = self._stepped.get(id(param))
            if id(param) in self._contaminated:
                self._contaminated[id(param)] = (*self._contaminated[id(param)][:2], _version(grad))
            elif stepped is not None and old_grad is not None and self._is_stale(id(param), old_grad, old_version):
                self._contaminated[id(param)] = (line, stepped[2], _version(grad))

    def _is_stale(self, param: int, grad: torch.Tensor | None, version: int) -> bool:
        stepped = self._stepped.get(param)
        return stepped is not None and grad is not None and stepped[0]() is grad and stepped[1] == version

    # -- retained graphs (GL005) and errors -----------------------------------------

    def _retain(self, roots: list[torch.Tensor], line: int) -> None:
        earlier = self._retained.pop(line, None)
        if earlier is not None:
            self.report(
                "GL005",
                line,
                f"the graph retained here (retain_graph=True) in the previous pass was never used by "
                f"another backward before line {line} retained a new one",
            )
        kept = [node for root in roots for node in nodes(root.grad_fn) if not is_accumulate(node)]
        self._retained[line] = _Retained(line, kept, {id(node) for node in kept})

    def _use_retained(self, roots: list[torch.Tensor], line: int) -> None:
        if not self._retained:
            return
        for node in (node for root in roots for node in nodes(root.grad_fn)):
            for retained in [r for r in self._retained.values() if id(node) in r.ids]:
                del self._retained[retained.line]
                if retained.line == line:
                    self.report(
                        "GL005",
                        line,
                        "this backward runs back through the graph it retained in an earlier pass: "
                        "a state carried across steps was never detached",
                    )
            if not self._retained:
                return

    @_guarded
    def _report_error(self, error: BaseException, line: int, path: str, grad_enabled: bool) -> None:
        """Map a gradient-related exception to its rule: a static finding on the line, one that ran, or a default."""
        codes = candidate_codes(str(error))
        if not codes or getattr(error, "_gradlint_reported", False):
            return
        error._gradlint_reported = True  # type: ignore[attr-defined]  # the top-level handler skips it
        text = f"{type(error).__name__}: {_first_sentence(str(error))}"
        if path != self.script:
            self.report(codes[0], line, f"raised {text}", path)
            return
        on_line = [h for h in self.hints if h.code in codes and h.line <= line <= h.end_line]
        ran = [h for h in self.hints if h.code in codes and self.lines.ran_since(h.line, h.end_line, self.backwards)]
        for hint in on_line or ran:
            self.report(hint.code, hint.line, f"line {line} raised {text}")
        if not on_line and not ran:
            self.report(default_code(codes, linecache.getline(self.script, line), grad_enabled), line, f"raised {text}")

    def report_exception(self, error: BaseException, line: int) -> None:
        """Map an exception that ended the script to its rule, if it is gradient-related."""
        self._report_error(error, line, self.script, torch.is_grad_enabled())

    def _confirm_or_report(self, code: str, line: int, message: str, *, since_step: bool = False) -> None:
        """Report on the static findings of `code` that ran in this backward (or step), else on `line`."""
        counts = {"steps": self.steps} if since_step else {"backwards": self.backwards}
        ran = [h for h in self.hints if h.code == code and self.lines.ran_since(h.line, h.end_line, **counts)]
        for hint in ran:
            self.report(code, hint.line, message)
        if not ran:
            self.report(code, line, message)

    # -- variables of the script (GL001, GL003) --------------------------------------

    def _variables(self, frame: FrameType) -> Iterator[tuple[str, object]]:
        for name, value in list(frame.f_locals.items()):
            if name.startswith("__"):
                continue
            yield name, value
            if name == "self" and not isinstance(value, torch.nn.Module):
                for attribute, item in list(getattr(value, "__dict__", {}).items()):
                    yield f"self.{attribute}", item

    def _scan_variables(self) -> int:
        """GL001: watch variables that hold graphs of losses from two or more steps; return nodes held."""
        roots = {id(node): step for node, step, _ in self._roots}
        held: set[int] = set()
        for frame in self._frames():
            for name, value in self._variables(frame):
                steps = set()
                for tensor in grad_tensors(value):
                    for node in nodes(tensor.grad_fn):
                        held.add(id(node))
                        if id(node) in roots:
                            steps.add(roots[id(node)])
                if len(steps) >= 2:
                    self._watch_leak(frame, name, len(steps))
        return len(held)

    def _watch_leak(self, frame: FrameType, name: str, count: int) -> None:
        key = (id(frame), name)
        if key in self._leaks or key in self._leaks_found or self.lines.watching(frame, name):
            return
        evidence = f"`{name}` still holds the autograd graphs of losses backpropagated in {count} earlier steps"
        self._leaks[key] = (frame.f_lineno, evidence)

        def changed(old: object, value: object, line: int) -> bool:
            if grad_tensors(value):
                self._leaks.pop(key, None)
                self._leaks_found.add(key)
                self.report("GL001", line, f"{evidence}; this line adds the next one")
            return False

        self.lines.watch(Watch(frame, name, changed))

    def _watch_leaves(self) -> None:
        """GL003: watch names bound to leaves that received gradients, to see one rebound to a non-leaf."""
        for frame in self._frames():
            for name, value in self._variables(frame):
                if not (isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad):
                    continue
                if value.grad is None or self.lines.watching(frame, name):
                    continue
                self.lines.watch(Watch(frame, name, functools.partial(self._leaf_rebound, name)))

    def _leaf_rebound(self, name: str, old: object, value: object, line: int) -> bool:
        # Ex) `w = w - lr * w.grad`: the new value is computed from the old leaf, with autograd on.
        if isinstance(value, torch.Tensor) and value.requires_grad and _derived_from(value, old):
            self.report(
                "GL003",
                line,
                f"`{name}` was a leaf that received gradients; this line rebinds it to the output of "
                f"{type(value.grad_fn).__name__}, a non-leaf whose .grad stays None",
            )
            return False
        return isinstance(value, torch.Tensor) and value.is_leaf

    # -- optimizers ---------------------------------------------------------------------

    def _live_optimizers(self) -> list[torch.optim.Optimizer]:
        return [opt for ref in self._optimizers if (opt := ref()) is not None]

    def _params(self, optimizer: torch.optim.Optimizer | None = None) -> list[torch.Tensor]:
        optimizers = [optimizer] if optimizer is not None else self._live_optimizers()
        seen: dict[int, torch.Tensor] = {}
        for opt in optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    seen.setdefault(id(param), param)
        return list(seen.values())

    def _optimizer_init(self, original: Callable[..., Any], optimizer: torch.optim.Optimizer, *a: Any, **k: Any) -> Any:
        self._depth += 1
        try:
            result = original(optimizer, *a, **k)
        finally:
            self._depth -= 1
        self._register(optimizer)
        return result

    @_guarded
    def _register(self, optimizer: torch.optim.Optimizer) -> None:
        """Track a new optimizer; GL014 when the line built one before that made a single step."""
        self._optimizers.append(weakref.ref(optimizer))
        line = self._line()
        previous = self._built_at.get(line)
        earlier = previous() if previous is not None else None
        if earlier is not None and self._opt_steps.get(id(earlier)) == 1 and _shares(earlier, optimizer):
            self.report(
                "GL014",
                line,
                f"a new {type(optimizer).__name__} is built here after its predecessor made a single step: "
                "its state (momentum, moments, step count) restarts every step",
            )
        if line:
            self._built_at[line] = weakref.ref(optimizer)

    @_guarded
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._depth or os.getpid() != self.pid:
            return
        self._check_stop()
        line = self._line()
        params = self._params(optimizer)
        grads = [(id(p), p.grad) for p in params if p.grad is not None]
        if grads and all(self._is_stale(pid, grad, _version(grad)) for pid, grad in grads):
            step_line = self._stepped[grads[0][0]][2]
            self.report(
                "GL011",
                line,
                f"optimizer.step() runs again on the gradients the step at line {step_line} already applied",
            )
        self._check_contaminated(params)
        if self._accumulating:
            self._check_accumulation(params)
        cleared = self._check_discarded(params, line)
        if _sampled(self.steps + 1):
            self._check_dead(optimizer, params, cleared)
            self._loss = self._step_loss()

    def _check_contaminated(self, params: list[torch.Tensor]) -> None:
        """GL002: the step applies gradients that a backward added onto gradients an earlier step applied."""
        stale = [
            found
            for p in params
            if (found := self._contaminated.pop(id(p), None)) is not None and _version(p.grad) == found[2]
        ]
        if stale:
            backward_line, step_line, _ = stale[0]
            self.report(
                "GL002",
                backward_line,
                f"backward added onto the gradients of {len(stale)} parameter(s) that optimizer.step() "
                f"(line {step_line}) had already applied, and the next step applied the sum; nothing cleared them",
            )

    def _check_discarded(self, params: list[torch.Tensor], line: int) -> bool:
        """GL002: a clear between backward and step, or one that throws away accumulated micro-batches."""
        for param in params:
            discarded = self._discarded.get(id(param))
            if discarded is None:
                continue
            clear_line, backward_line = discarded
            if id(param) not in self._contributed:
                self.report(
                    "GL002",
                    clear_line,
                    f"this clear runs after backward (line {backward_line}) and before the step (line {line}): "
                    "the step applies no gradient",
                )
                return True
            if self._contributed[id(param)] == backward_line:
                self.report(
                    "GL002",
                    clear_line,
                    f"this clear throws away the gradients backward (line {backward_line}) accumulated "
                    f"before the step at line {line} used them",
                )
        return False

    def _check_dead(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], cleared: bool) -> None:
        """GL006: every parameter of the optimizer got a None or all-zero gradient from this step's backward."""
        trainable = [p for p in params if p.requires_grad]
        norms = _norms(trainable)
        names = self._param_names(trainable)
        self._norms.update({name: norm for name, norm in zip(names, norms, strict=True)})
        if cleared or not trainable or self.backwards <= self._opt_backwards.get(id(optimizer), 0):
            return
        dead = [name for name, norm in zip(names, norms, strict=True) if not norm]
        evidence = f"after backward (line {self._last_backward_line}), "
        if len(dead) == len(trainable):
            message = f"{evidence}none of the {len(dead)} parameters the optimizer holds has a non-zero gradient"
            self._confirm_or_report("GL006", self._last_backward_line, message, since_step=True)
        elif dead:
            for hint in self.hints:
                if hint.code == "GL006" and self.lines.ran_since(hint.line, hint.end_line, steps=self.steps):
                    shown = ", ".join(dead[:3]) + (", ..." if len(dead) > 3 else "")
                    self.report("GL006", hint.line, f"{evidence}{len(dead)} parameter(s) got no gradient: {shown}")

    @_guarded
    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._depth or os.getpid() != self.pid:
            return
        line = self._line()
        for param in self._params(optimizer):
            self._contributed.pop(id(param), None)
            self._discarded.pop(id(param), None)
            self._contaminated.pop(id(param), None)
            if param.grad is not None:
                self._stepped[id(param)] = (weakref.ref(param.grad), _version(param.grad), line)
        self._micro_batches, self._scaled = [], {}
        self._opt_steps[id(optimizer)] = self._opt_steps.get(id(optimizer), 0) + 1
        self._opt_backwards[id(optimizer)] = self.backwards
        self._record_step(stop=True)

    def _record_step(self, *, stop: bool, **extra: object) -> None:
        """Count a finished step: stamp the lines, emit what it held and the coverage; stop after enough steps."""
        self.steps += 1
        self.lines.stamp = (self.backwards, self.steps)
        if _sampled(self.steps):
            graph_nodes = self._scan_variables()
            self.events.emit(
                "step", step=self.steps, graph_nodes=graph_nodes, grad_norms=self._norms, loss=self._loss, **extra
            )
        self._norms, self._losses, self._loss = {}, [], None
        if len(self.lines.hits) != self._covered:
            self._covered = len(self.lines.hits)
            self.events.emit("coverage", lines=sorted(self.lines.hits))
        if stop and self.steps >= self.max_steps and (not self._leaks or self.steps > self.max_steps):
            self.request_stop("steps")

    # -- scripts without an optimizer: each backward pass is a step -----------------------

    @_guarded
    def _end_manual_step(self, *, stop: bool = True) -> None:
        """Without any optimizer, a backward pass that begins (or the script's end) ends the step of the one before.

        The hand-written update (`w -= lr * w.grad` under no_grad) ran in between, so the step
        counts, limits and confirms findings as an optimizer's step would.
        """
        if self._optimizers or self.backwards <= self.steps:
            return
        if _sampled(self.steps + 1):
            leaves = self._reached_leaves()
            self._norms = dict(zip(self._param_names(leaves), _norms(leaves), strict=True))
            self._loss = self._step_loss()
        self._record_step(stop=stop, manual=True)

    def _reached_leaves(self) -> list[torch.Tensor]:
        """The leaves this step's backward passes wrote gradients into (their AccumulateGrad nodes hold them)."""
        found: dict[int, torch.Tensor] = {}
        for root, step, _ in self._roots:
            if step == self.steps:
                for node in nodes(root):
                    if is_accumulate(node):
                        found.setdefault(id(node.variable), node.variable)  # type: ignore[attr-defined]  # AccumulateGrad
        return list(found.values())

    @_guarded
    def _step_loss(self) -> float | list[float | None] | None:
        """What this step's backwards ran from: a float for one scalar, a list for several tensors.

        Called right after the gradient norms were fetched (one sync per device) and before
        the step's kernels are queued, so `.item()` waits for nothing; the first 32 steps only.
        """
        values = [_scalar(loss) for loss in self._losses]
        return values[0] if len(values) == 1 else values or None

    def _param_names(self, params: list[torch.Tensor]) -> list[str]:
        if any(id(p) not in self._names for p in params):
            for frame in self._frames():
                for name, value in self._variables(frame):
                    if isinstance(value, torch.nn.Module):
                        for sub, param in value.named_parameters(prefix=name):
                            self._names.setdefault(id(param), sub)
        return [self._names.get(id(p), f"param {tuple(p.shape)} #{index}") for index, p in enumerate(params)]

    # -- clearing, clipping, scaling ------------------------------------------------------

    def _optimizer_zero_grad(
        self, original: Callable[..., Any], optimizer: torch.optim.Optimizer, *a: Any, **k: Any
    ) -> Any:
        self._clear(self._params(optimizer))
        return original(optimizer, *a, **k)

    def _module_zero_grad(self, original: Callable[..., Any], module: torch.nn.Module, *a: Any, **k: Any) -> Any:
        self._clear(list(module.parameters()))
        return original(module, *a, **k)

    @_guarded
    def _clear(self, params: list[torch.Tensor]) -> None:
        line = self._line()
        self._micro_batches = []  # what accumulates starts again
        for param in params:
            self._contaminated.pop(id(param), None)
            backward_line = self._contributed.pop(id(param), None)
            if backward_line is not None:
                self._discarded[id(param)] = (line, backward_line)

    def _clip(self, original: Callable[..., Any], parameters: Any, *args: Any, **kwargs: Any) -> Any:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        self._check_clip(params)
        return original(params, *args, **kwargs)

    @_guarded
    def _check_clip(self, params: list[torch.Tensor]) -> None:
        """GL007: clipping None or already-applied gradients, or gradients still scaled by a GradScaler."""
        line = self._line()
        grads = [(id(p), p.grad) for p in params if p.grad is not None]
        if params and not grads:
            self.report("GL007", line, "clipping found no gradients (all None): it runs before this step's backward")
        elif grads and all(self._is_stale(pid, grad, _version(grad)) for pid, grad in grads):
            step_line = self._stepped[grads[0][0]][2]
            self.report(
                "GL007",
                line,
                f"clipping gradients that optimizer.step() (line {step_line}) already applied: it changes no update",
            )
        self._check_scaled(params, line)

    def _check_scaled(self, params: list[torch.Tensor], line: int) -> None:
        if not self._scalers:
            return
        ids = {id(p) for p in params}
        owners = [opt for opt in self._live_optimizers() if any(id(p) in ids for p in self._params(opt))]
        for scaler, state in list(self._scalers.items()):
            if state.scaled and any(id(opt) not in state.unscaled for opt in owners):
                self.report(
                    "GL007",
                    line,
                    f"clipping gradients still multiplied by the GradScaler's scale ({scaler.get_scale():g}): "
                    "unscale_(optimizer) was not called first",
                )

    def _scaler_scale(self, original: Callable[..., Any], scaler: GradScaler, *a: Any, **k: Any) -> Any:
        if scaler.is_enabled():
            self._scalers.setdefault(scaler, _ScalerState()).scaled = True
        result = original(scaler, *a, **k)
        if self._accumulating:
            self._note_scaled(a[0] if a else k.get("outputs"), result)
        return result

    def _scaler_unscale(self, original: Callable[..., Any], scaler: GradScaler, optimizer: Any, *a: Any) -> Any:
        self._scalers.setdefault(scaler, _ScalerState()).unscaled.add(id(optimizer))
        return original(scaler, optimizer, *a)

    def _scaler_update(self, original: Callable[..., Any], scaler: GradScaler, *a: Any, **k: Any) -> Any:
        self._scalers[scaler] = _ScalerState()
        return original(scaler, *a, **k)

    # -- gradient accumulation (GL018) ------------------------------------------------

    @_guarded
    def _note_scaled(self, loss: object, scaled: object) -> None:
        """Remember what `scaler.scale(loss)` multiplied, so the loss's own factor is read under it."""
        if not (isinstance(loss, torch.Tensor) and isinstance(scaled, torch.Tensor)):
            return
        if loss.grad_fn is not None and scaled.grad_fn is not None and loss.grad_fn is not scaled.grad_fn:
            self._scaled[id(scaled.grad_fn)] = (scaled.grad_fn, loss.grad_fn)

    def _loss_factor(self, root: torch.Tensor) -> float | None:
        """The constant the loss was last multiplied by (1/k for `loss / k`), 1.0 for none, None if not a constant."""
        node = root.grad_fn
        if node is not None and id(node) in self._scaled:
            node = self._scaled[id(node)][1]
        name = type(node).__name__
        if name not in ("DivBackward0", "MulBackward0"):
            return 1.0
        operands = [getattr(node, "_saved_other", None)] + (
            [getattr(node, "_saved_self", None)] if "Mul" in name else []
        )
        constants = [t for t in operands if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.requires_grad]
        if len(constants) != 1:
            return None  # divided by something that itself carries a gradient, or an elementwise mask
        value = float(constants[0].item())
        return (1.0 / value if value else None) if name == "DivBackward0" else value

    @_guarded
    def _note_micro_batch(self, before: dict[int, Any], line: int) -> None:
        reached = {
            pid
            for pid, (param, old, version) in before.items()
            if param.grad is not None and (param.grad is not old or _version(param.grad) != version)
        }
        if reached:
            factors = [factor for factor in self._factors if factor != 1.0] or self._factors[:1]
            self._micro_batches.append((line, factors[0] if factors else None, reached))

    def _check_accumulation(self, params: list[torch.Tensor]) -> None:
        """GL018: two or more backwards added into the gradients this step applies, their losses not divided by k."""
        ids = {id(p) for p in params}
        summed = [(line, factor) for line, factor, reached in self._micro_batches if reached & ids]
        factors = [factor for _, factor in summed if factor is not None]
        if len(summed) < 2 or len(factors) < len(summed):
            return  # one backward, or a loss divided by something that is not a constant
        lines = {line for line, _ in summed}  # where the summed backwards ran
        if set(factors) == {1.0}:
            evidence = f"{len(summed)} backward passes added into the gradients this step applies, no loss divided"
        elif min(map(abs, factors)) > 0 and max(map(abs, factors)) / min(map(abs, factors)) > 1 + 1e-6:
            shown = ", ".join(f"{factor:.3g}" for factor in factors[:4])
            evidence = f"the {len(summed)} losses summed into this step were scaled by different factors ({shown}...)"
        else:
            return  # every loss scaled by the same constant: averaged
        for hint in self.hints:  # the backward's line, or the division by a running count before it
            ran = self.lines.ran_since(hint.line, hint.end_line, steps=self.steps)
            if hint.code == "GL018" and (ran or any(hint.line <= line <= hint.end_line for line in lines)):
                self.report("GL018", hint.line, evidence)

    # -- late retain_grad (GL015) ------------------------------------------------------

    def _retain_grad(self, original: Callable[..., Any], tensor: torch.Tensor) -> Any:
        self._check_late_retain(tensor)
        return original(tensor)

    @_guarded
    def _check_late_retain(self, tensor: torch.Tensor) -> None:
        """GL015: retain_grad() on a tensor this step's backward already ran through."""
        target = tensor.grad_fn
        if target is None:
            return
        for root, step, backward_line in self._roots:
            if step == self.steps and any(node is target for node in nodes(root)):
                self.report(
                    "GL015",
                    self._line(),
                    f"retain_grad() after the backward at line {backward_line} already ran through this "
                    "tensor: its .grad stays None",
                )
                return

    # -- loss terms cut from the graph (GL019) -------------------------------------------

    def _check_cut_terms(self, roots: list[torch.Tensor], line: int) -> None:
        """GL019: a term bound on a hinted line holds no history while the loss backpropagated has a graph."""
        if not any(root.grad_fn is not None for root in roots):
            return
        for hint in self.hints:
            if hint.code != "GL019" or not self.lines.ran_since(hint.line, hint.end_line, backwards=self.backwards):
                continue
            for name, value in self._bound_at(hint.line):
                seen = _without_history(value, {id(p) for p in self._params()})
                if seen:
                    self.report(
                        "GL019", hint.line, f"`{name}` {seen} while the loss backpropagated at line {line} has a graph"
                    )

    def _bound_at(self, line: int) -> Iterator[tuple[str, object]]:
        """The values, in the script's live frames, of the names the assignment at `line` binds."""
        targets = _assigned_names(self.script).get(line, [])
        for frame in self._frames():
            if line not in {number for _, _, number in frame.f_code.co_lines()}:
                continue
            variables = dict(self._variables(frame))
            yield from ((name, variables[name]) for name in targets if name in variables)

    # -- evaluation with gradients on (GL009) --------------------------------------------

    def _module_train(self, original: Callable[..., Any], module: torch.nn.Module, mode: bool = True) -> Any:
        self._depth += 1  # train() recurses into the children: only the outer call counts
        try:
            result = original(module, mode)
        finally:
            self._depth -= 1
        self._switch_mode(module, mode)
        self._track_eval_mode(module, mode)
        return result

    @_guarded
    def _switch_mode(self, module: torch.nn.Module, training: bool) -> None:
        if not training and id(module) not in self._evaluating:
            self._evaluating[id(module)] = module.register_forward_hook(self._eval_forward)
        elif training and id(module) in self._evaluating:
            self._evaluating.pop(id(module)).remove()
            if not self._evaluating:
                self._judge_evaluation()

    @_guarded
    def _eval_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled() and not module.training and any(t.grad_fn is not None for t in _tensors(output)):
            line = self._line()
            self._eval_graphs[line] = self._eval_graphs.get(line, 0) + 1

    def _judge_evaluation(self) -> None:
        """GL009: model calls in eval mode recorded graphs, and no backward used any while evaluating."""
        if not self._eval_backward:
            for line, count in self._eval_graphs.items():
                self.report(
                    "GL009",
                    line,
                    f"{count} call(s) in eval mode with gradients on recorded autograd graphs no backward used",
                )
        self._eval_graphs.clear()
        self._eval_backward = False

    # -- constants of a loss that carry a gradient (GL017) -----------------------------------

    @_guarded
    def _inspect_target(self, hint: Hint, frame: FrameType) -> None:
        """GL017: about to run a target's line; see whether the target there has a grad_fn."""
        text = _hint_source(self.script, hint).strip()
        expression = _parsed(text)
        if expression is None:
            return
        if _pure(expression):
            # Ex) `advantages` in -(log_probs * advantages).mean(): names and arithmetic, safe to evaluate
            try:
                value = eval(compile(expression, self.script, "eval"), frame.f_globals, frame.f_locals)
            except Exception:  # noqa: BLE001  (a name bound later on the line, a comprehension's variable)
                return
            self._judge_target(hint, text, value)
            return
        assigned = _assigned_name(linecache.getline(self.script, hint.line), expression)
        if assigned is not None and not self.lines.watching(frame, assigned):
            # Ex) target = r + gamma * target_net(s2).max(1)[0]: judged once the line assigned it
            def assigned_value(old: object, value: object, line: int) -> bool:
                self._judge_target(hint, text, value)
                return False

            self.lines.watch(Watch(frame, assigned, assigned_value))

    def _judge_target(self, hint: Hint, text: str, value: object) -> None:
        with_history = [t for t in _tensors(value) if t.grad_fn is not None]
        if with_history:
            name = type(with_history[0].grad_fn).__name__
            shown = text if len(text) <= 60 else text[:59] + "…"
            self._with_grad[hint.line] = f"`{shown}` had a grad_fn ({name}) when the loss was backpropagated"
        else:
            self._with_grad.pop(hint.line, None)

    def _confirm_targets(self) -> None:
        """GL017: the targets whose lines ran in this step still carried history at this backward."""
        for hint in self.hints:
            evidence = self._with_grad.get(hint.line) if hint.code == "GL017" else None
            if evidence and self.lines.ran_since(hint.line, hint.end_line, backwards=self.backwards):
                self.report("GL017", hint.line, evidence)

    @_guarded
    def _track_eval_mode(self, module: torch.nn.Module, training: bool) -> None:
        """GL016: note a module the script puts in eval mode after a backward ran in train mode."""
        if training:
            for sub in module.modules():
                self._train_since[id(sub)] = self.backwards
            for key in [key for key, left in self._left_in_eval.items() if (m := left.module()) is None or m.training]:
                del self._left_in_eval[key]
            return
        lines = [frame.f_lineno for frame in self._frames()]
        if lines and self.backwards > self._train_since.get(id(module), 0):
            params = {id(p) for p in module.parameters() if p.requires_grad}
            self._left_in_eval[id(module)] = _LeftInEval(weakref.ref(module), params, lines)

    def _check_training_in_eval(self, before: dict[int, Any], line: int) -> None:
        """GL016: this backward gave gradients to a module the script left in eval mode."""
        for key, left in list(self._left_in_eval.items()):
            module = left.module()
            trained = any(_received_grad(*before[pid]) for pid in left.params if pid in before)
            if module is None or module.training or not trained:
                continue
            del self._left_in_eval[key]
            hints = [
                h.line for h in self.hints if h.code == "GL016" and any(h.line <= n <= h.end_line for n in left.lines)
            ]
            message = (
                f"the backward at line {line} trained a {type(module).__name__} still in eval mode since line "
                f"{left.lines[0]}: dropout and batch norm ran in inference behaviour"
            )
            for at in hints or left.lines[:1]:
                self.report("GL016", at, message)

    def finish(self) -> None:
        """Report what is still pending when the script ends: leaks, an evaluation that never switched back."""
        self._end_manual_step(stop=False)
        for line, evidence in self._leaks.values():
            self.report("GL001", line, evidence)
        self._leaks.clear()
        if self._evaluating:
            self._judge_evaluation()
        self.events.emit("coverage", lines=sorted(self.lines.hits))


_PURE_NODES = (
    ast.Expression, ast.Name, ast.Attribute, ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Constant, ast.Load,
    ast.Tuple, ast.Slice, ast.operator, ast.unaryop,
)  # fmt: skip


def _pure(expression: ast.Expression) -> bool:
    """Whether evaluating the expression again runs nothing of the script's: no call, no comprehension."""
    return all(isinstance(node, _PURE_NODES) for node in ast.walk(expression))


def _hint_source(script: str, hint: Hint) -> str:
    """The source of a finding's expression, from its line and columns (empty when it spans lines)."""
    if hint.end_line != hint.line or hint.column < 1:
        return ""
    return linecache.getline(script, hint.line)[hint.column - 1 : hint.end_column - 1]


def _parsed(text: str) -> ast.Expression | None:
    try:
        return ast.parse(text, mode="eval") if text else None
    except SyntaxError:
        return None


def _assigned_name(line: str, value: ast.Expression) -> str | None:
    """`target` for a line `target = VALUE` (or `self.target = VALUE`) whose whole value is `value`."""
    try:
        statement = ast.parse(line.strip())
    except SyntaxError:
        return None
    if len(statement.body) != 1 or not isinstance(statement.body[0], ast.Assign):
        return None
    assign = statement.body[0]
    if len(assign.targets) != 1 or ast.unparse(assign.value) != ast.unparse(value.body):
        return None
    target = assign.targets[0]
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return f"self.{target.attr}"
    return None


def _received_grad(param: torch.Tensor, old_grad: torch.Tensor | None, old_version: int) -> bool:
    """Whether a backward gave `param` a gradient: a new `.grad`, or one accumulated into in place."""
    return param.grad is not None and (param.grad is not old_grad or _version(param.grad) != old_version)


def _retains(args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> bool:
    """Whether a backward call passes `retain_graph=True` (at `index`) without `create_graph`.

    Graphs kept by `create_graph=True` are meant for higher-order gradients, so they are not judged.
    """
    retain = kwargs.get("retain_graph", args[index] if len(args) > index else None)
    create = kwargs.get("create_graph", args[index + 1] if len(args) > index + 1 else False)
    return bool(retain) and not create


def _derived_from(value: torch.Tensor, leaf: object) -> bool:
    """Whether `value`'s history starts at `leaf` (a leaf's AccumulateGrad node holds it as `.variable`)."""
    accumulators = [node for node in nodes(value.grad_fn, limit=256) if is_accumulate(node)]
    return any(node.variable is leaf for node in accumulators)  # type: ignore[attr-defined]  # only AccumulateGrad


def _first_sentence(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first.split(". ")[0].rstrip(".")


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


@functools.cache
def _assigned_names(script: str) -> dict[int, list[str]]:
    """Per line of the script: the names (`x`, `self.x`) bound by the innermost assignment spanning it."""
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    spans: dict[int, tuple[int, list[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [ast.unparse(target) for target in targets if isinstance(target, (ast.Name, ast.Attribute))]
        width = (node.end_lineno or node.lineno) - node.lineno
        for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            if number not in spans or width < spans[number][0]:
                spans[number] = (width, names)
    return {number: names for number, (_, names) in spans.items()}


def _without_history(value: object, params: set[int]) -> str | None:
    """How a term's value shows it has no gradient (a number, a tensor without history, a new leaf), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return f"is a Python number ({value:.4g})"
    if type(value).__module__ == "numpy":
        return "is a NumPy value"
    if not isinstance(value, torch.Tensor) or value.grad_fn is not None:
        return None
    if not value.requires_grad:
        return "is a tensor without autograd history"
    return None if id(value) in params else "is a new leaf tensor that no optimizer holds"


def _scalar(tensor: torch.Tensor) -> float | None:
    """The value of a real one-element tensor, None for any other (a non-scalar root, a meta tensor)."""
    if tensor.numel() != 1 or tensor.is_complex() or tensor.is_meta:
        return None
    return float(tensor.item())


def _version(tensor: torch.Tensor | None) -> int:
    return -1 if tensor is None else int(tensor._version)


def _shares(first: torch.optim.Optimizer, second: torch.optim.Optimizer) -> bool:
    ids = {id(p) for group in first.param_groups for p in group["params"]}
    return any(id(p) in ids for group in second.param_groups for p in group["params"])


def _norms(params: list[torch.Tensor]) -> list[float | None]:
    """The L2 norm of each parameter's gradient (None when it has none), with one sync per device."""
    norms: list[float | None] = [None] * len(params)
    groups: dict[tuple[torch.device, torch.dtype, bool], list[int]] = {}
    for index, param in enumerate(params):
        grad = param.grad
        if grad is not None:
            groups.setdefault((grad.device, grad.dtype, grad.is_sparse), []).append(index)
    with torch.no_grad():
        for (_, _, sparse), indices in groups.items():
            grads = [_dense(params[i].grad) for i in indices]
            found = [g.norm() for g in grads] if sparse else list(torch._foreach_norm(grads))
            for index, value in zip(indices, torch.stack(found).float().tolist(), strict=True):
                norms[index] = float(value)
    return norms


def _dense(grad: torch.Tensor | None) -> torch.Tensor:
    assert grad is not None
    return grad.coalesce().values() if grad.is_sparse else grad
