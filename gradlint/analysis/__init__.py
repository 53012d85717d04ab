"""The shared model of a module that rules query: roles, grad mode, values, training steps."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property, partial

import libcst as cst

from gradlint.analysis.facts.branches import Branches
from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.dtypes import DtypeKind, TensorDtypes
from gradlint.analysis.facts.graphs import Graphs
from gradlint.analysis.facts.keeping import kept_parameters
from gradlint.analysis.facts.leaves import PARAMETER_ITERATORS, Held, Leaves, iterated_holder, parameters_holder
from gradlint.analysis.facts.lineage import COUNTER, Lineages, zipped_iterable
from gradlint.analysis.facts.mutations import Mutations
from gradlint.analysis.facts.nograd import NoGradValues
from gradlint.analysis.facts.origins import Binding, Origins
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.shapes import Shapes
from gradlint.analysis.facts.steps import Event, EventIndex, Kind, TrainingStep
from gradlint.analysis.facts.tensors import TensorProofs
from gradlint.analysis.facts.values import GradValues
from gradlint.analysis.project.program import Callee, ModuleProgram
from gradlint.analysis.project.summaries import UPDATE, Effect
from gradlint.analysis.syntax.collect import Collected, Context, GradMode, Loop, Scope, collect
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in, prefixes
from gradlint.analysis.syntax.positions import ModulePositions, WrittenStatements
from gradlint.analysis.syntax.refs import BUILTINS, arguments_of
from gradlint.analysis.syntax.tree import descendants
from gradlint.analysis.training.accumulation import Accumulations
from gradlint.analysis.training.copies import LeafCopies
from gradlint.analysis.training.evaluation import Evaluation
from gradlint.analysis.training.freed import FreedGraphs
from gradlint.analysis.training.freezing import Freezing
from gradlint.analysis.training.modes import ModeSwitches
from gradlint.analysis.training.targets import Targets
from gradlint.analysis.training.updates import Updates
from gradlint.decoding import LINE_BREAK
from gradlint.pytest_layout import TestLayout

# How far class bases are followed to decide whether a class holds tests.
MAX_CLASS_DEPTH = 8
# Methods that take an entry out of a list or deque and return it.
TAKING_METHODS = frozenset({"pop", "popleft"})

__all__ = ["Context", "Event", "GradMode", "Kind", "ModuleAnalysis", "Role", "TrainingStep", "analyze"]


@dataclass(frozen=True)
class OutsideUpdate:
    """A call that updates parameters in place from their gradients in another module of the project."""

    call: cst.Call
    value: cst.BaseExpression  # what the call passes: a parameter or an iterable of them
    via: str  # the function called, `module.qualname`


class ModuleAnalysis:
    """Facts about one parsed module, computed once and shared by every rule."""

    def __init__(
        self,
        module: cst.Module,
        collected: Collected,
        program: ModuleProgram | None = None,
        written: WrittenStatements | None = None,
        tests: TestLayout | None = None,
    ) -> None:
        self.module = module
        self.tests = tests  # the project's collection patterns, when pytest collects this file; else None
        self.written = written  # the statements of this document's last version, for `positions`
        self.collected = collected
        self.imports = collected.imports
        self.program = program
        bases = partial(program.class_bases, imports=collected.imports) if program is not None else None
        returns = partial(program.returned_role, imports=collected.imports) if program is not None else None
        self.roles = Roles(collected, bases, returns)
        self.events = EventIndex(collected, self.roles, program)
        self.values = GradValues(collected, self.roles, self.events)
        self._statements_in: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}

    @cached_property
    def positions(self) -> ModulePositions:
        """Where each node is in the source; resolved on first use, which only files with findings need."""
        return ModulePositions(self.module, self.written)

    @cached_property
    def lines(self) -> list[str]:
        """The source's lines without their line breaks; `lines[n - 1]` is line n of a position."""
        return LINE_BREAK.split(self.positions.code)

    def in_test(self, node: cst.CSTNode) -> bool:
        """Whether `node` is in a test as pytest and unittest collect them, or in a function nested in one.

        A function of a file pytest collects whose name matches `python_functions`, at
        module level or in a class pytest collects (`python_classes`, no `__init__`, or a
        base such a class has in this module); and a `test*` method of a class that
        derives from a `TestCase`, in any file (`unittest.main()` runs it). Not a name:
        `def test(epoch):` in a training script, or `Trainer.test()`, is evaluation code.
        """
        context = self.collected.contexts.get(node)
        function = node if isinstance(node, cst.FunctionDef) else context.function if context is not None else None
        while function is not None:
            scope = self.collected.def_scopes.get(function)
            if self._collected_test(function, scope, self.collected.owners.get(function)):
                return True
            function = scope if isinstance(scope, cst.FunctionDef) else None
        return False

    def _collected_test(self, function: cst.FunctionDef, scope: Scope | None, owner: cst.ClassDef | None) -> bool:
        name = function.name.value
        if owner is not None and name.startswith("test") and self._unittest_case(owner, 0):
            return True
        if self.tests is None or not self.tests.collects_function(name):
            return False
        return self._test_class(owner, 0) if owner is not None else isinstance(scope, cst.Module)

    def _test_class(self, owner: cst.ClassDef, depth: int) -> bool:
        """A class pytest collects, or a base of one in this module (whose tests it inherits)."""
        if depth > MAX_CLASS_DEPTH or self.tests is None:
            return False
        owners = self.collected.owners
        if self.tests.collects_class(owner.name.value) and not any(
            method.name.value == "__init__" and owners.get(method) is owner for method in self.collected.functions
        ):
            return True
        return any(
            owner.name.value in {last_name(base.value) for base in other.bases}
            and (self._test_class(other, depth + 1) or self._unittest_case(other, depth + 1))
            for other in self.collected.classes
            if other is not owner
        )

    def _unittest_case(self, owner: cst.ClassDef, depth: int) -> bool:
        """Whether `owner` derives from a `TestCase` (unittest's, or one built on it: torch's, absltest's), through
        the classes of this module and, with the whole program, of the project."""
        if depth > MAX_CLASS_DEPTH:
            return False
        for base in owner.bases:
            name = last_name(base.value) or ""
            if name.endswith("TestCase"):
                return True
            inner = next((cls for cls in self.collected.classes if cls.name.value == name and cls is not owner), None)
            if inner is not None and self._unittest_case(inner, depth + 1):
                return True
            dotted = dotted_name(base.value)
            if (
                inner is None
                and dotted is not None
                and self.program is not None
                and any(b.endswith("TestCase") for b in self.program.class_bases(dotted, self.imports) or ())
            ):
                return True
        return False

    @cached_property
    def branches(self) -> Branches:
        """Which events of a step exclude each other (if/else branches, early exits)."""
        return Branches()

    @cached_property
    def dtypes(self) -> TensorDtypes:
        """Whether tensor expressions are integral or floating, where the source shows it."""
        return TensorDtypes(self.collected)

    def holds_no_graph(self, target: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `target`, just before statement `at`, is a tensor of an integer or bool dtype (`counts =
        torch.zeros([], dtype=torch.int)`): such a tensor cannot require grad, so nothing added into it in place
        keeps a graph."""
        return self.dtypes.dtype_of(target, at) is DtypeKind.INTEGRAL

    @property
    def origins(self) -> Origins:
        """Which assignments of a name may reach a statement: where its value was computed."""
        return self.events.origins

    @cached_property
    def shapes(self) -> Shapes:
        """Whether tensor expressions are scalars, clearly not, or unknown."""
        return Shapes(self.collected, self.roles, self.events, self.origins)

    @cached_property
    def tensors(self) -> TensorProofs:
        """Which expressions are proven tensors (and one-element ones): what a fix may rely on."""
        return TensorProofs(self.collected, self.roles, self.events, self.origins, self.shapes)

    @cached_property
    def lineage(self) -> Lineages:
        """What values were computed from, and which operations without a gradient cut them."""
        return Lineages(self.collected, self.roles, self.events, self.origins, self.callers, self.leaves)

    @cached_property
    def targets(self) -> Targets:
        """Constants of backpropagated losses (TD targets, advantages, soft targets) that carry a gradient."""
        return Targets(self.collected, self.roles, self.events, self.origins, self.lineage, self.leaves, self.callers)

    @cached_property
    def no_grad_values(self) -> NoGradValues:
        """Which values were provably computed with autograd off."""
        return NoGradValues(self.collected, self.roles, self.events, self.origins)

    @cached_property
    def callers(self) -> CallerGradMode:
        """Whether code runs without grad, counting the grad mode of its function's callers."""
        return CallerGradMode(self.collected, self.events)

    @cached_property
    def leaves(self) -> Leaves:
        """Which names hold leaf tensors that require grad (parameters), or iterables of them."""
        binds_other = partial(self.program.binds_other, imports=self.imports) if self.program is not None else None
        return Leaves(self.collected, self.roles, self.callers, binds_other)

    @cached_property
    def leaf_copies(self) -> LeafCopies:
        """Copies of leaves that require grad (`w.cuda()`, `w * 0.01`) used as parameters: optimized, updated."""
        return LeafCopies(self.collected, self.roles, self.events, self.leaves, self.callers, self.program)

    @cached_property
    def mutations(self) -> Mutations:
        """The in-place operations of the module and the manual parameter updates among them."""
        return Mutations(self.collected, self.leaves, self.roles)

    @cached_property
    def outside_calls(self) -> list[tuple[cst.Call, Callee, list[tuple[Effect, cst.BaseExpression | None]]]]:
        """The calls worth following (`EventIndex.worth_following`) that run a function of another module of the
        project, each with that function and its effects bound to this call's arguments (`ModuleProgram.
        bound_effects`)."""
        if self.program is None:
            return []
        found = []
        for call in self.collected.calls:
            context = self.context(call)
            if self.events.worth_following(context):
                bound = self.program.bound_effects(call, context, self.events, self.events.call_view(call))
                if bound is not None and bound[0].module != self.program.module:  # this module's: judged in place
                    found.append((call, *bound))
        return found

    @cached_property
    def outside_updates(self) -> list[OutsideUpdate]:
        """Calls that run, in another module of the project, an in-place update from gradients of parameters
        this module passes (`sgd(model.parameters(), lr)` doing `p.add_(p.grad, alpha=-lr)`), while autograd
        surely records here and nothing there turns it off."""
        found = []
        for call, callee, effects in self.outside_calls:
            if self.context(call).no_grad:
                continue
            for effect, value in effects:
                if effect.kind != UPDATE or effect.no_grad or value is None:
                    continue
                if self.holds_parameters(value, call) and self.callers.with_grad(call):
                    found.append(OutsideUpdate(call, value, callee.origin))
                    break
        return found

    def holds_parameters(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A leaf that requires grad, an iterable of them, or a model (whose `parameters()` a callee updates)."""
        if self.roles.role(value) is Role.MODEL:
            value = cst.Call(cst.Attribute(value, cst.Name("parameters")))
        return self.leaves.held(value, at) is not Held.OTHER

    @property
    def parameterless(self) -> frozenset[str]:
        """This module's classes proven to hold no parameters (`facts.parameters`)."""
        return self.values.parameterless

    def kept_by(self, call: cst.Call, at: cst.CSTNode) -> list[tuple[cst.BaseExpression, str]]:
        """The arguments that the project method `call` runs keeps on its object (`facts.keeping`), each with the
        attribute that holds it: `meter.update(loss, n)`, whose `update` runs `self.sum += val * n` in this module
        or in another, keeps `loss` in `sum`. `at`: the statement of the call."""
        method = self.events.resolve_instance_method(call)
        if method is not None:
            given = arguments_of(method, call)
            kept = kept_parameters(self.collected, self.values, method)
            return [(given[param], attribute) for param, attribute in kept if param in given]
        return self.program.kept(call, self.context(at), self.events) if self.program is not None else []

    @cached_property
    def graphs(self) -> Graphs:
        """What values were computed from, whether they require grad, what backward saved."""
        saved = partial(self.program.saves_output, imports=self.imports) if self.program is not None else None
        return Graphs(
            self.collected,
            self.roles,
            self.values,
            self.leaves,
            self.origins,
            self.callers.call_sites,
            saved,
            self.dtypes,
        )

    def own_events(self, kind: Kind) -> list[Event]:
        """The events of one kind written in each scope itself (not reached through a helper), in order."""
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        return [
            event
            for scope in scopes
            for event in self.events.scope_events(scope)
            if event.kind is kind and event.direct
        ]

    @cached_property
    def accumulations(self) -> Accumulations:
        """Gradient accumulation: micro-batch loops, their counters, and how each accumulated loss is scaled."""
        return Accumulations(self.collected, self.events, self.origins)

    @cached_property
    def updates(self) -> Updates:
        """Which models each optimizer updates, and steps that change weights a later backward needs."""
        return Updates(self.collected, self.roles, self.events, self.origins, self.branches)

    @cached_property
    def freed_graphs(self) -> FreedGraphs:
        """Backward calls that run through a graph an earlier backward freed."""
        return FreedGraphs(self.collected, self.events, self.values)

    @cached_property
    def evaluation(self) -> Evaluation:
        """Evaluation code: model calls in eval regions that run with autograd recording."""
        return Evaluation(self.collected, self.roles, self.events, self.values, self.callers, self.lineage)

    @cached_property
    def modes(self) -> ModeSwitches:
        """Train/eval mode switches and the training passes an eval mode leaks into."""
        return ModeSwitches(
            self.collected,
            self.events,
            self.backpropagated_names,
            self.rebinds,
            self.updates.updated_models,
            self.updates.updated_models_in,
            self.updates.updates_only_tensors,
            self.program,
        )

    @cached_property
    def freezing(self) -> Freezing:
        """Where parameters are frozen, which receivers are modules, and freezes that do not hold."""
        return Freezing(self.collected, self.roles, self.origins, self.events)

    @cached_property
    def training_steps(self) -> list[TrainingStep]:
        """Every training step of the module, in source order."""
        return self.events.training_steps()

    def context(self, node: cst.CSTNode) -> Context:
        """Where a call or statement sits: scope, loops, ifs and grad mode."""
        return self.collected.contexts[node]

    def statement_of(self, call: cst.Call) -> cst.CSTNode:
        """The statement a call belongs to."""
        return self.collected.statement_of[call]

    def statements_in(self, region: Loop | Scope) -> list[cst.BaseSmallStatement]:
        """The simple statements of a loop's body, or a function's or the module's own body, in order."""
        if region not in self._statements_in:
            if isinstance(region, (cst.FunctionDef, cst.Module)):
                found = self.collected.statements_in_scope(region)
            else:
                found = self.collected.statements_in_loop(region)
            self._statements_in[region] = found
        return self._statements_in[region]

    def stepped_objects(self, event: Event) -> set[str]:
        """The dotted names of what a STEP event updates: the optimizer (`opt`), or the tensor updated by hand and,
        for a loop variable, what the loop takes it from (`p` and `model` in `for p in model.parameters()`)."""
        found = {event.target} if event.target is not None else set()
        if event.by_hand and event.value is not None and event.node in self.collected.contexts:
            holder = parameters_holder(event.value, self.context(event.node).loops)
            key = dotted_name(holder) if holder is not None else None
            found.update({key} if key is not None else ())
        return found

    def same_target(self, first: Event, second: Event) -> bool:
        """Whether two events act on the same object: the same dotted name, and not two locals of different functions
        (`optimizer` built in one stage helper and `optimizer` built in another are two optimizers)."""
        if first.target is None or first.target != second.target:
            return False
        holders = [self._local_holder(event) for event in (first, second)]
        return holders[0] is None or holders[1] is None or holders[0] is holders[1]

    def clears_other_tensors(self, clear: Event, step: Event) -> bool:
        """Whether a clear of tensors' own gradients (`param.grad = None` in a loop over a list) is proven to clear
        other tensors than the ones `step`'s optimizer holds: the loop takes them from one list, the optimizer was
        built over another, and neither list is bound from the other (master weights stepped, copies freed)."""
        node = clear.node
        if not isinstance(node, cst.Assign) or len(node.targets) != 1 or step.target is None:
            return False
        target = node.targets[0].target
        if not (
            isinstance(target, cst.Attribute) and target.attr.value == "grad" and isinstance(target.value, cst.Name)
        ):
            return False
        cleared = self._iterated_from(target.value, node)
        built = self._built_over(step)
        if cleared is None or built is None:
            return False
        return not (self._bound_from(cleared, built, node) or self._bound_from(built, cleared, node))

    def _iterated_from(self, tensor: cst.Name, at: cst.CSTNode) -> str | None:
        """The dotted name of the list or module a loop variable takes its tensor from, through `zip` too."""
        for definition in self.origins.definitions(tensor.value, at):
            if definition.binding is not Binding.LOOP:
                continue
            zipped = zipped_iterable(definition, tensor.value)
            if zipped is COUNTER:
                return None
            holder = zipped if zipped is not None else parameters_holder(tensor, (definition.node,))
            return dotted_name(iterated_holder(holder)) if holder is not None else None
        return None

    def _built_over(self, step: Event) -> str | None:
        """The dotted name of what the stepped optimizer was built over (`master` for `Adam(master, lr=...)`), when
        every binding of it in the scope builds it."""
        if not isinstance(step.node, cst.Call) or step.target is None or not step.direct:
            return None
        definitions = self.origins.definitions(step.target, self.statement_of(step.node))
        found = set()
        for definition in definitions:
            value = definition.value
            if definition.binding is not Binding.ASSIGN or not isinstance(value, cst.Call) or not value.args:
                return None
            if self.roles.role_of_value(value) is not Role.OPTIMIZER or value.args[0].keyword is not None:
                return None
            found.add(dotted_name(iterated_holder(value.args[0].value)))
        return found.pop() if len(found) == 1 else None

    def _bound_from(self, key: str, other: str, at: cst.CSTNode) -> bool:
        """Whether `key` may name tensors of `other`: one is a prefix of the other, or `key` is bound (not known
        how, or as an alias: `list(other)`, `[p for p in other]`) from `other`. A list of copies is not."""
        if key == other or key.startswith(other + ".") or other.startswith(key + "."):
            return True
        for definition in self.origins.definitions(key.split(".")[0], at):
            if definition.binding is not Binding.ASSIGN or definition.value is None:
                return True
            alias = _alias_of(definition.value)
            if alias is None:
                continue  # Ex) master = [p.detach().float().clone() for p in params]: copies
            if alias == other or alias.startswith(other + ".") or other.startswith(alias + "."):
                return True
        return False

    def _local_holder(self, event: Event) -> cst.FunctionDef | None:
        """The function of this module whose own local `event.target` is, when the event's node is in it."""
        context = self.collected.contexts.get(event.node)
        function = context.function if context is not None else None
        if function is None or event.value is None or not isinstance(event.node, cst.Call):
            return None
        root = (event.target or "").split(".")[0]
        if root in ("self", "cls"):
            return None
        definitions = self.origins.definitions(root, self.statement_of(event.node))
        local = bool(definitions) and all(definition.binding is not Binding.OUTSIDE for definition in definitions)
        return function if local else None

    def handed_to_unknown(self, region: Loop | cst.FunctionDef, keys: Collection[str]) -> cst.Call | None:
        """A call in `region` that hands one of the objects `keys` name (itself, an attribute of it, its
        `.parameters()`) to a callee gradlint cannot read: an import from outside the project, a name it
        cannot resolve. What that callee does to it (clear it, step it, switch it to eval) is unknown.

        Known callees: torch's API and Python's builtins, a function of this module or a summarized one of
        the project, a method of the object itself, and calls that are gradient events (`scaler.step(opt)`).
        """
        events = self.events
        for statement in self.statements_in(region):
            for call in self.collected.calls_in_statement(statement):
                if not any(_object_key(arg.value) in keys for arg in call.args):
                    continue
                func = call.func
                receiver = dotted_name(func.value) if isinstance(func, cst.Attribute) else None
                if (
                    (self.imports.resolve(func) or "").startswith("torch.")
                    or (isinstance(func, cst.Name) and func.value in BUILTINS)
                    or receiver in keys
                    or events.classify(call) is not None
                    or events.resolve_helper(call) is not None
                    or events.resolve_instance_method(events.call_view(call), call) is not None
                    or events.outside(call) is not None
                ):
                    continue
                return call
        return None

    def rebinds(
        self,
        region: Loop | Scope,
        key: str,
        seen: frozenset[cst.FunctionDef] = frozenset(),
        whenever: cst.CSTNode | None = None,
    ) -> bool:
        """Whether `key` gets a fresh value inside `region` (`x = ...` not reading x, `x.clear()`, `del x`).

        The assignment may unpack (`losses, accs = [], []`) or be annotated (`losses: list[Tensor] = []`).
        A method of this module called on the object does it too: `pi.train_net()` whose body sets
        `self.data = []` gives `pi.data` a fresh start. With `whenever` (a statement of the region), only a
        fresh start that runs whenever that statement runs counts: one under an `if` of its own (`if step %
        log_every == 0: total = 0`) runs only on some passes, and what is kept between them stays.
        """
        for statement in self.statements_in(region):
            if whenever is not None and not self._runs_whenever(statement, whenever):
                continue
            if self._rebinds_through_method(statement, key, seen):
                return True
            if isinstance(statement, cst.Assign) and key not in set(names_in(statement.value)):
                if any(key in _bound_keys(target.target) for target in statement.targets):
                    return True
            elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
                if key not in set(names_in(statement.value)) and key in _bound_keys(statement.target):
                    return True
            elif isinstance(statement, cst.Del) and key in set(names_in(statement.target)):
                return True
            elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
                func = statement.value.func
                if isinstance(func, cst.Attribute) and func.attr.value == "clear" and dotted_name(func.value) == key:
                    return True
        return False

    def _runs_whenever(self, statement: cst.CSTNode, other: cst.CSTNode) -> bool:
        """Whether `statement` sits in no branch that `other` does not sit in too (same `if`, same arm)."""

        def arm(branch: cst.CSTNode, node: cst.CSTNode) -> tuple[cst.CSTNode, bool]:
            return branch, isinstance(branch, cst.If) and self.collected.in_body(branch, node)

        theirs = {arm(branch, other) for branch in self.collected.contexts[other].ifs}
        return all(arm(branch, statement) in theirs for branch in self.collected.contexts[statement].ifs)

    def assigns_fresh(self, region: Loop | cst.FunctionDef, key: str) -> bool:
        """Whether `region` assigns `key` a value that reads nothing of it.

        Ex) `model = Net()`, not `model = model.train()`: unlike `rebinds`, an attribute read counts as reading it.
        """
        for statement in self.statements_in(region):
            if not isinstance(statement, cst.Assign):
                continue
            if any(key in _bound_keys(target.target) for target in statement.targets):
                read = set(names_in(statement.value))
                if not any(name == key or name.startswith(key + ".") for name in read):
                    return True
        return False

    def grown_per_forward(self, function: cst.FunctionDef, key: str) -> bool:
        """Whether `key`, an attribute of `self` that `function` adds to, outlives every call: `function` is the
        `forward` of a class proven an nn.Module, which runs once per step of whoever trains it, and nothing in
        view gives the attribute a fresh start, neither the forward itself, nor another method of the class
        (its constructor aside), nor code of this module on another receiver (`model.saved.clear()`)."""
        owner = self.collected.owners.get(function)
        if function.name.value != "forward" or owner is None or not self.roles.is_model_class(owner):
            return False
        if not key.startswith("self.") or self.rebinds(function, key):
            return False
        attribute = key[len("self.") :]
        for other in self.collected.functions:
            same_class = self.collected.owners.get(other) is owner
            if other is function or (same_class and other.name.value == "__init__"):
                continue
            # Another class's `self.features` is another object's; any other receiver may be this one.
            receivers = {k for k in self._receivers_of(other, attribute) if same_class or not k.startswith("self.")}
            if any(self.rebinds(other, k) for k in receivers):
                return False
        module = self.collected.module
        return not any(self.rebinds(module, k) for k in self._receivers_of(module, attribute))

    def _receivers_of(self, scope: Scope, attribute: str) -> set[str]:
        """The dotted names in `scope` that end in `.attribute` (`self.saved`, `model.saved`)."""
        found = set()
        for statement in self.collected.statements_in_scope(scope):
            for node in descendants(statement):
                if isinstance(node, cst.Attribute) and node.attr.value == attribute:
                    dotted = dotted_name(node)
                    if dotted is not None:
                        found.add(dotted)
        return found

    def _rebinds_through_method(
        self, statement: cst.BaseSmallStatement, key: str, seen: frozenset[cst.FunctionDef]
    ) -> bool:
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
            return False
        call = statement.value
        if not isinstance(call.func, cst.Attribute):
            return False
        owner = dotted_name(call.func.value)
        if owner is None or not key.startswith(owner + "."):
            return False
        method = self.events.resolve_instance_method(call) or self.events.resolve_helper(call)
        if method is None or method in seen:
            return False
        return self.rebinds(method, "self." + key[len(owner) + 1 :], seen | {method})

    def backpropagated_names(self, region: Loop | cst.FunctionDef) -> set[str]:
        """Names whose value reaches a backward inside `region`, through assignments and through the arguments
        of a helper of this module that backpropagates its parameter (`backward_step(output)`)."""
        names: set[str] = set()
        for event in self.events.region_events(region):
            if event.kind is not Kind.BACKWARD or event.value is None:
                continue
            if event.direct:
                names.update(names_in(event.value))
            elif event.via is None and isinstance(event.site, cst.Call):
                helper = self.events.resolve_helper(event.site)
                given = arguments_of(helper, event.site) if helper is not None else {}
                for name in names_in(event.value):
                    if name in given:
                        names.update({*names_in(given[name]), *_taken_from(given[name])})
        assignments = [s for s in self.statements_in(region) if isinstance(s, cst.Assign)]
        # `logits = disc(fake)` reaches a backward that reads `logits.mean`, a method of what it binds
        heads = {head for name in names for head in prefixes(name)}
        changed = True
        while changed:
            changed = False
            for statement in assignments:
                targets = {dotted_name(target.target) for target in statement.targets}
                read = set(names_in(statement.value)) | _taken_from(statement.value)
                if targets & heads and not read <= names:
                    names.update(read)
                    heads.update(head for name in read for head in prefixes(name))
                    changed = True
        return names

    def sources(self, expression: cst.BaseExpression, at: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements of this scope that gave the names `expression` reads the values they hold at `at`."""
        found: dict[cst.CSTNode, None] = {}
        for name in names_in(expression):
            for key in prefixes(name):
                for definition in self.origins.definitions(key, at):
                    if definition.node in self.collected.order:  # not OUTSIDE: bound in this scope
                        found[definition.node] = None
        return sorted(found, key=self.collected.order.__getitem__)

    def code(self, node: cst.CSTNode, limit: int = 40) -> str:
        """The source of `node` on one line, shortened to `limit` characters: for naming values in messages."""
        text = " ".join(self.module.code_for_node(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def is_grad(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether `expression` carries autograd history just before statement `at`."""
        return self.values.is_grad(expression, at)


def analyze(
    module: cst.Module,
    wanted_types: frozenset[str] = frozenset(),
    program: ModuleProgram | None = None,
    written: WrittenStatements | None = None,
    tests: TestLayout | None = None,
) -> ModuleAnalysis:
    """Traverse `module` once and build its analysis; `wanted_types` are indexed for rules.

    With `program`, calls into other modules of the project are judged by their summaries;
    `written` holds the top-level statements of an earlier version already written out;
    `tests`, the project's pytest patterns when pytest collects the module's file.
    """
    return ModuleAnalysis(module, collect(module, wanted_types), program, written, tests)


def _object_key(argument: cst.BaseExpression) -> str | None:
    """The object an argument hands over: `model` for `model`, `model.parameters()`, `opt.param_groups`."""
    if isinstance(argument, cst.Call) and isinstance(argument.func, cst.Attribute):
        if argument.func.attr.value in PARAMETER_ITERATORS and not argument.args:
            return dotted_name(argument.func.value)
        return None
    if isinstance(argument, cst.Attribute) and argument.attr.value == "param_groups":
        return dotted_name(argument.value)
    return dotted_name(argument)


def _taken_from(value: cst.BaseExpression) -> set[str]:
    """The containers `value` takes an entry out of: `queue` in `queue.pop(0)`, `queue.popleft()` or
    `queues[chunk].pop(0)`, so a backward on the entry backpropagates what the container kept (a pipeline
    schedule's queue of outputs)."""
    taken: set[str] = set()
    for node in descendants(value):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in TAKING_METHODS
        ):
            container = node.func.value
            while isinstance(container, cst.Subscript):
                container = container.value
            key = dotted_name(container)
            if key is not None:
                taken.add(key)
    return taken


def _bound_keys(target: cst.BaseExpression) -> set[str]:
    """The dotted names an assignment target binds, unpacking tuples and lists (`a, (b, *c) = ...`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return {key for element in target.elements for key in _bound_keys(element.value)}
    key = dotted_name(target)
    return {key} if key is not None else set()


def _alias_of(value: cst.BaseExpression) -> str | None:
    """What a list is bound from when it holds the very same tensors: `list(params)`, `params[1:]`,
    `[p for p in model.parameters()]`, `model.parameters()`; None for anything else (new tensors, copies)."""
    if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
        target, element = value.for_in.target, value.elt
        if isinstance(target, cst.Name) and isinstance(element, cst.Name) and element.value == target.value:
            return dotted_name(iterated_holder(value.for_in.iter))
        return None
    if isinstance(value, cst.Subscript):
        return dotted_name(value.value)
    if isinstance(value, (cst.Name, cst.Attribute)) or (
        isinstance(value, cst.Call) and last_name(value.func) in ("list", "tuple", "parameters")
    ):
        return dotted_name(iterated_holder(value))
    return None
