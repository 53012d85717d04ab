"""GL022: parameters meant to be frozen that still change, or a freeze that catches the wrong model."""

from __future__ import annotations

import libcst as cst

from gradlint.fixes import replace_node
from gradlint.rule import Fix, Rule


class FrozenButTrained(Rule):
    """Checks for freezes that leave the parameters training, or that freeze the model being trained.

    Why is this bad?
    A parameter stops changing only when the optimizer skips it, and the optimizer skips a
    parameter whose `.grad` is None. Four shapes break that quietly:

    - `module.requires_grad = False` sets a plain Python attribute on the `nn.Module`;
      its parameters keep `requires_grad=True` and keep training. `module.requires_grad_(False)`,
      or `p.requires_grad = False` for each of `module.parameters()`, freezes them.
    - a freeze block (`def freeze_backbone(...)`, `if freeze_encoder:`) that sets
      `requires_grad` to True and never to False: the parameters it names keep training.
    - parameters frozen after the optimizer was built over them, while gradients are
      zeroed rather than set to None (`optimizer.zero_grad(set_to_none=False)`,
      `p.grad.zero_()`): the optimizer still steps a parameter whose gradient is a zero
      tensor, so weight decay and momentum (Adam's moments too) keep moving it.
    - an EMA, teacher or target model bound by plain assignment to the trained model
      (`teacher = student`, `self.ema = self.model`) and then frozen or put in eval mode:
      there is one object, so the trained model is frozen (or evaluated) too.
      `copy.deepcopy` makes the copy.

    A receiver is a module when a constructor or annotation says so (also of a class
    another module of the project defines), when it is an item of `.children()`,
    `.modules()` or an `nn.ModuleList`, when plain assignments bind it to one (an attribute of an
    attribute too, through the class of the module that built each object: `model.encoder.embedding`
    after `model = Recommender()`, whose `__init__` sets `self.encoder = Encoder(...)`), when the
    file uses it as only a module is used (`x.parameters()`, `x.conv.weight`), or when a
    builder's result or a name nothing in the file binds is named like a model (`model`,
    `module`, `backbone`, `text_encoder`, a known model's `layer1` or `fc`; not `encoder_out`). A
    tensor's or parameter's `requires_grad = False` (`model.cls_token`) is correct and not
    reported, nor is an object of a class that is not a module.
    Freezing before the optimizer is built, and the default `zero_grad()` (which sets
    gradients to None since PyTorch 2.0), are fine; so is plain SGD without momentum or
    weight decay, where a zero gradient moves nothing. Blocks named `unfreeze` that set
    True, and freeze blocks that also set something to False (freeze everything, then
    thaw the head), are not reported, also when the thaw sits in an inner block whose own
    test names freezing (`if freeze: ... p.requires_grad = False; if freeze_expression:
    p.requires_grad = True`): every freeze block around a setting must set only True.

    Known problems
    The late freeze is seen when the optimizer is built earlier in the same function, or
    in `__init__` of the class whose method freezes, and the zeroing clear is in the same
    file; a freeze in a function of the same file is followed to its calls (one level),
    but a freeze or a clear in another module is not. With PyTorch before 2.0 the default
    `zero_grad()` zeroed too; that is not reported. The EMA alias is seen only when the
    alias and the freeze are in the same function. An attribute bound only in another
    module is judged by its name and its use. A freeze block is known by its name only,
    never by a comment.

    Fix safety
    `module.requires_grad = flag` becomes `module.requires_grad_(flag)`. Unsafe: it does
    what the line says it wants, so the parameters stop training and results change from
    any run so far; code that reads `module.requires_grad` back would then raise
    `AttributeError`. The other shapes get no fix: which parameters should train is a
    decision only the author can make.

    References
    https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.requires_grad_
    https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    """

    code = "GL022"
    name = "frozen-but-trained"
    message = "a freeze that does not hold: the parameters meant to be frozen keep training"
    requires = ((b"requires_grad", b".eval("),)
    example = """
        model = torchvision.models.resnet18(weights="DEFAULT")
        model.layer1.requires_grad = False
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    """
    use_instead = """
        model = torchvision.models.resnet18(weights="DEFAULT")
        model.layer1.requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    """

    def check_module(self) -> None:
        freezing = self.analysis.freezing
        for assignment, receiver in freezing.attribute_sets():
            self.report(assignment, self._attribute_message(receiver), self._call_requires_grad(assignment, receiver))
        for statement in freezing.unfreezing_in_freeze_blocks():
            self.report(
                statement,
                "this freeze block sets `requires_grad` to True and never to False; the parameters keep training",
            )
        for late in freezing.late_freezes():
            related = [
                (late.optimizer, "the optimizer is built over these parameters here"),
                (late.clear, "gradients are zeroed here, not set to None"),
            ]
            if late.inner is not None:
                related.insert(0, (late.inner, "the called function freezes them here"))
            message = (
                "parameters are frozen after the optimizer was built over them and their gradients are zeroed, "
                "not set to None; weight decay and momentum keep moving them"
            )
            self.report(late.statement, message, related=related)
        for aliased in freezing.aliased_freezes():
            done = (
                "puts the trained model itself in eval mode"
                if aliased.evaluates
                else "freezes the trained model itself"
            )
            message = f"this {done}: the copy was bound by plain assignment, not copy.deepcopy"
            self.report(aliased.statement, message, related=[(aliased.alias, "the same object, not a copy")])

    def _attribute_message(self, receiver: cst.BaseExpression) -> str:
        code = self.analysis.code(receiver)
        return f"`{code}.requires_grad = ...` sets a plain attribute on a module and freezes none of its parameters"

    def _call_requires_grad(self, statement: cst.Assign, receiver: cst.BaseExpression) -> Fix:
        """`module.requires_grad_(flag)`: unsafe, it changes what trains, as the line says it should."""
        call = cst.Call(
            func=cst.Attribute(value=receiver, attr=cst.Name("requires_grad_")), args=[cst.Arg(statement.value)]
        )
        description = f"call `{self.analysis.code(receiver)}.requires_grad_(...)` to freeze its parameters"
        return replace_node(self.analysis, statement, cst.Expr(call), description, safe=False)
