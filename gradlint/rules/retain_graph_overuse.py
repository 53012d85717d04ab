"""GL005: `backward(retain_graph=True)` where no later backward needs the graph."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event, Kind, Role
from gradlint.analysis.facts.lineage import is_data_name
from gradlint.analysis.facts.origins import Binding
from gradlint.analysis.syntax.collect import Loop, Scope
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in, prefixes
from gradlint.analysis.syntax.refs import all_params
from gradlint.analysis.syntax.tree import children, descendants
from gradlint.fixes import replace_node, without_keyword
from gradlint.rule import Fix, Rule
from gradlint.screens import ITERATION_WRAPPERS

SUMMABLE = (
    "`{first}` and `{second}` run through one graph with nothing between them; "
    "backpropagating the sum of the losses once needs no retained graph"
)
BACKPROPAGATING = (Kind.BACKWARD, Kind.AUTOGRAD_GRAD)
# Events that make a second backward differ from backpropagating a sum of losses.
INTERVENING = (Kind.STEP, Kind.CLEAR, Kind.CLIP, Kind.UNSCALE)
HOLDS_NO_GRAPH = (Role.MODEL, Role.LOSS_FN, Role.OPTIMIZER, Role.SCALER)


class RetainGraphOveruse(Rule):
    """Checks for `backward(retain_graph=True)` where no later backward uses the graph.

    Why is this bad?
    `retain_graph=True` keeps every tensor the forward pass saved until the graph is
    garbage collected. It is needed only when another `backward()` or
    `torch.autograd.grad()` runs through the same graph before it is freed. Without
    one, each step keeps a second graph alive for nothing: memory roughly doubles
    and, in a loop, can grow until `CUDA out of memory`. Most often it was added to
    silence `RuntimeError: Trying to backward through the graph a second time (or
    directly access saved tensors after they have already been freed)`, which comes
    from an RNN hidden state or a generator output that should have been detached
    (`hidden = hidden.detach()`, `D(fake.detach())`).

    Two backward calls on losses of one forward pass with nothing between them
    (`loss_a.backward(retain_graph=True); loss_b.backward()`) compute the same
    gradients as `(loss_a + loss_b).backward()`, which needs no retained graph.

    Not reported: a later backward or `torch.autograd.grad` through the graph in the
    same step (GAN and actor-critic steps with an optimizer step between them,
    per-task gradients that are read between the calls; also in a helper whose later
    backward one caller's literal flag leaves out, since other calls need the graph), a
    graph built before a loop
    that backpropagates it once per iteration (Jacobian rows; any assignment of it before
    the loop counts), a backward that other code calls, through a graph built before
    (in a lambda handed to a benchmark harness, or a nested function that backpropagates
    a value of the function around it), an optimizer wrapper
    whose `step(loss)` backpropagates, a helper that returns the loss or keeps it on
    `self` without stepping (its caller may backpropagate again), and
    `create_graph=True`.

    Not reported when the loss is computed from the items of a loop over values other
    code hands out (`for model_trace, guide_trace in self._get_traces(...)`): a later
    item may replay an earlier one's graph, which is what the retained graph is for.
    Batches from a loader, items named as data and numbers from `range` are fresh.

    Known problems
    A later backward in another module is not seen.

    Fix safety
    Removing `retain_graph=True` is offered only where no later backward can reach the
    graph: no backward follows in the step or the loop, the loss is not returned or kept
    on `self`, the backward is not in a helper reached from a caller, and the loss is not
    computed from a value the loop carries into its next iteration (an undetached RNN
    state: there the cure is `.detach()`, and removing the flag would raise). It is safe
    when nothing a caller passed in can carry a graph into the loss: only parameters the
    function just calls (`criterion(out, y)`), those annotated as a module, loss,
    optimizer or GradScaler, and the batches of one annotated `DataLoader` feed it. A
    parameter's name proves nothing: `loader` may be a list of tensors with history.
    Unsafe otherwise (offered with `--unsafe-fixes`).

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html
    https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory
    """

    code = "GL005"
    name = "retain-graph-overuse"
    message = "retain_graph=True keeps the graph alive but nothing backpropagates through it again, wasting memory"
    quiet_in_tests = True
    requires = (b"retain_graph", b"backward")
    example = """
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward(retain_graph=True)
            optimizer.step()
    """
    use_instead = """
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        events = self.analysis.events
        roots: list[Scope] = [self.analysis.module]
        roots.extend(function for function in self.analysis.collected.functions if function not in events.called)
        for scope in roots:
            found = events.scope_events(scope)
            for index, event in enumerate(found):
                if event.kind is Kind.BACKWARD and event.retain_graph and not _creates_graph(event.node):
                    self._judge(scope, found, index)

    def _judge(self, scope: Scope, events: tuple[Event, ...], index: int) -> None:
        event = events[index]
        loop = event.loops[-1] if event.loops else None
        if loop is not None and self._graph_built_before(event, loop):
            return  # the next iteration backpropagates through it again
        if loop is not None and self._from_items_that_may_share(event, loop):
            return  # Ex) for trace in self._get_traces(): later items may replay this one's graph
        if self._deferred(event):
            return  # Ex) do_bench(lambda: out.backward(g, retain_graph=True)): each call backpropagates it again
        functions = {function.name.value for function in self.analysis.collected.functions}
        later = _later_backwards(events, index, functions)
        if not later and self._hands_graph_to_caller(scope, event, events):
            return
        if not later and self._needed_by_another_call(event, functions):
            return  # Ex) a test helper whose `if logdet:` backward one caller's literal flag leaves out
        story = [(source, "the retained graph is built here") for source in self._sources(event)[-1:]]
        if not later:
            where = [(loop, "nothing in this loop backpropagates through it again")] if loop is not None else []
            loss = self._loss(event)
            named = f"retain_graph=True keeps `{loss}`'s graph alive but nothing backpropagates through it again"
            self.report(event.node, named, self._drop_retain_graph(event), [*story, *where])
        elif later[0].kind is Kind.BACKWARD and self._nothing_between(events, index, events.index(later[0])):
            message = SUMMABLE.format(first=self.analysis.code(event.node), second=self.analysis.code(later[0].site))
            self.report(event.node, message, related=[*story, (later[0].site, "the next backward, right after it")])

    def _needed_by_another_call(self, event: Event, functions: set[str]) -> bool:
        """Whether a backward reached through a call (its caller's flags fixed) is followed, in the function that
        holds it read on its own, by another backward: the line serves every call, and other calls need the graph."""
        holder = self.analysis.context(event.node).function
        if event.direct or holder is None:
            return False
        own = self.analysis.events.scope_events(holder)
        index = next((i for i, e in enumerate(own) if e.node is event.node), None)
        return index is not None and bool(_later_backwards(own, index, functions))

    def _from_items_that_may_share(self, event: Event, loop: Loop) -> bool:
        """Whether the loss is computed from the items of an iterable that may hand out related graphs.

        Batches from a loader or a collection handed in, items named as data (`inputs`,
        `targets`) and numbers from `range` are fresh on every iteration; items a call
        produces (traces, particles) may share a graph that a later item's backward goes
        through, which is what the retained graph is for.
        """
        if not isinstance(loop, cst.For) or event.value is None or _counts(loop.iter):
            return False
        if not _produced(loop.iter):
            return False  # a list or batches handed in: data
        statement = self.analysis.statement_of(event.node)  # type: ignore[arg-type]  # a backward is a call
        return any(
            not is_data_name(name) and self.analysis.origins.reads(event.value, name, statement)
            for name in names_in(loop.target)
        )

    def _deferred(self, event: Event) -> bool:
        """Whether the backward runs whenever other code calls it, through a graph built before: in a lambda, or in
        a nested function that backpropagates a value of the function around it (`return backward_fn`, a benchmark
        harness's closure). Each call goes through the same graph again, which is what the retained graph is for."""
        analysis = self.analysis
        statement = analysis.statement_of(event.node)  # type: ignore[arg-type]  # a backward is a call
        lambdas = (node for node in descendants(statement) if isinstance(node, cst.Lambda))
        if any(event.node in descendants(node.body) for node in lambdas):
            return True
        function = analysis.context(event.node).function
        if function is None or event.value is None or analysis.context(function).function is None:
            return False  # not nested in another function: its values are its own, or its caller's
        params = set(all_params(function))
        return any(
            key is not None
            and key.split(".")[0] not in params
            and all(reaching.binding is Binding.OUTSIDE for reaching in analysis.origins.definitions(key, statement))
            for key in (dotted_name(operand) for operand in analysis.graphs.operands(event.value))
        )

    def _loss(self, event: Event) -> str:
        return self.analysis.code(event.value) if event.value is not None else "the loss"

    def _sources(self, event: Event) -> list[cst.CSTNode]:
        if event.value is None or not isinstance(event.node, cst.Call):
            return []
        return self.analysis.sources(event.value, self.analysis.statement_of(event.node))

    def _drop_retain_graph(self, event: Event) -> Fix | None:
        """Remove `retain_graph=True`; not in a helper, whose other callers may need the graph."""
        call = event.node
        if call is not event.site or not isinstance(call, cst.Call):
            return None
        flags = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "retain_graph"]
        if not (len(flags) == 1 and isinstance(flags[0], cst.Name) and flags[0].value == "True"):
            return None
        if self._carried_round_the_loop(event) or self._handed_on(self.analysis.context(call).function, event):
            return None  # a later backward (the next iteration's, a caller's) may go through this graph
        # A loss that cannot be read (`accelerator.backward(**outputs, ...)`) cannot be checked either.
        safe = event.value is not None and not self._may_share_a_callers_graph(event)
        fix = without_keyword(call, "retain_graph")
        return replace_node(self.analysis, call, fix, "remove `retain_graph=True`", safe=safe)

    def _handed_on(self, function: cst.FunctionDef | None, event: Event) -> bool:
        """Whether `function` returns the loss or keeps it on `self`, where other code may backpropagate it."""
        if function is None or event.value is None:
            return False
        keys = set(names_in(event.value))
        handed = (_handed_on(statement) for statement in self.analysis.statements_in(function))
        return any(keys & set(names_in(value)) for value in handed if value is not None)

    def _carried_round_the_loop(self, event: Event) -> bool:
        """Whether the loss is computed from a value the loop carries from one iteration to the next.

        Ex) `logits, hidden = model(x, hidden)` without `hidden.detach()`: each iteration's
        graph extends the last one's, so a later backward reaches it again.
        """
        analysis = self.analysis
        if not event.loops or event.value is None:
            return False
        loop, order = event.loops[-1], analysis.collected.order
        pending = [(event.value, analysis.statement_of(event.node))]  # type: ignore[arg-type]  # a backward is a call
        seen: set[tuple[str, cst.CSTNode]] = set()
        while pending:
            value, where = pending.pop()
            # `logits.flatten()` reads `logits`
            for name in [prefix for read in names_in(value) for prefix in prefixes(read)]:
                if (name, where) in seen:
                    continue
                seen.add((name, where))
                for definition in analysis.origins.definitions(name, where):
                    node = definition.node
                    if node not in order or loop not in analysis.context(node).loops:
                        continue  # from before the loop, or from outside the scope
                    if order[node] >= order[where]:
                        return True  # bound later in the loop body: carried from the last iteration
                    pending.append((definition.value, node))
        return False

    def _may_share_a_callers_graph(self, event: Event) -> bool:
        """Whether the graph may hold tensors a caller passed in, which a caller's later backward could reach.

        A parameter proven (by its annotation) to be a module, a loss function, an optimizer, a GradScaler or a
        `DataLoader` (whose batches are fresh), or one the function only ever calls (`criterion(out, y)`: a
        callable, not a tensor), holds no caller's graph; any other parameter might, whatever it is called.
        """
        analysis = self.analysis
        function = analysis.context(event.node).function
        if function is None or event.value is None:
            return False
        statement = analysis.statement_of(event.node)  # type: ignore[arg-type]  # a backward is a call
        params = function.params
        star = [param for param in (params.star_arg, params.star_kwarg) if isinstance(param, cst.Param)]
        for param in (*params.posonly_params, *params.params, *params.kwonly_params, *star):
            name = param.name.value
            if name in ("self", "cls") or self._holds_no_callers_graph(function, param):
                continue
            if analysis.origins.reads(event.value, name, statement):
                return True
        return False

    def _holds_no_callers_graph(self, function: cst.FunctionDef, param: cst.Param) -> bool:
        """Whether a parameter surely holds no graph from the caller: an annotation proves it an object that holds
        none, or the function only calls it."""
        analysis = self.analysis
        if analysis.roles.proven_role(param.name) in HOLDS_NO_GRAPH:
            return True
        annotation = param.annotation.annotation if param.annotation is not None else None
        if annotation is not None and (analysis.imports.resolve(annotation) or "").endswith("utils.data.DataLoader"):
            return True
        name = param.name.value
        uses = [node for node in descendants(function.body) if isinstance(node, cst.Name) and node.value == name]
        callees = {
            id(node.func)
            for node in descendants(function.body)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == name
        }
        return bool(uses) and all(id(use) in callees for use in uses)

    def _hands_graph_to_caller(self, scope: Scope, event: Event, events: tuple[Event, ...]) -> bool:
        """Whether a loss-and-grads helper returns or stores the retained loss for other code to use again."""
        # Ex) def loss_and_grads(): loss = ...; loss.backward(retain_graph=True); return loss
        # Ex) self.loss = loss (another method backpropagates it again)
        if not isinstance(scope, cst.FunctionDef) or any(e.kind is Kind.STEP for e in events):
            return False
        return self._handed_on(scope, event)

    def _graph_built_before(self, event: Event, loop: Loop) -> bool:
        """Whether the backpropagated value comes from a graph built before `loop`."""
        analysis = self.analysis
        if event.value is None or not isinstance(event.node, cst.Call):
            return False
        if analysis.context(loop).scope is not analysis.context(event.node).scope:
            return False  # the loop is a caller's, around a helper that backpropagates
        bound = _bound_in(loop, analysis.statements_in(loop))
        # Ex) for out in outputs: out.loss.backward(retain_graph=True)  /  f.backward(...) with f from outside
        tensors = {dotted_name(tensor) for tensor in analysis.graphs.tensors_of(event.value)}
        items = _targets(loop)
        if any(tensor is not None and _is_bound(tensor, items) for tensor in tensors) or (
            tensors and not any(_is_bound(tensor, bound) for tensor in tensors)
        ):
            return True
        statement = analysis.statement_of(event.node)
        for definition in analysis.graphs.sources(event.value, statement).values():
            if isinstance(definition, (cst.Assign, cst.AnnAssign)) and definition.value is not None:
                outside = loop not in analysis.context(definition).loops
                if outside and analysis.graphs.may_carry_graph(definition.value, definition):
                    return True
        # A name assigned in several places (`if qmc: samples = sampler(p) else: samples = p.rsample()`): any
        # assignment before the loop that may carry a graph is backpropagated again by the next iteration.
        for operand in analysis.graphs.operands(event.value):
            key = dotted_name(operand)
            for reaching in analysis.origins.definitions(key, statement) if key is not None else ():
                outside = reaching.binding is Binding.ASSIGN and loop not in analysis.context(reaching.node).loops
                if outside and analysis.graphs.may_carry_graph(reaching.value, reaching.node):
                    return True
        return False

    def _nothing_between(self, events: tuple[Event, ...], first: int, second: int) -> bool:
        """Whether two backward calls are side by side: no step, clear, or gradient read between them."""
        start, end = events[first], events[second]
        if not start.direct or not end.direct or (start.loops, start.ifs) != (end.loops, end.ifs):
            return False
        if any(event.kind in INTERVENING for event in events[first + 1 : second]):
            return False
        order = self.analysis.collected.order
        low, high = order[start.node], order[end.node]
        scope = self.analysis.context(start.node).scope
        return not any(
            _reads_grad(statement)
            for statement in self.analysis.collected.statements_in_scope(scope)
            if low < order[statement] < high
        )


