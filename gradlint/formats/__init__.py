"""Output formats: each sibling module exposes `render(diagnostics) -> str`."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence

from gradlint.rule import Diagnostic

Renderer = Callable[[Sequence[Diagnostic]], str]


def formats() -> dict[str, Renderer]:
    """Every output format by its command-line name (`json_lines.py` is `json-lines`)."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        found[module.name.replace("_", "-")] = importlib.import_module(f"{__name__}.{module.name}").render
    return dict(sorted(found.items()))
