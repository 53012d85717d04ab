"""What the training frameworks around user code do with it, read from their contracts (`gradlint.frameworks`).

A framework drives a class when one of its bases is the framework's own (`Collected.
framework_of`): PyTorch Lightning calls a `LightningModule`'s `training_step` once per
batch and backpropagates what it returns (`loss` or `{"loss": loss}`), unless the class
sets `self.automatic_optimization = False` and calls `self.manual_backward(loss)` itself;
a Hugging Face `Trainer` subclass's `compute_loss` returns the loss the Trainer
backpropagates. Which methods are hooks, and what runs around them, is data
(`Framework.hooks`); a method is a hook only of a class the framework is proven to drive.
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.syntax.collect import UNFOLLOWED, Collected
from gradlint.analysis.syntax.names import last_name
from gradlint.frameworks import DRIVING, Framework

# Every name a framework runs after the backward pass (Lightning's `on_after_backward`, ...).
AFTER_BACKWARD = frozenset(name for f in DRIVING if f.hooks is not None for name in f.hooks.after_backward)


def hook_methods(collected: Collected, kind: str) -> list[cst.FunctionDef]:
    """The methods that are hooks of `kind` (a field of `Hooks`: "backpropagated", "after_backward", ...) of the
    framework that drives their class."""
    found = []
    for function, owner in collected.owners.items():
        framework = collected.framework_of(owner)
        if (
            isinstance(framework, Framework)
            and framework.hooks
            and function.name.value in getattr(framework.hooks, kind)
        ):
            found.append(function)
    return found


def backpropagated_returns(collected: Collected) -> list[cst.FunctionDef]:
    """The hooks whose returned loss their framework backpropagates after they return (Lightning's `training_step`
    under automatic optimization, a Trainer's `compute_loss`)."""
    return [
        function
        for function in hook_methods(collected, "backpropagated")
        if not optimizes_manually(collected, collected.owners[function])
    ]


def optimizes_manually(collected: Collected, owner: cst.ClassDef) -> bool:
    """Whether the class takes backward and step over from its framework (Lightning's `self.automatic_optimization =
    False`): it calls `manual_backward` itself."""
    framework = collected.framework_of(owner)
    manual = framework.hooks.manual if isinstance(framework, Framework) and framework.hooks else None
    return manual is not None and sets_flag(collected, owner, *manual)


def runs_after_backward(collected: Collected, function: cst.FunctionDef) -> bool:
    """Whether a framework runs the method after a backward pass: a hook of the framework that drives its class, or,
    where its class has a base gradlint cannot follow, a method named like such a hook (it may be one)."""
    owner = collected.owners.get(function)
    if owner is None or function.name.value not in AFTER_BACKWARD:
        return False
    framework = collected.framework_of(owner)
    if isinstance(framework, Framework):
        return framework.hooks is not None and function.name.value in framework.hooks.after_backward
    return framework == UNFOLLOWED


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