def _later_backwards(events: tuple[Event, ...], index: int, functions: set[str]) -> list[Event]:
    """The events after `events[index]` that backpropagate, in its innermost loop when it has one."""
    loop = events[index].loops[-1] if events[index].loops else None
    return [e for e in events[index + 1 :] if _backpropagates(e, functions) and (loop is None or loop in e.loops)]


def _backpropagates(event: Event, functions: set[str]) -> bool:
    # Some wrappers backpropagate the loss they are given: tianshou's optim.step(loss, retain_graph=True).
    # A closure passed to LBFGS's step(closure) is not one: its own events are inlined already.
    if event.kind is Kind.STEP and isinstance(event.node, cst.Call) and event.node.args and not event.via_scaler:
        argument = event.node.args[0].value
        return not (isinstance(argument, cst.Name) and argument.value in functions)
    return event.kind in BACKPROPAGATING


def _targets(loop: Loop) -> set[str | None]:
    if not isinstance(loop, cst.For):
        return set()
    return {dotted_name(node) for node in _target_names(loop.target)}


def _bound_in(loop: Loop, statements: list[cst.BaseSmallStatement]) -> set[str | None]:
    """Every name a statement of `loop` (or a nested loop's target) binds."""
    bound = _targets(loop)
    for statement in statements:
        if isinstance(statement, cst.Assign):
            bound.update(dotted_name(node) for target in statement.targets for node in _target_names(target.target))
        elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)):
            bound.add(dotted_name(statement.target))
    return bound


