"""GL001: a value with autograd history accumulated across training iterations."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Event, Kind
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.facts.keeping import added_to
from gradlint.analysis.facts.values import ADDING_METHODS, CONTAINER_METHODS, container_of
from gradlint.analysis.syntax.names import dotted_name, last_name, names_in
from gradlint.fixes import method_call, replace_node
from gradlint.rule import Fix, Rule

# Calls that accept a float as well as a one-element tensor: what `.item()` may feed.
LOGGING_CALLS = frozenset(
    {"print", "log", "info", "debug", "warning", "write", "add_scalar", "set_postfix", "set_description", "echo"}
)


class LossAccumulation(Rule):
    """Checks for losses and other graph-carrying tensors kept across training iterations.

    Why is this bad?
    A tensor that carries autograd history keeps its whole graph alive: every
    activation the forward pass saved. `total_loss += loss` or `losses.append(loss)` in
    a training loop chains each step's graph onto the accumulator, so memory grows with
    every step until `CUDA out of memory`; so does an exponential average that keeps the
    tensor (`avg = 0.98 * avg + 0.02 * loss`). Use `loss.item()` (a Python float) or
    `loss.detach()` (a tensor without history) for logging. Storing each step's loss by
    index into a list or dict made before the loop (`history[step] = loss`, the index
    counting the iterations) keeps the graphs the same way; a fixed window
    (`recent[step % k] = loss`) does not grow. A fresh start counts only where it runs on
    every pass that adds: one under an `if` of its own (`if step % log_every == 0: ...;
    total = 0`) leaves every graph added in between alive, up to `log_every` steps of
    activations. Handing the loss to an object whose method
    keeps it (a meter's `update(val, n)` running `self.sum += val * n`, a statistics
    collector whose `__setitem__` appends to a list per key) keeps the graphs as well,
    wherever in the project that class is defined; a method that keeps `float(val)` or
    `val.item()` keeps none, and neither does one that first turns a tensor into a number
    (`if isinstance(val, torch.Tensor): val = val.item()`). A queue whose entries are taken
    out again and backpropagated (a pipeline schedule's `outputs.pop(0)` handed to a
    backward, here or through a helper of the module) keeps its graphs only until their
    backward, and an integer tensor (`total_tokens = torch.zeros([], dtype=torch.int)`)
    holds no graph whatever is added into it. An in-place addition (`running.add_(loss)`)
    keeps the graph as `+=` does. What is backpropagated carries a graph however it was
    computed (`loss = sum(losses)` over heads of unknown type, or `loss, out =
    self.get_loss(x)` from a helper whose criterion is unknown, then `loss.backward()`), a
    list that such values were appended to carries it too, and so does what
    `optimizer.step(closure)` hands back when the closure returns the loss. The container
    a backpropagated value was taken out of holds its graph (`output = self.train_step(batch)`,
    then `output["loss"].backward()`: keeping `output` keeps the graph), though what its other
    entries hold stays unknown; a loop that replaces every entry by one without a graph
    (`for k, v in output.items(): output[k] = v.detach() if isinstance(v, Tensor) else v`)
    leaves it holding none.

    Summing losses that are backpropagated in the same step (several heads, gradient
    accumulation that calls backward on the sum) is fine and not reported, and so is
    anything computed under `torch.no_grad()`, and the indices of a (values, indices)
    pair (`_, predicted = torch.max(logits, 1)`, `logits.sort(dim=1)`): integers, with
    no graph.

    A module's `forward` runs once in every training step of whoever trains it: what it adds
    to an attribute of the module (`self.features.append(h)`, `self.total += h.sum()`) keeps
    each step's graph unless something gives the attribute a fresh start. A reset in the
    forward itself, in another method of the class (`def reset(self): self.features = []`)
    or in code of the same module (`model.features.clear()`) counts; a value detached
    first (`h.detach()`) keeps no graph.

    A loss function known only by its name (`grad_loss_fn = task.get_grad_loss_func()`) carries
    the graph of what it is given and nothing of its own: per-sample gradients it computes
    from detached parameters keep no graph; a criterion has weights only where the code is
    seen building it as a class that has them. What a helper of the module returns carries a
    graph only through the parameters that are given one at the call: a benchmark's
    `train(model, "cuda")` that returns records of timings, the device and
    `model.__class__.__name__` (Python's own attributes are never tensors) keeps nothing.

    Known problems
    An object whose class cannot be proven (a parameter without an annotation) is not
    followed into its methods. A value returned by a function of another module carries
    a graph only where that function's summary shows it. An index store inside a tuple
    target (`history[i], cost = step()`) is not followed. A module attribute that only code
    in another module resets (`model.features.clear()` in the project's trainer) is taken
    to grow.

    Fix safety
    Safe, and offered only on proof. `.detach()` is appended only to a value the source
    proves to be a tensor (a torch function's result, the output of a `torch.nn` layer or
    loss, arithmetic on such a value, or a name that `.backward()` is called on); on a
    value of unknown type (a count or float returned beside the loss) no fix is offered.
    `.item()` is used instead only for a one-element tensor added to a local number that
    nothing but printing and logging calls reads: any other reader (a return, a call, a
    method) might need a tensor.

    References
    https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory
    """

    code = "GL001"
    name = "loss-accumulation"
    message = "a tensor with autograd history is accumulated across iterations, keeping every step's graph alive"
    quiet_in_tests = True
    # Lightning backpropagates what training_step returns; a module's forward runs in every training step.
    requires = ((b"backward", b"training_step", b"def forward"),)
    example = """
        total_loss = 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss
    """
    use_instead = """
        total_loss = 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
    """

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # Ex) total += loss  /  stats["loss"] += loss (the entry keeps the graph)
        if isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign)):
            self._check(node, _container_key(node.target), node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        # Ex) running = running + loss  /  preds = torch.cat([preds, logits])
        if len(node.targets) != 1:
            return
        target = node.targets[0].target
        if isinstance(target, cst.Subscript):
            # Ex) losses[step] = loss: a new entry every iteration, as `losses.append(loss)` makes
            if self._indexed_per_iteration(target, node):
                self._check(node, _container_key(target), node.value)
            elif len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
                # Ex) stats["loss"] = loss, where the class's `__setitem__` appends to a list per key
                setitem = cst.Call(
                    cst.Attribute(target.value, cst.Name("__setitem__")),
                    [cst.Arg(target.slice[0].slice.value), cst.Arg(node.value)],
                )
                self._check_kept(node, setitem)
            return
        key = dotted_name(node.targets[0].target)
        added = added_to(node.value, key) if key else None
        if added is not None:
            self._check(node, key, added)

    def visit_Expr(self, node: cst.Expr) -> None:
        # Ex) losses.append(loss)  /  history["loss"].append(loss)
        call = node.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.args):
            return
        if call.func.attr.value in CONTAINER_METHODS:
            self._check(node, _container_key(call.func.value), call.args[-1].value)
            return
        if call.func.attr.value in ADDING_METHODS:
            # Ex) running.add_(loss), as `running += loss` does
            self._check(node, _container_key(call.func.value), call.args[0].value, total=call.func.value)
            return
        # Ex) meter.update(loss, n) with `def update(self, val, n): self.sum += val * n`, here or in another module
        self._check_kept(node, call)

    def _indexed_per_iteration(self, target: cst.Subscript, statement: cst.Assign) -> bool:
        """Whether the index counts the iterations of an enclosing loop (`i`, `i + 1`; not `i % k`, a ring)."""
        if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
            return False
        index = target.slice[0].slice.value
        if isinstance(index, cst.BinaryOperation):
            if not isinstance(index.operator, (cst.Add, cst.Subtract)) or not isinstance(index.right, cst.Integer):
                return False
            index = index.left
        loops = self.analysis.context(statement).loops
        return isinstance(index, cst.Name) and self.analysis.accumulations.is_counter(index, loops)

    def _check_kept(self, statement: cst.BaseSmallStatement, call: cst.Call) -> None:
        """Report a graph-carrying argument that the method `call` runs keeps on its object."""
        assert isinstance(call.func, cst.Attribute)
        container = _container_key(call.func.value)
        for value, attribute in self.analysis.kept_by(call, statement):
            if self.analysis.is_grad(value, statement):
                self._check(statement, container, value, f"{container}.{attribute}" if container else None)
                return

    def _check(
        self,
        statement: cst.BaseSmallStatement,
        key: str | None,
        value: cst.BaseExpression,
        store: str | None = None,
        total: cst.BaseExpression | None = None,
    ) -> None:
        """Report `value` kept in `key` across the iterations of a training step; `store` is the attribute of
        `key` that a method keeps it in, whose fresh start (`pi.train_net()` setting `self.data = []`) counts;
        `total`, the tensor an in-place addition adds `value` onto."""
        analysis = self.analysis
        if key is None or not analysis.is_grad(value, statement):
            return
        if isinstance(statement, cst.AugAssign):
            total = statement.target
        if total is not None and analysis.holds_no_graph(total, statement):
            return  # Ex) total_tokens += tokens into an integer tensor: the sum has no graph
        context = analysis.context(statement)
        region = next(
            (loop for loop in reversed(context.loops) if _backpropagates(analysis.events.region_events(loop))),
            None,
        )
        if region is None:
            # A training-step method storing on `self` keeps graphs across its calls; so does
            # a Lightning `training_step` (`self.outputs.append(loss)`), which Lightning runs per batch,
            # and a module's `forward` adding to an attribute nothing resets (`self.features.append(h)`).
            function = context.function
            if (
                function is None
                or not key.startswith("self.")
                or not (
                    _backpropagates(analysis.events.region_events(function))
                    or function in backpropagated_returns(analysis.collected)
                    or analysis.grown_per_forward(function, key)
                )
            ):
                return
            region_node: cst.For | cst.While | cst.FunctionDef = function
        else:
            region_node = region
        if analysis.rebinds(region_node, key, whenever=statement) or key in analysis.backpropagated_names(region_node):
            return
        if store is not None and analysis.rebinds(region_node, store, whenever=statement):
            return
        if isinstance(context.scope, cst.FunctionDef) and key in analysis.backpropagated_names(context.scope):
            return  # kept on purpose: the function backpropagates the kept values later
        self.report(
            statement,
            self._named(statement, key, value),
            self._fix(statement, key, value),
            self._story(statement, value, region_node),
        )

    def _named(self, statement: cst.CSTNode, key: str, value: cst.BaseExpression) -> str:
        kept = self.analysis.code(value)
        scope = self.analysis.context(statement).scope
        holds = isinstance(value, (cst.Dict, cst.List, cst.Tuple, cst.Set))
        what = "which holds a" if holds or self.analysis.values.holds_backpropagated(value, scope) else "a"
        return (
            f"`{key}` keeps `{kept}`, {what} tensor with autograd history, across iterations: "
            "every step's graph stays alive"
        )

    def _story(
        self,
        statement: cst.BaseSmallStatement,
        value: cst.BaseExpression,
        region: cst.For | cst.While | cst.FunctionDef,
    ) -> list[tuple[cst.CSTNode, str]]:
        """Where the value got its graph, the loop that keeps adding one, and the backward that leaves it alive."""
        analysis = self.analysis
        named = analysis.code(value)
        story = [(source, f"`{named}` gets its autograd graph here") for source in analysis.sources(value, statement)]
        each = "iteration of this loop" if not isinstance(region, cst.FunctionDef) else "call of this method"
        story.append((region, f"each {each} adds another graph"))
        backward = next((e for e in analysis.events.region_events(region) if e.kind is Kind.BACKWARD), None)
        if backward is not None:
            story.append((backward.site, "backward frees the step's buffers, but the graph stays referenced"))
        return story

    def _fix(self, statement: cst.BaseSmallStatement, key: str, value: cst.BaseExpression) -> Fix | None:
        # Ex) preds = torch.cat([preds, logits]): the value checked is synthesized, not in the tree.
        if isinstance(statement, cst.Assign) and not isinstance(statement.value, cst.BinaryOperation):
            return None
        tensors = self.analysis.tensors
        if not tensors.is_tensor(value, statement):
            return None  # `.detach()` on an int or a float raises: no fix without proof
        # `.item()` turns the sum into a float: only for a one-element tensor added to a local
        # number that nothing but logging ever reads.
        scalar = tensors.is_scalar_tensor(value, statement)
        method = "item" if scalar and self._only_logged(statement, key) else "detach"
        return replace_node(self.analysis, value, method_call(value, method), f"use `.{method}()` to drop the graph")

    def _only_logged(self, statement: cst.BaseSmallStatement, key: str) -> bool:
        """Whether local `key` starts as a number and is otherwise only read by printing and logging calls."""
        if "." in key:
            return False  # an attribute: other methods may read it as a tensor
        scope = self.analysis.context(statement).scope
        starts = 0
        for other in self.analysis.collected.statements_in_scope(scope):
            if not _reads(other, key):
                continue
            if isinstance(other, cst.Assign) and [dotted_name(t.target) for t in other.targets] == [key]:
                if not isinstance(other.value, (cst.Integer, cst.Float)):
                    return False
                starts += 1
            elif not (_accumulates(other, key) or _logs(other, key)):
                return False
        return starts > 0


def _accumulates(statement: cst.BaseSmallStatement, key: str) -> bool:
    """`key += value` or `key -= value`, where `value` does not read `key`."""
    return (
        isinstance(statement, cst.AugAssign)
        and dotted_name(statement.target) == key
        and not _reads(statement.value, key)
    )


def _logs(statement: cst.BaseSmallStatement, key: str) -> bool:
    """A call statement of a printing or logging function, `key` read only in its arguments."""
    if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
        return False
    call = statement.value
    if last_name(call.func) not in LOGGING_CALLS or _reads(call.func, key):
        return False
    return not any(name.startswith(f"{key}.") for arg in call.args for name in names_in(arg))  # total.cpu()


def _reads(node: cst.CSTNode, key: str) -> bool:
    return any(name == key or name.startswith(f"{key}.") for name in names_in(node))


def _backpropagates(events: tuple[Event, ...]) -> bool:
    return any(event.kind is Kind.BACKWARD for event in events)


def _container_key(node: cst.BaseExpression) -> str | None:
    return dotted_name(container_of(node))
