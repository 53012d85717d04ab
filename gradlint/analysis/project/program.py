"""The whole program: the linted project's modules, their summaries, and calls resolved across them.

Shaped after Pysa's models and mypy's incremental mode (see shared/STYLE.md §9):

- A `Project` (`gradlint.project`) finds modules on disk from the linted files: the directory above a file's
  top package, the file's own directory (a script imports its siblings), `src/`
  layouts, and the checkout's top where that is a package itself. It resolves absolute
  and relative imports, `__init__` re-exports and `from x import *` to the module that
  defines a name. Nothing outside the project
  (site-packages) is read: such calls keep the per-module assumptions.
- A module's `ModuleSummary` is computed from its own code (`summaries.summarize`),
  on demand, once per process, and cached on disk by content hash.
- `Program.effects` applies callee summaries at call sites, binding arguments to ports,
  to a fixed point over recursive calls (no depth limit: the effects of a function are
  drawn from a finite set, so iteration stops).
- Every summary a judgement reads is recorded (`Program.used`), so that a cached result
  is reused only while those summaries are unchanged.

Reading a file is all this does: no linted code is imported or run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import libcst as cst

from gradlint.analysis.facts.steps import Event, EventIndex, Kind
from gradlint.analysis.project.summaries import CALL, Effect, FunctionSummary, ModuleSummary, from_data, to_data
from gradlint.analysis.syntax.collect import Collected, Context
from gradlint.analysis.syntax.names import ImportMap, dotted_name
from gradlint.analysis.syntax.refs import MAX_PORT_PARTS, OFF_FALSE, OFF_NONE, call_ref, name_ref
from gradlint.index import CALLERS, Outlines, Ref

V = TypeVar("V")
# Between the alternatives of a port that a wrapper spreads: `args[1]|kwargs[opt]`.
EITHER = "|"
# A recursive group whose effects still change after this many rounds keeps its last round.
MAX_ROUNDS = 12


@dataclass(frozen=True)
class Callee:
    """A function of the project a call runs, with its transitively resolved effects."""

    module: str
    qualname: str
    summary: FunctionSummary
    effects: tuple[Effect, ...]

    @property
    def origin(self) -> str:
        """`module.qualname`, how messages name the callee."""
        return f"{self.module}.{self.qualname}"


Summarize = Callable[[bytes, str], "ModuleSummary | None"]


class SummaryStore(Protocol):
    """Where summaries outlive a run (the engine's `gradlint.cache.SummaryStore`): keyed by a module's bytes."""

    def key(self, data: bytes) -> str: ...

    def get(self, key: str) -> Any: ...

    def put(self, key: str, summary: Any) -> None: ...


class Program:
    """Summaries of the project's modules and the effects of calls between them.

    Calls are resolved through the modules' outlines (`gradlint.index.Outlines`); a
    function is summarized with LibCST only when its outline says it may affect
    gradients. `summarize(data, path)` turns a module's bytes into its summary (None: it
    cannot be read); the engine passes one that parses with LibCST.
    """

    def __init__(self, outlines: Outlines, summarize: Summarize, *, store: SummaryStore | None = None) -> None:
        self.outlines = outlines
        self.project = outlines.project
        self._summarize = summarize
        self.store = store
        self._summaries: dict[str, ModuleSummary | None] = {}
        self._effects: dict[tuple[str, str], tuple[Effect, ...]] = {}
        self._approximate: dict[tuple[str, str], tuple[Effect, ...]] = {}
        self._active: list[tuple[str, str]] = []
        self._read_active: set[tuple[str, str]] = set()
        self._effect_reads: dict[tuple[str, str], frozenset[str]] = {}
        self._interfaces: dict[tuple[str, bool], str] = {}

    def summary(self, module: str) -> ModuleSummary | None:
        """The LibCST summary of a project module: computed (or loaded from the store) on first use."""
        if module not in self._summaries:
            source = self.outlines.source(module)
            self._summaries[module] = self.summarize(source[1], str(source[0])) if source is not None else None
        return self._summaries[module]

    def summarize(self, data: bytes, path: str) -> ModuleSummary | None:
        """The summary of the module file `path` holding `data`: from the store, or computed and stored."""
        if self.store is None:
            return self._summarize(data, path)
        key = self.store.key(data)
        cached = self.store.get(key)
        if cached is not None:
            try:
                return from_data(cached)
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # written by another version of the format: computed again
        summary = self._summarize(data, path)
        if summary is not None:
            self.store.put(key, to_data(summary))
        return summary

    def used(self, modules: Iterable[str]) -> dict[str, tuple[str, str, str]]:
        """{module: (path, content hash, interface)} for the project modules among `modules`: what a cached result
        depends on, and the digest of what it could read of each (`interface`)."""
        return {
            module: (path, digest, self.interface(module, summarized=self._summaries.get(module) is not None))
            for module, (path, digest) in self.outlines.used(modules).items()
        }

    def interface(self, module: str, *, summarized: bool) -> str:
        """A digest of what a judgement can read of `module`: its outline's interface, and its summary when
        `summarized` (`s:` then, else `o:`); a module that cannot be read has the empty interface."""
        key = (module, summarized)
        if key not in self._interfaces:
            face = self.outlines.outline_interface(module)
            if summarized:
                summary = self.summary(module)
                data = json.dumps(to_data(summary), sort_keys=True) if summary is not None else ""
                face = f"s:{face[2:]}:{hashlib.sha256(data.encode()).hexdigest()}"
            self._interfaces[key] = face
        return self._interfaces[key]

    def interface_now(self, module: str, recorded: str) -> str | None:
        """The interface `module` has now, of the kind `recorded` is (the one a cached entry holds)."""
        if not module.startswith(CALLERS) and self.outlines.read(module) is None:
            return None
        return self.interface(module, summarized=recorded.startswith("s:"))

    def function(self, module: str, qualname: str) -> FunctionSummary | None:
        """The summary of one function of the project: from LibCST when it deserves one (`Outlines.analysed`), else
        from its outline, which leaves what it returns unknown."""
        if self.outlines.analysed(module, qualname):
            summary = self.summary(module)
            return summary.functions.get(qualname) if summary is not None else None
        found = self.outlines.outline(module)
        function = found.function(qualname) if found is not None else None
        if function is None:
            return None
        return FunctionSummary(
            function.params,
            function.keyword_only,
            function.defaults_off,
            method=function.method,
            analysed=False,
            varargs=function.varargs,
            varkw=function.varkw,
        )

    def read_function(self, module: str, qualname: str) -> FunctionSummary | None:
        """The LibCST summary of one function wherever one may say more than its outline (`Outlines.analysed` or
        `Outlines.worth_reading`: what it keeps, what it builds); None elsewhere."""
        if not (self.outlines.analysed(module, qualname) or self.outlines.worth_reading(module, qualname)):
            return None
        summary = self.summary(module)
        return summary.functions.get(qualname) if summary is not None else None

    def callee(self, ref: Ref, module: str) -> Callee | None:
        """The project function `ref` names from `module`, with its resolved effects."""
        target = self.outlines.resolve(ref, module)
        if target is None:
            return None
        function = self.function(*target)
        if function is None:
            return None
        return Callee(target[0], target[1], function, self.effects(*target))

    # Effects, to a fixed point.

    def effects(self, module: str, qualname: str) -> tuple[Effect, ...]:
        """Everything the function does, calls to project functions applied, in order."""
        key = (module, qualname)
        if key in self._effects:
            self.outlines.note(self._effect_reads[key])
            return self._effects[key]
        if key in self._active:
            self._read_active.add(key)
            return self._approximate.get(key, ())
        if not self.outlines.affects(module, qualname):
            return ()
        self._active.append(key)
        reads = self.outlines.record()
        for _ in range(MAX_ROUNDS):
            self._read_active.discard(key)
            result = self._expand(module, qualname)
            stable = result == self._approximate.get(key)
            self._approximate[key] = result
            if key not in self._read_active or stable:
                break
        self._active.pop()
        self.outlines.stop(reads)
        if not (self._read_active & set(self._active)):
            self._effects[key] = result  # final: no caller still being computed was read as an approximation
            self._effect_reads[key] = frozenset(reads)
            self._approximate.pop(key, None)
        self.outlines.note(reads)
        return result

    def _expand(self, module: str, qualname: str) -> tuple[Effect, ...]:
        summary = self.summary(module)
        function = summary.functions.get(qualname) if summary is not None else None
        if function is None:
            return ()
        origin = f"{module}.{qualname}"
        found: list[Effect] = []
        for index, effect in enumerate(function.effects):
            if effect.kind != CALL:
                found.append(replace(effect, origin=effect.origin or origin))
                continue
            assert effect.callee is not None
            target = self.outlines.resolve(effect.callee, module)
            callee = self.function(*target) if target is not None else None
            if target is None or callee is None:
                continue
            arguments = dict(effect.args)
            positional = [bound for name, bound in effect.args if name.isdigit()]
            keywords = {name: bound for name, bound in effect.args if name.isidentifier() and name != "self"}
            binding = bind(callee, positional, keywords, arguments.get("self"))
            given = len(positional) + (callee.method and arguments.get("self") is not None)
            _spread_into(binding, callee.params[given:], callee.keyword_only, arguments.get("*"), arguments.get("**"))
            off = switched_off(callee, binding, _port_off, effect.star)
            for inner in self.effects(*target):
                if dropped(inner, off):
                    continue
                found.append(
                    replace(
                        inner,
                        port=_substitute(inner.port, binding),
                        repeated=inner.repeated or effect.repeated,
                        no_grad=inner.no_grad or effect.no_grad,
                        enables_grad=inner.enables_grad or effect.enables_grad,
                        needs=tuple(sorted({*effect.needs, *_lifted(inner.needs, binding)})),
                        needs_true=tuple(sorted({*effect.needs_true, *_lifted(inner.needs_true, binding)})),
                        arms=(*effect.arms, *(f"{index}/{arm}" for arm in inner.arms)),
                    )
                )
        return tuple(dict.fromkeys(found))


def bind(
    callee: FunctionSummary, positional: Sequence[V], keywords: Mapping[str, V], receiver: V | None
) -> dict[str, V]:
    """The callee's parameters mapped to the values a call gives them (missing: not given).

    What `*args` and `**kwargs` take is bound as `args[0]`, `args[1]`, ... and `kwargs[name]`:
    the ports through which a wrapper passes them on (`_spread_into`).
    """
    params = list(callee.params)
    bound: dict[str, V] = {}
    if receiver is not None and callee.method and params:
        bound[params.pop(0)] = receiver
    for name, value in zip(params, positional, strict=False):
        bound[name] = value
    if callee.varargs is not None:
        for index, value in enumerate(positional[len(params) :]):
            bound[f"{callee.varargs}[{index}]"] = value
    for name, value in keywords.items():
        if name in callee.params or name in callee.keyword_only:
            bound[name] = value
        elif callee.varkw is not None:
            bound[f"{callee.varkw}[{name}]"] = value
    return bound


def _spread_into(
    binding: dict[str, str | None],
    rest: Sequence[str],
    keyword_only: Sequence[str],
    args: str | None,
    kwargs: str | None,
) -> None:
    """Bind what a wrapper spreads (`inner(model, *args, **kwargs)`) to the callee's parameters that the call
    leaves open (`rest`: the positional ones after those given): the wrapper's `args[i]` and `kwargs[name]`
    ports, which its own callers bind (`bind`)."""
    for index, name in enumerate(rest):
        ports = ([f"{args}[{index}]"] if args else []) + ([f"{kwargs}[{name}]"] if kwargs else [])
        if ports:
            binding.setdefault(name, EITHER.join(ports))  # by position or by keyword: whichever the caller gives
    for name in keyword_only:
        if kwargs:
            binding.setdefault(name, f"{kwargs}[{name}]")


def switched_off(
    callee: FunctionSummary, binding: Mapping[str, V], off_value: Callable[[V], bool | None], star: bool
) -> dict[str, bool]:
    """Parameters that are None (True) or False (False) at a call: omitted with such a default, or given so."""
    if star:
        return {}
    off = {}
    for name, none in callee.defaults_off:
        if name not in binding:
            off[name] = none
    for name, value in binding.items():
        literal = off_value(value)
        if literal is not None:
            off[name] = literal
    return off


def dropped(effect: Effect, off: Mapping[str, bool]) -> bool:
    """Whether a switched-off parameter keeps `effect` from running."""
    return any(lookup(off, name) is True for name in effect.needs) or any(
        lookup(off, name) is False for name in effect.needs_true
    )


def lookup(binding: Mapping[str, V], key: str) -> V | None:
    """`binding[key]`, where a spread port names its alternatives (`args[1]|kwargs[opt]`): the first bound."""
    for alternative in key.split(EITHER):
        if alternative in binding:
            return binding[alternative]
    return None


def _port_off(port: str | None) -> bool | None:
    return True if port == OFF_NONE else False if port == OFF_FALSE else None


def _substitute(port: str | None, binding: Mapping[str, str | None]) -> str | None:
    """The caller's port for the callee's `port` (`opt.inner` with opt bound to `self.opt`)."""
    if port is None:
        return None
    head, _, rest = port.partition(".")
    base = lookup(binding, head)
    if base is None or base.startswith("="):
        return None
    result = f"{base}.{rest}" if rest else base
    return result if result.count(".") < MAX_PORT_PARTS else None


def _lifted(needs: tuple[str, ...], binding: Mapping[str, str | None]) -> set[str]:
    """The caller's parameters that a callee's `needs` pass through unchanged."""
    lifted = (lookup(binding, name) for name in needs)
    return {bound for bound in lifted if bound is not None and "." not in bound and "=" not in bound}


class ModuleProgram:
    """The whole program as seen from one module being judged: its calls into other modules."""

    def __init__(self, program: Program, module: str) -> None:
        self.program = program
        self.module = module
        self._callees: dict[cst.Call, Callee | None] = {}
        self._returned_roles: dict[str, str | None] = {}

    def callee_of(
        self, call: cst.Call, context: Context, events: EventIndex, view: cst.Call | None = None
    ) -> Callee | None:
        """The project function in another module (or a base class there) that `call` runs (as `view`, its
        `EventIndex.call_view`, writes it)."""
        if call not in self._callees:
            func = (view or call).func
            ref = call_ref(func, context, events.imports, events.instance_class(view or call, call))
            callee = self.program.callee(ref, self.module) if ref is not None else None
            self._callees[call] = (
                callee if (callee is not None and callee.module != self.module) or _via_base(ref) else None
            )
        return self._callees[call]

    def returns_cut(self, call: cst.Call, context: Context, events: EventIndex) -> bool:
        """Whether the project function in another module that `call` runs returns, at every `return`, a value cut
        from the autograd history it had (its summary's `returns_cut`)."""
        callee = self.callee_of(call, context, events)
        function = self.program.read_function(callee.module, callee.qualname) if callee is not None else None
        return function is not None and function.returns_cut

    def returned_role(self, dotted: str, imports: ImportMap) -> str | None:
        """The role (a `Role` value) of what the project function of another module that `dotted` names through
        `imports` returns, as its summary proves it (`make_optimizer(model)` building `torch.optim.Adam`)."""
        if dotted not in self._returned_roles:
            ref = name_ref(dotted, imports)
            target = self.program.outlines.resolve(ref, self.module) if ref is not None else None
            function = (
                self.program.read_function(*target)
                if target is not None and target[0] != self.module and not target[1].endswith(".__init__")
                else None
            )
            self._returned_roles[dotted] = function.returns_role if function is not None else None
        return self._returned_roles[dotted]

    def kept(self, call: cst.Call, context: Context, events: EventIndex) -> list[tuple[cst.BaseExpression, str]]:
        """The arguments the project method of another module that `call` runs keeps on its object, each with the
        attribute that holds it (its summary's `keeps`)."""
        callee = self.callee_of(call, context, events)
        if callee is None or not callee.summary.method:
            return []
        function = self.program.read_function(callee.module, callee.qualname)
        if function is None or not function.keeps:
            return []
        binding = self.binding(call, callee)
        return [(binding[param], attribute) for param, attribute in function.keeps if param in binding]

    def parameterless(self, dotted: str, imports: ImportMap) -> bool:
        """Whether the project class of another module that `dotted` names through `imports` is proven to hold no
        parameters (its module's summary says so)."""
        found = self._class_summary(dotted, imports)
        return found is not None and found[0] in found[1].parameterless

    def saves_output(self, dotted: str, imports: ImportMap) -> bool:
        """Whether the project class of another module that `dotted` names through `imports` returns from its
        forward a tensor an operation saved for backward (its module's summary says so)."""
        found = self._class_summary(dotted, imports)
        return found is not None and found[0] in found[1].saved_outputs

    def _class_summary(self, dotted: str, imports: ImportMap) -> tuple[str, ModuleSummary] | None:
        """The name of the project class of another module that `dotted` names through `imports`, and the summary
        of its module; None for a class of this module or no project class."""
        ref = name_ref(dotted, imports)
        target = self.program.outlines.class_of(ref, self.module) if ref is not None else None
        if target is None or target[0] == self.module:
            return None
        summary = self.program.summary(target[0])
        return (target[1], summary) if summary is not None else None

    def stored_argument(self, construction: cst.Call, attribute: str, imports: ImportMap) -> cst.BaseExpression | None:
        """What `construction`, a call of a project class of another module, passes for the `__init__` parameter that
        the class stores as `attribute` (its summary's `stores`); None where that is not shown."""
        dotted = dotted_name(construction.func)
        ref = name_ref(dotted, imports) if dotted is not None else None
        target = self.program.outlines.class_of(ref, self.module) if ref is not None else None
        if target is None or target[0] == self.module:
            return None
        summary = self.program.summary(target[0])
        init = summary.functions.get(f"{target[1]}.__init__") if summary is not None else None
        param = next((param for param, stored in init.stores if stored == attribute), None) if init else None
        if init is None or param is None:
            return None
        positional = [arg.value for arg in construction.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value: arg.value for arg in construction.args if arg.keyword is not None}
        return bind(init, positional, keywords, cst.Name("self")).get(param)

    def method_without_grad(self, cls: str, method: str) -> bool:
        """Whether every call of `self.<method>` that the class `cls` of this module and its project base classes make
        runs with autograd off, and there is one (`gradlint.index.Outlines.hierarchy_without_grad`)."""
        return self.program.outlines.hierarchy_without_grad(self.module, cls, method) is True

    def callers_without_grad(self, qualname: str) -> bool:
        """Whether every call the run's files make of this module's function `qualname` (`f`, `Class.method`) runs
        with autograd off, and there is one (`gradlint.index.Outlines.callers_without_grad`)."""
        return self.program.outlines.callers_without_grad(self.module, qualname)

    def runs_without_grad(self, dotted: str, method: str, imports: ImportMap) -> bool:
        """Whether `method` of the project class `dotted` names (through `imports`, or this module's own) runs with
        autograd off whoever calls it (`gradlint.index.Outlines.runs_without_grad`)."""
        ref = name_ref(dotted, imports, local_classes=True)
        return ref is not None and self.program.outlines.runs_without_grad(ref, self.module, method)

    def binds_other(self, dotted: str, attribute: str, imports: ImportMap) -> bool:
        """Whether the project class `dotted` names (through `imports`, or this module's own) binds `self.<attribute>`
        to something other than a Parameter, in its own methods or those of a project class it derives from."""
        ref = name_ref(dotted, imports, local_classes=True)
        return ref is not None and self.program.outlines.binds_other(ref, self.module, attribute)

    def class_bases(self, dotted: str, imports: ImportMap) -> tuple[str, ...] | None:
        """The base class names (transitively) of the project class that `dotted` names through `imports`; None when
        it names no class of the project."""
        ref = name_ref(dotted, imports)
        outlines = self.program.outlines
        if ref is None or not outlines.defines_class(ref, self.module):
            return None
        return outlines.bases(ref, self.module)

    def reached_tokens(self, collected: Collected, events: EventIndex, tokens: frozenset[bytes]) -> frozenset[bytes]:
        """Which of `tokens` the functions of other project modules that this module calls, and that may affect
        gradients, contain (their code runs here). Decided from outlines alone: summaries are made only for the
        calls rules then ask about."""
        outlines = self.program.outlines
        found: set[bytes] = set()
        for call in collected.calls:
            context = events.context(call)
            if not events.worth_following(context):
                continue  # its effects would not become events here (`EventIndex.worth_following`)
            view = events.call_view(call)
            classes: set[str | None] = set(events.possible_classes(view)) or {None}
            for ref in {call_ref(view.func, context, events.imports, cls) for cls in classes}:
                target = outlines.resolve(ref, self.module) if ref is not None else None
                if target is not None and (target[0] != self.module or _via_base(ref)):
                    found |= outlines.reached_tokens(*target, tokens)
            if found == tokens:
                break
        return frozenset(found)

    def bound_effects(
        self, call: cst.Call, context: Context, events: EventIndex, view: cst.Call | None = None
    ) -> tuple[Callee, list[tuple[Effect, cst.BaseExpression | None]]] | None:
        """The project function in another module that `call` runs, and each of its effects that this call does
        not switch off, with the caller's expression for the value it acts on (as `view`, the call's
        `EventIndex.call_view`, passes them)."""
        callee = self.callee_of(call, context, events, view)
        if callee is None:
            return None
        given = view or call
        binding = self.binding(given, callee)
        off = switched_off(callee.summary, binding, _literal_off, any(arg.star for arg in given.args))
        return callee, [(effect, _value(effect.port, binding)) for effect in callee.effects if not dropped(effect, off)]

    def call_events(
        self, call: cst.Call, context: Context, events: EventIndex, view: cst.Call | None = None
    ) -> list[Event] | None:
        """The gradient events `call` runs in another module, bound to this call's arguments."""
        bound = self.bound_effects(call, context, events, view)
        if bound is None:
            return None
        callee, effects = bound
        found = []
        for effect, value in effects:
            if effect.kind not in KINDS:
                continue
            if effect.unsure and (value is None or not events.roles.is_optimizer(value)):
                continue  # Ex) a helper's `sched.step()`, given a scheduler here
            found.append(
                Event(
                    Kind(effect.kind),
                    call,
                    call,
                    context.loops,
                    context.ifs,
                    (context.no_grad and not effect.enables_grad) or effect.no_grad,
                    value,
                    effect.via_scaler,
                    effect.retain_graph,
                    via=callee.origin,
                    repeats=effect.repeated,
                    by_hand=effect.by_hand,
                    arms=effect.arms,
                )
            )
        return found

    def binding(self, call: cst.Call, callee: Callee) -> dict[str, cst.BaseExpression]:
        """The callee's parameters mapped to the expressions `call` passes them."""
        func = call.func
        receiver: cst.BaseExpression | None = None
        if isinstance(func, cst.Attribute) and callee.summary.method:
            receiver = cst.Name("self") if isinstance(func.value, cst.Call) else func.value  # super().m()
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        return bind(callee.summary, positional, keywords, receiver)

    def defines(self, call: cst.Call, context: Context, events: EventIndex) -> bool:
        """Whether `call` runs a project function in another module (or a base class there)."""
        return self.callee_of(call, context, events) is not None

    def returns(self, call: cst.Call, context: Context, events: EventIndex) -> FunctionSummary | None:
        """The summary of the project function in another module that `call` runs, for its return value."""
        callee = self.callee_of(call, context, events)
        return callee.summary if callee is not None and callee.summary.analysed else None


KINDS = frozenset(kind.value for kind in Kind)


def _via_base(ref: Ref | None) -> bool:
    return ref is not None and ref.kind in ("class", "super")


def _literal_off(value: cst.BaseExpression) -> bool | None:
    if isinstance(value, cst.Name) and value.value in ("None", "False"):
        return value.value == "None"
    return None


def _value(port: str | None, binding: Mapping[str, cst.BaseExpression]) -> cst.BaseExpression | None:
    """The caller's expression for a callee's port: an argument, or an attribute path built on one."""
    if port is None:
        return None
    head, *rest = port.split(".")
    value = lookup(binding, head)
    if value is None:
        return None
    for name in rest:
        value = cst.Attribute(value=value, attr=cst.Name(name))
    return value
