"""The array frameworks gradlint knows, as data: those built on torch (and which it has a contract for), and others.

This is the one place that says which imports bring torch into a file (its *torch scope*,
see `gradlint.index.Outlines.torch_reaches`): a file that imports none of the torch
packages, and no project module that does, is out of scope. So is a file that imports
another array framework itself and no torch package: code of MXNet, TensorFlow, JAX or
NVIDIA Warp has its own `backward`, `step` and in-place methods, which are not torch's,
even where the project's other modules use torch. docs/frameworks.md is checked against
it by the tests: each framework with a contract has its section there, and every
package here is named there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hooks:
    """What a framework does around the methods of the classes it drives: its contract with them, as data.

    A class is driven by the framework when one of its bases is one of `bases`, imported
    from one of the framework's modules (`pl.LightningModule`, `from transformers import
    Trainer`), or a class of the same module that is. A method of a class whose base
    gradlint cannot follow (a class of another module, or of a package it does not know)
    that is named like a hook of some framework may be that hook: what runs around it is
    unknown.
    """

    bases: tuple[str, ...]  # the framework's classes whose subclasses' methods it calls
    backpropagated: tuple[str, ...] = ()  # methods whose returned loss the framework backpropagates
    without_grad: tuple[str, ...] = ()  # methods it runs under torch.no_grad()
    after_backward: tuple[str, ...] = ()  # methods it runs after the backward pass, before the step
    manual: tuple[str, str] | None = None  # the class flag (attribute, value) that takes backward and step over


@dataclass(frozen=True)
class Framework:
    """An array framework: importing one of its `modules` brings torch into a file, or (`on_torch` False) its own
    autograd, whose methods are not torch's."""

    name: str  # as docs/frameworks.md names it
    modules: tuple[str, ...]  # the top-level import names
    contract: bool = False
    on_torch: bool = True  # gradlint models what it does around user code (a section of docs/frameworks.md)
    hooks: Hooks | None = None


LIGHTNING_HOOKS = Hooks(
    bases=("LightningModule", "Callback"),
    backpropagated=("training_step",),
    without_grad=(
        "validation_step", "test_step", "predict_step",
        # the evaluation loops' own hooks, of a LightningModule or a Callback: Lightning runs each loop under no_grad
        "on_validation_epoch_end", "on_validation_batch_end", "on_test_epoch_end", "on_test_batch_end",
        "on_predict_epoch_end", "on_predict_batch_end",
    ),
    after_backward=(
        "on_after_backward", "on_before_optimizer_step", "configure_gradient_clipping", "optimizer_step",
        "on_before_zero_grad", "on_after_optimizer_step", "on_train_batch_end",
    ),
    manual=("automatic_optimization", "False"),
)  # fmt: skip


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("PyTorch", ("torch",)),
    Framework("PyTorch Lightning", ("lightning", "pytorch_lightning"), contract=True, hooks=LIGHTNING_HOOKS),
    Framework("Lightning Fabric", ("lightning_fabric",), contract=True),
    Framework("Accelerate", ("accelerate",), contract=True),
    Framework(
        "Hugging Face Transformers", ("transformers",), contract=True, hooks=Hooks(("Trainer",), ("compute_loss",))
    ),
    Framework("skorch", ("skorch",), contract=True, hooks=Hooks(("NeuralNet",), without_grad=("validation_step",))),
    Framework("Ignite", ("ignite",), contract=True),
    Framework("torchvision", ("torchvision",)),
    Framework("torchaudio", ("torchaudio",)),
    Framework("torchtext", ("torchtext",)),
    Framework("timm", ("timm",)),
    Framework("DeepSpeed", ("deepspeed",)),
    Framework("fairseq", ("fairseq",)),
    Framework("apex", ("apex",)),
    Framework("bitsandbytes", ("bitsandbytes",)),
    Framework("PEFT", ("peft",)),
    Framework("diffusers", ("diffusers",)),
    Framework("PyTorch Geometric", ("torch_geometric",)),
    Framework("DGL", ("dgl",)),
    Framework("MXNet", ("mxnet",), on_torch=False),
    Framework("TensorFlow", ("tensorflow", "keras", "tf_keras"), on_torch=False),
    Framework("JAX", ("jax", "flax", "optax"), on_torch=False),
    Framework("NVIDIA Warp", ("warp",), on_torch=False),
    Framework("PaddlePaddle", ("paddle",), on_torch=False),
    Framework("MindSpore", ("mindspore",), on_torch=False),
    Framework("OneFlow", ("oneflow",), on_torch=False),
    Framework("Chainer", ("chainer",), on_torch=False),
    Framework("TensorDict", ("tensordict",)),
    Framework("functorch", ("functorch",)),
)

# Top-level modules whose import brings torch into a file.
TORCH_MODULES = frozenset(module for framework in FRAMEWORKS if framework.on_torch for module in framework.modules)
# Top-level modules of other array frameworks: a file that imports one itself, and no torch package, is theirs.
OTHER_FRAMEWORKS = frozenset(
    module for framework in FRAMEWORKS if not framework.on_torch for module in framework.modules
)
# The frameworks with a contract for the classes they drive, and every hook name any of them has.
DRIVING = tuple(framework for framework in FRAMEWORKS if framework.hooks is not None)
HOOK_NAMES = frozenset(
    name
    for framework in DRIVING
    if framework.hooks is not None
    for name in (
        *framework.hooks.backpropagated,
        *framework.hooks.without_grad,
        *framework.hooks.after_backward,
    )
)


# Optimizer classes by name, torch's own and those of libraries built on it (apex, bitsandbytes, timm, DeepSpeed,
# torch-optimizer, schedule-free): constructing one builds an optimizer wherever it is imported from.
KNOWN_OPTIMIZERS = frozenset(
    {
        "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "LBFGS", "NAdam",
        "RAdam", "SparseAdam", "ASGD", "Lion", "LAMB", "Lamb", "Adafactor", "FusedAdam", "FusedLAMB",
        "FusedSGD", "AdamW8bit", "Adam8bit", "PagedAdamW", "PagedAdamW8bit", "Sophia", "Shampoo",
        "Muon", "Ranger", "AdaBelief", "Yogi", "Prodigy", "DAdaptAdam", "ScheduleFreeAdamW",
        "Lookahead", "LARS", "SAM", "ZeroRedundancyOptimizer",
    }
)  # fmt: skip
