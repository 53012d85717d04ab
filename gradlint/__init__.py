"""gradlint: finds PyTorch gradient bugs before they cost a training run."""

from gradlint.config import Config
from gradlint.engine import lint_file, lint_paths, lint_source
from gradlint.rule import Diagnostic, Fix, Rule

__version__ = "0.1.0"
__all__ = ["Config", "Diagnostic", "Fix", "Rule", "__version__", "lint_file", "lint_paths", "lint_source"]
