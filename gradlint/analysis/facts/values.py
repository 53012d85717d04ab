"""Which values carry autograd history at a point of the program.

A forward walk over each scope's statements tracks, per name or attribute, whether it
holds a tensor with a graph (a model or criterion output, arithmetic on one, anything
`.backward()` is called on) or provably not (`.item()`, `.detach()`, `float(...)`,
values computed under no_grad). Unknown values count as graph-free: when in doubt,
rules stay quiet.

Unpacking a tuple keeps each element's own fact: `loss, acc = step(batch)` with a
same-module `step` that returns `loss, accuracy(...)` leaves `acc` graph-free. The
extra results of a forward pass (`loss, count = model.forward_loss(batch)`) are
unknown, unless the same call takes them back (a recurrent state, from the loop's last
pass or kept on an object: `out, hidden = rnn(x, hidden)`) or the scope backpropagates them.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst

from gradlint.analysis.facts.origins import Binding
from gradlint.analysis.facts.parameters import parameterless_classes, weightless_layer
from gradlint.analysis.facts.roles import Role, Roles, constructor_of
from gradlint.analysis.facts.steps import EventIndex, Kind
from gradlint.analysis.syntax.collect import Collected, Scope
from gradlint.analysis.syntax.flow import ForwardWalk
from gradlint.analysis.syntax.names import ImportMap, dotted_name, forward_receiver, last_name, operand_names
from gradlint.analysis.syntax.refs import arguments_of
from gradlint.frameworks import OTHER_FRAMEWORKS

Env = Mapping[str, bool]

# Methods whose result has no autograd history.
DETACHING_METHODS = frozenset(
    {
        "item", "detach", "tolist", "numpy", "size", "dim", "numel", "nelement", "argmax", "argmin",
        "eq", "ne", "lt", "gt", "le", "ge", "isnan", "isinf", "isfinite", "any", "all", "nonzero",
        "data_ptr", "element_size", "is_contiguous", "type", "long", "int", "bool", "byte", "short",
        "sign", "round", "floor", "ceil", "trunc", "__len__", "stride", "get_device", "count_nonzero",
    }
)  # fmt: skip
NON_GRAD_ATTRIBUTES = frozenset(
    {"data", "grad", "shape", "dtype", "device", "requires_grad", "is_leaf", "ndim", "grad_fn", "is_cuda"}
)
NON_GRAD_BUILTINS = frozenset(
    {
        "float",
        "int",
        "bool",
        "len",
        "str",
        "repr",
        "print",
        "isinstance",
        "range",
        "enumerate",
        "zip",
        "type",
        "id",
        "hash",
    }
)
# Reductions and orderings that, given a dimension, return (values, indices): the values keep the
# input's graph, the indices are integers and have none (`_, predicted = torch.max(logits, 1)`).
VALUES_AND_INDICES = frozenset(
    {"max", "min", "median", "nanmedian", "mode", "sort", "topk", "kthvalue", "cummax", "cummin"}
)
# Builtins that hand out their argument's items unchanged: `for loss in reversed(losses)`.
ITEM_WRAPPERS = frozenset({"list", "tuple", "reversed", "sorted"})
# Methods that put a value into a container: the container then holds the value's graph.
# How many containers deep a backpropagated value is followed back (`loss = logs["train"]["loss"]` is one).
MAX_CONTAINER_DEPTH = 2
CONTAINER_METHODS = frozenset({"append", "extend", "insert", "appendleft"})
# In-place additions: `acc.add_(loss)` adds onto `acc` as `acc += loss` does.
ADDING_METHODS = frozenset({"add_", "sub_"})
# Libraries whose functions compute on their own arrays: what they return carries no torch graph (`np.log(p)`,
# `scipy.special.softmax(x)`, and the array frameworks torch scope keeps out).
ARRAY_LIBRARIES = frozenset({"numpy", "scipy", "sklearn", "pandas"}) | OTHER_FRAMEWORKS


def graphless_call(func: cst.BaseExpression, imports: ImportMap) -> bool:
    """Whether `func` resolves, through the imports, to a function of a library that computes without torch."""
    qualified = imports.resolve(func) or ""
    return qualified.split(".", 1)[0] in ARRAY_LIBRARIES


# torch functions whose result has no graph whatever their inputs.
NON_GRAD_TORCH = frozenset(
    {
        "tensor", "argmax", "argmin", "zeros", "ones", "empty", "full", "arange", "linspace", "randn", "rand",
        "randint", "randperm", "zeros_like", "ones_like", "empty_like", "full_like", "randn_like", "rand_like",
        "eq", "ne", "lt", "gt", "le", "ge", "isnan", "isinf", "isfinite", "is_tensor", "numel", "no_grad",
        "manual_seed", "device", "sign", "round", "floor", "ceil", "trunc", "bucketize", "searchsorted",
        "equal", "allclose", "count_nonzero", "unique", "save", "load", "from_numpy",
    }
)  # fmt: skip


class GradValues:
    """Answers whether an expression carries autograd history at a given statement."""

    def __init__(self, collected: Collected, roles: Roles, events: EventIndex) -> None:
        self.collected = collected
        self.roles = roles
        self.events = events
        self._env_at: dict[cst.CSTNode, Env] = {}
        self._assumed: dict[tuple[Scope, tuple[tuple[str, bool], ...]], dict[cst.CSTNode, Env]] = {}
        self._walked: set[Scope] = set()
        self._returns: dict[cst.FunctionDef, tuple[bool, bool]] = {}
        self._returns_given: dict[tuple[cst.FunctionDef, frozenset[str]], bool] = {}
        self._returned_elements: dict[cst.FunctionDef, tuple[tuple[bool, bool], ...] | None] = {}
        self._backprop_keys: dict[Scope, frozenset[str]] = {}
        # Containers a backpropagated value was taken out of, and the entries (as written) it was taken from.
        self._holders: dict[tuple[Scope, str], set[str]] = {}
        self._backprop_definitions: dict[Scope, frozenset[tuple[cst.CSTNode, str]]] = {}
        self._parameterless: frozenset[str] | None = None

    @property
    def parameterless(self) -> frozenset[str]:
        """This module's classes proven to hold no parameters (`facts.parameters`), the project's summaries
        answering for classes of other modules."""
        if self._parameterless is None:
            program = self.events.program
            imports = self.roles.imports
            elsewhere = (lambda dotted: program.parameterless(dotted, imports)) if program is not None else None
            self._parameterless = parameterless_classes(self.collected, imports, elsewhere)
        return self._parameterless

    def holds_no_parameters(self, module: cst.BaseExpression, scope: Scope) -> bool:
        """Whether the module `module` evaluates to (`self` in a method, `self.converter`) is proven to hold no
        parameters: every construction of it builds such a class, of this module or of another, or one of torch's
        layers without weights (`nn.Softmax(dim=1)`)."""
        if isinstance(module, cst.Name) and module.value == "self":
            owner = self.collected.owners.get(scope) if isinstance(scope, cst.FunctionDef) else None
            return owner is not None and owner.name.value in self.parameterless
        if isinstance(module, cst.Call):  # Ex) Converter()(numbers)
            inline = constructor_of(module)
            built = [inline] if inline is not None else []
        else:
            built = self.roles.constructors(module)
            if len(built) != len(self.roles.values.get(dotted_name(module) or "", [])):
                return False  # bound to something besides a construction: unknown
        if not built:
            return False
        program = self.events.program
        for call in built:
            name = dotted_name(call.func)
            if name is None or name in self.roles.redefined:
                return False
            if weightless_layer(self.roles.imports.resolve(call.func)):
                continue
            if name not in self.parameterless and not (
                program is not None and program.parameterless(name, self.roles.imports)
            ):
                return False
        return True

    def env_before(self, statement: cst.CSTNode) -> Env:
        """What is known about names just before `statement` runs."""
        scope = self._scope_of_statement(statement)
        if scope not in self._walked:
            self._walked.add(scope)
            _Walker(self, scope, {}, recording=True).walk_scope(scope)
        return self._env_at.get(statement, {})

    def evaluate_assuming(self, expression: cst.BaseExpression, at: cst.CSTNode, assumed: Env, scope: Scope) -> bool:
        """Whether `expression` carries a graph just before statement `at` of `scope` when the walk starts from
        `assumed` (a function's parameters taken to hold graphs): what the body rebinds them to on the way
        (`val = val.item()`) and the type tests it passes (`if isinstance(val, torch.Tensor):`) count."""
        key = (scope, tuple(sorted(assumed.items())))
        if key not in self._assumed:
            walker = _Walker(self, scope, dict(assumed), recording=True, into={})
            walker.walk_scope(scope)
            self._assumed[key] = walker.into
        return self.evaluate(expression, self._assumed[key].get(at, assumed), scope)

    def _scope_of_statement(self, statement: cst.CSTNode) -> Scope:
        context = self.collected.contexts.get(statement)
        return context.scope if context is not None else self.collected.module

    def is_grad(self, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """True when `expression`, evaluated just before statement `at`, carries a graph."""
        context = self.collected.contexts.get(at)
        if context is not None and context.no_grad:
            return False
        return self.evaluate(expression, self.env_before(at), self._scope_of_statement(at))

    def backprop_keys(self, scope: Scope) -> frozenset[str]:
        """Names a backward in `scope` is called on (directly or through arithmetic)."""
        if scope not in self._backprop_keys:
            keys: set[str] = set()
            for event in self.events.scope_events(scope):
                if event.kind is Kind.BACKWARD and event.direct and event.value is not None:
                    keys.update(operand_names(event.value, self.roles.imports.aliases))
            self._backprop_keys[scope] = frozenset(keys)
        return self._backprop_keys[scope]

    def backpropagated_definitions(self, scope: Scope) -> frozenset[tuple[cst.CSTNode, str]]:
        """(assignment, name) for each assignment of a name that reaches a backward called on that name in
        `scope` (`loss = sum(losses)` before `loss.backward()`): whatever it computed, it carries a graph. So does
        the container the backpropagated value was taken out of (`output` in `loss = output["loss"]` or in
        `output["loss"].backward()`): it holds the tensor, and its graph with it."""
        if scope not in self._backprop_definitions:
            found: set[tuple[cst.CSTNode, str]] = set()
            for event in self.events.scope_events(scope):
                if event.kind is not Kind.BACKWARD or not event.direct or event.value is None:
                    continue
                at = self.collected.statement_of.get(event.node) if isinstance(event.node, cst.Call) else None
                found |= self._definitions_holding(event.value, at or event.node, scope, 0)
            self._backprop_definitions[scope] = frozenset(found)
        return self._backprop_definitions[scope]

    def holds_backpropagated(self, expression: cst.BaseExpression, scope: Scope) -> bool:
        """Whether `expression` names a container that a value backpropagated in `scope` was taken out of."""
        self.backpropagated_definitions(scope)
        return (scope, dotted_name(expression) or "") in self._holders

    def _other_entry(self, node: cst.Subscript, scope: Scope) -> bool:
        """Whether `node` reads an entry of a container known to carry a graph only by the backpropagated entry it
        holds, other than that one (`output["accuracy"]` beside `output["loss"].backward()`): unknown."""
        self.backpropagated_definitions(scope)
        entries = self._holders.get((scope, dotted_name(container_of(node)) or ""))
        return entries is not None and _entry_of(node) not in entries

    def _definitions_holding(
        self, value: cst.BaseExpression, at: cst.CSTNode, scope: Scope, depth: int
    ) -> set[tuple[cst.CSTNode, str]]:
        """(assignment, name) for the assignments that bind `value` (a name, or an entry of a named container) as
        it reaches `at` (an unpacking binds the name to the part that is backpropagated), and, through an
        assignment that takes it out of a container, those of the container."""
        entry = _entry_of(value) if isinstance(value, cst.Subscript) else None
        key = dotted_name(container_of(value))
        if key is None or depth > MAX_CONTAINER_DEPTH:
            return set()
        found: set[tuple[cst.CSTNode, str]] = set()
        for definition in self.events.origins.definitions(key, at):
            if definition.binding is Binding.UNPACK and entry is None:
                found.add((definition.node, key))  # Ex) loss, out = self.get_loss(x): the part that is the loss
                continue
            if definition.binding is not Binding.ASSIGN:
                continue
            found.add((definition.node, key))
            if entry is not None:
                self._holders.setdefault((scope, key), set()).add(entry)
            elif isinstance(definition.value, cst.Subscript):
                found |= self._definitions_holding(definition.value, definition.node, scope, depth + 1)
        return found

    def carried_state(self, key: str, statement: cst.CSTNode, value: cst.BaseExpression) -> bool:
        """Whether `key`, an extra result of the forward pass `value` at `statement`, is a recurrent state: the same
        call takes it back, either from the loop's last pass (`out, hidden = rnn(x, hidden)`) or kept on an object
        across calls (`out, self.hidden = self.rnn(x, self.hidden)`). Fed only to other code, it is unknown."""
        if not isinstance(value, cst.Call):
            return False
        aliases = self.roles.imports.aliases
        if not any(key in operand_names(arg.value, aliases) for arg in value.args):
            return False
        return "." in key or any(d.node is statement for d in self.events.origins.definitions(key, statement))

    def elements(self, node: cst.BaseExpression, count: int, env: Env, scope: Scope) -> list[bool | None] | None:
        """The fact of each of `count` values unpacked from `node` (None: unknown), or None when not known apart.

        A tuple written out, and a same-module helper whose every `return` writes one,
        keep their elements apart; a forward pass's first result is its output and the
        others are unknown unless the same call takes them back (a recurrent state) or
        they are backpropagated.
        """
        if isinstance(node, (cst.Tuple, cst.List)):
            if len(node.elements) != count or any(isinstance(e, cst.StarredElement) for e in node.elements):
                return None
            return [self.evaluate(element.value, env, scope) for element in node.elements]
        if not isinstance(node, cst.Call):
            return None
        helper = self.events.resolve_helper(node) if node in self.collected.contexts else None
        outside = self.events.outside(node) if helper is None else None
        if helper is not None or outside is not None:
            returned = self.returned_elements(helper) if helper is not None else outside.elements if outside else None
            if returned is None or len(returned) != count:
                return None
            args_grad = any(self.evaluate(arg.value, env, scope) for arg in node.args)
            return [always or (if_args and args_grad) for always, if_args in returned]
        func = node.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        indexed = self._values_and_indices(node, env, scope)
        if indexed is not None and count == 2:
            return [indexed, False]
        if method in DETACHING_METHODS or not self._is_forward_call(node, scope):
            return None
        return [True] + [None] * (count - 1)

    def _values_and_indices(self, call: cst.Call, env: Env, scope: Scope) -> bool | None:
        """Whether the values of a (values, indices) pair carry a graph; None when `call` returns no such pair."""
        source = values_and_indices_source(call)
        if source is None:
            return None
        carries = self.evaluate(source, env, scope)
        if isinstance(call.func, cst.Attribute) and source is call.func.value:
            return True if carries else None  # a method of a tensor with a graph; anything else may be no tensor
        return carries

    def evaluate(self, node: cst.BaseExpression, env: Env, scope: Scope) -> bool:
        """Whether `node` carries a graph under `env` in `scope`."""
        if isinstance(node, (cst.Name, cst.Attribute)):
            return self._evaluate_symbol(node, env, scope)
        if isinstance(node, cst.Subscript):
            return not self._other_entry(node, scope) and self.evaluate(node.value, env, scope)
        if isinstance(node, cst.Call):
            return self._evaluate_call(node, env, scope)
        if isinstance(node, cst.BinaryOperation):
            return self.evaluate(node.left, env, scope) or self.evaluate(node.right, env, scope)
        if isinstance(node, cst.UnaryOperation):
            return not isinstance(node.operator, cst.Not) and self.evaluate(node.expression, env, scope)
        if isinstance(node, cst.BooleanOperation):
            return self.evaluate(node.left, env, scope) or self.evaluate(node.right, env, scope)
        if isinstance(node, cst.IfExp):
            return self._evaluate_arm(node.body, node.test, True, env, scope) or self._evaluate_arm(
                node.orelse, node.test, False, env, scope
            )
        if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
            return any(self.evaluate(element.value, env, scope) for element in node.elements)
        if isinstance(node, cst.Dict):
            return any(self.evaluate(element.value, env, scope) for element in node.elements)  # {"loss": loss}
        return False

    def _evaluate_arm(
        self, node: cst.BaseExpression, test: cst.BaseExpression, outcome: bool, env: Env, scope: Scope
    ) -> bool:
        """`node`, one arm of a conditional expression, taken when `test` has `outcome`: a name that fails
        `isinstance(v, torch.Tensor)` there is no tensor (`v.detach() if isinstance(v, Tensor) else v`)."""
        proven = self.collected.no_tensor_when(test)
        if proven is not None and proven[1] == outcome:
            env = {**env, proven[0]: False}
        return self.evaluate(node, env, scope)

    def _evaluate_symbol(self, node: cst.Name | cst.Attribute, env: Env, scope: Scope) -> bool:
        key = dotted_name(node)
        if key is not None and key in env:
            return env[key]
        if isinstance(node, cst.Attribute):
            if node.attr.value in NON_GRAD_ATTRIBUTES or _dunder(node.attr.value):
                return False  # `out.shape`, `model.__class__.__name__`: what it is, not a value with history
            if self.evaluate(node.value, env, scope):
                return True  # outputs.loss, out.logits
        return key is not None and key in self.backprop_keys(scope)

    def _evaluate_call(self, call: cst.Call, env: Env, scope: Scope) -> bool:
        func = call.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        if method in DETACHING_METHODS:
            return False
        args_grad = any(self.evaluate(arg.value, env, scope) for arg in call.args)
        if isinstance(func, cst.Attribute) and self.evaluate(func.value, env, scope):
            return True  # a method of a grad tensor: out.mean(), loss.cpu(), out.view(-1)
        helper = self.events.resolve_helper(call) if call in self.collected.contexts else None
        if helper is not None:
            always, if_args = self.returns_grad(helper)
            if always or not (if_args and args_grad):
                return always
            # Only the parameters given a graph here count: `train(model, "cuda")` hands none to `device`.
            given = frozenset(
                name for name, value in arguments_of(helper, call).items() if self.evaluate(value, env, scope)
            )
            return self.returns_grad_given(helper, given)
        closure = self._step_closure(call)
        if closure is not None:
            return self.returns_grad(closure)[0]  # `optimizer.step(closure)` returns what the closure returns
        qualified = self.roles.imports.resolve(func) or ""
        name = last_name(func) or ""
        if graphless_call(func, self.roles.imports):
            return False  # np.sum(...), scipy's functions: arrays, not tensors with a graph
        if qualified.endswith("autograd.grad"):
            return _creates_graph(call)  # the gradients have a graph of their own only with create_graph=True
        if qualified.startswith("torch."):
            return name not in NON_GRAD_TORCH and args_grad  # known, even where the project is PyTorch
        if isinstance(func, cst.Name) and name in NON_GRAD_BUILTINS:
            return False
        if name in ("sum", "max", "min", "abs", "stack", "cat"):
            return args_grad
        outside = self.events.outside(call)
        if outside is not None:
            return outside.returns_grad or (outside.returns_grad_if_args and args_grad)
        if not self._is_forward_call(call, scope):
            return False
        # A module without parameters (a converter, a metric, activations) passes on only its inputs' graphs; so
        # does a loss function known only by its name (`grad_loss_fn(detached_params, batch)`): a criterion has
        # weights of its own only where it is seen being built as one.
        receiver = forward_receiver(func)
        if self.roles.role(receiver) is Role.LOSS_FN and self.roles.proven_role(receiver) is None:
            return args_grad
        return args_grad or not self.holds_no_parameters(receiver, scope)

    def _step_closure(self, call: cst.Call) -> cst.FunctionDef | None:
        """The same-module function an optimizer's `step(closure)` runs, if it can be known."""
        closure = self.events.step_closure(call)
        if not isinstance(closure, cst.FunctionDef) or not isinstance(call.func, cst.Attribute):
            return None
        return closure if self.roles.role(call.func.value) is Role.OPTIMIZER else None

    def _is_forward_call(self, call: cst.Call, scope: Scope) -> bool:
        # model(x), criterion(out, y), self.encoder(x), model.forward(x), self(x) in a module
        callee = forward_receiver(call.func)
        if isinstance(callee, cst.Name) and callee.value == "self":
            owner = self.collected.owners.get(scope) if isinstance(scope, cst.FunctionDef) else None
            return owner is not None and self.roles.is_model_class(owner)
        return self.roles.runs_model(callee, call, (Role.MODEL, Role.LOSS_FN))

    def returns_grad(self, function: cst.FunctionDef) -> tuple[bool, bool]:
        """(always, if_arguments_do): whether a same-module function returns a graph."""
        if function in self._returns:
            return self._returns[function]
        self._returns[function] = (False, False)  # recursion guards
        self._returned_elements[function] = None
        always = self._walk_returns(function, {})
        always_elements = always.returned_elements()
        if always.returns_grad and always_elements is None:
            self._returns[function] = (True, True)  # nothing more to learn from the arguments
            return self._returns[function]
        params = {param.name.value: True for param in function.params.params if param.name.value != "self"}
        if_args = self._walk_returns(function, params)
        self._returns[function] = (always.returns_grad, always.returns_grad or if_args.returns_grad)
        if_args_elements = if_args.returned_elements()
        if always_elements is not None and if_args_elements is not None:
            self._returned_elements[function] = tuple(
                (first, first or second) for first, second in zip(always_elements, if_args_elements, strict=True)
            )
        return self._returns[function]

    def returns_grad_given(self, function: cst.FunctionDef, given: frozenset[str]) -> bool:
        """Whether a same-module function returns a graph when only the parameters `given` hold one."""
        key = (function, given)
        if key not in self._returns_given:
            self._returns_given[key] = False  # recursion guard
            params = {param.name.value: param.name.value in given for param in function.params.params}
            self._returns_given[key] = self._walk_returns(function, params).returns_grad
        return self._returns_given[key]

    def returned_elements(self, function: cst.FunctionDef) -> tuple[tuple[bool, bool], ...] | None:
        """(always, if_arguments_do) per element, when every `return` of `function` writes a tuple of one length."""
        self.returns_grad(function)
        return self._returned_elements[function]

    def _walk_returns(self, function: cst.FunctionDef, initial: dict[str, bool]) -> _Walker:
        walker = _Walker(self, function, initial, recording=not initial)
        walker.walk_scope(function)
        if not initial:
            self._walked.add(function)
        return walker


def _creates_graph(call: cst.Call) -> bool:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "create_graph":
            return not (isinstance(arg.value, cst.Name) and arg.value.value in ("False", "None"))
    return False


class _Walker(ForwardWalk[bool]):
    """One forward pass over a scope, tracking which names hold a graph."""

    def __init__(
        self,
        values: GradValues,
        scope: Scope,
        initial: dict[str, bool],
        recording: bool,
        into: dict[cst.CSTNode, Env] | None = None,
    ) -> None:
        super().__init__()
        self.values = values
        self.scope = scope
        self.env = dict(initial)
        self.recording = recording
        self.into = values._env_at if into is None else into  # where each statement's state is recorded
        self.returns_grad = False
        self.returned: list[tuple[bool, ...] | None] = []  # per `return`: its elements' facts, if a tuple
        self._replaced: dict[cst.For | cst.While, str] = {}  # loops that replace every entry of a container

    def returned_elements(self) -> tuple[bool, ...] | None:
        """Each element's fact over every `return`, when all of them write a tuple of one length."""
        if not self.returned or None in self.returned or len({len(r or ()) for r in self.returned}) != 1:
            return None
        return tuple(any(column) for column in zip(*(r for r in self.returned if r is not None), strict=True))

    def record(self, statement: cst.CSTNode) -> None:
        if self.recording:
            self.into[statement] = self.env

    def enter_branch(self, test: cst.BaseExpression, outcome: bool) -> None:
        # A name that fails `isinstance(val, torch.Tensor)` is no tensor there, so it holds no graph.
        proven = self.values.collected.no_tensor_when(test)
        if proven is not None and proven[1] == outcome:
            self.env = {**self.env, proven[0]: False}

    def enter_iteration(self, loop: cst.For | cst.While) -> None:
        if isinstance(loop, cst.For):
            self._bind_items(loop.target, loop.iter)

    def leave_loop(self, loop: cst.For | cst.While) -> None:
        # `for k, v in out.items(): out[k] = v.detach()`: every entry replaced by one without a graph (an empty
        # container held none either).
        container = self._replaced.pop(loop, None)
        if container is not None:
            self.env = {**self.env, container: False}

    def _replaces_entry(self, target: cst.BaseExpression, statement: cst.CSTNode) -> str | None:
        """The container `target` (`out[k]`) stores into when the statement runs on every pass of a loop over that
        container's keys (`for k, v in out.items():`, `for k in out:`) and stores at the loop's key."""
        context = self.values.collected.contexts.get(statement)
        if not isinstance(target, cst.Subscript) or context is None or not context.loops:
            return None
        loop = context.loops[-1]
        if not isinstance(loop, cst.For) or context.ifs != self.values.collected.contexts[loop].ifs:
            return None
        key, container = _keys_loop(loop)
        entry = target.slice[0].slice if len(target.slice) == 1 else None
        if key is None or not isinstance(entry, cst.Index) or dotted_name(entry.value) != key:
            return None
        return container if dotted_name(target.value) == container else None

    def _bind_items(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> None:
        """Bind a loop's target to the items of `iterable`: the items of a graph-carrying iterable carry it,
        `enumerate` pairs a count with them, `zip` takes one from each of its iterables."""
        if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name) and iterable.args:
            name, args = iterable.func.value, [arg.value for arg in iterable.args if arg.keyword is None]
            parts = target.elements if isinstance(target, (cst.Tuple, cst.List)) else None
            plain = parts is not None and not any(isinstance(part, cst.StarredElement) for part in parts)
            if name in ITEM_WRAPPERS and len(args) == 1:
                self._bind_items(target, args[0])
                return
            if name == "enumerate" and args and parts is not None and plain and len(parts) == 2:
                self.assign(parts[0].value, False)
                self._bind_items(parts[1].value, args[0])
                return
            if name == "zip" and parts is not None and plain and len(parts) == len(args):
                for part, arg in zip(parts, args, strict=True):
                    self._bind_items(part.value, arg)
                return
        self.assign(target, self.values.evaluate(iterable, self.env, self.scope))

    def merge(self, first: Env, second: Env) -> dict[str, bool]:
        merged = dict(first)
        for key, value in second.items():
            merged[key] = merged.get(key, False) or value
        return merged

    def apply(self, statement: cst.BaseSmallStatement) -> None:
        context = self.values.collected.contexts.get(statement)
        no_grad = context is not None and context.no_grad
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                self._assign_value(target.target, statement.value, no_grad, statement)
        elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
            self.assign(statement.target, not no_grad and self.values.evaluate(statement.value, self.env, self.scope))
        elif isinstance(statement, cst.AugAssign):
            key = dotted_name(statement.target)
            if key is not None and not no_grad:
                grad = self.env.get(key, False) or self.values.evaluate(statement.value, self.env, self.scope)
                self.env = {**self.env, key: grad}
        elif isinstance(statement, cst.Return) and statement.value is not None:
            value = statement.value
            self.returns_grad = self.returns_grad or (not no_grad and self.values.evaluate(value, self.env, self.scope))
            written = isinstance(value, cst.Tuple) and not any(
                isinstance(e, cst.StarredElement) for e in value.elements
            )
            elements = value.elements if isinstance(value, cst.Tuple) and written else None
            self.returned.append(
                None
                if elements is None
                else tuple(not no_grad and self.values.evaluate(e.value, self.env, self.scope) for e in elements)
            )
        elif isinstance(statement, cst.Expr):
            # One call, or a tuple of them (`x_adv.detach_(), loss.detach_()`).
            value = statement.value
            calls = [element.value for element in value.elements] if isinstance(value, cst.Tuple) else [value]
            for call in calls:
                if isinstance(call, cst.Call):
                    self._apply_inplace_call(call)

    def _apply_inplace_call(self, call: cst.Call) -> None:
        # x.detach_() and x.requires_grad_(False) cut a name's history in place; `acc.add_(loss)` and
        # `losses.append(loss)` make `acc` and `losses` hold the graph.
        if not isinstance(call.func, cst.Attribute):
            return
        key = dotted_name(call.func.value)
        if key is not None and call.func.attr.value in CONTAINER_METHODS | ADDING_METHODS:
            if any(self.values.evaluate(arg.value, self.env, self.scope) for arg in call.args if arg.keyword is None):
                self.env = {**self.env, key: True}
            return
        if (
            key is not None
            and call.func.attr.value in ("detach_", "requires_grad_")
            and (call.func.attr.value == "detach_" or (call.args and last_name(call.args[0].value) == "False"))
        ):
            self.env = {**self.env, key: False}

    def _assign_value(
        self, target: cst.BaseExpression, value: cst.BaseExpression, no_grad: bool, statement: cst.Assign
    ) -> None:
        if not no_grad and isinstance(target, (cst.Tuple, cst.List)):
            elements = self.values.elements(value, len(target.elements), self.env, self.scope)
            if elements is not None and not any(isinstance(e, cst.StarredElement) for e in target.elements):
                for element, grad in zip(target.elements, elements, strict=True):
                    self._assign_element(element.value, grad, value, statement)
                return
        grad = not no_grad and self.values.evaluate(value, self.env, self.scope)
        replaced = None if grad else self._replaces_entry(target, statement)
        if replaced is not None:
            self._replaced[self.values.collected.contexts[statement].loops[-1]] = replaced
        key = dotted_name(target)
        if not (grad or no_grad) and key is not None:
            # Backward is proof: what is assigned here and backpropagated later carries a graph.
            grad = (statement, key) in self.values.backpropagated_definitions(self.scope)
        self.assign(target, grad)

    def _assign_element(
        self, target: cst.BaseExpression, grad: bool | None, value: cst.BaseExpression, statement: cst.Assign
    ) -> None:
        if grad is not None:
            # Backward is proof here too: `loss, out = self.get_loss(x)`, then `loss.backward()` (what the helper
            # returns may only be unproven, never proven to carry no graph, where it is backpropagated).
            key = dotted_name(target)
            self.assign(
                target,
                grad or (key is not None and (statement, key) in self.values.backpropagated_definitions(self.scope)),
            )
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._assign_element(element.value, None, value, statement)
        elif (key := dotted_name(target)) is not None:
            if self.values.carried_state(key, statement, value) or key in self.values.backprop_keys(self.scope):
                self.env = {**self.env, key: True}
            else:
                self.env = {k: v for k, v in self.env.items() if k != key}  # unknown: nothing assumed

    def assign(self, target: cst.BaseExpression, grad: bool) -> None:
        """Bind `target` (a name, attribute or tuple of them) to a value with or without a graph."""
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.assign(element.value, grad)
            return
        if isinstance(target, cst.Subscript):
            # Ex) losses[i] = loss: the container now holds a graph too (and keeps whatever it held)
            container = dotted_name(container_of(target))
            if grad and container is not None:
                self.env = {**self.env, container: True}
            return
        key = dotted_name(target)
        if key is not None:
            self.env = {**self.env, key: grad}


def _keys_loop(loop: cst.For) -> tuple[str | None, str | None]:
    """(the key name, the container) of `for k, v in out.items():` or `for k in out:` / `out.keys()`."""
    iterable, target = loop.iter, loop.target
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute) and not iterable.args:
        method, container = iterable.func.attr.value, dotted_name(iterable.func.value)
        if method == "items" and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
            return dotted_name(target.elements[0].value), container
        if method == "keys":
            return dotted_name(target), container
        return None, None
    return dotted_name(target), dotted_name(iterable)


def _entry_of(node: cst.Subscript) -> str:
    """The entry, as written, that `node` reads out of its outermost container: `"train"` in `logs["train"]["loss"]`."""
    while isinstance(node.value, cst.Subscript):
        node = node.value
    return cst.Module([]).code_for_node(node.slice[0]) if len(node.slice) == 1 else ""


def container_of(node: cst.BaseExpression) -> cst.BaseExpression:
    """`losses` in `losses[i]` and in `stats["loss"][i]` (and `losses` itself)."""
    while isinstance(node, cst.Subscript):
        node = node.value
    return node


def values_and_indices_source(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`out` in `out.max(1)` or `torch.max(out, 1)`: a reduction that also returns indices."""
    if not isinstance(node, cst.Call) or last_name(node.func) not in VALUES_AND_INDICES:
        return None
    arguments = [arg.value for arg in node.args]
    if isinstance(node.func, cst.Attribute) and dotted_name(node.func.value) not in ("torch",):
        return node.func.value if arguments else None
    return arguments[0] if len(arguments) >= 2 else None


def _dunder(name: str) -> bool:
    """`__class__`, `__name__`, `__dict__`: Python's own attributes, never a tensor with history."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")
