"""What the training frameworks around user code do with it.

PyTorch Lightning's automatic optimization calls a `LightningModule`'s `training_step`
once per batch and then backpropagates what it returns (`loss` or `{"loss": loss}`),
clips through `configure_gradient_clipping` and steps; a module that sets
`self.automatic_optimization = False` calls `self.manual_backward(loss)` and steps
`self.optimizers()` itself. A Hugging Face `Trainer` subclass's `compute_loss` returns
the loss the Trainer backpropagates.
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.collect import Collected
from gradlint.analysis.names import last_name


def overriding_methods(collected: Collected, method: str, base_suffix: str) -> list[cst.FunctionDef]:
    """Methods named `method` of classes with a base named `*base_suffix` (`training_step` of a LightningModule)."""
    found = []
    for function, owner in collected.owners.items():
        if function.name.value == method and any(
            (last_name(base.value) or "").endswith(base_suffix) for base in owner.bases
        ):
            found.append(function)
    return found


def automatic_training_steps(collected: Collected) -> list[cst.FunctionDef]:
    """`training_step` methods whose returned loss Lightning backpropagates after they return."""
    return [
        function
        for function in overriding_methods(collected, "training_step", "LightningModule")
        if not optimizes_manually(collected, collected.owners[function])
    ]


def optimizes_manually(collected: Collected, owner: cst.ClassDef) -> bool:
    """Whether a method of the class sets `self.automatic_optimization = False`: it calls manual_backward itself."""
    return sets_flag(collected, owner, "automatic_optimization", "False")


def sets_flag(collected: Collected, owner: cst.ClassDef, attribute: str, value: str) -> bool:
    """Whether the class sets the framework flag `attribute` to `value` (`True`/`False`), in its body or on `self`
    in a method: how frameworks let a class declare what they do around it."""
    return any(
        isinstance(statement, cst.Assign)
        and isinstance(statement.value, cst.Name)
        and statement.value.value == value
        and any(last_name(target.target) == attribute for target in statement.targets)
        and collected.contexts[statement].class_def is owner
        for statement in collected.statements
    )
