"""Backward calls that run through a graph an earlier backward already freed.

`backward()` and `torch.autograd.grad()` free the buffers the graph saved, unless they
are called with `retain_graph=True` (or `create_graph=True`). A forward walk over each
scope gives every graph-carrying value the set of computations ("nodes") its graph
holds: a fresh node for each execution of the statement that computed it, plus the
nodes of the graph-carrying values it was computed from (not through `.detach()`,
`.item()` and other operations without history). An entry read with a constant key
(`losses["actor"]`) holds its own node in place of the container's: the entries of a
forward pass's result are not known to share a graph (an actor and a critic loss
returned together), unless the container was computed from a graph-carrying value
that they then share too; so does each item of a loop over a graph-carrying iterable
(`for term in criterion.terms(outputs, y): term.backward()` goes back through `outputs`
on every item). A backward frees its value's nodes;
a later backward whose value holds a freed node raises "Trying to backward through the
graph a second time". Loops are walked twice, so a value computed once before a loop,
or a hidden state carried round it without `.detach()`, shows up on the second pass.
A training-step method is walked twice too, the second time with the `self.*`
attributes the first left behind (see `carried_attributes`). Values of unknown origin
hold no nodes: when in doubt, nothing is reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product

import libcst as cst

from gradlint.analysis.facts.branches import fixed_tests, truth_of
from gradlint.analysis.facts.forwards import constructs, fetches_module
from gradlint.analysis.facts.frameworks import backpropagated_returns, hook_methods
from gradlint.analysis.facts.roles import Role, constructor_of
from gradlint.analysis.facts.steps import EventIndex, Kind
from gradlint.analysis.facts.values import (
    DETACHING_METHODS,
    NON_GRAD_ATTRIBUTES,
    NON_GRAD_TORCH,
    GradValues,
)
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in
from gradlint.analysis.syntax.refs import arguments_of
from gradlint.analysis.syntax.tree import children

Nodes = frozenset[int]
# Builtins whose result keeps the history of their arguments.
KEEPING_BUILTINS = frozenset({"sum", "max", "min", "abs"})
JUMPS = (cst.Return, cst.Raise, cst.Continue, cst.Break)
# How many fixed conditions of one scope are walked each way (2**n walks); the rest merge their arms.
MAX_FIXED_TESTS = 3


@dataclass(frozen=True)
class _State:
    """What holds at a point: the nodes each name's graph holds, and the nodes already freed."""

    env: dict[str, Nodes] = field(default_factory=dict)
    freed: Nodes = frozenset()


def _merge(*states: _State | None) -> _State | None:
    # A name may hold what any path gave it; a node counts as freed only when every path
    # freed it (`if due: loss.backward(); loss = 0` leaves the other path's loss intact).
    live = [state for state in states if state is not None]
    if not live:
        return None
    env: dict[str, Nodes] = {}
    for state in live:
        for key, nodes in state.env.items():
            env[key] = env.get(key, frozenset()) | nodes
    return _State(env, frozenset.intersection(*(state.freed for state in live)))


@dataclass(frozen=True)
class Reuse:
    """A backward (or `autograd.grad`) call whose graph an earlier one freed.

    `node` is the call, or the `return loss` of a Lightning `training_step` whose loss
    Lightning backpropagates, or of a module's `forward`, whose output its caller does.
    `kept`: the statement that keeps on `self` (for the next call) the graph reused, when
    the graph crosses from one call into the next.
    """

    node: cst.CSTNode
    kind: Kind  # BACKWARD or AUTOGRAD_GRAD
    freed_by: cst.CSTNode
    kept: cst.CSTNode | None = None


