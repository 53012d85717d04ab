"""Optimizer steps that change weights a later backward still needs.

`optimizer.step()` updates its parameters in place. A loss computed through a model
before that model's optimizer steps saved the model's weights for its backward: if the
loss is backpropagated after the step (a GAN that steps the discriminator between
computing the generator's loss and backpropagating it), backward raises "one of the
variables needed for gradient computation has been modified by an inplace operation"
(PyTorch 1.5 and later). The step may be written in the loop or run by a helper of
this module or another (the events of the training step carry it either way).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import libcst as cst

from gradlint.analysis.facts.branches import Branches
from gradlint.analysis.facts.leaves import is_leaf_value
from gradlint.analysis.facts.origins import OUTSIDE, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import Event, EventIndex, Kind, TrainingStep, straight_run
from gradlint.analysis.facts.values import DETACHING_METHODS
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.names import dotted_name, forward_receiver, last_name, unpacked_index
from gradlint.analysis.syntax.refs import arguments_of
from gradlint.analysis.syntax.tree import children, descendants

MAX_DEPTH = 6
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})


@dataclass(frozen=True)
class StaleWeights:
    """A backward through `model`, whose optimizer stepped after the loss was computed."""

    backward: Event
    step: Event
    model: str
    computed: cst.CSTNode  # the statement that computed the loss through the model


@dataclass(frozen=True)
class ForeignGradients:
    """Gradients a backward left on `model` for another optimizer, which `model`'s own optimizer applies with its own.

    `backward` was computed through `model` and optimizers' parameters (a GAN's generator loss, through the
    discriminator); `taken`, another optimizer's step, applied what the backward was for; `own` backpropagates the
    loss `model`'s optimizer is for, and `applied`, that optimizer's step, applies both: no clear that covers `model`
    runs between `backward` and `applied`.
    """

    backward: Event
    taken: Event
    own: Event
    applied: Event
    model: str


class Updates:
    """Which models an optimizer updates, and which steps change weights a later backward needs."""

    def __init__(
        self, collected: Collected, roles: Roles, events: EventIndex, origins: Origins, branches: Branches
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.origins = origins
        self.branches = branches
        self._updated: dict[str, frozenset[str]] = {}

    def builds_optimizers(self) -> bool:
        """Whether the module builds an optimizer (`Adam(D.parameters())`), which a step can be traced to."""
        return any(self.roles.role_of_value(call) is Role.OPTIMIZER for call in self.collected.calls)

    def updated_models(self, optimizer: cst.BaseExpression) -> frozenset[str]:
        """The models whose parameters `optimizer` was built on: `Adam(D.parameters())`, param groups, sums."""
        # By name: every optimizer of the module called `optimizer` has the same constructors.
        key = dotted_name(optimizer)
        if key is not None and key in self._updated:
            return self._updated[key]
        models: set[str] = set()
        owner = key.rpartition(".")[0] if key is not None else ""
        for constructor in self.roles.constructors(optimizer):
            # Built in a method of the class that built `owner` (`roles.values_of`): its `self` is `owner`.
            models |= {_on(owner, model) if owner else model for model in _parameter_owners(constructor)}
        if not models and key is not None and "." in key:
            models = self._built_by_class(key)
        if key is not None:
            self._updated[key] = frozenset(models)
        return frozenset(models)

    def updates_only_tensors(self, optimizer: cst.BaseExpression) -> bool:
        """Whether every construction of `optimizer` is built on a list of tensors made to be trained, no model's
        parameters among them (`Adam([delta_feat])` after `delta_feat = nn.Parameter(torch.zeros(n, d))`): a forward
        of a model feeding its loss trains the inputs, not the model."""
        constructors = self.roles.constructors(optimizer)
        if not constructors:
            return False
        for constructor in constructors:
            given = [arg.value for arg in constructor.args if arg.keyword is None or arg.keyword.value == "params"]
            if not given or not isinstance(given[0], (cst.List, cst.Tuple)) or not given[0].elements:
                return False
            for element in given[0].elements:
                key = dotted_name(element.value)
                bound = self.roles.values.get(key, []) if key is not None else []
                if not bound or not all(is_leaf_value(value) for value in bound):
                    return False
        return True

    def _built_by_class(self, key: str) -> set[str]:
        """The models an optimizer held on an instance of a class of this module was built on, as its methods build
        it: `model.dis_optimizer` after `model = RN(...)`, whose `__init__` sets `self.dis_optimizer =
        Adam(self.discriminator.parameters())`, updates `model.discriminator`."""
        owner, _, attribute = key.rpartition(".")
        cls = self.events.class_of(owner)
        if cls is None:
            return set()
        models: set[str] = set()
        for function, defined_in in self.collected.owners.items():
            if defined_in is not cls:
                continue
            for statement in self.collected.statements_in_scope(function):
                if not isinstance(statement, cst.Assign) or statement.value is None:
                    continue
                if not any(dotted_name(target.target) == f"self.{attribute}" for target in statement.targets):
                    continue
                if self.roles.role_of_value(statement.value) is Role.OPTIMIZER:
                    models |= {_on(owner, model) for model in _parameter_owners(statement.value)}
        return models

    def updated_models_in(self, optimizer: cst.BaseExpression, scope: Scope) -> frozenset[str]:
        """Like `updated_models`, from the constructors written in `scope` only, and through the names their
        arguments read there: `params = chain(unet.parameters(), text_encoder.parameters()); AdamW(params)`."""
        models: set[str] = set()
        for constructor in self.roles.constructors(optimizer):
            if self.collected.contexts[constructor].scope is not scope:
                continue
            models |= _parameter_owners(constructor)
            keys = {key for arg in constructor.args if (key := dotted_name(arg.value)) is not None}
            for statement in self.collected.statements_in_scope(scope) if keys else ():
                if isinstance(statement, cst.Assign) and any(dotted_name(t.target) in keys for t in statement.targets):
                    models |= _parameter_owners(statement.value)
        return frozenset(models)

    def stale_weights(self, steps: list[TrainingStep]) -> list[StaleWeights]:
        """The stale weights of every training step, and of every function that backpropagates and steps in its own
        straight line though a loop elsewhere runs it (a GAN class's `optimize_parameters()`, whose losses a method
        of the same object computes): there the losses and the steps are named as the function names them."""
        found: list[StaleWeights] = []
        reported: set[cst.CSTNode] = set()
        covered = {step.node for step in steps}
        for step in [*steps, *(s for s in self.events.step_functions() if s.node not in covered)]:
            for stale in self.stale(step):
                if stale.backward.site not in reported:
                    reported.add(stale.backward.site)
                    found.append(stale)
        return found

    def stale(self, step: TrainingStep) -> list[StaleWeights]:
        """Backwards of `step` whose loss was computed through a model an optimizer stepped since."""
        found = []
        order = self.collected.order
        for index, backward in enumerate(step.events):
            if backward.kind is not Kind.BACKWARD or backward.value is None:
                continue
            statement = self.collected.statement_of.get(backward.site) if isinstance(backward.site, cst.Call) else None
            if statement is None:
                continue
            computed = self._computing_statements(backward.value, statement, step)
            if not computed:
                continue
            key = dotted_name(backward.value)
            for stepped in step.events[:index]:
                if stepped.kind is not Kind.STEP or stepped.value is None or self.branches.exclusive(stepped, backward):
                    continue
                moment = order[stepped.site]
                # A loss computed after the step (`loss = gen_loss + reg`) is fresh itself, but the terms it
                # reads that were computed before the step saved the weights as they were.
                before: list[tuple[cst.CSTNode, str | None]] = []
                for node in computed:
                    before += [(node, key)] if order[node] < moment else self._stale_inputs(node, moment, step)
                models = self.updated_models(stepped.value)
                for node, read in before:
                    called = models & self._models_called(node, lambda found: self._inside(found, step), 0, set(), read)
                    if called:
                        found.append(StaleWeights(backward, stepped, sorted(called)[0], node))
                        break
                else:
                    continue
                break
        return found

    def foreign_gradients(self, step: TrainingStep) -> list[ForeignGradients]:
        """The backwards of `step` whose gradients on one model an optimizer other than the one they were for applies.

        Only a straight run of events is judged (`straight_run`), written in the step itself, with every optimizer
        traced to the models it was built on, and nothing in the step that may freeze a model (a `requires_grad`
        written there, or the model handed to a call): a model whose parameters do not require grad gets none.
        In a loop, the events of the next iteration follow the last one.
        """
        events = straight_run(step, self.collected)
        if events is None or any(not event.direct for event in events):
            return []
        found: list[ForeignGradients] = []
        cyclic = not isinstance(step.node, cst.FunctionDef)
        for index, backward in enumerate(events):
            if backward.kind is not Kind.BACKWARD:
                continue
            reached = self._models_reached(backward, step)
            later = events[index + 1 :] + (events[:index] if cyclic else [])
            foreign = self._applied_again(backward, reached, later, step)
            if foreign is not None:
                found.append(foreign)
        return found

    def _applied_again(
        self, backward: Event, reached: frozenset[str], later: list[Event], step: TrainingStep
    ) -> ForeignGradients | None:
        """The first step after `backward` that applies gradients on `reached` once another optimizer took them."""
        taken: Event | None = None
        own: Event | None = None
        left = set(reached)
        for event in later:
            if event.kind is Kind.CLEAR:
                left = {model for model in left if not self._clear_covers(event, model)}
            elif event.kind is Kind.BACKWARD and taken is not None and own is None:
                own = event if left & self._models_reached(event, step) else None
            elif event.kind is Kind.STEP:
                models = self.updated_models(event.value) if event.value is not None else frozenset()
                if not models:
                    return None  # an optimizer whose parameters are unknown: nothing is proven
                if taken is None:
                    if models & left:
                        taken, left = event, left - models
                    continue
                stepped = sorted(models & left)
                if stepped and own is not None and not self._may_freeze(stepped[0], step):
                    return ForeignGradients(backward, taken, own, event, stepped[0])
                left -= models
            if not left:
                return None
        return None

    def _models_reached(self, backward: Event, step: TrainingStep) -> frozenset[str]:
        """The models the loss of `backward` was computed through inside `step` (empty when that is unknown)."""
        statement = self.collected.statement_of.get(backward.site) if isinstance(backward.site, cst.Call) else None
        if backward.value is None or statement is None:
            return frozenset()
        key = dotted_name(backward.value)
        reached: set[str] = set()
        for node in self._computing_statements(backward.value, statement, step):
            reached |= self._models_called(node, lambda found: self._inside(found, step), 0, set(), key)
        return frozenset(reached)

    def _clear_covers(self, clear: Event, model: str) -> bool:
        """Whether `clear` may clear `model`'s gradients: all but an optimizer traced to other models."""
        if clear.value is None or not self.roles.is_optimizer(clear.value):
            return True  # `model.zero_grad()`, `p.grad = None`, a helper: may cover every parameter
        models = self.updated_models(clear.value)
        return not models or model in models

    def _may_freeze(self, model: str, step: TrainingStep) -> bool:
        """Whether the step may switch off `model`'s gradients: it writes `requires_grad`, or hands the model to a call
        (`set_requires_grad(netD, False)`)."""
        for statement in self.collected.statements_in_scope(step.scope):
            if not self._inside(statement, step):
                continue
            for node in descendants(statement):
                if isinstance(node, cst.Attribute) and node.attr.value in ("requires_grad", "requires_grad_"):
                    return True
                if isinstance(node, cst.Call) and any(
                    dotted_name(value) == model for arg in node.args for value in (arg.value, *_elements(arg.value))
                ):
                    return True
        return False

    def _stale_inputs(self, node: cst.CSTNode, moment: int, step: TrainingStep) -> list[tuple[cst.CSTNode, str]]:
        """The assignments inside `step`, before `moment`, of the names the statement `node` reads."""
        order = self.collected.order
        found: list[tuple[cst.CSTNode, str]] = []
        for read in self._calls_and_reads(node, node, 0, None)[1]:
            for definition in self.origins.definitions(read, node):
                if (
                    definition is not OUTSIDE
                    and self._inside(definition.node, step)
                    and order[definition.node] < moment
                ):
                    found.append((definition.node, read))
        return found

    def _computing_statements(
        self, value: cst.BaseExpression, at: cst.CSTNode, step: TrainingStep
    ) -> list[cst.CSTNode]:
        """The statements inside `step`'s loop that assign the names `value` reads, as reaching `at`."""
        key = dotted_name(value)
        if key is None:
            return []
        definitions = self.origins.definitions(key, at)
        if definitions == (OUTSIDE,) and (set_by := self.events.set_by_method(key, at)) is not None:
            nodes = [set_by.statement]  # Ex) self.compute_losses() before self.loss_G.backward()
        elif not definitions or OUTSIDE in definitions:
            return []
        else:
            nodes = [definition.node for definition in definitions]
        if not all(self._inside(node, step) for node in nodes):
            return []
        return nodes

    def _inside(self, node: cst.CSTNode, step: TrainingStep) -> bool:
        context = self.collected.contexts.get(node)
        if context is None:
            return False
        return step.node in context.loops if not isinstance(step.node, cst.FunctionDef) else context.scope is step.node

    def _models_called(
        self,
        statement: cst.CSTNode,
        within: Callable[[cst.CSTNode], bool],
        depth: int,
        seen: set[tuple[cst.CSTNode, str | None]],
        key: str | None = None,
        value: cst.CSTNode | None = None,
    ) -> set[str]:
        """The models called to compute `key` at `statement` (or its whole value, or `value`, a part of it): directly,
        through the names it reads whose definitions are `within` the step, and inside the same-module helpers it
        calls, whose parameters stand for the call's arguments (`d_loss, g_loss = losses(G, D, z)` calls `D` for
        `g_loss` when the helper's second returned element is computed through its `D`)."""
        if depth > MAX_DEPTH or (statement, key) in seen:
            return set()
        seen.add((statement, key))
        if value is None:
            value = statement
        called, reads = self._calls_and_reads(statement, value, depth, key)
        for read in reads:
            for definition in self.origins.definitions(read, statement):
                if definition is not OUTSIDE and within(definition.node):
                    called |= self._models_called(definition.node, within, depth + 1, seen, read)
        return called

    def _calls_and_reads(
        self, statement: cst.CSTNode, value: cst.CSTNode, depth: int, key: str | None
    ) -> tuple[set[str], list[str]]:
        """The models `value` (part of `statement`) calls, and the names it computes through. A helper's arguments
        count as far as what it hands back reads them: `_temperature_objective(log_pi, data)` returning a loss
        built on `log_pi.detach()` computes through nothing that made `log_pi`."""
        index = unpacked_index(statement, key) if key is not None else None
        called: set[str] = set()
        through: set[str] = set()  # what the helpers' results are computed through, named as the caller names it
        handed: set[int] = set()
        for call in _calls_in(value):
            helper = (
                self.events.resolve_helper(call) or self.events.resolve_instance_method(call)
                if call in self.collected.contexts
                else None
            )
            if helper is not None:
                index_here = index if call is _assigned(statement) else None
                through |= self._helper_models(call, helper, index_here, depth, key)
                handed.update(id(arg.value) for arg in call.args)
                continue
            callee = forward_receiver(call.func)
            name = dotted_name(callee)
            if name is not None and last_name(callee) not in PARAMETER_METHODS:
                called.add(name)
        reads = [read for node in _names_in(value, handed) if (read := dotted_name(node)) is not None]
        return called | through, reads + sorted(through - set(reads))

    def _helper_models(
        self, call: cst.Call, helper: cst.FunctionDef, index: int | None, depth: int, key: str | None = None
    ) -> set[str]:
        """The models a same-module helper calls to compute what it returns (element `index` of a returned tuple),
        or the attribute `key` of `self` it sets (`self.loss_G = ...` in `self.compute_losses()`), named as the
        caller names them: a parameter stands for its argument at `call`."""
        arguments = {param: name for param, given in arguments_of(helper, call).items() if (name := dotted_name(given))}
        called: set[str] = set()
        for statement, returned in self._results(helper, key):
            if index is not None and isinstance(returned, cst.Tuple):
                if index >= len(returned.elements):
                    continue
                returned = returned.elements[index].value
            inside = self._models_called(
                statement,
                lambda found: getattr(self.collected.contexts.get(found), "scope", None) is helper,
                depth + 1,
                set(),
                None,
                returned,
            )
            inside |= self._parameters_read(helper, statement, returned, set(arguments))
            receiver = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
            for name in inside:
                head, _, rest = name.partition(".")
                if head in arguments:
                    called.add(arguments[head] + (f".{rest}" if rest else ""))
                elif head == "self":
                    called.add(_on(receiver, name) if receiver is not None else name)
        return called

    def _parameters_read(
        self, helper: cst.FunctionDef, statement: cst.CSTNode, value: cst.CSTNode, parameters: set[str]
    ) -> set[str]:
        """The parameters of `helper` (or attributes of them) that `value`, at `statement`, computes through: read
        there or by the helper's own assignments it reads, never under a `.detach()`."""
        found: set[str] = set()
        seen: set[cst.CSTNode] = set()
        pending: list[tuple[cst.CSTNode, cst.CSTNode]] = [(statement, value)]
        while pending:
            at, read_from = pending.pop()
            for node in _names_in(read_from):
                name = dotted_name(node)
                if name is None:
                    continue
                if name.partition(".")[0] in parameters:
                    found.add(name)
                for definition in self.origins.definitions(name, at):
                    inside = getattr(self.collected.contexts.get(definition.node), "scope", None) is helper
                    if definition is not OUTSIDE and inside and definition.node not in seen:
                        seen.add(definition.node)
                        pending.append((definition.node, definition.node))
        return found

    def _results(self, helper: cst.FunctionDef, key: str | None) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(statement, value) for what a helper hands back: its assignments of `key` when `key` is an attribute of
        `self` it sets, else its returns."""
        statements = self.collected.statements_in_scope(helper)
        if key is not None and key.startswith("self."):
            sets = [
                (statement, statement.value)
                for statement in statements
                if isinstance(statement, cst.Assign) and any(dotted_name(t.target) == key for t in statement.targets)
            ]
            if sets:
                return list(sets)
        return [(s, s.value) for s in statements if isinstance(s, cst.Return) and s.value is not None]


def _on(owner: str, name: str) -> str:
    """`name`, written in a class's methods, as the caller names it on `owner`: `self.discriminator` on `model`
    is `model.discriminator` (`self` itself, inside the class, stays `self`)."""
    if owner == "self" or not (name == "self" or name.startswith("self.")):
        return name
    return owner + name[len("self") :]


def _elements(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The elements of a list or tuple display (`[netD, netD2]`), else none."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [element.value for element in value.elements]
    return []


def _assigned(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The value an assignment statement binds."""
    return statement.value if isinstance(statement, cst.Assign) else None


