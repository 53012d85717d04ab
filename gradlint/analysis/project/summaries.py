"""Function summaries: what each function of a module does to gradient state, as plain data.

A summary is written in terms of *ports*, the paths through which a caller reaches the
values a function acts on: a parameter (`opt`), an attribute of one (`trainer.opt`) or
of `self` (`self.optimizer`). A call site applies the callee's summary by binding its
arguments to those ports (`gradlint.analysis.project.program`). Summaries are local: a call to
another module stays a `call` effect holding a `Ref`, resolved by the program. They are
frozen, serializable and cached by the content hash of their module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import libcst as cst

from gradlint.analysis.facts.branches import EXITS, STATE_TEST, is_state_test
from gradlint.analysis.facts.keeping import kept_parameters
from gradlint.analysis.facts.leaves import ITERABLE_WRAPPERS, parameters_holder
from gradlint.analysis.facts.roles import Role
from gradlint.analysis.facts.steps import Kind, runs_when_off, updates_by_hand
from gradlint.analysis.facts.terms import LossTerms
from gradlint.analysis.syntax.collect import Scope
from gradlint.analysis.syntax.names import last_name, names_in
from gradlint.analysis.syntax.refs import all_params, call_ref, port, positional_params, stored_parameters
from gradlint.analysis.syntax.tree import descendants
from gradlint.index import Ref

# The effects a summary records besides the gradient events of `steps.Kind`.
CALL = "call"
TRAIN = "train"
EVAL = "eval"
BUILDS_OPTIMIZER = "optimizer"
UPDATE = "update"  # a parameter (or each of an iterable of them) changed in place from a gradient
GRAD_READ = "grad_read"  # a method called on a parameter's `.grad`, which is None before any backward
MAX_NESTED_DEPTH = 4


@dataclass(frozen=True)
class Effect:
    """One thing a function does, in order.

    `kind` is a `Kind` value, or CALL / TRAIN / EVAL / BUILDS_OPTIMIZER / UPDATE / GRAD_READ. `port` is the
    value acted on (None: a local value, or nothing). `repeated`: inside a loop of the
    function. `needs`: parameters that switch the effect off when None (`if opt is not
    None: opt.step()`); `needs_true`: those that switch it off when False. A CALL holds
    its `callee` and `args`: (callee parameter, caller port) pairs, by position ("0",
    "1", ...), by keyword, or "self" for the receiver of a method call; `star` when
    `*args`/`**kwargs` pass more; a call that spreads a parameter of its own (`inner(*args, **kwargs)`)
    records it as ("*", port) and ("**", port), after the positional arguments. `origin` says where the
    effect is written (`module.qualname`).
    `unsure`: a `.step()` on a parameter whose role the function cannot know (an optimizer
    or a scheduler): the caller decides from the argument it passes. `enables_grad`: the
    function turns autograd back on (`with torch.enable_grad():`), whatever its caller does.
    `arms`: the branches of the function's `if` statements the effect runs in, as "N=0" (the
    body) or "N=1" (the `else`/`elif` chain) by the order of the `if` in the module; an
    effect reached through a call has that call's arms, then its own prefixed by the
    call's index ("3/N=1"). Two effects whose arms differ at one `if` never both run. A branch that ends by
    leaving the function (`return`, `raise`) is an arm of its own, "N!0" for the body and "N!1" for the `else`:
    "=0" for the effects inside it, "=1" for those after its `if`, which run only when it did not (`if overflow:
    opt.zero_grad(); return` then `opt.step()`).
    """

    kind: str
    port: str | None = None
    repeated: bool = False
    no_grad: bool = False
    retain_graph: bool = False
    via_scaler: bool = False
    needs: tuple[str, ...] = ()
    needs_true: tuple[str, ...] = ()
    callee: Ref | None = None
    args: tuple[tuple[str, str | None], ...] = ()
    star: bool = False
    origin: str = ""
    unsure: bool = False
    enables_grad: bool = False
    by_hand: bool = False  # a STEP that updates its port in place from the port's own gradient
    arms: tuple[str, ...] = ()


@dataclass(frozen=True)
class FunctionSummary:
    """What one function or method does: its parameters, effects and what it returns."""

    params: tuple[str, ...]  # filled by position, `self` included
    keyword_only: tuple[str, ...] = ()
    defaults_off: tuple[tuple[str, bool], ...] = ()  # parameter -> whether its default is None (else False)
    effects: tuple[Effect, ...] = ()
    returns_grad: bool = False  # always returns a graph-carrying value
    returns_grad_if_args: bool = False  # returns one when an argument carries a graph
    elements: tuple[tuple[bool, bool], ...] | None = None  # per element of a returned tuple
    method: bool = False
    analysed: bool = True  # False: built from the outline alone, so what it returns is unknown
    varargs: str | None = None  # the name of `*args`, which takes positional arguments beyond `params`
    varkw: str | None = None  # the name of `**kwargs`, which takes keywords that name no parameter
    keeps: tuple[tuple[str, str], ...] = ()  # (parameter, attribute of self) a method adds it onto or appends it to
    returns_role: str | None = None  # the `Role` value of what every return proves it builds: optimizer, scaler, model
    stores: tuple[tuple[str, str], ...] = ()  # (parameter, attribute of self) a constructor sets to what it is given
    returns_cut: bool = False  # every return gives a value cut from the history it had (`facts.terms`)


@dataclass(frozen=True)
class ModuleSummary:
    """Every addressable function (`f`, `Class.method`) of a module; what the module defines and imports
    is in its outline (`gradlint.index`)."""

    functions: dict[str, FunctionSummary] = field(default_factory=dict)
    parameterless: tuple[str, ...] = ()  # top-level classes proven to hold no parameters (`facts.parameters`)
    saved_outputs: tuple[str, ...] = ()  # top-level classes whose forward returns a saved output (`facts.graphs`)


def to_data(summary: ModuleSummary) -> dict[str, Any]:
    """The summary as JSON-ready data."""
    return asdict(summary)


def from_data(data: dict[str, Any]) -> ModuleSummary:
    """The summary `to_data` wrote; raises KeyError or TypeError for anything else."""

    def ref(item: dict[str, Any]) -> Ref:
        return Ref(**item)

    def effect(item: dict[str, Any]) -> Effect:
        callee = item.pop("callee")
        return Effect(
            **{key: tuple(value) if isinstance(value, list) else value for key, value in item.items() if key != "args"}
            | {"args": tuple((name, bound) for name, bound in item["args"])},
            callee=ref(callee) if callee is not None else None,
        )

    functions = {
        name: FunctionSummary(
            params=tuple(item["params"]),
            keyword_only=tuple(item["keyword_only"]),
            defaults_off=tuple((name, off) for name, off in item["defaults_off"]),
            effects=tuple(effect(dict(e)) for e in item["effects"]),
            returns_grad=item["returns_grad"],
            returns_grad_if_args=item["returns_grad_if_args"],
            elements=tuple((a, b) for a, b in item["elements"]) if item["elements"] is not None else None,
            method=item["method"],
            varargs=item["varargs"],
            varkw=item["varkw"],
            keeps=tuple((param, attribute) for param, attribute in item["keeps"]),
            returns_role=item["returns_role"],
            stores=tuple((param, attribute) for param, attribute in item["stores"]),
            returns_cut=item["returns_cut"],
        )
        for name, item in data["functions"].items()
    }
    return ModuleSummary(functions, tuple(data["parameterless"]), tuple(data["saved_outputs"]))


def summarize(analysis: Any) -> ModuleSummary:
    """The summary of the module `analysis` (a `ModuleAnalysis`) describes, from its own code alone."""
    return _Summarizer(analysis).summary()


class _Summarizer:
    def __init__(self, analysis: Any) -> None:
        self._exits: dict[tuple[str, bool], list[int]] = {}
        self.analysis = analysis
        self.collected = analysis.collected
        self.events = analysis.events
        self.imports = analysis.imports
        self._updates: frozenset[cst.CSTNode] | None = None
        self._ifs: dict[cst.FunctionDef, dict[cst.If, int]] = {}
        self._leaving: dict[cst.FunctionDef, list[tuple[str, frozenset[cst.CSTNode], int]]] = {}
        self._order: dict[cst.FunctionDef, dict[cst.CSTNode, int]] = {}
        self._if_keys: dict[tuple[cst.If, cst.FunctionDef], str] = {}
        self.terms = LossTerms(analysis.collected, analysis.lineage, analysis.origins)

    def summary(self) -> ModuleSummary:
        functions = {}
        for function in self.collected.functions:
            name = qualname(self.collected, function)
            if name is not None:
                functions[name] = self._function(function)
        return ModuleSummary(
            functions,
            tuple(sorted(self.analysis.parameterless)),
            tuple(sorted(self.analysis.graphs.saved_output_classes())),
        )

    def _function(self, function: cst.FunctionDef) -> FunctionSummary:
        positional = positional_params(function)
        keyword_only = tuple(param.name.value for param in function.params.kwonly_params)
        defaults_off = tuple(
            (param.name.value, param.default.value == "None")
            for param in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params)
            if isinstance(param.default, cst.Name) and param.default.value in ("None", "False")
        )
        params = all_params(function)
        self._exits = {
            (name, none): self.events.exits_without(function, {name: none})
            for name in params - {"self", "cls"}
            for none in (True, False)
        }
        always, if_args = self.analysis.values.returns_grad(function)
        return FunctionSummary(
            params=positional,
            keyword_only=keyword_only,
            defaults_off=defaults_off,
            effects=tuple(dict.fromkeys(self._effects(function, function, params, 0))),
            returns_grad=always,
            returns_grad_if_args=if_args,
            elements=self.analysis.values.returned_elements(function),
            method=function in self.collected.owners,
            varargs=_star_name(function.params.star_arg),
            varkw=_star_name(function.params.star_kwarg),
            keeps=kept_parameters(self.collected, self.analysis.values, function)
            if function in self.collected.owners
            else (),
            returns_role=role.value if (role := self.analysis.roles.returned_role(function)) is not None else None,
            stores=stored_parameters(function)
            if function in self.collected.owners and function.name.value == "__init__"
            else (),
            returns_cut=self.terms.returns_cut(function),
        )

    def _effects(self, scope: Scope, function: cst.FunctionDef, params: frozenset[str], depth: int) -> list[Effect]:
        """The effects of `scope`'s own code, with functions nested in `function` taken in where called."""
        effects: list[Effect] = []
        enables = self.collected.enables_grad(scope)
        for item in self.events.items_of(scope):
            context = self.events.context(item)
            common = {
                "repeated": bool(context.loops),
                "no_grad": context.no_grad,
                "enables_grad": enables,
                "needs": self._needs(item, function, params, none=True),
                "needs_true": self._needs(item, function, params, none=False),
                "arms": (
                    *(
                        f"{self._if_key(branch, function)}={0 if self.collected.in_body(branch, item) else 1}"
                        for branch in context.ifs
                        if isinstance(branch, cst.If)
                    ),
                    *self._leaving_arms(item, function),
                ),
            }
            if isinstance(item, cst.Call):
                nested = self._nested_callees(item)
                if nested and depth < MAX_NESTED_DEPTH:
                    for inner in nested:
                        effects.extend(self._effects(inner, function, params, depth + 1))
                    continue
            effects.extend(self._gradient_uses(item, params, common))  # `p.grad.zero_()` reads, then clears
            classified = self.events.classify(item)
            if classified is not None:
                kind, value, via_scaler, retain = classified
                by_hand = kind is Kind.STEP and updates_by_hand(item)
                # A tensor updated by hand is reached as an update is: itself, or the iterable a loop takes it from.
                reached = (
                    self._holder(value, item, params)
                    if by_hand and value is not None
                    else self._port(value, item, params)
                )
                effects.append(
                    Effect(kind.value, reached, via_scaler=via_scaler, retain_graph=retain, by_hand=by_hand, **common)
                )
                continue
            if isinstance(item, cst.Call):
                effect = self._call_effect(item, params, common)
                if effect is not None:
                    effects.append(effect)
        return effects

    def _if_key(self, branch: cst.If, function: cst.FunctionDef) -> str:
        """What names an `if` among the arms: its test, where it reads only its object's own state (`if
        self.is_mixed():`, `if not self.activated:`; see `branches.STATE_TEST`), so that two methods of one object
        testing the same state take the same arm; else its place in `function`."""
        key = (branch, function)
        if key not in self._if_keys:
            self._if_keys[key] = (
                STATE_TEST + cst.Module([]).code_for_node(branch.test)
                if is_state_test(branch.test)
                else str(self._if_index(branch, function))
            )
        return self._if_keys[key]

    def _leaving_arms(self, item: cst.CSTNode, function: cst.FunctionDef) -> list[str]:
        """The arms `item` takes of the branches of `function` that end by leaving it (see `Effect`)."""
        if function not in self._leaving:
            self._leaving[function] = self._leaving_branches(function)
        place = self._order[function].get(item, -1)
        return [
            f"{key}={0 if item in inside else 1}"
            for key, inside, end in self._leaving[function]
            if item in inside or place > end
        ]

    def _leaving_branches(self, function: cst.FunctionDef) -> list[tuple[str, frozenset[cst.CSTNode], int]]:
        """The branches of `function`'s own `if` statements that end in `return` or `raise` and hold one of its
        items: their arm, their nodes, and the place of the last node of their `if` in `function`."""
        nodes = descendants(function)
        self._order[function] = order = {node: index for index, node in enumerate(nodes)}
        items = self.events.items_of(function)
        found = []
        for statement in nodes:
            context = self.collected.contexts.get(statement)
            if not isinstance(statement, cst.If) or context is None or context.scope is not function:
                continue
            for side, branch in enumerate((statement.body, statement.orelse)):
                if not isinstance(branch, cst.IndentedBlock) or not _leaves(branch):
                    continue
                inside = frozenset(descendants(branch))
                if any(item in inside for item in items):
                    end = order[descendants(statement)[-1]]
                    found.append((f"{self._if_index(statement, function)}!{side}", inside, end))
        return found

    def _if_index(self, branch: cst.If, function: cst.FunctionDef) -> int:
        """The place of `branch` among the `if` statements of `function`, in source order."""
        if function not in self._ifs:
            found = (node for node in descendants(function) if isinstance(node, cst.If))
            self._ifs[function] = {node: index for index, node in enumerate(found)}
        return self._ifs[function].get(branch, -1)

    def _gradient_uses(self, item: cst.CSTNode, params: frozenset[str], common: dict[str, Any]) -> list[Effect]:
        """UPDATE for an in-place update of a parameter from a gradient (`p.add_(p.grad, alpha=-lr)`, `w -= lr *
        w.grad`), GRAD_READ for a method called on a parameter's `.grad` (`p.grad.zero_()`), outside a test of
        `.grad` (`if p.grad is not None:`). Ports: the parameter, or the iterable a loop takes it from."""
        if self._updates is None:
            mutations = self.analysis.mutations
            self._updates = frozenset(
                operation.node
                for operation in mutations.operations
                if any(mutations.gradients.is_gradient(operand, operation.statement) for operand in operation.operands)
            )
        found = []
        if item in self._updates:
            operation = next(o for o in self.analysis.mutations.operations if o.node is item)
            holder = self._holder(operation.target, item, params)
            if holder is not None:
                found.append(Effect(UPDATE, holder, **common))
        if isinstance(item, cst.Call) and isinstance(item.func, cst.Attribute):
            grad = _grad_of(item.func.value)
            if grad is not None and not any(_tests_grad(branch) for branch in self.events.context(item).ifs):
                holder = self._holder(grad, item, params)
                if holder is not None:
                    found.append(Effect(GRAD_READ, holder, **common))
        return found

    def _holder(self, tensor: cst.BaseExpression, at: cst.CSTNode, params: frozenset[str]) -> str | None:
        """The port of a parameter: itself (`w`, `self.weight`), or the iterable an enclosing loop takes it from
        (`for p in params`, `for p in model.parameters()`, `for name, p in model.named_parameters()`)."""
        direct = port(tensor, params)
        if direct is not None:
            return direct
        holder = parameters_holder(tensor, self.events.context(at).loops)
        return port(holder, params) if holder is not None else None

    def _port(self, value: cst.BaseExpression | None, at: cst.CSTNode, params: frozenset[str]) -> str | None:
        """The port `value` reads at `at`, unless the parameter it starts from holds a deep copy there (`model =
        copy.deepcopy(model)`): what is done to the copy never reaches the caller's object."""
        found = port(value, params)
        head = found.split(".", 1)[0] if found is not None else None
        if head is None or head in ("self", "cls") or head not in params:
            return found
        return None if self.events.holds_deep_copy(head, at) else found

    def _nested_callees(self, call: cst.Call) -> list[cst.FunctionDef]:
        """Functions nested in the summarized one that `call` runs (itself, or by a function argument)."""
        found = []
        for candidate in (call.func, *(arg.value for arg in call.args)):
            if isinstance(candidate, cst.Name):
                helper = self.events.resolve_name(candidate, self.events.context(call))
                if helper is not None and qualname(self.collected, helper) is None:
                    found.append(helper)
        return found

    def _call_effect(self, written: cst.Call, params: frozenset[str], common: dict[str, Any]) -> Effect | None:
        call = self.events.call_view(written)  # `step(batch)` after `step = partial(train_step, model)`
        func = call.func
        receiver = func.value if isinstance(func, cst.Attribute) else None
        method = last_name(func)
        if receiver is not None and self._switches_mode(written, call, receiver, method):
            mode = EVAL if method == "eval" or _is_false(call) else TRAIN
            return Effect(mode, self._port(receiver, written, params), **common)
        if self.analysis.roles.role_of_value(written) is Role.OPTIMIZER:
            return Effect(BUILDS_OPTIMIZER, **common)
        if method == "step" and not call.args and port(receiver, params) not in (None, "self"):
            return Effect(Kind.STEP.value, port(receiver, params), unsure=True, **common)
        ref = self.callee_ref(written, call)
        if ref is None:
            return None
        args = [(str(index), port(arg.value, params)) for index, arg in enumerate(_positional(call))]
        args += [(arg.keyword.value, port(arg.value, params)) for arg in call.args if arg.keyword is not None]
        if ref.kind in ("class", "super") or (ref.kind == "local" and _on_self(receiver)):
            args.append(("self", "self"))
        elif receiver is not None and (ref.method or ref.kind == "local"):
            args.append(("self", port(receiver, params)))
        args += _spread(call, params)
        star = any(arg.star for arg in call.args)
        return Effect(CALL, callee=ref, args=tuple(args), star=star, **common)

    def _switches_mode(
        self, written: cst.Call, call: cst.Call, receiver: cst.BaseExpression, method: str | None
    ) -> bool:
        """Whether `receiver.train(...)`/`receiver.eval()` is `nn.Module`'s mode switch: `eval()` takes no argument
        and `train()` at most a mode (`value_approx.eval(0, x)` is not one), and a class with an `eval` or `train`
        method of its own does not switch modes by `self.eval()`."""
        if method == "eval":
            plain = not call.args
        elif method == "train":
            plain = len(call.args) <= 1 and not any(arg.star for arg in call.args)
        else:
            return False
        owner = self.events.context(written).class_def if _on_self(receiver) else None
        return plain and not (owner is not None and self.events.method_of(owner, method) is not None)

    def callee_ref(self, call: cst.Call, view: cst.Call) -> Ref | None:
        """The reference `call` (as `view` writes it) makes outside this module: same-module functions are refs
        to this module."""
        helper = self.events.resolve_view(view, call)
        if helper is not None:
            name = qualname(self.collected, helper)
            return Ref("local", name) if name is not None else None
        method = self.events.resolve_instance_method(view, call)
        if method is not None:
            name = qualname(self.collected, method)
            return Ref("local", name) if name is not None else None
        return call_ref(view.func, self.events.context(call), self.imports, self.events.instance_class(view, call))

    def _needs(
        self, item: cst.CSTNode, function: cst.FunctionDef, params: frozenset[str], *, none: bool
    ) -> tuple[str, ...]:
        context = self.events.context(item)
        if not context.ifs and not any(self._exits.values()):
            return ()
        return tuple(
            name
            for name in sorted(params - {"self", "cls"})
            if self.events.needs_any(item, context.ifs, {name: none}, self._exits[(name, none)])
        )