class FreedGraphs:
    """Finds backward calls that reuse a freed graph, one scope at a time."""

    def __init__(self, collected: Collected, events: EventIndex, values: GradValues) -> None:
        self.collected = collected
        self.events = events
        self.values = values
        # Hooks a framework runs once per batch (training_step), and those whose returned loss it backpropagates.
        self.per_batch_hooks = frozenset(hook_methods(collected, "backpropagated"))
        self.backpropagated_hooks = frozenset(backpropagated_returns(collected))
        # A module's forward, where a training loop of this module calls an instance of its class: it runs once
        # per batch, and what it returns is what that loop backpropagates.
        self.forwards = frozenset(
            function
            for function, owner in collected.owners.items()
            if function.name.value == "forward" and events.roles.is_model_class(owner) and self._driven(owner)
        )

    def _driven(self, owner: cst.ClassDef) -> bool:
        """Whether a loop of this module that backpropagates calls an instance of `owner` (`model = Net()` ...
        `for x in loader: model(x).sum().backward()`): only then are its forward's calls known to repeat,
        each output backpropagated. A class used once (a test's network) or elsewhere is not followed."""
        roles = self.events.roles
        instances = {
            key
            for key, values in roles.values.items()
            if any(
                (built := constructor_of(value)) is not None and dotted_name(built.func) == owner.name.value
                for value in values
            )
        }
        if not instances:
            return False
        for loop in self.collected.loops:
            if not any(event.kind is Kind.BACKWARD for event in self.events.region_events(loop)):
                continue
            for statement in self.collected.statements_in_loop(loop):
                if any(dotted_name(call.func) in instances for call in self.collected.calls_in_statement(statement)):
                    return True
        return False

    def reuses(self) -> list[Reuse]:
        """Every backward of the module that runs through a graph freed before it, in source order."""
        found: dict[cst.CSTNode, Reuse] = {}
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        for scope in filter(self._frees_graphs, scopes):
            # One walk for each value of the conditions fixed for a call: the arms of `if fp16:` taken
            # in one iteration are taken in every other.
            tests = fixed_tests(self.collected, scope)[:MAX_FIXED_TESTS]
            for values in product((True, False), repeat=len(tests)):
                walker = _Walker(self, scope, list(zip(tests, values, strict=True)))
                walker.walk_scope()
                for reuse in walker.found:
                    found.setdefault(reuse.node, reuse)
        return sorted(found.values(), key=lambda reuse: self.collected.order[reuse.node])

    def carried_attributes(self, method: cst.FunctionDef) -> frozenset[str]:
        """`self.*` attributes a training-step method or a module's `forward` leaves for its next call to read.

        Only attributes that no other method of the class (but `__init__`) assigns count, and none that code
        outside the class assigns on an object (`net.hidden = net.init_hidden()`): a reset elsewhere may run
        between two calls.
        """
        owner = self.collected.owners.get(method)
        if owner is None or not self._repeats(method):
            return frozenset()
        assigned: dict[str, set[Scope]] = {}
        reset_outside: set[str] = set()
        for statement in self.collected.statements:
            if not isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                continue
            context = self.collected.contexts[statement]
            for key in _assigned_keys(statement):
                if context.class_def is owner:
                    assigned.setdefault(key, set()).add(context.scope)
                elif "." in key and not key.startswith("self."):
                    reset_outside.add(key.rpartition(".")[2])
        return frozenset(
            key
            for key, scopes in assigned.items()
            if key.startswith("self.")
            and method in scopes
            and all(scope is method or _is_init(scope) for scope in scopes)
            and key.rpartition(".")[2] not in reset_outside
        )

    def _repeats(self, method: cst.FunctionDef) -> bool:
        # A method that backpropagates runs once per batch; so does a hook whose loss its framework backpropagates.
        if method in self.per_batch_hooks or method in self.forwards:
            return True
        return any(event.kind is Kind.BACKWARD and event.direct for event in self.events.scope_events(method))

    def _frees_graphs(self, scope: Scope) -> bool:
        """Whether the walk of `scope` can free a graph: only its own backward calls (or what Lightning
        backpropagates from `training_step`) do, so a scope without one is not walked."""
        if isinstance(scope, cst.FunctionDef) and scope in self.per_batch_hooks:
            return True
        if isinstance(scope, cst.FunctionDef) and scope in self.forwards:
            return bool(self.carried_attributes(scope))  # its caller's backward frees what it keeps
        return any(self.backward_value(call) is not None for call in self.collected.calls_in_scope(scope))

    def backward_value(self, call: cst.Call) -> tuple[Kind, cst.BaseExpression, bool] | None:
        """(kind, value, keeps_graph) for a direct backward or `autograd.grad` call, else None."""
        classified = self.events.classify(call)
        if classified is None or classified[0] not in (Kind.BACKWARD, Kind.AUTOGRAD_GRAD) or classified[1] is None:
            return None
        return classified[0], classified[1], _keeps_graph(call)

    def graph_reads(self, node: cst.CSTNode) -> Iterator[str | cst.Call]:
        """Names, attributes and calls read where their history flows into the result."""
        if isinstance(node, (cst.Name, cst.Attribute)):
            if isinstance(node, cst.Attribute) and node.attr.value in NON_GRAD_ATTRIBUTES:
                return
            key = dotted_name(node)
            if key is not None:
                yield key
            if isinstance(node, cst.Attribute):
                yield from self.graph_reads(node.value)
            return
        if isinstance(node, cst.Subscript) and (entry := _entry_key(node)) is not None:
            yield entry
            return
        if isinstance(node, cst.Call):
            if not self._cuts_history(node):
                yield node
                if isinstance(node.func, cst.Attribute):
                    yield from self.graph_reads(node.func.value)
                cut = self._cut_arguments(node)
                for arg in node.args:
                    if not any(arg.value is value for value in cut):
                        yield from self.graph_reads(arg.value)
            return
        if not isinstance(node, (cst.Lambda, cst.BaseComp)):
            for child in children(node):
                yield from self.graph_reads(child)

    def _cut_arguments(self, call: cst.Call) -> list[cst.BaseExpression]:
        """What `call` passes to parameters that its same-module helper cuts before anything reads them (`fake =
        fake.data` first thing in a gradient penalty): their history reaches nothing the helper computes."""
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is None:
            return []
        cut = _cut_on_entry(helper)
        return [value for name, value in arguments_of(helper, call).items() if name in cut] if cut else []

    def _cuts_history(self, call: cst.Call) -> bool:
        # x.detach(), x.item(), float(x), torch.tensor(x), a same-module helper that detaches,
        # or a function of another module (`repackage_hidden(h)` may well detach).
        func = call.func
        name = last_name(func)
        if isinstance(func, cst.Attribute) and name in DETACHING_METHODS:
            return True
        resolved = self.collected.imports.resolve(func) or ""
        if resolved.startswith("torch."):
            return name in NON_GRAD_TORCH
        if fetches_module(call):
            return True
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            return self.values.returns_grad(helper) == (False, False)
        if isinstance(func, cst.Name):
            return name not in KEEPING_BUILTINS and self.values.roles.role(func) not in (Role.MODEL, Role.LOSS_FN)
        return False

    def calls_of(self, statement: cst.CSTNode) -> list[cst.Call]:
        """The calls of a simple statement in evaluation order."""
        return self.collected.calls_in_statement(statement)


