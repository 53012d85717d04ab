"""gradlint: finds PyTorch gradient bugs before they cost a training run."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Config", "Diagnostic", "Fix", "Rule", "__version__", "lint_file", "lint_paths", "lint_source"]

if TYPE_CHECKING:
    from gradlint.config import Config
    from gradlint.engine import lint_file, lint_paths, lint_source
    from gradlint.rule import Diagnostic, Fix, Rule

# The public API is loaded on first use: `gradlint --version` and `--help` need neither the
# engine nor LibCST, and importing them costs most of a start.
_HOMES = {
    "Config": "gradlint.config",
    "lint_file": "gradlint.engine",
    "lint_paths": "gradlint.engine",
    "lint_source": "gradlint.engine",
    "Diagnostic": "gradlint.rule",
    "Fix": "gradlint.rule",
    "Rule": "gradlint.rule",
}


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'gradlint' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
