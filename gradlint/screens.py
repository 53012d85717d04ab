"""Screens: what a rule's own findings need in a file's shape, read with CPython's parser first.

A rule's `requires` tokens decide cheaply which files it could fire on, but some rules
need a shape that tokens cannot see: GL009 needs evaluation code, and the words that
make one (`for`, `eval`, `data`) are in nearly every file of a PyTorch project. A
screen answers from the standard `ast` tree, which CPython builds in a fraction of a
LibCST parse, whether that shape is there. It is a necessary condition, never a finding:
it may pass a file the analysis then finds clean, it must never fail one the analysis
would report (`tests/test_prefilter_pool_cache.py` lints every fixture with and without
the prefilter). The engine asks a file's screens only when every rule that could fire
on it has one; a file that some other rule makes it parse anyway is not read twice.

The vocabulary the screens read (how a loop names its loader, which methods detach) is the analysis's too:
`gradlint.analysis.training.evaluation` imports it from here, so the two cannot drift.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from gradlint.frameworks import DRIVING

# What a loop draws batches from, by name: `val_loader`, `test_batches`, `dataset`, `ds`, `eval_split`.
LOADER_NAME = re.compile(r"(?i)\w*(loader|batches|dataset|data|iterator)s?|(\w+_)?(dl|ds|set|split)s?")
# Calls that hand on what they iterate: `for i, (x, y) in enumerate(tqdm(loader))` iterates `loader`.
ITERATION_WRAPPERS = frozenset({"enumerate", "tqdm", "zip", "iter", "track", "islice", "progress_bar", "trange"})
DATA_LOADER = "DataLoader"
# Methods that cut a tensor's graph: a forward whose output only reaches these recorded its graph for nothing.
DETACHING = frozenset({"detach", "item", "tolist", "numpy", "argmax", "argmin"})
MAX_BINDING_DEPTH = 3  # `tq = tqdm(it)`, `it = iter(loader)`: how many local names to follow back
# Calls that put trained weights into a model (`Evaluation._loads_weights`), by their last name.
WEIGHT_LOADERS = frozenset({"load_state_dict", "from_pretrained", "load"})
# Calls that backpropagate, by their last name: their scope records.
BACKPROPAGATING = frozenset({"backward", "manual_backward", "grad"})
# Hooks whose returned loss a framework backpropagates (Lightning's `training_step`).
BACKPROPAGATED_HOOKS = frozenset(
    name for framework in DRIVING if framework.hooks for name in framework.hooks.backpropagated
)

_Function = ast.FunctionDef | ast.AsyncFunctionDef
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def evaluation_code(tree: ast.Module) -> bool:
    """Whether some code could be evaluation code (`Evaluation.regions`): a loop in a scope that switches a
    module's mode (`model.eval()`, `model.train(flag)`), a scope that switches one and detaches what it computes
    (one inference pass whose graph is thrown away), or a loop of a function over what could be a loader (a name
    like one, a `DataLoader(...)`, or a local name assigned one, through `enumerate`/`tqdm`); or an inference
    script (it loads weights, and loops or detaches); or a detached forward in code that records
    (`Evaluation.detached_forwards`): something detaches, and the module backpropagates, defines a hook whose
    result its framework backpropagates, or runs code of its own at the top level."""
    nodes = list(ast.walk(tree))
    detaches = any(_detaches(node) for node in nodes)
    calls = [_last_name(node.func) for node in nodes if isinstance(node, ast.Call)]
    if any(name in WEIGHT_LOADERS for name in calls) and (detaches or any(isinstance(n, _LOOPS) for n in nodes)):
        return True
    if detaches and _may_record(tree, nodes, calls):
        return True
    scopes: list[ast.Module | _Function] = [tree]  # the module first: its imports hold for every function
    loaders = {DATA_LOADER}
    while scopes:
        scope = scopes.pop()
        nodes = list(_own_nodes(scope, scopes))
        loaders.update(_data_loader_names(nodes))
        loops = [node for node in nodes if isinstance(node, _LOOPS)]
        switches = any(_switches_mode(node) for node in nodes)
        if switches and (loops or any(_detaches(node) for node in nodes)):
            return True
        if not loops:
            continue
        if isinstance(scope, ast.Module):
            continue  # only a function is evaluation code by its shape
        assigned = _assignments(nodes)
        if any(_is_loader(loop.iter, assigned, loaders, 0) for loop in loops if not isinstance(loop, ast.While)):
            return True
    return False


SCREENS: dict[str, Callable[[ast.Module], bool]] = {"evaluation_code": evaluation_code}


def _may_record(tree: ast.Module, nodes: list[ast.AST], calls: list[str | None]) -> bool:
    """Whether some code of the module is proven to record: a backward or `autograd.grad` (imported under any
    name), a framework hook whose result is backpropagated, or top-level code that detaches or calls a function
    or method the module defines."""
    if any(name in BACKPROPAGATING for name in calls) or any(
        isinstance(node, ast.ImportFrom) and any(alias.name == "grad" for alias in node.names) for node in nodes
    ):
        return True
    defined = {node.name for node in nodes if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if defined & BACKPROPAGATED_HOOKS:
        return True
    top_level = [node for node in _own_nodes(tree, []) if not isinstance(node, ast.ClassDef)]
    return any(
        _detaches(node) or (isinstance(node, ast.Call) and _last_name(node.func) in defined) for node in top_level
    )


def _own_nodes(scope: ast.Module | _Function, nested: list[ast.Module | _Function]) -> Iterator[ast.AST]:
    """The nodes of a scope's own code; its nested functions go to `nested`, scopes of their own (their
    decorators and defaults are this scope's). Class bodies and lambdas count as the enclosing scope's, which
    only screens more in."""
    stack: list[ast.AST] = list(scope.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested.append(node)
            stack.extend([*node.decorator_list, *node.args.defaults])
            stack.extend(default for default in node.args.kw_defaults if default is not None)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _switches_mode(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("eval", "train")


def _detaches(node: ast.AST) -> bool:
    """A call of a method that cuts a graph (`out.detach()`, `.numpy()`, `.item()`), or a read of `.data`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in DETACHING
    return isinstance(node, ast.Attribute) and node.attr == "data"