class _Walker:
    """One forward pass over a scope's statements (branches merged, loops walked twice)."""

    def __init__(self, graphs: FreedGraphs, scope: Scope, fixed: list[tuple[cst.BaseExpression, bool]]) -> None:
        self.graphs = graphs
        self.scope = scope
        self.fixed = fixed  # conditions with one value for the whole walk (`branches.fixed_tests`)
        self.found: list[Reuse] = []
        self.counter = 0
        self.outside: dict[str, int] = {}  # a stable node for a value made outside the scope
        self.parameters = _parameters(scope)
        # A function's own local names that no path has bound yet hold nothing: reading one raises.
        self.unbound = dict.fromkeys(_locals(graphs.collected, scope) - self.parameters, False)
        self.freed_by: dict[int, cst.CSTNode] = {}
        self.entries: dict[tuple[int, str], int] = {}  # (container's own node, key) -> the entry's node
        self.loop_exits: list[tuple[list[_State], list[_State]]] = []  # (continues, breaks)
        self.exits: list[_State] = []
        self.carried: dict[str, Nodes] = {}  # on the walk of the next call: what the last one left in `self`
        # Lightning backpropagates what training_step returns, unless the class optimizes manually.
        self.returns_backpropagated = scope in graphs.backpropagated_hooks or scope in graphs.forwards

    def walk_scope(self) -> None:
        if isinstance(self.scope, cst.Module):
            self.walk_block(self.scope.body, _State())
            return
        end = self._suite(self.scope.body, _State())
        carried = self.graphs.carried_attributes(self.scope)
        exit_state = _merge(end, *self.exits)
        if not carried or exit_state is None:
            return
        # The next call (the next batch) starts with what this call left in `self`, and new arguments.
        env = {key: nodes for key, nodes in exit_state.env.items() if key in carried}
        self.exits = []
        self.outside = {}
        self.carried = env
        self._suite(self.scope.body, _State(env, exit_state.freed))

    def walk_block(self, statements: Sequence[cst.CSTNode], state: _State | None) -> _State | None:
        for statement in statements:
            if state is None:
                return None
            state = self.walk_statement(statement, state)
        return state

    def _suite(self, suite: cst.BaseSuite | None, state: _State | None) -> _State | None:
        if isinstance(suite, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            return self.walk_block(suite.body, state)
        return state

    def walk_statement(self, statement: cst.CSTNode, state: _State) -> _State | None:
        if isinstance(statement, cst.SimpleStatementLine):
            return self.walk_block(statement.body, state)
        if isinstance(statement, cst.BaseSmallStatement):
            return self.apply(statement, state)
        if isinstance(statement, cst.If):
            when_true, when_false = _refine(statement.test, state)
            truth = next(
                (value for known, given in self.fixed if (value := truth_of(statement.test, known, given)) is not None),
                None,
            )
            body = self._suite(statement.body, when_true) if truth is not False else None
            if truth is True:
                return body
            if isinstance(statement.orelse, cst.If):
                return _merge(body, self.walk_statement(statement.orelse, when_false))
            orelse = self._suite(statement.orelse.body, when_false) if statement.orelse is not None else when_false
            return _merge(body, orelse)
        if isinstance(statement, (cst.For, cst.While)):
            return self._walk_loop(statement, state)
        if isinstance(statement, cst.With):
            return self._suite(statement.body, state)
        if isinstance(statement, (cst.Try, cst.TryStar)):
            return self._walk_try(statement, state)
        return state

    def _walk_loop(self, loop: cst.For | cst.While, before: _State) -> _State | None:
        # The first pass starts from the state before the loop, the second from the end of
        # the first: what one iteration freed is still freed when the next one starts.
        start: _State | None = before
        breaks: list[_State] = []
        ends: list[_State | None] = []
        for _ in range(2):
            if start is None:
                break
            continues: list[_State] = []
            self.loop_exits.append((continues, breaks))
            end = self._suite(loop.body, self._bind_item(loop, start))
            self.loop_exits.pop()
            start = _merge(end, *continues)
            ends.append(start)
        after = _merge(before, ends[-1])
        if loop.orelse is not None:
            after = self._suite(loop.orelse.body, after)
        return _merge(after, *breaks)

    def _bind_item(self, loop: cst.For | cst.While, state: _State) -> _State:
        # Each item of a graph-carrying iterable is its own value: `for loss in losses`. Like an
        # entry read with a constant key, it shares what the iterable was computed from: the losses
        # `model.loss(outputs, batch)` returns all run back through the forward pass of `outputs`.
        if not isinstance(loop, cst.For):
            return state
        flags = self.unbound | {key: bool(nodes) for key, nodes in state.env.items()}
        if not self.graphs.values.evaluate(loop.iter, flags, self.scope):
            return self._bind(loop.target, frozenset(), state)
        elements = loop.iter.elements if isinstance(loop.iter, (cst.Tuple, cst.List)) else None
        if elements and not any(isinstance(element, cst.StarredElement) for element in elements):
            # `for logits in (a_logits, b_logits)`: each iteration takes one of the values written out, so the
            # items share only what every one of them was computed from.
            read = [self._read_nodes(element.value, state) for element in elements]
            return self._bind(loop.target, frozenset.intersection(*read) | self._fresh(), state)
        container = self._read_nodes(loop.iter, state)
        shared = container - {max(container)} if container else frozenset()
        return self._bind(loop.target, shared | self._fresh(), state)

    def _walk_try(self, statement: cst.Try | cst.TryStar, state: _State) -> _State | None:
        body = self._suite(statement.body, state)
        handlers = [self._suite(handler.body, state) for handler in statement.handlers]
        if statement.orelse is not None:
            body = self._suite(statement.orelse.body, body)
        merged = _merge(body, *handlers)
        if statement.finalbody is not None:
            return self._suite(statement.finalbody.body, merged)
        return merged

    def apply(self, statement: cst.BaseSmallStatement, state: _State) -> _State | None:
        for call in self.graphs.calls_of(statement):
            state = self._backward(call, state)
            if _calls_own_method(call) and self.graphs.events.resolve_helper(call) is not None:
                # A method of the same class may rebind any attribute: forget what `self.*` held.
                state = _State({k: v for k, v in state.env.items() if not k.startswith("self.")}, state.freed)
        if isinstance(statement, cst.Return):
            self.exits.append(self._returned(statement, state))
            return None
        if isinstance(statement, JUMPS):
            if isinstance(statement, (cst.Continue, cst.Break)) and self.loop_exits:
                continues, breaks = self.loop_exits[-1]
                (continues if isinstance(statement, cst.Continue) else breaks).append(state)
            return None
        if isinstance(statement, cst.Assign):
            nodes = self.nodes_of(statement.value, state, statement)
            for target in statement.targets:
                state = self._bind_unpacked(target.target, statement, nodes, state)
        elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
            state = self._bind(statement.target, self.nodes_of(statement.value, state, statement), state)
        elif isinstance(statement, cst.AugAssign):
            key = dotted_name(statement.target)
            added = self.nodes_of(statement.value, state, statement)
            if key is not None and added:
                state = _State({**state.env, key: state.env.get(key, frozenset()) | added}, state.freed)
        elif isinstance(statement, cst.Del):
            deleted = set(names_in(statement.target))
            state = _State({key: nodes for key, nodes in state.env.items() if key not in deleted}, state.freed)
        return state

    def _keeping(self, key: str | None) -> cst.CSTNode | None:
        """The last statement of the scope that assigns `key`, the state it keeps for the next call."""
        if key is None:
            return None
        statements = self.graphs.collected.statements_in_scope(self.scope)
        assigning = [
            statement
            for statement in statements
            if isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and key in _assigned_keys(statement)
        ]
        return assigning[-1] if assigning else None

    def _returned(self, statement: cst.Return, state: _State) -> _State:
        # Lightning backpropagates what training_step returns (the loss, or {"loss": loss}).
        if not self.returns_backpropagated or statement.value is None:
            return state
        nodes = self._read_nodes(statement.value, state)
        return self._free(statement, nodes, state, Kind.BACKWARD, keeps_graph=False)

    def _backward(self, call: cst.Call, state: _State) -> _State:
        found = self.graphs.backward_value(call)
        if found is None:
            return state
        kind, value, keeps_graph = found
        nodes = self._read_nodes(value, state)
        key = dotted_name(value)
        if key in self.parameters and key not in state.env:
            # Ex) def step(loss): loss.backward() ... loss.backward(): the caller's one graph.
            if key not in self.outside:
                self.outside[key] = self._fresh_id()
            nodes |= {self.outside[key]}
        return self._free(call, nodes, state, kind, keeps_graph)

    def _free(self, site: cst.CSTNode, nodes: Nodes, state: _State, kind: Kind, keeps_graph: bool) -> _State:
        reused = nodes & state.freed
        if reused:
            kept = next((key for key, carried in self.carried.items() if carried & reused), None)
            self.found.append(Reuse(site, kind, self.freed_by[min(reused)], self._keeping(kept)))
        if keeps_graph:
            return state
        for node in nodes - state.freed:
            self.freed_by[node] = site
        return _State(state.env, state.freed | nodes)

    def nodes_of(self, value: cst.BaseExpression, state: _State, statement: cst.CSTNode) -> Nodes:
        """The nodes of the graph `value` computes at `statement`: a fresh one plus those it reads."""
        context = self.graphs.collected.contexts.get(statement)
        if context is not None and context.no_grad:
            return frozenset()
        # Besides what `values` knows carries a graph, anything computed from a graph through
        # an operation that keeps history (an unknown layer: `self.model.head(features)`).
        read = self._read_nodes(value, state)
        flags = self.unbound | {key: bool(nodes) for key, nodes in state.env.items()}
        calls = [
            item
            for item in self.graphs.graph_reads(value)
            if isinstance(item, cst.Call) and not constructs(item, self.graphs.events.roles)
        ]
        if not read and not any(self.graphs.values.evaluate(call, flags, self.scope) for call in calls):
            return frozenset()
        return read | self._fresh()

    def _read_nodes(self, value: cst.BaseExpression, state: _State) -> Nodes:
        nodes: set[int] = set()
        for key in self.graphs.graph_reads(value):
            if isinstance(key, cst.Call):
                continue
            if key in state.env:
                nodes |= state.env[key]
            elif key.endswith("]") and (container := state.env.get(key.split("[", 1)[0])):
                nodes |= self._entry_nodes(container, key)
        return frozenset(nodes)

    def _entry_nodes(self, container: Nodes, key: str) -> Nodes:
        # The newest node is the container's own computation; the older ones it read are shared.
        own = max(container)
        if (own, key) not in self.entries:
            self.entries[(own, key)] = self._fresh_id()
        return (container - {own}) | {self.entries[(own, key)]}

    def _fresh(self) -> Nodes:
        return frozenset({self._fresh_id()})

    def _fresh_id(self) -> int:
        self.counter += 1
        return self.counter

    def _bind_unpacked(self, target: cst.BaseExpression, statement: cst.Assign, nodes: Nodes, state: _State) -> _State:
        """Bind a target; unpacked from a call, each element gets the graph only if the values analysis says it
        carries one (the output of a forward pass, a recurrent state the call takes back), not the others."""
        value = statement.value
        if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(value, cst.Call) or not nodes:
            return self._bind(target, nodes, state)
        if any(isinstance(element, cst.StarredElement) for element in target.elements):
            return self._bind(target, nodes, state)
        flags = self.unbound | {key: bool(held) for key, held in state.env.items()}
        facts = self.graphs.values.elements(value, len(target.elements), flags, self.scope)
        # A call nothing is known of: its first result is what it computes, the others are unknown.
        known = facts if facts is not None else [True, *([None] * (len(target.elements) - 1))]
        apart = self._returns_apart(value)
        for element, fact in zip(target.elements, known, strict=True):
            # Each element a project function writes out in its returns is its own computation: two losses
            # returned together share only the graphs of the arguments, not one another's.
            held = (nodes - {max(nodes)}) | self._fresh() if apart else nodes
            state = self._bind_element(element.value, fact, statement, held, state)
        return state

    def _returns_apart(self, call: cst.Call) -> bool:
        """Whether `call` runs a project function whose every `return` writes a tuple out, element by element."""
        events = self.graphs.events
        helper = events.resolve_helper(call) if call in self.graphs.collected.contexts else None
        if helper is not None:
            return self.graphs.values.returned_elements(helper) is not None
        outside = events.outside(call)
        return outside is not None and outside.elements is not None

    def _bind_element(
        self, target: cst.BaseExpression, fact: bool | None, statement: cst.Assign, nodes: Nodes, state: _State
    ) -> _State:
        if fact is not None:
            return self._bind(target, nodes if fact else frozenset(), state)
        if isinstance(target, (cst.Tuple, cst.List)):  # Ex) out, (h, c) = lstm(x, (h, c))
            for element in target.elements:
                state = self._bind_element(element.value, None, statement, nodes, state)
            return state
        key = dotted_name(target)
        carried = key is not None and self.graphs.values.carried_state(key, statement, statement.value)
        return self._bind(target, nodes if carried else frozenset(), state)

    def _bind(self, target: cst.BaseExpression, nodes: Nodes, state: _State) -> _State:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                state = self._bind(element.value, nodes, state)
            return state
        key = dotted_name(target)
        if key is None:
            return state
        return _State({**state.env, key: nodes}, state.freed)


def _entry_key(node: cst.Subscript) -> str | None:
    """`losses["actor"]` for an entry of a named container read with one constant key, else None."""
    container = dotted_name(node.value)
    if container is None or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    index = node.slice[0].slice.value
    if not isinstance(index, (cst.SimpleString, cst.Integer)):
        return None
    return f"{container}[{index.value}]"


def _refine(test: cst.BaseExpression, state: _State) -> tuple[_State, _State]:
    """The states in which an `if` body and its `else` run: a name tested for None holds no graph there."""
    # Ex) if hidden is not None: hidden = hidden.detach()  (the other path has no hidden state)
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    if negated and isinstance(test, cst.UnaryOperation):
        test = test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        is_none_test = isinstance(target.operator, (cst.Is, cst.IsNot)) and (
            isinstance(target.comparator, cst.Name) and target.comparator.value == "None"
        )
        if not is_none_test:
            return state, state
        negated ^= isinstance(target.operator, cst.Is)
        test = test.left
    key = dotted_name(test)
    if key is None or key not in state.env:
        return state, state
    empty = _State({**state.env, key: frozenset()}, state.freed)
    return (empty, state) if negated else (state, empty)


def _assigned_keys(statement: cst.Assign | cst.AugAssign | cst.AnnAssign) -> list[str]:
    targets: list[cst.BaseExpression] = (
        [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    )
    keys = []
    while targets:
        target = targets.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            targets.extend(element.value for element in target.elements)
        elif (key := dotted_name(target)) is not None:
            keys.append(key)
    return keys


def _cut_on_entry(helper: cst.FunctionDef) -> frozenset[str]:
    """The parameters the helper's first statements rebind to a cut of themselves (`real = real.data`, `fake =
    fake.detach()`) before any other statement reads more of them than what they are (`real.device`)."""
    parameters = _parameters(helper)
    cut: set[str] = set()
    read: set[str] = set()
    body = helper.body.body if isinstance(helper.body, cst.IndentedBlock) else ()
    for line in body:
        if not isinstance(line, cst.SimpleStatementLine):
            break
        for statement in line.body:
            if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
                target = statement.targets[0].target
                name = target.value if isinstance(target, cst.Name) else None
                if name in parameters and name not in read and _cut_of(statement.value, name):
                    cut.add(name)
                    continue
            # Reading what a tensor is (`device = real.device`) reads none of its history.
            keys = [key.split(".") for key in names_in(statement)]
            read |= {parts[0] for parts in keys if len(parts) == 1 or parts[1] not in NON_GRAD_ATTRIBUTES} & parameters
    return frozenset(cut)


def _cut_of(value: cst.BaseExpression, name: str) -> bool:
    """`name.data`, `name.detach()`, `name.data.clone()`, `name.detach().clone()`: a copy without history."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "clone":
        value = value.func.value
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        return isinstance(value.value, cst.Name) and value.value.value == name
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "detach"
        and isinstance(value.func.value, cst.Name)
        and value.func.value.value == name
    )


def _is_init(scope: Scope) -> bool:
    return isinstance(scope, cst.FunctionDef) and scope.name.value == "__init__"


def _locals(collected: Collected, scope: Scope) -> frozenset[str]:
    """The plain names a function assigns, which Python makes local to it (none for a module)."""
    if not isinstance(scope, cst.FunctionDef):
        return frozenset()
    return frozenset(
        key
        for statement in collected.statements_in_scope(scope)
        if isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        for key in _assigned_keys(statement)
        if "." not in key and "[" not in key
    )


def _parameters(scope: Scope) -> frozenset[str]:
    if not isinstance(scope, cst.FunctionDef):
        return frozenset()
    params = scope.params
    names = {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}
    return frozenset(names - {"self", "cls"})  # self.backward() is a method, not a tensor's backward


def _calls_own_method(call: cst.Call) -> bool:
    func = call.func
    return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"


def _keeps_graph(call: cst.Call) -> bool:
    # retain_graph=True, retain_graph=not last, create_graph=True (retain_graph defaults to it)
    return any(
        arg.keyword is not None
        and arg.keyword.value in ("retain_graph", "create_graph")
        and not (isinstance(arg.value, cst.Name) and arg.value.value in ("False", "None"))
        for arg in call.args
    )