def _is_bound(key: str | None, bound: set[str | None]) -> bool:
    # outputs.loss is bound when `outputs` is
    return key is None or any(name is not None and (key == name or key.startswith(name + ".")) for name in bound)


def _target_names(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [node for element in target.elements for node in _target_names(element.value)]
    return [target]


def _handed_on(statement: cst.BaseSmallStatement) -> cst.BaseExpression | None:
    """The value a statement returns or stores on `self`, where other code can reach it."""
    if isinstance(statement, cst.Return):
        return statement.value
    if isinstance(statement, cst.Assign) and any(
        (dotted_name(target.target) or "").startswith("self.") for target in statement.targets
    ):
        return statement.value
    return None


def _creates_graph(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and any(
        arg.keyword is not None
        and arg.keyword.value == "create_graph"
        and isinstance(arg.value, cst.Name)
        and arg.value.value == "True"
        for arg in node.args
    )


def _reads_grad(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Attribute) and node.attr.value == "grad":
        return True
    return any(_reads_grad(child) for child in children(node))


def _counts(iterable: cst.BaseExpression) -> bool:
    """`range(n)`, `enumerate(range(n))`, `tqdm(range(n))`: numbers, not values with graphs."""
    while isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name):
        if iterable.func.value == "range":
            return True
        if not iterable.args:
            return False
        iterable = iterable.args[0].value
    return False


def _produced(iterable: cst.BaseExpression) -> bool:
    """Whether the items come from a call of other code (`self._get_traces(...)`), past `enumerate`/`zip`."""
    while isinstance(iterable, cst.Call) and last_name(iterable.func) in ITERATION_WRAPPERS and iterable.args:
        iterable = iterable.args[0].value
    return isinstance(iterable, cst.Call) and last_name(iterable.func) not in ("items", "values", "keys", "range")
