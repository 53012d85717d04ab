"""The packages built on torch that gradlint knows, as data, and which of them it has a contract for.

This is the one place that says which imports bring torch into a file (its *torch scope*,
see `gradlint.index.Outlines.torch_reaches`): a file that imports none of these modules,
and no project module that does, is out of scope (code of MXNet, TensorFlow, JAX or
NumPy has its own `backward`, `step` and in-place methods, which are not torch's).
docs/frameworks.md is checked against it by the tests: each framework with a contract
has its section there, and every package here is named there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Framework:
    """A package built on torch: importing one of its `modules` brings torch into a file."""

    name: str  # as docs/frameworks.md names it
    modules: tuple[str, ...]  # the top-level import names
    contract: bool = False  # gradlint models what it does around user code (a section of docs/frameworks.md)


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("PyTorch", ("torch",)),
    Framework("PyTorch Lightning", ("lightning", "pytorch_lightning"), contract=True),
    Framework("Lightning Fabric", ("lightning_fabric",), contract=True),
    Framework("Accelerate", ("accelerate",), contract=True),
    Framework("Hugging Face Transformers", ("transformers",), contract=True),
    Framework("skorch", ("skorch",), contract=True),
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
    Framework("TensorDict", ("tensordict",)),
    Framework("functorch", ("functorch",)),
)

# Top-level modules whose import brings torch into a file.
TORCH_MODULES = frozenset(module for framework in FRAMEWORKS for module in framework.modules)
