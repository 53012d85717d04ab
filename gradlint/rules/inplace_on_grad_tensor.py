"""GL004: an in-place operation on a tensor autograd still needs."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis import Kind
from gradlint.analysis.facts.branches import only_in_eval_mode
from gradlint.analysis.facts.frameworks import backpropagated_returns
from gradlint.analysis.facts.mutations import InPlace
from gradlint.rule import Rule

INPLACE_ERROR = "'modified by an inplace operation'"
SAVED = "a tensor saved for backward is modified in place, so backward raises 'modified by an inplace operation'"
BACKPROPAGATING = (Kind.BACKWARD, Kind.AUTOGRAD_GRAD)
MAX_CALLER_DEPTH = 3


class InplaceOnGradTensor(Rule):
    """Checks for in-place operations on tensors that autograd needs.

    Why is this bad?
    Two kinds of tensor must not change in place while autograd records:

    - A leaf that requires grad (an `nn.Parameter`, a layer's own `weight` or `bias`,
      also reached through `self.conv` or each layer of an `nn.ModuleList` built in view,
      a tensor made with `requires_grad=True`), or a view of one (`conv.bias.view(3,
      -1)`): `x.add_(1)`, `x += 1`, `x[0] = 5`, `x.zero_()` raise
      `RuntimeError: a leaf Variable that requires grad is being used in an in-place
      operation.` A module's `weight` is not taken for a Parameter where its project class
      (or one it derives from, in any module) binds `self.weight` to an object of its own
      (`self.weight = FactorizedTensor.new(...)`, whose `normal_` may run under `no_grad`).
    - A tensor an operation saved for its backward: `exp`, `sigmoid`, `tanh`, `relu`,
      `softmax` (function or method form), `sqrt`, `std`, `logsumexp` and the distances
      `cdist` and `pdist` save their output, `log`, `pow`, layers and products save their
      input, and so do `max` and `min` as full reductions (along a dimension, `y.max(1)`,
      they keep only the indices). A layer with weights (`nn.Linear`, `nn.Conv2d`, an
      `nn.Sequential` or `weight_norm` that starts with one) keeps its input for its
      weight's gradient even when the input requires no grad. Changing it (`y =
      torch.exp(x); y += 1`), through another name for the same tensor (`p = y; p *=
      2`) or as an unnamed result handed to an in-place layer
      (`self.drop(torch.sigmoid(h))` with `inplace=True`), makes the next `backward()`
      raise `RuntimeError: one of the variables needed for gradient computation has
      been modified by an inplace operation`. An in-place update in a loop changes, on its
      first pass, the tensor made before the loop (`h = self.relu(...)`, then `for block in
      blocks: h += block(h)`).
    - A model's weights, which `optimizer.step()` updates in place: a loss computed
      through the model before its optimizer steps, and backpropagated after (a GAN
      that steps the discriminator between computing the generator's loss and
      backpropagating it), raises the same error (PyTorch 1.5 and later). The step
      may be written in the loop or run by a helper, of this module or another, and
      the losses may come back from a helper of the module as a tuple: each element
      was computed through the models the helper called for it. A loss combined after
      the step from a term computed before it (`loss = adversarial + reg`) counts. An optimizer a class of
      the module builds in its methods (`self.dis_optimizer = Adam(self.discriminator
      .parameters())`) updates that part of every instance (`model.discriminator`).

    A view shares its base's storage: a slice, `.t()` or `.view()` kept in a name (`top =
    g[:, :4]; top.zero_()`) changes its base, and the views `chunk`, `split` or `unbind`
    return may not be changed in place at all while their base requires grad (torch raises
    at once), a base computed on the spot too (`q, k, v = self.qkv(x).chunk(3)`). torch's
    function forms are the same views (`torch.chunk(h, 2)`, `torch.transpose(t, 0, 1)`).
    A name bound by a split on one path and otherwise on another (`if self_attn: q, k, v =
    self.in_proj(x).split(d)` / `else: q = self.q_proj(x)`) is reported, as that path
    raises; other views are followed only through a single binding.

    A layer built with `inplace=True` (`nn.ReLU(inplace=True)`, `nn.LeakyReLU(0.2, True)`,
    `nn.Dropout(p, inplace=True)`, an `nn.Sequential` that starts with one) and an
    in-place function (`F.relu(h, inplace=True)`, `torch.relu_(h)`) change their input:
    after `torch.sigmoid`, `tanh`, `exp`, `softmax` or an in-place ReLU (which save their
    output), backward raises. Inside an `nn.Sequential` a model class builds, each layer
    feeds the next: `nn.ReLU(inplace=True), nn.Dropout(inplace=True)` (or an in-place layer
    after `nn.Sigmoid()`, `nn.Tanh()`, `nn.Softmax()`, or after `nn.LeakyReLU`/`ELU`/`SELU`/
    `CELU`/`RReLU` built in place, which then keep their output) raises in the first backward.

    Use the out-of-place form (`y = y + 1`, `h = h.mul(2)`), or change leaves under
    `torch.no_grad()`. Changes inside `no_grad`, through `.data`, on tensors that
    never required grad (data batches, masks, buffers, metrics, and integer or bool tensors
    whatever they were computed from: `pixels = points.to(torch.int32)`), and on fresh results
    nothing saved (`h = lin(x); h.relu_()`, an in-place ReLU after a convolution or a
    batch norm, as in every ResNet block) are fine and not reported, as is a loss
    computed again after the step, or through `.detach()`ed outputs only. Manual
    updates from a gradient are GL003's.

    A helper method that `forward` (or a function that backpropagates) calls, directly or
    through other helpers of the module, runs under that backward too; its parameter
    requires grad when every call of the module passes a value that does
    (`self._partial(distances * self.weight)`). A layer built as
    `nn.Sigmoid()`, `nn.Tanh()`, `nn.ReLU()` or `nn.Softmax()`, or an `nn.Sequential` whose
    last layer is one, returns a saved output; so does a project module, of this module or
    another (imported by name, relatively or through `from .utils import *`), whose `forward`
    returns one on every path (`self.cbr = conv2DBatchNormRelu(...)`, whose forward returns
    its `nn.Sequential(conv, bn, nn.ReLU(inplace=True))`'s output): `x = self.cbr(x)`, then
    an in-place dropout or `x += pos`, raises. A project class is known by what it derives
    from, whatever the case of its name. A module call saves its input only where the module
    is seen being built as one of torch's layers or a project class: one built from a
    configuration (`instantiate(cfg.backbone)`), a constructor argument or a factory may be
    anything (a module that returns the dict of features it is given), and a project class
    whose `forward` reads only what its input is (`x.shape`, `x.new_empty(...)`, a positional
    encoding sized from it) saves nothing of it. Code a module runs only in eval mode (under
    `if not self.training:`, or in the `else` of `if self.training:`) counts as backpropagated
    only where a backward follows it in the same function (an input-gradient saliency map):
    a forward's eval-only branch is what inference runs, usually under `no_grad`.

    Known problems
    Only operations of the same function, and what the forwards of project modules
    return, are followed: a tensor saved inside a helper function is not seen, nor an
    input a forward changes in place that its callers in other modules hand it. A leaf is
    reported only where autograd surely records (module-level code, a constructor or
    `forward`, a function that backpropagates, or one called from such code in the
    same module, a framework hook whose result the framework backpropagates included):
    an EMA or weight-copy helper whose callers live in another module is assumed to run
    under `no_grad`.

    References
    https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd
    """

    code = "GL004"
    name = "inplace-on-grad-tensor"
    message = "a leaf tensor that requires grad is modified in place outside torch.no_grad(), which raises at runtime"
    # A leaf comes from a Parameter, parameters(), group["params"], requires_grad or a module's
    # weight/bias; a saved tensor matters only before a backward, autograd.grad, or in a forward.
    requires = ((b"arameter", b"params", b"grad", b"weight", b"bias", b"backward", b"forward"),)
    example = """
        x = torch.randn(3, requires_grad=True)
        x.add_(1)
        x.sum().backward()
    """
    use_instead = """
        x = torch.randn(3, requires_grad=True)
        with torch.no_grad():
            x.add_(1)
        x.sum().backward()
    """

    def check_module(self) -> None:
        self._check_optimizer_steps()
        self._check_sequential_layers()
        analysis = self.analysis
        for operation in analysis.mutations.operations:
            if not analysis.callers.with_grad(operation.statement) or analysis.mutations.is_update(operation):
                continue
            view = analysis.graphs.view_base(operation.target, operation.statement)
            split = view.split if view is not None else None
            if view is not None and split is not None and analysis.graphs.requires_grad(view.base, operation.statement):
                named = (
                    f"`{analysis.code(operation.target)}`, one of the views `{analysis.code(split)}` returns, is "
                    f"modified in place while `{analysis.code(view.base)}` requires grad, which raises"
                )
                self.report(operation.node, named, related=[(split, "the views are made here")])
                continue
            for tensor in (operation.target,) if view is None else (operation.target, view.base):
                if self._check_tensor(operation, tensor):
                    break

    def _check_sequential_layers(self) -> None:
        """An in-place layer right after one that saved its output, in an `nn.Sequential` a model class builds:
        the model's forward runs it whenever the model trains."""
        analysis = self.analysis
        for layer, previous in analysis.graphs.sequential_overwrites():
            owner = analysis.context(layer).class_def
            if owner is None or not analysis.roles.is_model_class(owner):
                continue
            named = (
                f"`{analysis.code(layer)}` overwrites in place the output `{analysis.code(previous)}` saved for "
                f"backward, so the first backward through this block raises {INPLACE_ERROR}"
            )
            self.report(layer, named, related=[(previous, "this layer saves its output for backward")])

    def _check_tensor(self, operation: InPlace, tensor: cst.BaseExpression) -> bool:
        """Report `operation` when it changes `tensor` (its target, or the tensor its target is a view of), a leaf
        that requires grad or a tensor saved for backward; whether it did."""
        analysis = self.analysis
        target = analysis.code(tensor)
        view = "" if tensor is operation.target else f"`{analysis.code(operation.target)}`, a view of "
        sources = analysis.sources(tensor, operation.statement)
        if analysis.leaves.is_leaf(tensor, operation.statement):
            named = (
                f"{view}`{target}`, a leaf that requires grad, is modified in place outside torch.no_grad(), "
                "which raises"
            )
            self.report(operation.node, named, related=[(s, f"`{target}` requires grad from here") for s in sources])
            return True
        if analysis.graphs.saved_for_backward(tensor, operation.statement) and self._backpropagated(operation):
            story = [(source, f"`{target}` is computed here and saved for backward") for source in sources]
            story += [(site, "backward needs the saved value here") for site in self._backwards_after(operation)]
            named = f"{view}`{target}`, saved for backward, is modified in place, so backward raises {INPLACE_ERROR}"
            self.report(operation.node, named, related=story)
            return True
        return False

    def _check_optimizer_steps(self) -> None:
        # Ex) a GAN that steps the discriminator between computing the generator's loss and backpropagating it.
        # Only a module that builds an optimizer knows which model it updates: the others skip the steps.
        if not self.analysis.updates.builds_optimizers():
            return
        for stale in self.analysis.updates.stale_weights(self.analysis.training_steps):
            loss, stepped = self.analysis.code(stale.backward.value), self.analysis.code(stale.step.site)  # type: ignore[arg-type]
            named = (
                f"`{stepped}` changes `{stale.model}`'s weights in place after `{loss}` was computed through them, "
                f"so `{self.analysis.code(stale.backward.site)}` raises {INPLACE_ERROR}"
            )
            story = [
                (stale.computed, f"`{loss}` is computed through `{stale.model}` here"),
                (stale.step.site, f"the optimizer updates `{stale.model}` in place here"),
            ]
            self.report(stale.backward.site, named, related=story)

    def _backpropagated(self, operation: InPlace) -> bool:
        """Whether a backward may run through the modified tensor after the operation. Code that runs only in eval
        mode (`if not self.training:`) is taken to be backpropagated only by a backward that follows it in view."""
        scope = self.analysis.context(operation.statement).scope
        if self._backward_after(scope, _moment(operation)):
            return True
        return not only_in_eval_mode(
            self.analysis.collected, operation.statement
        ) and self._backpropagated_after_return(scope, 0)

    def _backpropagated_after_return(self, scope: cst.FunctionDef | cst.Module, depth: int) -> bool:
        """Whether what `scope` computes may be backpropagated after it returns: it is a model's forward, or a
        caller of this module backpropagates after calling it, or is itself such a function (a block's helper
        method that `forward` calls)."""
        if not isinstance(scope, cst.FunctionDef) or depth > MAX_CALLER_DEPTH:
            return False
        if scope.name.value == "forward":
            return True
        for site in self.analysis.callers.call_sites(scope):
            caller = self.analysis.context(site).scope
            if self._backward_after(caller, site) or (
                caller is not scope and self._backpropagated_after_return(caller, depth + 1)
            ):
                return True
        return False

    def _backwards_after(self, operation: InPlace) -> list[cst.CSTNode]:
        """The first backward of the operation's scope that runs after it, if any."""
        order = self.analysis.collected.order
        scope = self.analysis.context(operation.statement).scope
        after = [
            event.site
            for event in self.analysis.events.scope_events(scope)
            if event.kind in BACKPROPAGATING and order[event.site] > order[_moment(operation)]
        ]
        return after[:1]

    def _backward_after(self, scope: cst.FunctionDef | cst.Module, node: cst.CSTNode) -> bool:
        if scope in backpropagated_returns(self.analysis.collected):
            return True  # Ex) Lightning's training_step: the framework backpropagates what it returns
        order = self.analysis.collected.order
        return any(
            event.kind in BACKPROPAGATING and order[event.site] > order[node]
            for event in self.analysis.events.scope_events(scope)
        )


def _moment(operation: InPlace) -> cst.CSTNode:
    """When the operation runs: its call (`y.mul_(2).sum().backward()` changes `y` before that
    backward, in one statement), or its statement for `y += 1` and `y[0] = 1`."""
    return operation.node if isinstance(operation.node, cst.Call) else operation.statement