def _assignments(nodes: list[ast.AST]) -> dict[str, list[ast.expr]]:
    """The values each plain name is assigned in a scope (`tq = tqdm(loader)`, `it: Iter = iter(dl)`)."""
    assigned: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.value:
            assigned.setdefault(node.target.id, []).append(node.value)
    return assigned


def _is_loader(iterable: ast.expr, assigned: dict[str, list[ast.expr]], loaders: set[str], depth: int) -> bool:
    if isinstance(iterable, ast.Starred):
        iterable = iterable.value
    while isinstance(iterable, ast.Call) and _last_name(iterable.func) in ITERATION_WRAPPERS:
        first = [*iterable.args, *(keyword.value for keyword in iterable.keywords)][:1]
        if not first:
            break
        iterable = first[0].value if isinstance(first[0], ast.Starred) else first[0]
    if isinstance(iterable, ast.Call):
        return _last_name(iterable.func) in loaders
    name = _last_name(iterable)
    if name is not None and LOADER_NAME.fullmatch(name) is not None:
        return True
    if not isinstance(iterable, ast.Name) or depth >= MAX_BINDING_DEPTH:
        return False
    # A name the scope never assigns is a parameter or from outside: unknown, not a loader.
    return any(_is_loader(value, assigned, loaders, depth + 1) for value in assigned.get(iterable.id, ()))


def _data_loader_names(nodes: list[ast.AST]) -> Iterator[str]:
    """The names imports among `nodes` bind `DataLoader` to (`from torch.utils.data import DataLoader as DL`)."""
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            yield from (alias.asname for alias in node.names if alias.name == DATA_LOADER and alias.asname)


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None
