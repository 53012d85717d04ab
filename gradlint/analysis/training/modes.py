"""Train and eval mode switches, and the training forwards an eval mode left behind reaches.

Per scope, a *timeline* lists in evaluation order what happens to module modes: a
switch to eval (`model.eval()`, `model.train(False)`), a switch back (`model.train()`,
also `model.train(was_training)`, whose mode is unknown: it counts as a restore), and
each training pass (a backward, with the models whose forward feeds it). A call of a
same-module function or method takes its timeline in, bound to the call's arguments
(`evaluate(net)` evaluates `net`); a call of a function in another module of the
project takes the train/eval/backward effects of its summary, followed through the
functions it calls (an evaluation helper has no gradient effect, so the whole-program
model does not expand it on its own).

A *leak* is an eval switch inside a loop whose path to a training pass of the same
model, through the rest of the iteration and around the loop, meets no switch back.
An eval switch of a submodule right after the parent's `train()` (freezing batch norm
while fine-tuning) is meant to last and is no leak, nor is an eval switch in the other
branch of an `if` that switches to train (`model.train() if training else model.eval()`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

import libcst as cst

from gradlint.analysis.facts.forwards import ForwardCalls
from gradlint.analysis.facts.steps import Event, EventIndex, Kind, rebound, switched_off_at
from gradlint.analysis.project.program import ModuleProgram
from gradlint.analysis.project.summaries import EVAL, TRAIN
from gradlint.analysis.syntax.collect import Collected, Context, Loop, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in
from gradlint.analysis.syntax.refs import all_params

if TYPE_CHECKING:
    pass

MAX_DEPTH = 4
SELF = frozenset({"self", "cls"})
# Hugging Face's `from_pretrained` hands the model back in eval mode: transformers'
# PreTrainedModel and diffusers' ModelMixin call `model.eval()` after loading the weights.
EVAL_LOADERS = ("transformers.", "diffusers.")
# Calls that take a model without switching its mode (`accelerator.prepare(unet, text_encoder, opt)`).
MODE_KEEPING = frozenset({"prepare", "unwrap_model", "chain", "list", "len", "print", "id", "isinstance"})


class Mode(Enum):
    """What a timeline entry does."""

    TRAIN = "train"
    EVAL = "eval"
    TRAINING = "training"  # a backward through the forwards of `models`


@dataclass(frozen=True)
class Mark:
    """One timeline entry: `node` does it, `site` is where it runs in the judged scope (the helper call)."""

    mode: Mode
    models: tuple[cst.BaseExpression, ...]
    node: cst.CSTNode
    site: cst.CSTNode
    loops: tuple[Loop, ...]
    index: int = 0  # its place among the entries of one site
    forward: cst.CSTNode | None = None  # of a TRAINING mark: the first forward that feeds its backward

    def names(self) -> set[str]:
        """The dotted names of the models, `self` alone left out."""
        return {key for model in self.models if (key := dotted_name(model)) is not None and key not in SELF}


@dataclass(frozen=True)
class Leak:
    """An eval switch in `loop` that reaches `training` without a switch back."""

    switch: Mark
    training: Mark
    loop: Loop
    model: str


@dataclass(frozen=True)
class LoadedInEval:
    """A model `from_pretrained` returned in eval mode, whose forward `forward` is trained with no `train()`."""

    load: cst.Call
    model: str
    forward: cst.Call


Region = Loop | cst.FunctionDef
Backpropagated = Callable[[Region], set[str]]


class ModeSwitches:
    """Finds eval switches whose mode leaks into later training passes."""

    def __init__(
        self,
        collected: Collected,
        events: EventIndex,
        backpropagated: Backpropagated,
        rebinds: Callable[[Region, str], bool],
        updated_models: Callable[[cst.BaseExpression], frozenset[str]],
        updated_models_in: Callable[[cst.BaseExpression, Scope], frozenset[str]],
        updates_only_tensors: Callable[[cst.BaseExpression], bool],
        program: ModuleProgram | None = None,
    ) -> None:
        self.collected = collected
        self.events = events
        self.program = program
        self.backpropagated = backpropagated
        self.rebinds = rebinds
        self.updated_models = updated_models
        self.updated_models_in = updated_models_in
        self.updates_only_tensors = updates_only_tensors
        self.forwards = ForwardCalls(collected, events.roles, events)
        self._timelines: dict[Scope, tuple[Mark, ...]] = {}

    def leaks(self) -> list[Leak]:
        """Every eval switch that leaks, one per site, in source order."""
        found: dict[cst.CSTNode, Leak] = {}
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        for scope in scopes:
            if not any(event.kind is Kind.BACKWARD and event.loops for event in self.events.scope_events(scope)):
                continue  # no training loop here: helpers and other modules are followed only from one
            timeline = self.timeline(scope)
            for mark in timeline:
                if mark.mode is Mode.EVAL and mark.site not in found:
                    leak = self._leak(scope, mark, timeline)
                    if leak is not None:
                        found[mark.site] = leak
        return sorted(found.values(), key=lambda leak: self.collected.order[leak.switch.site])

    def loaded_in_eval(self) -> list[LoadedInEval]:
        """Models loaded by a Hugging Face `from_pretrained` and trained in the same scope, never switched to train.

        Ex) `text_encoder = CLIPTextModel.from_pretrained(...)` optimized and called in the step loop. Quiet
        when anything may switch it: a `train()` of it (or of a holder) anywhere in the scope's timeline, an
        assignment of another model to the name, or the model handed to a call (a helper, a wrapper) or
        put in a collection (`for m in (unet, text_encoder): m.train()`).
        """
        found = []
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        for scope in scopes:
            steps = [e for e in self.events.scope_events(scope) if e.kind is Kind.STEP and e.loops and e.direct]
            if not steps:
                continue
            for load, key in self._eval_loads(scope):
                forward = self._trained_forward(scope, key, steps)
                if forward is not None and not self._may_switch(scope, key, load):
                    found.append(LoadedInEval(load, key, forward))
        return found

    def _eval_loads(self, scope: Scope) -> list[tuple[cst.Call, str]]:
        loads = []
        for call in self.collected.calls_in_scope(scope):
            qualified = self.collected.imports.resolve(call.func) or ""
            if not (qualified.startswith(EVAL_LOADERS) and qualified.endswith(".from_pretrained")):
                continue
            statement = self.collected.statement_of.get(call)
            if not isinstance(statement, cst.Assign) or statement.value is not call or len(statement.targets) != 1:
                continue
            key = dotted_name(statement.targets[0].target)
            if key is not None and not self.events.context(call).loops:
                loads.append((call, key))
        return loads

    def _trained_forward(self, scope: Scope, key: str, steps: Sequence[Event]) -> cst.Call | None:
        """The first forward of `key` with autograd on in a loop whose optimizer updates `key`'s parameters."""
        for step in steps:
            loop = step.loops[-1]
            if step.value is None or key not in self.updated_models_in(step.value, scope):
                continue
            for call in self.collected.calls_in_loop(loop):
                context = self.events.context(call)
                if context.scope is scope and not context.no_grad and dotted_name(call.func) in (key, key + ".forward"):
                    return call
        return None

    def _may_switch(self, scope: Scope, key: str, load: cst.Call) -> bool:
        trains = (mark for mark in self.timeline(scope) if mark.mode is Mode.TRAIN)
        if any(_related(key, name) for mark in trains for name in mark.names()):
            return True
        loaded = self.collected.statement_of[load]
        for statement in self.collected.statements_in_scope(scope):
            if statement is not loaded and key in _bound_names(statement) and not _reads(statement, key):
                return True  # another model under the same name
            if isinstance(statement, (cst.Assign, cst.Expr)) and _holds(statement.value, key):
                return True  # Ex) models = [unet, text_encoder]
        for call in self.collected.calls_in_scope(scope):
            handed = any(dotted_name(arg.value) == key for arg in call.args)
            if handed and last_name(call.func) not in MODE_KEEPING:
                return True
        loops = (loop for loop in self.collected.loops if self.events.context(loop).scope is scope)
        return any(isinstance(loop, cst.For) and _holds(loop.iter, key) for loop in loops)

    # The timeline of a scope.

    def timeline(self, scope: Scope, depth: int = 0) -> tuple[Mark, ...]:
        """The mode marks of `scope` in order, helpers taken in."""
        if scope in self._timelines:
            return self._timelines[scope]
        self._timelines[scope] = ()  # recursion guard
        marks: list[Mark] = []
        for item in self.events.items_of(scope):
            found = self._marks_at(item, depth) if isinstance(item, cst.Call) else []
            marks.extend(replace(mark, index=index) for index, mark in enumerate(found))
        marks.extend(self._trainings(scope))
        marks.sort(key=self._position)
        self._timelines[scope] = tuple(marks)
        return self._timelines[scope]

    def _position(self, mark: Mark) -> tuple[int, int]:
        return self.collected.order[mark.site], mark.index

    def _marks_at(self, call: cst.Call, depth: int) -> list[Mark]:
        context = self.events.context(call)
        helper = self._helper(call)
        if helper is not None:
            return self._inline(helper, call, depth) if depth < MAX_DEPTH else []
        mode = switch_mode(call)
        if mode is not None:
            assert isinstance(call.func, cst.Attribute)
            return [Mark(mode, (call.func.value,), call, call, context.loops)]
        return self._from_outside(call)

    def _helper(self, call: cst.Call) -> cst.FunctionDef | None:
        """The same-module function `call` runs; a bare name is also looked up in the enclosing functions
        (`_eval_epoch()` called from its sibling closure `_train_epoch`)."""
        found = self.events.resolve_helper(call) or self.events.resolve_instance_method(call)
        scope = self.events.context(call).scope
        while found is None and isinstance(call.func, cst.Name) and isinstance(scope, cst.FunctionDef):
            scope = self.collected.def_scopes[scope]
            found = self.events.resolve_name(call.func, Context(scope))
        return found

    def _inline(self, helper: cst.FunctionDef, call: cst.Call, depth: int) -> list[Mark]:
        context = self.events.context(call)
        off = switched_off_at(helper, call)
        exits = self.events.exits_without(helper, off)
        marks = []
        for mark in self.timeline(helper, depth + 1):
            inner = self.events.context(mark.node)
            if inner.scope is helper and off and self.events.needs_any(mark.node, inner.ifs, off, exits):
                continue  # Ex) evaluate(model, train=False), or run_epoch("val"), never runs `model.train()`
            if inner.scope is helper and any(self._copied(model, helper, mark.node) for model in mark.models):
                continue  # Ex) `model = copy.deepcopy(model)` first: the caller's model keeps its mode
            models = tuple(self._held(rebound(model, helper, call) or model, call) for model in mark.models)
            marks.append(replace(mark, models=models, site=call, loops=context.loops + mark.loops))
        return marks

    def _trainings(self, scope: Scope) -> list[Mark]:
        """For each backward written in `scope`, a TRAINING mark at the first forward of each model that reaches it."""
        marks = []
        for event in self.events.scope_events(scope):
            context = self.events.context(event.node)
            if event.kind is not Kind.BACKWARD or not event.direct or context.scope is not scope:
                continue
            region: Region | None = context.loops[-1] if context.loops else context.function
            if region is None:
                continue
            forwards = [
                (call, found) for call in self._trained_forwards(region, event.node) if (found := self._forwarded(call))
            ]
            optimized = self._optimized(scope, context.loops[-1] if context.loops else None)
            kept = [(call, found) for call, found in forwards if optimized and _optimized_any(found, optimized)]
            # None kept: the optimizer was built where the models have other names; an empty set: the optimizers
            # train tensors only (inputs, a perturbation), so no model trains here.
            forwards = (kept or forwards) if optimized is None or optimized else []
            # A model trains from its first forward in the step on: an eval switch between that forward and the
            # backward (a validation run mid-step) no longer changes the mode this step's graph was recorded in,
            # and a data helper run before `model.train()` (`mask_tokens(inputs, tokenizer)`) trains no model.
            seen: set[str] = set()
            for call, found in forwards:
                first = [model for model in found if (dotted_name(model) or str(id(model))) not in seen]
                seen |= {dotted_name(model) or str(id(model)) for model in first}
                if first:
                    marks.append(Mark(Mode.TRAINING, tuple(first), event.node, call, context.loops, forward=call))
        return marks

    def _optimized(self, scope: Scope, loop: Loop | None) -> set[str] | None:
        """The models the optimizers stepped in `loop` (or `scope`) were built on (`Adam(decoder.parameters())`);
        None when one is not known. A frozen encoder whose output feeds the loss is no trained model; an optimizer
        built on tensors only (`Adam([delta])`) trains no model: an empty set when every step is one."""
        models: set[str] = set()
        steps = 0
        for event in self.events.scope_events(scope):
            if event.kind is not Kind.STEP or (loop is not None and loop not in event.loops):
                continue
            steps += 1
            found = self.updated_models(event.value) if event.value is not None else frozenset()
            if not found and not (event.value is not None and self.updates_only_tensors(event.value)):
                return None
            models |= found
        return models if steps else None

    def _trained_forwards(self, region: Region, backward: cst.CSTNode) -> list[cst.Call]:
        """The calls of `region` outside no_grad whose result reaches `backward`."""
        names = self.backpropagated(region)
        if isinstance(region, cst.FunctionDef):
            calls = self.collected.calls_in_scope(region)
        else:
            calls = self.collected.calls_in_loop(region)
        scope = self.events.context(backward).scope
        statement = self._statement(backward)
        found = []
        end = self.collected.order.get(statement) if statement is not None else None
        for call in calls:
            context = self.events.context(call)
            if context.no_grad or context.scope is not scope:
                continue
            held = self.collected.statement_of.get(call)
            place = self.collected.order.get(held) if held is not None else None
            if place is not None and end is not None and place > end:
                continue  # after the backward: `logits = model(x)` again for validation feeds no graph of it
            bound = _bound_names(held) if held is not None else set()
            if held is statement or any(_covers(outer, name) for outer in bound for name in names):
                found.append(call)
        return found

    def _forwarded(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The models a call runs forward: its own module, a same-module helper's forwards, or its arguments."""
        if self.forwards.is_forward(call):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "forward":
                func = func.value
            return [func]
        helper = self._helper(call)
        if helper is not None:
            return [
                rebound(forward.func, helper, call) or forward.func
                for forward in self.collected.calls_in_scope(helper)
                if self.forwards.is_forward(forward) and not self.events.context(forward).no_grad
            ]
        program = self.program
        if program is None or program.callee_of(call, self.events.context(call), self.events) is None:
            # Ex) loss = self.model.compute_loss(x, y), backpropagated: the object ran its forward
            owner = call.func.value if isinstance(call.func, cst.Attribute) else None
            key = dotted_name(owner) if owner is not None else None
            if owner is None or key is None or key.split(".", 1)[0] in self.events.roles.imports.aliases:
                return []
            return [owner]
        receiver = [call.func.value] if isinstance(call.func, cst.Attribute) else []
        return [*receiver, *(arg.value for arg in call.args)]  # Ex) loss = compute_loss(model, batch)

    # Calls into other modules of the project.

    def _from_outside(self, call: cst.Call) -> list[Mark]:
        """The train, eval and backward effects of another module's function at `call`, in its order, from the
        whole-program model (`ModuleProgram.bound_effects`: its own calls followed, ports bound here)."""
        program = self.program
        context = self.events.context(call)
        bound = program.bound_effects(call, context, self.events) if program is not None else None
        if bound is None:
            return []
        _, effects = bound
        arguments = tuple(arg.value for arg in call.args)
        if isinstance(call.func, cst.Attribute):
            arguments = (call.func.value, *arguments)
        marks: list[Mark] = []
        evaluated: set[str] = set()  # what the function itself has put in eval mode so far
        for effect, model in effects:
            if effect.kind == Kind.BACKWARD.value:
                # Which arguments' forwards feed the backward, the summary does not say; one the function put in
                # eval itself before it (a teacher it runs under no_grad) is meant to be there.
                trained = tuple(argument for argument in arguments if dotted_name(argument) not in evaluated)
                if not marks or marks[-1].mode is not Mode.TRAINING:
                    marks.append(Mark(Mode.TRAINING, trained, call, call, context.loops))
            elif effect.kind in (TRAIN, EVAL) and model is not None:
                model = self._held(model, call)
                mode = Mode.EVAL if effect.kind == EVAL else Mode.TRAIN
                key = dotted_name(model)
                if key is not None:
                    (evaluated.add if mode is Mode.EVAL else evaluated.discard)(key)
                marks.append(Mark(mode, (model,), call, call, context.loops))
        return marks

    def _copied(self, model: cst.BaseExpression, helper: cst.FunctionDef, at: cst.CSTNode) -> bool:
        """Whether `model`, a parameter of `helper` (or an attribute of one), holds a deep copy at `at`."""
        head = (dotted_name(model) or "").split(".", 1)[0]
        return head in all_params(helper) - SELF and self.events.holds_deep_copy(head, at)

    def _held(self, model: cst.BaseExpression, site: cst.CSTNode) -> cst.BaseExpression:
        """The caller's name for a model a helper switches on an object it was built with (`evaluator.model` after
        `evaluator = Evaluator(model)` is `model`), else the model as it is."""
        return self.events.constructed_with(model, site) or model

    # Judging one eval switch.

    def _leak(self, scope: Scope, switch: Mark, timeline: Sequence[Mark]) -> Leak | None:
        if self._paired(switch, timeline):
            return None
        own = [loop for loop in switch.loops if self.events.context(loop).scope is scope]
        for loop in reversed(own):
            inside = [mark for mark in timeline if loop in mark.loops]
            trainings = [(mark, key) for mark in inside if (key := self._trains(switch, mark)) is not None]
            if not trainings:
                continue
            for training, key in trainings:
                if self._judged_inside(switch, training, scope):
                    continue  # the helper's own timeline judges them
                if self._rebuilt(loop, key):
                    continue  # Ex) `trainer = Trainer(model=Net())` in the loop: each pass trains a new one
                if not self._restored(switch, training, inside) and not self._freezes(switch, training, inside):
                    return Leak(switch, training, loop, key)
            return None
        return None

    def _rebuilt(self, loop: Loop, key: str) -> bool:
        """Whether the loop binds the model (or an object that holds it) afresh."""
        parts = key.split(".")
        return any(self.rebinds(loop, ".".join(parts[:end])) for end in range(1, len(parts) + 1))

    def _trains(self, switch: Mark, mark: Mark) -> str | None:
        """The model `mark` trains that `switch` puts in eval mode (it or a parent or a child of it)."""
        if mark.mode is not Mode.TRAINING:
            return None
        for evaluated in switch.names():
            for trained in mark.names():
                if _related(evaluated, trained):
                    return evaluated
        return None

    def _restored(self, switch: Mark, training: Mark, inside: Sequence[Mark]) -> bool:
        """Whether a switch back to train of the model lies on the path from `switch` to `training`."""
        start, end = self._position(switch), self._position(training)
        for mark in inside:
            if mark.mode is not Mode.TRAIN or not _restores(mark, switch):
                continue
            position = self._position(mark)
            on_path = start < position < end if start < end else position > start or position < end
            if on_path:
                return True
        return False

    def _freezes(self, switch: Mark, training: Mark, inside: Sequence[Mark]) -> bool:
        """An eval switch of a submodule after the parent's `train()`, no training between: frozen on purpose."""
        if switch.names() & training.names():
            return False
        start = self._position(switch)
        before = [mark for mark in inside if self._position(mark) < start]
        for mark in reversed(before):
            if mark.mode is Mode.TRAINING:
                return False
            if mark.mode is Mode.TRAIN and _restores(mark, switch):
                return True
        return False

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.collected.statement_of.get(node) if isinstance(node, cst.Call) else node

    def _paired(self, switch: Mark, timeline: Sequence[Mark]) -> bool:
        """Whether a switch to train sits in the other branch of an `if` (or of `a if c else b`)."""
        for mark in timeline:
            if mark.mode is not Mode.TRAIN or not mark.names() & switch.names():
                continue
            if self._statement(mark.node) is self._statement(switch.node):
                return True
            same_scope = self.events.context(mark.node).scope is self.events.context(switch.node).scope
            if same_scope and self.collected.exclusive(mark.node, switch.node):
                return True
        return False

    def _judged_inside(self, switch: Mark, training: Mark, scope: Scope) -> bool:
        """Whether both run in one loop of a helper: that helper's own timeline judges them."""
        return any(
            loop in training.loops and self.events.context(loop).scope is not scope
            for loop in switch.loops
            if switch.site is training.site
        )


def switch_mode(call: cst.Call) -> Mode | None:
    """EVAL for `m.eval()` and `m.train(False)`, TRAIN for `m.train()` and `m.train(flag)`, on a named module."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in ("eval", "train"):
        return None
    if dotted_name(func.value) is None:
        return None  # Net().eval() builds a module in eval mode: it switches no model
    if func.attr.value == "eval":
        return None if call.args else Mode.EVAL  # eval(...) with arguments is no nn.Module.eval()
    first = call.args[0].value if call.args else None
    return Mode.EVAL if isinstance(first, cst.Name) and first.value == "False" else Mode.TRAIN


def _restores(train: Mark, switch: Mark) -> bool:
    """Whether the `train()` of `train` switches back the modules `switch` evaluates; a module's `self.train()`
    switches every submodule it holds (`self.model.running_mean_std`)."""
    outers = train.names() | ({"self"} if any(dotted_name(model) == "self" for model in train.models) else set())
    return any(_covers(outer, inner) for outer in outers for inner in switch.names())


def _optimized_any(models: Sequence[cst.BaseExpression], optimized: set[str]) -> bool:
    """Whether one of `models` holds parameters of an optimized model (or is held by one)."""
    return any(_related(key, other) for model in models if (key := dotted_name(model)) for other in optimized)


def _related(evaluated: str, trained: str) -> bool:
    return _covers(evaluated, trained) or _covers(trained, evaluated)


def _covers(outer: str, inner: str) -> bool:
    """Whether switching `outer` switches `inner`: the same module or a parent of it."""
    return inner == outer or inner.startswith(outer + ".")


def _reads(statement: cst.CSTNode, key: str) -> bool:
    """Whether an assignment's value reads `key` or an attribute of it (`m = m.to(device)`)."""
    value = statement.value if isinstance(statement, (cst.Assign, cst.AnnAssign, cst.AugAssign)) else None
    if value is None:
        return False
    return any(name == key or name.startswith(key + ".") for name in names_in(value))


def _holds(node: cst.BaseExpression | None, key: str) -> bool:
    """Whether `node` is a literal collection with `key` among its elements."""
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return any(dotted_name(element.value) == key for element in node.elements)
    return False


def _bound_names(statement: cst.CSTNode) -> set[str]:
    """The dotted names a statement assigns, tuples unpacked."""
    targets: list[cst.BaseExpression] = []
    if isinstance(statement, cst.Assign):
        targets = [target.target for target in statement.targets]
    elif isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
        targets = [statement.target]
    names: set[str] = set()
    while targets:
        target = targets.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            targets.extend(element.value for element in target.elements)
        elif isinstance(target, cst.StarredElement):
            targets.append(target.value)
        elif (key := dotted_name(target)) is not None:
            names.add(key)
    return names


__all__ = ["Leak", "LoadedInEval", "Mark", "Mode", "ModeSwitches", "switch_mode"]