def _parameter_owners(node: cst.CSTNode) -> set[str]:
    """The models whose `.parameters()` (or `named_parameters()`) `node` calls."""
    owners = set()
    for call in _calls_in(node):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in PARAMETER_METHODS:
            model = dotted_name(func.value)
            if model is not None:
                owners.add(model)
    return owners


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """The calls in `node` whose results it computes through: none under a `.detach()` (`log_pi.detach()`)."""
    found = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Call):
            func = current.func
            if isinstance(func, cst.Attribute) and func.attr.value in DETACHING_METHODS:
                continue  # no graph back through what computed the receiver
            found.append(current)
        if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        pending.extend(children(current))
    return found


def _names_in(statement: cst.CSTNode, skipped: Collection[int] = ()) -> list[cst.Name | cst.Attribute]:
    """The names a statement reads on its right-hand side (for an assignment, its value), outside the nodes whose
    ids are `skipped`."""
    value = statement.value if isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)) else statement
    if value is None:
        return []
    found: list[cst.Name | cst.Attribute] = []
    pending: list[cst.CSTNode] = [value]
    while pending:
        current = pending.pop()
        if id(current) in skipped:
            continue
        if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) is not None:
            found.append(current)
            continue
        if isinstance(current, cst.Call):
            func = current.func
            if isinstance(func, cst.Attribute) and func.attr.value in DETACHING_METHODS:
                continue  # `fake.detach()`: no graph back through what computed `fake`
            pending.extend(arg.value for arg in current.args)
            if isinstance(func, cst.Attribute):
                pending.append(func.value)
            continue
        pending.extend(children(current))
    return found
