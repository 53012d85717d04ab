"""Evaluation code: the regions of a module that run a model without wanting its gradients.

Two kinds of region are evaluation code:

- from `model.eval()` (or `model.train(False)`) to the next `model.train()` of the same
  scope, in source order;
- the whole body of a function that iterates a loader (`for x, y in val_loader`: a loader's
  name or a torch `DataLoader`, through `tqdm`/`enumerate`/`iter` and local names bound from
  them, `bar = tqdm(loader)`) and
  never backpropagates, steps, clears or clips (same-module helpers included), is not
  named like training or gradient code (`train_epoch`, `fgsm_attack`, `saliency`),
  is not a method of an `nn.Module` and does not return a graph.

A forward inside `with torch.profiler.profile(...)` or `record_function(...)` is left
alone: a profile measures the code as written, grad mode included (and a compiled
model recompiles under a new grad mode).

A region opened by a switch that runs only for some value of a parameter of its function
(`if is_train: model.train()` / `else: model.eval()`, `if mode == "val": model.eval()`)
is judged for that value: what runs only for another one (`if is_train: loss.backward()`)
is not part of it, so one function that trains or validates by a flag evaluates with
autograd recording when its validation forward is not under no_grad.

A region that backpropagates, steps, calls `torch.autograd.grad`, asks for gradients
(`x.requires_grad_()`, `x.requires_grad = True`, `torch.enable_grad()`) or switches the
grad mode by a plain call (`torch.set_grad_enabled(False)`) wants, or may want,
gradients: it is not evaluation code.

The code to run under `no_grad` for a finding is the smallest part of its region that
holds the forward and nothing else that might need gradients: the innermost loop around
the forward when that loop lies wholly after `model.eval()` (and before `model.train()`),
else the statements that follow `model.eval()` in its block up to the next
`model.train()`. Neither may hold a gradient event, a request for gradients, or a call
of unknown effect named like training (`agent.update(...)`, `train_step(...)`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from gradlint.analysis.facts.callers import CallerGradMode
from gradlint.analysis.facts.forwards import ForwardCalls
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.facts.leaves import parameter_names
from gradlint.analysis.facts.lineage import Lineages
from gradlint.analysis.facts.origins import Binding
from gradlint.analysis.facts.roles import Role, Roles
from gradlint.analysis.facts.steps import EventIndex, Given, Kind, runs_when_off, switched_off_at
from gradlint.analysis.facts.values import GradValues
from gradlint.analysis.syntax.collect import Collected, GradMode, Loop, Scope
from gradlint.analysis.syntax.names import dotted_name, forward_receiver, last_name, names_in
from gradlint.analysis.syntax.refs import arguments_of
from gradlint.analysis.syntax.tree import block_holding, descendants
from gradlint.screens import DETACHING, ITERATION_WRAPPERS, LOADER_NAME, MAX_BINDING_DEPTH

TRAINING_NAME = re.compile(
    r"(?i).*(train|fit|step|update|optimi[sz]|learn|backward|loss|attack|advers|perturb|saliency|grad|explain"
    r"|attribut|fgsm|pgd|finetune|distill).*"
)
GRAD_SWITCHES = frozenset({"enable_grad", "set_grad_enabled", "requires_grad_"})
# Calls of unknown effect that may train: never moved under no_grad by a fix.
MIGHT_TRAIN = re.compile(r"(?i).*(train|fit|step|update|optimi[sz]|learn|backward|grad|attack|advers|perturb).*")
# `env.step(action)` advances a simulator: evaluation loops of RL agents call it.
ENVIRONMENT = re.compile(r"(?i)(\w+_)?(env|envs|environment|vec_env|simulator|sim)")
END = 1 << 62
# torch's loaders, by qualified name: iterating one draws batches.
DATA_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
MAX_CALLER_DEPTH = 4
# What returns a whole model, trained weights included, by qualified name.
LOADERS = frozenset({"torch.load", "torch.jit.load"})
# Methods a value passes through on its way to a detaching one (`out.cpu().numpy()`).
PASSING = frozenset(
    {"cpu", "cuda", "to", "float", "double", "half", "squeeze", "unsqueeze", "contiguous", "view", "reshape", "flatten"}
)
# Calls that give numbers to iterate over, not data.
NUMBER_SEQUENCES = frozenset({"range", "trange", "linspace", "arange", "logspace", "geomspace"})
# torch's own `nn.Module` methods, none of which runs the module's forward.
MODULE_API = frozenset(
    {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "eval", "train", "parameters",
     "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules", "named_modules",
     "state_dict", "load_state_dict", "apply", "zero_grad", "requires_grad_", "register_forward_hook",
     "register_forward_pre_hook", "register_full_backward_hook", "register_buffer", "register_parameter",
     "add_module", "get_submodule", "get_parameter", "share_memory", "extra_repr", "forward"}
)  # fmt: skip


@dataclass(frozen=True)
class Region:
    """Part of a scope, by traversal order, that evaluates a model."""

    scope: Scope
    start: int
    end: int
    over_loader: bool  # only loops over a loader count (a function found by its shape)
    phase: tuple[tuple[str, bool | Given], ...] = ()  # the parameter values under which the switch runs

    @property
    def off(self) -> dict[str, bool | Given]:
        """The phase as `runs_when_off` reads it: parameter -> None (True), False (False) or a literal."""
        return dict(self.phase)


class Evaluation:
    """Finds model calls in evaluation code that run with autograd recording."""

    def __init__(
        self,
        collected: Collected,
        roles: Roles,
        events: EventIndex,
        values: GradValues,
        callers: CallerGradMode,
        lineage: Lineages,
    ) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self.values = values
        self.callers = callers
        self.lineage = lineage
        self.forwards = ForwardCalls(collected, roles, events)
        self._exits: dict[Region, list[int]] = {}
        self._receivers: dict[Scope, frozenset[int]] = {}
        self._forward_inside: dict[tuple[cst.FunctionDef, int], cst.Call | None] = {}
        self._tries: dict[Scope, dict[cst.ExceptHandler, cst.Try]] = {}  # the `try` of each `except`, per scope
        self._backpropagated_hooks = frozenset(backpropagated_returns(collected))
        self._reported: list[cst.Call] | None = None

    def iterates_loader(self, loop: Loop) -> bool:
        """Whether `loop` draws batches from a loader or dataset: `for x, y in tqdm(val_loader)`, or a local name
        bound from one first (`tq = tqdm(loader)`; `for batch in tq`), or a torch `DataLoader` built in view."""
        return isinstance(loop, cst.For) and self._is_loader(loop.iter, loop, depth=0)

    def _is_loader(self, iterable: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        while isinstance(iterable, cst.Call) and last_name(iterable.func) in ITERATION_WRAPPERS and iterable.args:
            iterable = iterable.args[0].value
        if isinstance(iterable, cst.Call):
            return self.collected.imports.resolve(iterable.func) in DATA_LOADERS
        name = last_name(iterable)
        if name is not None and LOADER_NAME.fullmatch(name) is not None:
            return True
        if not isinstance(iterable, cst.Name) or depth >= MAX_BINDING_DEPTH:
            return False
        statement = self.collected.statement_of.get(at) if isinstance(at, cst.Call) else at
        bound = self.events.origins.definitions(iterable.value, statement or at)
        return all(d.binding is Binding.ASSIGN for d in bound) and all(
            self._is_loader(d.value, d.node, depth + 1) for d in bound
        )

    def graph_building_forwards(self) -> list[cst.Call]:
        """The first model call of each evaluation loop that runs outside no_grad, in source order."""
        if self._reported is None:
            self._reported = self._graph_building_forwards()
        return self._reported

    def _graph_building_forwards(self) -> list[cst.Call]:
        first: dict[Loop, cst.Call] = {}
        # Only a forward inside a loop is reported, and a function's loops are its own; a function
        # found by its shape reports only forwards in loops over a loader.
        looping: dict[Scope, bool] = {}
        for loop in self.collected.loops:
            scope = self.collected.contexts[loop].scope
            looping[scope] = looping.get(scope, False) or self.iterates_loader(loop)
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        discarded: list[cst.Call] = []
        inference = self._inference_scopes()
        for scope in (scope for scope in scopes if not self._is_module_forward(scope)):
            regions = self.regions(scope, by_shape=looping.get(scope, False))
            if scope in inference:
                regions.append(Region(scope, -1, END, over_loader=False))
            for region in regions:
                if self._wants_gradients(region):
                    continue
                for call in self._forwards_in(region):
                    loop = self.collected.contexts[call].loops[-1]
                    if loop not in first or self.collected.order[call] < self.collected.order[first[loop]]:
                        first[loop] = call
                discarded.extend(self._discarded_forwards(region)[:1])
        return sorted({*first.values(), *discarded}, key=self.collected.order.__getitem__)

    def _discarded_forwards(self, region: Region) -> list[cst.Call]:
        """The forwards after `model.eval()` outside any loop whose output the code itself throws the graph of away:
        every use of it is detached (`out.detach()`, `out.cpu().numpy()`, `out.argmax(1)`, `out.item()`), so the
        graph recorded for it serves nothing (one inference pass, `def predict(x): model.eval(); return
        model(x).detach()`)."""
        if region.over_loader:
            return []
        found = []
        for call in self.collected.calls_in_scope(region.scope):
            context = self.collected.contexts[call]
            if context.loops or context.profiled or not self._in_region(region, call):
                continue
            if not self.forwards.is_forward(call) or not self._records(call):
                continue
            if self._builds_no_graph(call) or self._forward_needs_gradients(call) or self._retries_with_gradients(call):
                continue
            if self._only_detached(call, region.scope):
                found.append(call)
        return found

    def _inference_scopes(self) -> frozenset[Scope]:
        """The code of an inference script: the module's own top-level code, and the functions it calls (and
        those they call) that are no model's methods and return no graph, when the module loads trained weights
        into a model (`model.load_state_dict(...)`, `model = torch.load(...)`, `X.from_pretrained(...)`) and
        never trains: no gradient event (of its own or of a project function it calls), no optimizer or
        GradScaler, no request for gradients, and no call of unknown effect named like training. Every forward
        such code runs records a graph nothing will use."""
        if not self._loads_weights() or not self._never_trains():
            return frozenset()
        found: set[Scope] = {self.collected.module}
        candidates = [
            function
            for function in self.collected.functions
            if not (function in self.collected.owners and self.roles.is_model_class(self.collected.owners[function]))
            and not self.values.returns_grad(function)[0]
        ]
        grown = True
        while grown:
            grown = False
            for function in candidates:
                if function not in found and any(
                    self.collected.contexts[site].scope in found for site in self.callers.call_sites(function)
                ):
                    found.add(function)
                    grown = True
        return frozenset(found)

    def _loads_weights(self) -> bool:
        """Whether the module puts trained weights into a model: `model.load_state_dict(...)`, or binds a model to
        what `torch.load`, `torch.jit.load` or a `from_pretrained` returns."""
        for call in self.collected.calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "load_state_dict"
                and self._is_model(func.value, call)
            ):
                return True
            statement = self.collected.statement_of.get(call)
            loads = last_name(func) == "from_pretrained" or self.collected.imports.resolve(func) in LOADERS
            if (
                loads
                and isinstance(statement, cst.Assign)
                and statement.value is call
                and any(self.roles.role(target.target) is Role.MODEL for target in statement.targets)
            ):
                return True
        return False

    def _never_trains(self) -> bool:
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        if any(self.events.scope_events(scope) for scope in scopes):
            return False
        for call in self.collected.calls:
            torch_own = (self.collected.imports.resolve(call.func) or "").startswith("torch.")  # torch.no_grad()
            if _asks_for_gradients(call) or (self._might_train(call) and not torch_own):
                return False
            if self.roles.role_of_value(call) in (Role.OPTIMIZER, Role.SCALER):
                return False
        return not any(_enables_requires_grad(statement) for statement in self.collected.statements)

    def detached_forwards(self) -> list[cst.Call]:
        """The forwards of code proven to record whose every use is detached (`x_test = self.G(z); save(x_test.data)`,
        `images = g(z).data.cpu()`): the graph each records serves nothing, inside a training loop too. Code proven
        to record is module-level code, a function that backpropagates, a hook whose result its framework
        backpropagates, and a function one of those calls; a module's own `forward` runs in its caller's grad
        mode and is left alone. The forwards `graph_building_forwards` reports are not repeated."""
        reported = set(self.graph_building_forwards())
        found = []
        scopes: list[Scope] = [self.collected.module, *self.collected.functions]
        for scope in scopes:
            if self._is_module_forward(scope) or not self._surely_records(scope, 0):
                continue
            for call in self.collected.calls_in_scope(scope):
                context = self.collected.contexts[call]
                if call in reported or context.profiled or context.grad_mode is not GradMode.ENABLED:
                    continue
                if not self.forwards.is_forward(call) or not self._only_detached(call, scope):
                    continue
                if (
                    self._builds_no_graph(call)
                    or self._forward_needs_gradients(call)
                    or self._retries_with_gradients(call)
                    or self._serves_training(call, scope)
                ):
                    continue
                found.append(call)
        return found

    def _serves_training(self, call: cst.Call, scope: Scope) -> bool:
        """Whether what the statement holding `call` hands on may reach a value the scope backpropagates (or that
        a framework backpropagates after its hook returns): a target network's detached output in a TD target, a
        generator's detached sample the critic scores, a detached value kept in a list the loss is built from.
        Such a forward is part of the step, and the DOMAIN calls it correct. What the statement hands on is the
        names it binds, or for a call statement the objects it gives the value to (`buffer.append(...)`); a
        `return` or `yield` hands it to the caller, and a binding of anything but local names (`self.target =
        ...`) to code out of view: both count as serving training."""
        statement = self.collected.statement_of.get(call)
        if statement is None or any(isinstance(node, (cst.Return, cst.Yield)) for node in descendants(statement)):
            return True
        if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
            handed_to = statement.value
            if any(value is call for value in self._handed_to_detach(handed_to, 0)):
                return False  # `self.save_grid(self.G(z))`: the helper it is given only detaches it
        targets: list[cst.BaseExpression] = []
        if isinstance(statement, cst.Assign):
            targets = [target.target for target in statement.targets]
        elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)):
            targets = [statement.target]
        if any(not isinstance(target, (cst.Name, cst.Tuple, cst.List)) for target in targets):
            return True
        inside = set(descendants(call))
        handed = targets or [
            node
            for node in descendants(statement)
            if isinstance(node, (cst.Name, cst.Attribute)) and node not in inside
        ]
        bound = {name.split(".", 1)[0] for node in handed for name in names_in(node)}
        losses: list[tuple[cst.BaseExpression, cst.CSTNode]] = []
        for event in self.events.scope_events(scope):
            if event.kind not in (Kind.BACKWARD, Kind.AUTOGRAD_GRAD):
                continue
            at = self.collected.statement_of.get(event.site) if isinstance(event.site, cst.Call) else event.site
            if event.value is None or at is None or at is statement:
                return True  # a backward of this statement, or one whose loss is not in view
            losses.append((event.value, at))
        if scope in self._backpropagated_hooks:
            return True  # what the hook returns is backpropagated: its lineage is the framework's to follow
        read: set[str] = set()
        seen: set[cst.CSTNode] = set()
        while losses:
            value, at = losses.pop()
            for name in {part for dotted in names_in(value) for part in (dotted, dotted.split(".", 1)[0])}:
                read.add(name)  # `preds.float()` reads `preds`
                for definition in self.events.origins.definitions(name, at):
                    if definition.binding is not Binding.OUTSIDE and definition.node not in seen:
                        seen.add(definition.node)
                        losses.append((definition.value, definition.node))
        return bool(bound & read)

    def _surely_records(self, scope: Scope, depth: int) -> bool:
        """Whether `scope` runs with autograd recording: module-level code, a function that backpropagates (a
        backward raises where nothing was recorded), a hook its framework backpropagates the result of, or a
        function that one of those calls with autograd on."""
        if not isinstance(scope, cst.FunctionDef):
            return self.collected.module not in self.callers.switched_off()
        if depth > MAX_CALLER_DEPTH or scope in self.callers.switched_off():
            return False
        if scope in self._backpropagated_hooks or any(
            event.kind in (Kind.BACKWARD, Kind.AUTOGRAD_GRAD) and event.via is None
            for event in self.events.scope_events(scope)
        ):
            return True  # a backward of this module's code (`screens.evaluation_code` sees the same ones)
        return any(
            self.collected.contexts[site].grad_mode is GradMode.ENABLED
            and self._surely_records(self.collected.contexts[site].scope, depth + 1)
            for site in self.callers.call_sites(scope)
        )

    def _only_detached(self, call: cst.Call, scope: Scope) -> bool:
        """Whether every use of what `call` returns is detached: the call itself, or the one name bound to it."""
        receivers = self._detached_receivers(scope)
        if id(call) in receivers:
            return True
        statement = self.collected.statement_of.get(call)
        if not (
            isinstance(statement, cst.Assign)
            and statement.value is call
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return False
        key = statement.targets[0].target.value
        statements = self.collected.statements_in_scope(scope)
        bound = {  # the name where an assignment binds it anew (`x = self.G(z)` in two branches) is no use of it
            id(target.target) for other in statements if isinstance(other, cst.Assign) for target in other.targets
        }
        uses = [
            node
            for other in statements
            for node in descendants(other)
            if isinstance(node, cst.Name) and node.value == key and id(node) not in bound
        ]
        return bool(uses) and all(id(node) in receivers for node in uses)

    def _detached_receivers(self, scope: Scope, depth: int = 0) -> frozenset[int]:
        """The nodes of `scope` whose value reaches only a detaching method or `.data`, through moves, casts,
        reshapes and indexing (`out[0].cpu().numpy()`): ids of the innermost receivers. So is a list whose every
        item is detached where it is mapped (`[x.detach() for x in outs]`, `map(lambda x: x.detach(), outs)`), and
        an argument of a same-module helper that uses its parameter only so (`self.create_grid(self.gen(z))`)."""
        if scope in self._receivers:
            return self._receivers[scope]
        self._receivers[scope] = frozenset()  # recursion guard: a helper that calls itself
        found: set[int] = set()
        statements = self.collected.statements_in_scope(scope)
        nodes = [node for statement in statements for node in descendants(statement)]
        for node in nodes:
            _add_receiver(found, _cut_operand(node))
        for node in nodes:
            mapped = _mapped(node)
            if mapped is not None and all(id(use) in found for use in _uses(mapped[1], mapped[0])):
                _add_receiver(found, mapped[2])
        for node in nodes:
            if isinstance(node, cst.Call) and node in self.collected.contexts and depth < MAX_CALLER_DEPTH:
                for value in self._handed_to_detach(node, depth):
                    _add_receiver(found, value)
        self._receivers[scope] = frozenset(found)
        return self._receivers[scope]

    def _handed_to_detach(self, call: cst.Call, depth: int) -> list[cst.BaseExpression]:
        """What `call` passes to parameters that its same-module helper uses only detached, before it rebinds them
        (`samples = [s.detach() for s in samples]`)."""
        helper = self.events.resolve_helper(call) or self.events.resolve_instance_method(call)
        if helper is None:
            return []
        receivers = self._detached_receivers(helper, depth + 1)
        handed = []
        for name, value in arguments_of(helper, call).items():
            reads = _reads_before_rebinding(helper, name)
            if reads and all(id(use) in receivers for use in reads):
                handed.append(value)
        return handed

    def _is_module_forward(self, scope: Scope) -> bool:
        """Whether `scope` is the `forward` of a class proven an nn.Module: it runs in the grad mode of whoever calls
        the module (a trainer with gradients, an evaluation loop under no_grad), which is unknown here."""
        if not isinstance(scope, cst.FunctionDef) or scope.name.value != "forward":
            return False
        owner = self.collected.owners.get(scope)
        return owner is not None and self.roles.is_model_class(owner)

    def no_grad_target(self, call: cst.Call) -> tuple[cst.CSTNode, ...]:
        """The consecutive statements to run under no_grad for a reported forward; () when none is safe."""
        context = self.collected.contexts[call]
        order = self.collected.order
        region = next((r for r in self.regions(context.scope) if r.start < order[call] < r.end), None)
        if region is None or not context.loops:
            return ()
        loop = context.loops[-1]
        inside = self.collected.statements_in_loop(loop)
        if order[loop] > region.start and all(order[s] < region.end for s in inside):
            return (
                (loop,) if self._only_evaluates(context.scope, [*inside, *self.collected.calls_in_loop(loop)]) else ()
            )
        if region.over_loader:
            return ()
        return self._block_after_switch(region, call)

    def _block_after_switch(self, region: Region, forward: cst.Call) -> tuple[cst.CSTNode, ...]:
        """The statements after `model.eval()` in its block, before `model.train()`, if they hold `forward`."""
        order = self.collected.order
        calls = self.collected.calls_in_scope(region.scope)
        switch = next(call for call in calls if order[call] == region.start)
        block = block_holding(region.scope, self.collected.statement_of[switch])
        if block is None:
            return ()
        statement = self.collected.statement_of[switch]
        index = next(
            i for i, line in enumerate(block) if isinstance(line, cst.SimpleStatementLine) and statement in line.body
        )
        chosen: list[cst.BaseStatement] = []
        inside: set[cst.CSTNode] = set()
        for item in block[index + 1 :]:
            below = set(descendants(item))
            if any(order.get(node, 0) >= region.end for node in below):
                break  # the next model.train()
            chosen.append(item)
            inside |= below
        held = [node for node in (*self.collected.statements_in_scope(region.scope), *calls) if node in inside]
        if forward not in inside or not self._only_evaluates(region.scope, held):
            return ()
        return tuple(chosen)

    def _only_evaluates(self, scope: Scope, nodes: Sequence[cst.CSTNode]) -> bool:
        """Whether these statements and calls of `scope` hold nothing that might need gradients."""
        inside = set(nodes)
        if any(event.site in inside for event in self.events.scope_events(scope)):
            return False
        for node in nodes:
            if isinstance(node, cst.Call):
                if _asks_for_gradients(node):
                    return False
                if self._might_train(node):
                    return False
            elif _enables_requires_grad(node):  # type: ignore[arg-type]  # statements are small statements here
                return False
        return True

    def _might_train(self, call: cst.Call) -> bool:
        """A call of unknown effect named like training (not the model's forward, not an environment's step)."""
        if not MIGHT_TRAIN.fullmatch(last_name(call.func) or "") or self.forwards.is_forward(call):
            return False
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        return receiver is None or not ENVIRONMENT.fullmatch(last_name(receiver) or "")

    def regions(self, scope: Scope, by_shape: bool = True) -> list[Region]:
        """The evaluation regions of one scope (`by_shape`: also a whole function that evaluates by its shape)."""
        calls = self.collected.calls_in_scope(scope)
        order = self.collected.order
        found = []
        for call in calls:
            flag = self._mode_flag(call)
            if self._switches_model(call, to_eval=True) or flag is not None:
                # A switch back that runs only in another phase (the `else: model.train()`) ends nothing.
                phase = self._phase_of(call, {flag: False} if flag is not None else {})
                if flag is not None and not phase:
                    continue  # every call of the function trains: `run_epoch(loader, train=True)`
                phased = Region(scope, order[call], END, over_loader=False, phase=phase)
                ends = [
                    order[other] for other in calls if self._switches_model(other) and self._in_region(phased, other)
                ]
                found.append(Region(scope, order[call], min(ends, default=END), over_loader=False, phase=phased.phase))
        if not found and by_shape and isinstance(scope, cst.FunctionDef) and self._evaluates_by_shape(scope):
            found.append(Region(scope, 0, END, over_loader=True))
        return found

    def _switches_model(self, call: cst.Call, to_eval: bool = False) -> bool:
        # Ex) model.eval()  /  model.train(False)  /  self.train()
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("eval", "train"):
            return False
        if dotted_name(func.value) is None or not self._is_model(func.value, call):
            return False  # Net(...).eval() builds a module in eval mode; it switches no model
        if func.attr.value == "eval":
            return to_eval and not call.args  # eval(...) with arguments is not nn.Module.eval()
        first = call.args[0].value if call.args else None
        turns_off = isinstance(first, cst.Name) and first.value == "False"
        return turns_off == to_eval

    def _mode_flag(self, call: cst.Call) -> str | None:
        """The parameter that `model.train(mode=flag)` switches by: eval mode when the caller passes False."""
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "train" or len(call.args) != 1:
            return None
        argument = call.args[0]
        function = self.collected.contexts[call].function
        if argument.keyword is not None and argument.keyword.value != "mode":
            return None
        if function is None or not isinstance(argument.value, cst.Name):
            return None
        if argument.value.value not in parameter_names(function) or not self._is_model(func.value, call):
            return None
        return argument.value.value

    def _is_model(self, node: cst.BaseExpression, call: cst.Call) -> bool:
        if isinstance(node, cst.Name) and node.value == "self":
            owner = self.collected.contexts[call].class_def
            return owner is not None and self.roles.is_model_class(owner)
        return self.roles.role(node) is Role.MODEL

    def _evaluates_by_shape(self, function: cst.FunctionDef) -> bool:
        if TRAINING_NAME.fullmatch(function.name.value):
            return False
        owner = self.collected.owners.get(function)
        if owner is not None and self.roles.is_model_class(owner):
            return False  # a module's own methods (forward over its layers) are not evaluation code
        if self.events.scope_events(function) or self._handles_optimizer(function):
            return False
        return not self.values.returns_grad(function)[0] and not self._returns_outputs(function)

    def _returns_outputs(self, function: cst.FunctionDef) -> bool:
        """Whether a value `function` returns holds a model output along a path with a gradient, whatever wraps it
        on the way (`return Batch(reference=torch.stack(refs))`): a caller may backpropagate it (a solver's
        `_inference` that the base class's training step runs), so the function is not proven evaluation code."""
        return any(
            self.lineage.of(statement.value, statement).known_live
            for statement in self.collected.statements_in_scope(function)
            if isinstance(statement, cst.Return) and statement.value is not None
        )

    def _handles_optimizer(self, function: cst.FunctionDef) -> bool:
        # Ex) def run(model, loader, optimizer): ... backprop(loss, optimizer) in another module
        params = function.params
        names: list[cst.BaseExpression] = [
            param.name for param in (*params.posonly_params, *params.params, *params.kwonly_params)
        ]
        for call in self.collected.calls_in_scope(function):
            names.extend(arg.value for arg in call.args)
        return any(self.roles.role(name) in (Role.OPTIMIZER, Role.SCALER) for name in names)

    def _wants_gradients(self, region: Region) -> bool:
        for event in self.events.scope_events(region.scope):
            if self._in_region(region, event.site):
                return True
        for call in self.collected.calls_in_scope(region.scope):
            if self._in_region(region, call) and _asks_for_gradients(call):
                return True
        return any(
            _enables_requires_grad(statement)
            for statement in self.collected.statements_in_scope(region.scope)
            if self._in_region(region, statement)
        )

    def _in_region(self, region: Region, node: cst.CSTNode) -> bool:
        """Whether `node` of the region's scope lies in it and runs in its phase."""
        if not region.start < self.collected.order[node] < region.end:
            return False
        if not region.phase or not isinstance(region.scope, cst.FunctionDef):
            return True
        if region not in self._exits:
            self._exits[region] = self.events.exits_without(region.scope, region.off)
        return not self.events.needs_any(node, self.collected.contexts[node].ifs, region.off, self._exits[region])

    def _phase_of(
        self, switch: cst.Call, given: dict[str, bool | Given] | None = None
    ) -> tuple[tuple[str, bool | Given], ...]:
        """The parameter values for which `switch`, inside `if`s testing them, runs; () when unconditional or unknown.

        Ex) `if is_train: ... else: model.eval()` runs for `is_train=False`; `model.train(mode=is_train)`
        (`given`: {is_train: False}) switches to eval for `is_train=False`.
        """
        context = self.collected.contexts[switch]
        function = context.function
        branches = [branch for branch in context.ifs if isinstance(branch, cst.If)]
        if function is None or context.scope is not function or not (branches or given):
            return ()
        params = parameter_names(function)
        phase: dict[str, bool | Given] = dict(given or {})
        for branch in branches:
            phase.update(_value_entering(branch.test, self.collected.in_body(branch, switch), params))
        if not phase:
            return ()
        for branch in branches:
            runs = runs_when_off(branch.test, phase)
            if runs is not None and runs != self.collected.in_body(branch, switch):
                return ()
        sites = self.callers.call_sites(function)
        if sites and not any(_may_pass(function, site, phase) for site in sites):
            return ()  # every call of the module trains: `run(model, loader, opt, train=True)`
        return tuple(sorted(phase.items(), key=lambda item: item[0]))

    def _forwards_in(self, region: Region) -> list[cst.Call]:
        found = []
        for call in self.collected.calls_in_scope(region.scope):
            context = self.collected.contexts[call]
            if not context.loops or context.profiled:
                continue  # a profiled forward is measured as written, grad mode included
            if not self._in_region(region, call):
                continue
            if region.over_loader and not any(self.iterates_loader(loop) for loop in context.loops):
                continue
            if self._retries_with_gradients(call):
                continue
            if self._builds_no_graph(call) or self._forward_needs_gradients(call):
                continue
            if self._records_in(region, call) and (
                self.forwards.is_forward(call)
                or self.helper_forward(call) is not None
                or self._model_method_on_data(call, context.loops)
            ):
                found.append(call)
        return found

    def _model_method_on_data(self, call: cst.Call, loops: tuple[Loop, ...]) -> bool:
        """A method of a model that is no part of torch's module API, handed what the loop iterates
        (`model.encode(batch)`, `model.sample(x.to(device))`): it computes with the model's weights. The model
        must be proven one (built, optimized, or used as one), not named one; a method handed something else
        (a path, a count, a flag derived from the batch, outputs already computed) proves nothing, and so does one
        whose result the code throws away: a command that changes the model (`model.set_embeddings(entity,
        weights)`, `model.clear_cache(key)`), not a computation."""
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value in MODULE_API:
            return False
        statement = self.collected.statement_of.get(call)
        if isinstance(statement, cst.Expr) and statement.value is call:
            return False
        key = dotted_name(func.value)
        roles = self.roles
        proven = roles.proven_role(func.value) is Role.MODEL or key in roles.optimized or key in roles.used_as_modules
        if not proven:
            return False
        items = {name for loop in loops if isinstance(loop, cst.For) for name in _data_items(loop)}
        return any(_the_item(arg.value) in items for arg in call.args)

    def _builds_no_graph(self, call: cst.Call) -> bool:
        """Whether `call` records nothing, under no_grad or not: it runs a module proven to hold no trainable
        parameters on inputs proven to carry no graph, or a project class whose `forward` turns autograd off
        itself (`@torch.inference_mode()`, or handing its work to a method of its own that does)."""
        receiver = forward_receiver(call.func)
        view = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("forward")))
        built = self.events.instance_class(view, call)
        program = self.events.program
        imports = self.events.imports
        if built is not None and program is not None and program.runs_without_grad(built, "forward", imports):
            return True
        statement = self.collected.statement_of.get(call)
        scope = self.collected.contexts[call].scope
        if statement is None or not self.values.holds_no_parameters(receiver, scope):
            return False
        return not any(self.values.is_grad(arg.value, statement) for arg in call.args)

    def _retries_with_gradients(self, call: cst.Call) -> bool:
        """Whether `call` runs in an `except` handler whose `try` ran a forward under no_grad: the retry runs
        only when that failed (a model that needs autograd in its forward), so it records on purpose."""
        context = self.collected.contexts[call]
        handlers = [node for node in context.ifs if isinstance(node, cst.ExceptHandler)]
        if not handlers:
            return False
        if context.scope not in self._tries:
            found = (node for node in descendants(context.scope) if isinstance(node, cst.Try))
            self._tries[context.scope] = {handler: attempt for attempt in found for handler in attempt.handlers}
        tries = self._tries[context.scope]
        attempts = [tries[handler] for handler in handlers if handler in tries]
        return any(
            isinstance(inner, cst.Call)
            and inner in self.collected.contexts
            and self.collected.contexts[inner].no_grad
            and self.forwards.is_forward(inner)
            for attempt in attempts
            for inner in descendants(attempt.body)
        )

    def _forward_needs_gradients(self, call: cst.Call) -> bool:
        """Whether `model(x)` runs the `forward` of a same-module class that backpropagates or asks autograd for
        gradients itself (a poisoning model whose forward scores samples by `torch.autograd.grad`): under no_grad
        it would raise, so it records on purpose."""
        view = cst.Call(func=cst.Attribute(value=forward_receiver(call.func), attr=cst.Name("forward")))
        forward = self.events.resolve_instance_method(view, call)
        return forward is not None and self._needs_gradients(forward)

    def _needs_gradients(self, function: cst.FunctionDef, depth: int = 0) -> bool:
        """Whether `function`, or a same-module helper it calls, has a gradient event or asks for gradients."""
        if depth > MAX_CALLER_DEPTH or self._wants_gradients_itself(function):
            return True
        helpers = (self.events.resolve_helper(inner) for inner in self.collected.calls_in_scope(function))
        return any(helper is not None and self._needs_gradients(helper, depth + 1) for helper in helpers)

    def _wants_gradients_itself(self, function: cst.FunctionDef, call: cst.Call | None = None) -> bool:
        """Whether `function`'s own body has a gradient event (same-module helpers inlined) or asks for gradients;
        given the `call` that runs it, only what that call's literal arguments leave on counts (`step(x, y,
        backward=False)` of a helper that backpropagates under `if backward:` wants none)."""
        off = switched_off_at(function, call) if call is not None else {}
        exits = self.events.exits_without(function, off)

        def runs(node: cst.CSTNode) -> bool:
            return not off or not self.events.needs_any(node, self.collected.contexts[node].ifs, off, exits)

        return (
            any(runs(event.site) for event in self.events.scope_events(function))
            or any(_asks_for_gradients(inner) and runs(inner) for inner in self.collected.calls_in_scope(function))
            or any(
                _enables_requires_grad(statement) and runs(statement)
                for statement in self.collected.statements_in_scope(function)
            )
        )

    def helper_forward(self, call: cst.Call, depth: int = 0) -> cst.Call | None:
        """The forward pass a same-module helper that `call` runs makes with autograd recording (`self._eval_step(
        batch)` whose body calls `self.model(x)`), following helpers of helpers; None if it makes none, or if the
        helper may want gradients (a gradient event or a request for them: its caller's region then trains)."""
        view = self.events.call_view(call)
        helper = self.events.resolve_view(view, call) or self.events.resolve_instance_method(view, call)
        if helper is None or depth > MAX_CALLER_DEPTH or self._wants_gradients_itself(helper, view):
            return None
        key = (helper, depth)
        if key not in self._forward_inside:
            self._forward_inside[key] = None  # recursion guard: a helper that calls itself
            self._forward_inside[key] = self._first_recording_forward(helper, depth)
        return self._forward_inside[key]

    def _first_recording_forward(self, helper: cst.FunctionDef, depth: int) -> cst.Call | None:
        for inner in self.collected.calls_in_scope(helper):
            if self.collected.contexts[inner].grad_mode is not GradMode.ENABLED:
                continue
            if self.forwards.is_forward(inner):
                if not self._builds_no_graph(inner):
                    return inner
                continue
            nested = self.helper_forward(inner, depth + 1)
            if nested is not None:
                return nested
        return None

    def _records_in(self, region: Region, call: cst.Call) -> bool:
        """`_records` for a forward of a region run by a flag of its function (`procedure(..., mode)` evaluating for
        `mode="valid"`): only the calls of the module that may pass that value count, so a validating caller that
        runs it under `no_grad` decides, whatever the training caller does."""
        if not self._records(call):
            return False
        function = region.scope
        if not region.phase or not isinstance(function, cst.FunctionDef):
            return True
        if self.collected.contexts[call].function is not function:
            return True
        sites = [site for site in self.callers.call_sites(function) if _may_pass(function, site, region.off)]
        return not sites or any(self._records(site, 1) for site in sites)

    def _records(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """Whether `node` may run with grad recording: not under no_grad, nor only called from there."""
        context = self.collected.contexts[node]
        if context.grad_mode is not GradMode.ENABLED:
            return False  # no_grad, or set_grad_enabled(is_train) whose mode is unknown
        function = context.function
        sites = self.callers.call_sites(function) if function is not None else []
        if not sites:
            return function is None or not self.callers.unseen_callers_without_grad(function)
        return depth > MAX_CALLER_DEPTH or any(self._records(site, depth + 1) for site in sites)


def _cut_operand(node: cst.CSTNode) -> cst.BaseExpression | None:
    """What `node` cuts the graph of: `out` of `out.detach()`, `out.numpy()`, `out.argmax(1)` or `out.data`."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in DETACHING:
        return node.func.value
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        return node.value
    return None


def _add_receiver(found: set[int], value: cst.BaseExpression | None) -> None:
    while value is not None:
        found.add(id(value))
        value = _passed_through(value)


def _mapped(node: cst.CSTNode) -> tuple[str, cst.CSTNode, cst.BaseExpression] | None:
    """(item name, what is computed from it, the iterable) of `[f(x) for x in xs]` or `map(lambda x: f(x), xs)`."""
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)) and node.for_in.inner_for_in is None:
        target = node.for_in.target
        if isinstance(target, cst.Name) and not node.for_in.ifs:
            return target.value, node.elt, node.for_in.iter
    if isinstance(node, cst.Call) and dotted_name(node.func) == "map" and len(node.args) == 2:
        function = node.args[0].value
        if isinstance(function, cst.Lambda) and len(function.params.params) == 1:
            return function.params.params[0].name.value, function.body, node.args[1].value
    return None


def _uses(node: cst.CSTNode, name: str) -> list[cst.Name]:
    found = [child for child in descendants(node) if isinstance(child, cst.Name) and child.value == name]
    return found + ([node] if isinstance(node, cst.Name) and node.value == name else [])


def _reads_before_rebinding(function: cst.FunctionDef, name: str) -> list[cst.Name]:
    """The reads of parameter `name` in `function` up to the top-level statement that first binds it anew (that
    statement's own reads included): what the caller's value reaches. Empty when a compound statement (a loop, a
    branch) binds it first, where which value a later read sees is not known."""
    reads: list[cst.Name] = []
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    for statement in body:
        binds = _binds(statement, name)
        reads += [node for node in _uses(statement, name) if not any(node is bound for bound in binds)]
        if binds:
            return reads if isinstance(statement, cst.SimpleStatementLine) else []
    return reads


def _binds(statement: cst.CSTNode, name: str) -> list[cst.Name]:
    """The `name` nodes that `statement` binds (assignment targets, loop and `with ... as` names)."""
    targets: list[cst.CSTNode] = []
    for node in descendants(statement):
        if isinstance(node, (cst.AssignTarget, cst.For, cst.CompFor, cst.AnnAssign)):
            targets.append(node.target)
        elif isinstance(node, cst.AsName):
            targets.append(node.name)
    return [found for target in targets for found in _uses(target, name)]


def _passed_through(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The tensor `value` moves, casts, reshapes or indexes (`out` of `out[0]`, `out.cpu()`), if it does."""
    if isinstance(value, cst.Subscript):
        return value.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in PASSING:
        return value.func.value
    return None


def _may_pass(function: cst.FunctionDef, site: cst.Call, phase: dict[str, bool | Given]) -> bool:
    """Whether `site` may call `function` with the parameter values of `phase` (a literal elsewhere rules it out)."""
    given = switched_off_at(function, site)
    arguments = arguments_of(function, site)
    for name, value in phase.items():
        if name in given:
            if isinstance(value, Given) != isinstance(given[name], Given) or (
                isinstance(value, Given) and value != given[name]
            ):
                return False
        elif isinstance(arguments.get(name), (cst.Name, cst.SimpleString, cst.Integer)):
            argument = arguments[name]
            if not isinstance(argument, cst.Name) or argument.value == "True":
                return False  # True, or another literal than the phase's
    return True


def _value_entering(test: cst.BaseExpression, in_body: bool, params: set[str]) -> dict[str, bool | Given]:
    """The value of a parameter under which the body (or else arm) of `if test` runs, when `test` shows one."""
    # Ex) else arm of `if is_train:` / body of `if not is_train:` -> is_train is False
    if isinstance(test, cst.Name) and test.value in params and not in_body:
        return {test.value: False}
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and in_body:
        negated = test.expression
        return {negated.value: False} if isinstance(negated, cst.Name) and negated.value in params else {}
    # Ex) body of `if mode == "val":`
    if not in_body or not isinstance(test, cst.Comparison) or not isinstance(test.left, cst.Name):
        return {}
    if test.left.value not in params or len(test.comparisons) != 1:
        return {}
    operator, comparator = test.comparisons[0].operator, test.comparisons[0].comparator
    if isinstance(operator, cst.Equal) and isinstance(comparator, (cst.SimpleString, cst.Integer)):
        literal = comparator.evaluated_value
        return {test.left.value: Given(literal)} if isinstance(literal, (str, int)) else {}
    return {}


def _asks_for_gradients(call: cst.Call) -> bool:
    name = last_name(call.func)
    if name not in GRAD_SWITCHES and not (dotted_name(call.func) or "").endswith("autograd.grad"):
        return False
    if name == "requires_grad_" and call.args:
        value = call.args[0].value
        return not (isinstance(value, cst.Name) and value.value == "False")
    return True


def _enables_requires_grad(statement: cst.BaseSmallStatement) -> bool:
    """`x.requires_grad = value` where the value may be true: the code may want gradients of `x` (a force field's
    positions, `coords.requires_grad = needs_forces`). Only a literal False proves it does not, as for
    `requires_grad_(flag)` (`_asks_for_gradients`)."""
    # Ex) images.requires_grad = True  /  graph.positions.requires_grad = compute_forces
    if not isinstance(statement, cst.Assign):
        return False
    value = statement.value
    return not (isinstance(value, cst.Name) and value.value == "False") and any(
        last_name(target.target) == "requires_grad" for target in statement.targets
    )


def _the_item(value: cst.BaseExpression) -> str | None:
    """The name a value is, moved or indexed: `x` for `x`, `x.to(device)`, `x.cuda()`, `batch["image"]`."""
    while True:
        if isinstance(value, cst.Subscript):
            value = value.value
        elif (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("to", "cuda", "float", "half")
        ):
            value = value.func.value
        else:
            return value.value if isinstance(value, cst.Name) else None


def _data_items(loop: cst.For) -> list[str]:
    """The names a loop binds to what it iterates, not to counts: `batch` in `for i, batch in
    enumerate(loader)`, nothing in `for i in range(n)` or `for t in np.linspace(0, 1, n)`."""
    iterable = loop.iter
    target: cst.BaseExpression = loop.target
    if isinstance(iterable, cst.Call) and last_name(iterable.func) in NUMBER_SEQUENCES:
        return []  # Ex) for threshold in np.linspace(0, 1, 100): numbers, not data
    if (
        isinstance(iterable, cst.Call)
        and last_name(iterable.func) == "enumerate"
        and isinstance(target, (cst.Tuple, cst.List))
        and len(target.elements) == 2
    ):
        target = target.elements[1].value
    return list(names_in(target))