def qualname(collected: Any, function: cst.FunctionDef) -> str | None:
    """`f` for a module-level function, `Class.method` for a method of a module-level class, else None."""
    owner = collected.owners.get(function)
    if owner is not None:
        return f"{owner.name.value}.{function.name.value}" if owner in top_classes(collected) else None
    return function.name.value if isinstance(collected.def_scopes.get(function), cst.Module) else None


def top_classes(collected: Any) -> frozenset[cst.ClassDef]:
    """The classes defined at the top of the module, which other modules can name."""
    return frozenset(statement for statement in collected.module.body if isinstance(statement, cst.ClassDef))


def _positional(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


def _spread(call: cst.Call, params: frozenset[str]) -> list[tuple[str, str | None]]:
    """("*", port) and ("**", port) for a parameter spread into `call` after its positional arguments
    (`inner(model, *args, **kwargs)`): the callee's remaining parameters take what the caller passed."""
    found: list[tuple[str, str | None]] = []
    for index, arg in enumerate(call.args):
        if arg.star == "*" and all(later.keyword is not None or later.star == "**" for later in call.args[index + 1 :]):
            found.append(("*", port(arg.value, params)))
        elif arg.star == "**":
            found.append(("**", port(arg.value, params)))
    return [(name, bound) for name, bound in found if bound is not None and "." not in bound]


def _grad_of(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`p` for `p.grad` or `p.grad.data`, else None."""
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        value = value.value
    return value.value if isinstance(value, cst.Attribute) and value.attr.value == "grad" else None


def _tests_grad(branch: cst.CSTNode) -> bool:
    """Whether an `if` tests a gradient (`if p.grad is not None:`), which guards what it holds."""
    test = branch.test if isinstance(branch, (cst.If, cst.While)) else None
    return test is not None and any(name.endswith(".grad") for name in names_in(test))


def _unwrapped(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """`params` for `list(params)` or `tuple(filter(f, params))`'s last argument."""
    while isinstance(iterable, cst.Call) and iterable.args and last_name(iterable.func) in ITERABLE_WRAPPERS:
        iterable = iterable.args[-1].value
    return iterable


def _leaves(block: cst.IndentedBlock) -> bool:
    """Whether `block` ends with a `return` or a `raise`."""
    last = block.body[-1] if block.body else None
    return isinstance(last, cst.SimpleStatementLine) and bool(last.body) and isinstance(last.body[-1], EXITS)


def _star_name(param: object) -> str | None:
    return param.name.value if isinstance(param, cst.Param) else None


def _on_self(receiver: cst.BaseExpression | None) -> bool:
    return isinstance(receiver, cst.Name) and receiver.value in ("self", "cls")


def _is_false(call: cst.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == "False"


__all__ = ["CALL", "EVAL", "TRAIN", "Effect", "FunctionSummary", "Kind", "ModuleSummary", "runs_when_off", "summarize"]
