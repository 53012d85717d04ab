"""GL009: an evaluation or inference loop that runs the model with autograd recording."""

from __future__ import annotations

import libcst as cst

from gradlint.fixes import reference, wrap_in_with
from gradlint.rule import Fix, Rule


class EvalWithoutNoGrad(Rule):
    """Checks for evaluation and inference loops that run the model outside `torch.no_grad()`.

    Why is this bad?
    `model.eval()` only switches layers such as dropout and batch norm to inference
    behaviour; it does not stop autograd. Outside `torch.no_grad()` or
    `torch.inference_mode()`, every forward pass of an evaluation loop still records a
    graph and keeps the activations it needs for a backward that never comes: evaluation
    takes more time and memory than it should (often `CUDA out of memory` on a batch
    size that trains fine), and predictions collected in a list keep their graphs
    alive. Nothing raises. Wrap the loop in `with torch.no_grad():` (or
    `torch.inference_mode()`), or decorate the evaluation function with
    `@torch.no_grad()`.

    Evaluation code is a loop after `model.eval()` (up to the next
    `model.train()`), or a function that runs the model over a loader and never
    backpropagates, steps or touches an optimizer. One forward after `model.eval()` outside
    any loop is reported where the code itself throws its graph away: every use of its
    output is detached (`self.model(x).detach().cpu().numpy()`, `model(x).argmax(1).tolist()`,
    `out[0].item()`), so the graph serves nothing; an output returned or kept as it is may be
    backpropagated by a caller and is left alone. A function that trains or validates
    by a flag of its own (`if is_train: model.train()` / `else: model.eval()`, or
    `model.train(mode=is_train)`, the backward under `if is_train:`) is evaluation code
    for the flag's validation value, unless every call of the module passes the training
    one; it runs in the grad mode of the calls that may pass the validation value
    (`procedure(loader, net, "valid")` called only inside `with torch.no_grad():` records
    nothing, whatever the training call does). A model is what the code shows it to be: what
    an optimizer trains is a model, whatever its class is called (`ModelWithLoss`), and a method a base class in another
    module defines is that method, not a forward, whatever its name. A class is a module by
    what its bases derive from, in this module or another of the project, not by their names:
    `self(loader)` in a class derived from a plain `BaseModule` runs its own `__call__`. A forward takes inputs:
    a call with no arguments of something a model only by its name
    (`self.quantizer.true_model_size()`) is not one. The first model call of
    each loop is reported; so is a call of a helper of the same module whose body runs
    the model with autograd recording (`total += self._eval_step(batch)`), at the call,
    unless the helper wants gradients itself; a backward the call switches off by a literal
    argument does not count (`self.forward_and_loss(x, y, backward=False)` of a helper that
    backpropagates under `if backward:`). A function runs in the grad mode of the calls of
    its module, calls on an instance of its class included (an ensemble's `forward` that
    only a trainer's `with torch.no_grad():` loop runs as `self.ensemble.forward(batch)` is
    not reported). A method that nothing in its module calls runs in
    the grad mode its class and the project classes it derives from (in other modules too)
    call it in: a `predict` that only a base class's `@torch.no_grad()` `__call__` runs,
    directly or through `super().__call__(...)`, or a `forward` a pipeline base runs inside
    `with torch.no_grad():`, is not reported. A forward retried in an `except` handler
    after the same forward failed under `no_grad` records on purpose (a model that needs
    autograd inside its forward) and is not reported. A module proven to hold no trainable
    parameters (one of torch's layers without weights, `nn.Softmax(dim=1)` or `nn.Sigmoid()`
    as the code builds it, or a project class that stores none) run on outputs computed under
    `no_grad` records nothing, in the loop or in a helper the loop calls.
    Loops inside `no_grad`/`inference_mode` blocks or decorated functions,
    Lightning's `validation_step`/`test_step`/`predict_step` (of a LightningModule) and
    the evaluation loops' hooks (`on_validation_epoch_end`, ..., of the module or of a
    `Callback`), the `forward` of a class proven an nn.Module (it runs in the grad mode of
    whoever calls the module), training code, and code that wants gradients with respect to the inputs
    (saliency maps, adversarial examples, force fields: `x.requires_grad_()`,
    `x.requires_grad = flag` with anything but a literal `False`, `torch.autograd.grad`)
    are fine and not reported.

    An inference script is evaluation code too: a module that loads trained weights into a
    model (`model.load_state_dict(...)`, `model = torch.load(path)`, `X.from_pretrained(...)`)
    and never trains (no backward, step or clear, of its own or in a project function it calls;
    no optimizer or GradScaler; no request for gradients; no call of unknown effect named like
    training) runs every forward of its top-level code, and of the functions that code calls,
    for nothing: the first forward of each loop there is reported, as is a helper's forward at
    the call in the loop (`for line in lines: synthesize(model, line)`).

    Anywhere autograd is proven to record (module-level code, a function that backpropagates,
    or one such code calls), a forward whose every use is detached (`x_test = self.G(z)` used
    only as `x_test.data`, `images = g(z).data.cpu()`) is reported too, inside a training loop
    as well: its graph serves nothing (a preview sample, a logged image, an accuracy check after
    an attack). A use detaches where a helper of the module takes the output and only detaches
    it (`self.save_grid(self.G(z))`, whose first statement maps each sample through
    `.detach()`: `[s.detach() for s in samples]`, `map(lambda s: s.detach(), samples)`). A
    detached output that may reach a loss the scope backpropagates (a target network's output
    in a TD target, a generator's detached sample the critic scores, a value kept in a list the
    loss is built from) is part of the step and is not reported, nor is one a `return` hands to
    the caller or a statement stores outside the scope (`self.target = ...`).

    A method of a model proven one (not only named one), handed what the loop iterates
    (`model.encode(batch)`), is a forward too, unless the code throws its result away (a
    command that changes the model: `model.set_embeddings(name, weights)`); a model is known by what the code does
    with it (`trainedModel.to(device)`, `trainedModel.eval()`, `trainedModel(x)`) whatever
    its name. `torch.set_grad_enabled(False)` written as a
    statement turns grad off for the rest of its block.

    A function that nothing in its module calls runs in the grad mode of its callers in the
    other files of the run: an `evaluate(model, loader)` that every caller runs inside `with
    torch.no_grad():` (or in a function decorated so, or whose own callers all do) is not
    reported.

    Known problems
    A `no_grad` context entered by a caller outside the files of the run (a file linted
    alone, in an editor, or by flake8) is not seen, nor one entered around a call through an
    object that cannot be resolved (`registry[name](...).tune()`). A flag is
    followed only when it is a parameter of the function tested directly
    (`if is_train`, `if not is_train`, `if mode == "val"`), not through a local copy or
    into a helper that receives it.

    Fix safety
    Unsafe: code of other modules that the evaluation calls might need gradients. The
    wrapped region is the smallest that holds the forward and only evaluation code: the
    innermost loop around it when that loop lies wholly after `model.eval()` (and before
    `model.train()`), else the statements after `model.eval()` in its block. A region that
    holds a backward, an optimizer call, a request for gradients or an unknown call named
    like training (`agent.update(...)`) gets no fix.

    References
    https://pytorch.org/docs/stable/generated/torch.no_grad.html
    """

    code = "GL009"
    name = "eval-without-no-grad"
    message = (
        "the model runs outside torch.no_grad() in evaluation code, "
        "recording a graph that is never used and wasting memory and time"
    )
    quiet_in_tests = True
    requires = ((b"for", b"while", b".eval(", b".data", b".detach(", b".item(", b".numpy(", b".tolist(", b".arg"),)
    screen = "evaluation_code"
    example = """
        model.eval()
        for x, y in val_loader:
            preds = model(x).argmax(dim=1)
            correct += (preds == y).sum().item()
    """
    use_instead = """
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                preds = model(x).argmax(dim=1)
                correct += (preds == y).sum().item()
    """

    def check_module(self) -> None:
        for call in self.analysis.evaluation.graph_building_forwards():
            loops = self.analysis.context(call).loops
            inner = self.analysis.evaluation.helper_forward(call)
            related: list[tuple[cst.CSTNode, str]] = [(loops[-1], "every iteration records a graph")] if loops else []
            if inner is None:
                runs = f"`{self.analysis.code(call.func)}` runs"
            else:
                runs = f"`{self.analysis.code(call.func)}(...)` runs `{self.analysis.code(inner.func)}`"
                related.append((inner, "the forward pass it runs, with autograd recording"))
            message = f"{runs} outside torch.no_grad() in evaluation code, recording a graph that is never used"
            self.report(call, message, self._wrap_loop(call), related)
        for call in self.analysis.evaluation.detached_forwards():
            message = (
                f"`{self.analysis.code(call.func)}` runs with autograd recording, but every use of its output is "
                "detached: the graph it records is never used"
            )
            self.report(call, message, self._wrap_statement(call))

    def _wrap_statement(self, call: cst.Call) -> Fix | None:
        """Run the one statement holding the forward under `torch.no_grad()`: unsafe, as the forward's own code
        (in another module) may ask for gradients."""
        no_grad = reference(self.analysis.imports, "torch.no_grad")
        statement = self.analysis.collected.statement_of.get(call)
        if no_grad is None or statement is None:
            return None
        return wrap_in_with(
            self.analysis, statement, cst.Call(no_grad), "run the forward under `torch.no_grad()`", safe=False
        )

    def _wrap_loop(self, call: cst.Call) -> Fix | None:
        """Run the evaluation code under `torch.no_grad()`: unsafe, as code of other modules may need gradients."""
        no_grad = reference(self.analysis.imports, "torch.no_grad")
        target = self.analysis.evaluation.no_grad_target(call)
        if no_grad is None or not target:
            return None
        first, last = target[0], target[-1]
        what = "loop" if len(target) == 1 and isinstance(first, (cst.For, cst.While)) else "evaluation code"
        description = f"run the {what} under `torch.no_grad()`"
        return wrap_in_with(self.analysis, first, cst.Call(no_grad), description, safe=False, last=last)
