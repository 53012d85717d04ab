"""The analysis is built in layers a reader can see, and each layer imports only downward.

`gradlint/analysis/` holds four layers, lowest first: `syntax`, `facts` (values and
objects of one module), `project` (summaries and the whole program) and `training` (the
training-step model rules query), with `analysis/__init__.py` (ModuleAnalysis) on top.
Every import is read, those inside functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
ANALYSIS = ROOT / "gradlint" / "analysis"
LAYERS = ("syntax", "facts", "project", "training")
# The modules of the package outside the analysis that it may use: they read bytes, outlines and
# configuration, and import nothing of the engine, the rules or the front-ends themselves.
BELOW_THE_ANALYSIS = frozenset(
    {
        "gradlint.decoding",
        "gradlint.pytest_layout",
        "gradlint.index",
        "gradlint.frameworks",
        "gradlint.project",
        "gradlint.screens",
    }
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The gradlint modules `path` imports, anywhere in it (`from pkg import module` counts the module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gradlint"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (ROOT / Path(*candidate.split("."))).with_suffix(".py").is_file()
                found.add(candidate if is_module else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("gradlint"))
    return found


def _layer(module: str) -> int:
    """The rank of an analysis module's layer; the package's __init__ (ModuleAnalysis) is above them all."""
    parts = module.split(".")
    if len(parts) < 3:
        return len(LAYERS)
    return LAYERS.index(parts[2])


MODULES = {_module_name(path): path for path in sorted(ANALYSIS.rglob("*.py"))}


def test_every_analysis_module_sits_in_a_layer() -> None:
    loose = [name for name, path in MODULES.items() if path.parent == ANALYSIS and path.name != "__init__.py"]
    assert loose == []
    assert {path.parent.name for path in MODULES.values() if path.parent != ANALYSIS} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_its_own_layer_and_those_below(module: str) -> None:
    for imported in _imports(MODULES[module]):
        if imported.startswith("gradlint.analysis"):
            assert imported in MODULES, f"{module} imports {imported}, a package, not a module"
            assert _layer(imported) <= _layer(module), f"{module} imports {imported}, from a layer above"
            assert imported != "gradlint.analysis", f"{module} imports the package's __init__"
        else:
            assert imported in BELOW_THE_ANALYSIS, f"{module} imports {imported}, outside the analysis"


def test_no_module_imports_its_packages_init() -> None:
    offenders = [
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        for imported in _imports(path)
        if imported in {"gradlint.analysis", *(f"gradlint.analysis.{layer}" for layer in LAYERS)}
    ]
    assert offenders == []


def test_the_analysis_imports_no_circle() -> None:
    graph = {module: {i for i in _imports(path) if i in MODULES} for module, path in MODULES.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in graph[module]:
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_what_the_analysis_uses_outside_it_imports_no_engine() -> None:
    for module in BELOW_THE_ANALYSIS:
        path = (ROOT / Path(*module.split("."))).with_suffix(".py")
        assert _imports(path) <= BELOW_THE_ANALYSIS, module


@pytest.mark.parametrize("front_end", ["flake8_plugin", "lsp", "cli"])
def test_front_ends_ask_the_engine_not_the_analysis(front_end: str) -> None:
    imported = _imports(ROOT / "gradlint" / f"{front_end}.py")
    assert not any(module.startswith("gradlint.analysis") for module in imported)
