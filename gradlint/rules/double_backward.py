"""GL008: a second backward through a graph the first backward already freed."""

from __future__ import annotations

from gradlint.analysis import Kind
from gradlint.rule import Rule


class DoubleBackward(Rule):
    """Checks for backward calls through a graph that an earlier backward already freed.

    Why is this bad?
    To save memory, `backward()` and `torch.autograd.grad()` free the intermediate
    values the graph saved as soon as they have used them. A second backward through
    any part of that graph raises `RuntimeError: Trying to backward through the graph a
    second time (or directly access saved tensors after they have already been
    freed)`. It happens when a loss computed once before a loop is backpropagated on
    every iteration, when two losses share an undetached part of the graph (a GAN
    generator's output used for the discriminator step without `.detach()`), or when an
    RNN's hidden state is carried from batch to batch without `.detach()`, or when
    each of the terms one loss call returned from a forward output is backpropagated in
    turn (`for term in criterion.terms(outputs, y): term.backward()`).

    Recompute the forward pass before each backward, detach what crosses from one
    step into the next (`hidden = hidden.detach()`, `D(fake.detach())`), or sum the
    losses and call backward once. `retain_graph=True` silences the error, but only
    fits when a second backward through the same graph is really wanted; it also keeps
    the memory alive.

    A first backward with `retain_graph=True` (or `create_graph=True`) and backward
    calls that each follow their own forward pass are fine and not reported.

    A `backward` that takes what `torch.Tensor.backward` never takes (`hmm.backward(X,
    priors=priors)`), or whose result is bound to a name (the tensor method returns None), is
    another method (a hidden Markov model's backward algorithm) and frees no graph. A tensor
    handed to a helper of the module that cuts it first thing (`fake = fake.data` in a
    gradient penalty, after reading only `real.device`) brings none of its graph into what the
    helper returns.

    Hidden state kept on `self` by a training-step method (one that backpropagates, or
    Lightning's `training_step`, whose returned loss Lightning backpropagates) is
    followed into the next call, unless another method of the class may reset it; so is
    state a module's `forward` keeps (`out, self.hidden = self.lstm(x, self.hidden)`)
    where a training loop of the same module calls an instance of the class and
    backpropagates each output, unless another method or code outside the class may reset
    it (`model.hidden = None`). A module built and called once (a test's network) is not.

    Known problems
    Values returned by functions of other modules are not followed. A module whose
    training loop is in another module is not followed into its `forward`.

    References
    https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html
    """

    code = "GL008"
    name = "double-backward"
    message = "backward runs through a graph an earlier backward already freed; this raises at runtime"
    requires = ((b"backward", b"training_step", b"forward"),)  # a module's forward is backpropagated by its caller
    example = """
        loss = criterion(model(x), y)
        for step in range(10):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
    use_instead = """
        for step in range(10):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """

    def check_module(self) -> None:
        # A second `autograd.grad` raises too, but only backward calls are reported: the
        # file filter in `requires` looks for "backward" (or Lightning's "training_step").
        freed = self.analysis.freed_graphs
        for reuse in freed.reuses():
            if reuse.kind is not Kind.BACKWARD:
                continue
            if self.analysis.context(reuse.node).scope in freed.forwards and reuse.kept is not None:
                named = (
                    "`forward` keeps state on `self` with its graph and reads it back on the next call: the next "
                    "backward runs into the graph the last one freed; this raises at runtime (detach what is kept)"
                )
                related = [(reuse.node, "the caller backpropagates this output, freeing the graph kept")]
                self.report(reuse.kept, named, related=related)
                continue
            call, freeing = self.analysis.code(reuse.node), self.analysis.code(reuse.freed_by)
            named = f"`{call}` runs through a graph that `{freeing}` already freed; this raises at runtime"
            self.report(reuse.node, named, related=[(reuse.freed_by, "this earlier backward frees the graph")])
