"""GL016: a model left in eval mode by evaluation code while training goes on."""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.training.modes import switch_mode
from gradlint.rule import Rule


class EvalModeNotRestored(Rule):
    """Checks for `model.eval()` in a training loop that is never undone before the next training forward.

    Why is this bad?
    `model.eval()` (or `model.train(False)`) sets `training = False` on the module and
    all its submodules, and it stays so until `model.train()`. Dropout stops dropping
    and batch norm normalizes with its running statistics and stops updating them, so
    every training step after an evaluation that does not switch back trains a
    different network: regularization is gone, batch-norm statistics freeze, and
    results quietly change. Nothing raises. It usually happens in an evaluation helper
    called every N steps or at the end of each epoch, while `model.train()` is called
    only once before the loops (or at the top of the epoch, which a mid-epoch
    evaluation does not reach).

    The finding is at the `eval()` call, or at the call of the helper (of this module
    or another module of the project) that evaluates; the training forward the eval
    mode reaches is shown with it. Not reported: `model.train()` before the training
    forward on every path (at the top of each epoch or step, at the end of the helper,
    in a `finally`, `model.train(was_training)`); evaluation after the last training
    loop; `eval()` on another module than the one trained (a teacher, an EMA or target
    network kept in eval mode); a submodule put in eval mode right after the parent's
    `train()` (frozen batch norm while fine-tuning); `model.train() if training else
    model.eval()` and other switches chosen by a branch, also a helper's switch that the
    call's literal argument rules out (`self.predict(x, training=True)` of a helper that
    runs `if not training: self.model.eval()`); a helper that switches a deep copy
    (`model = copy.deepcopy(model)`, then `model.eval()`); Lightning, which switches modes
    itself, and inference-only code.

    A model loaded with Hugging Face's `from_pretrained` (transformers, diffusers) comes
    back in eval mode: when a manual training loop of the same function steps an optimizer
    built on its parameters and runs its forward with autograd on, and nothing switches
    it to train (no `train()` of it or of a holder, the model not handed to another call
    such as a helper or a wrapper, nor put in a collection), the finding is at the load.
    Trainer and Lightning loops, which call `train()` themselves, and frozen models that
    no optimizer updates are not reported.

    A method a base class calls on `self` without defining it (`def test(self): return
    self._test()`) runs the one class of the module that derives from it and implements
    it; a method of the model whose result is backpropagated (`loss =
    self.model.compute_loss(x, y)`, then `loss.backward()`) is its training forward. A
    training step counts from its first forward: an evaluation run between that forward and
    the step's backward is judged by the next step's forward (a `train()` at the top of the
    loop restores it). An object built from the trained model keeps it where its constructor
    stores what it is given (`self.model = model`): `evaluator.scores()` switching
    `self.model` to eval, after `evaluator = Evaluator(net, loader)`, leaves `net` in eval mode,
    the constructor's class in this module or in another.

    Each forward that feeds the backward trains the models it runs: a data helper of another
    module run before `model.train()` (`inputs = mask_tokens(inputs, tokenizer)`) trains none,
    and the switch back after it comes in time.

    A loop whose optimizers are built on tensors only (`Adam([delta])` over an input
    perturbation made with `nn.Parameter(...)`) trains no model: a model left in eval mode
    for it (test-time adaptation, an adversarial search through a frozen model) is not
    reported.

    Known problems
    When several classes of the module implement what a base class calls on `self`, the
    call is not followed. The path is read in source order: a
    `train()` in a branch that does not always run counts as a restore, and an
    evaluation that returns early before its `train()` is not seen. Modules switched
    through `model.apply(fn)` or in a loop over `model.modules()` are not followed, nor
    code outside the project. A model without dropout or batch norm is reported too,
    although there the mode changes nothing (yet): the layers are not looked at.

    References
    https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval
    """

    code = "GL016"
    name = "eval-mode-not-restored"
    message = (
        "the model is left in eval mode and training goes on: dropout and batch norm "
        "stay in inference behaviour for the following training steps"
    )
    quiet_in_tests = True  # tests train tiny models to check mechanics, often without dropout or batch norm
    requires = ((b"eval", b"train"),)
    example = """
        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                return sum(criterion(model(x), y).item() for x, y in loader)


        model.train()
        for epoch in range(10):
            for x, y in train_loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            evaluate(model, val_loader)
    """
    use_instead = """
        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                return sum(criterion(model(x), y).item() for x, y in loader)


        for epoch in range(10):
            model.train()
            for x, y in train_loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            evaluate(model, val_loader)
    """

    def check_module(self) -> None:
        for leak in self.analysis.modes.leaks():
            site, forward = leak.switch.site, leak.training.forward or leak.training.site
            how = "sets" if isinstance(site, cst.Call) and switch_mode(site) is not None else "leaves"
            message = (
                f"`{self.analysis.code(site)}` {how} `{leak.model}` in eval mode and nothing switches it back "
                "before the next training forward: dropout and batch norm stay in inference behaviour"
            )
            self.report(site, message, related=[(forward, "this training forward then runs in eval mode")])
        for loaded in self.analysis.modes.loaded_in_eval():
            message = (
                f"`{loaded.model}` comes from `from_pretrained` in eval mode and is trained without `.train()`: "
                "dropout and batch norm stay in inference behaviour"
            )
            self.report(loaded.load, message, related=[(loaded.forward, "this training forward runs in eval mode")])
