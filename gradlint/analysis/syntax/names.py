"""Dotted names of expressions and the module's imports, resolved without executing anything."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import cast

import libcst as cst

from gradlint.analysis.syntax.tree import children

# Operators whose right operand scales the left (`loss / n`): n is a count, not an operand with a graph.
SCALING_OPERATORS = (cst.Divide, cst.FloorDivide, cst.Power, cst.Modulo)


def dotted_name(node: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    # `type(...) is`, not isinstance: LibCST's node classes are abstract-base subclasses, whose
    # isinstance checks are slow, and these two run on nearly every expression the rules look at.
    parts = []
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)
        node = node.value
    if type(node) is not cst.Name:
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def is_true(node: cst.BaseExpression | None) -> bool:
    """The literal `True`."""
    return isinstance(node, cst.Name) and node.value == "True"


def forward_receiver(func: cst.BaseExpression) -> cst.BaseExpression:
    """The module a call of `func` runs: `model` for `model(x)` and for `model.forward(x)`."""
    return func.value if isinstance(func, cst.Attribute) and func.attr.value == "forward" else func


def last_name(node: cst.BaseExpression) -> str | None:
    """The final identifier of a Name/Attribute (`c` in `a.b.c`), else None."""
    kind = type(node)
    if kind is cst.Name:
        return cast(cst.Name, node).value
    if kind is cst.Attribute:
        return cast(cst.Attribute, node).attr.value
    return None


class ImportMap:
    """Local names bound by imports, mapped to the dotted names they stand for."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        # `from .engine import step as run`: run -> (1, "engine.step"); for the whole-program model only.
        self.relative: dict[str, tuple[int, str]] = {}
        # `from pkg.utils import *` / `from . import *`: (level, module), in order.
        self.stars: list[tuple[int, str]] = []

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        """Record the names one import statement binds."""
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted_name(alias.name) or ""
                as_name = alias.asname.name if alias.asname else None
                if isinstance(as_name, cst.Name):
                    self.aliases[as_name.value] = full
                else:
                    self.aliases.setdefault(full.split(".")[0], full.split(".")[0])
            return
        module = dotted_name(node.module) if node.module else ""
        level = len(node.relative)
        if isinstance(node.names, cst.ImportStar):
            self.stars.append((level, module or ""))
            return
        if level:
            for alias in node.names:
                local = alias.asname.name if alias.asname else alias.name
                name = dotted_name(alias.name) or ""
                if isinstance(local, cst.Name):
                    self.relative[local.value] = (level, f"{module}.{name}" if module else name)
            return
        if not module:
            return
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            local = alias.asname.name if alias.asname else alias.name
            if isinstance(local, cst.Name):
                self.aliases[local.value] = f"{module}.{name}"

    def resolve(self, node: cst.BaseExpression) -> str | None:
        """The dotted name `node` refers to, with its first part resolved through imports."""
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base


def prefixes(name: str) -> list[str]:
    """`a`, `a.b` and `a.b.c` for `a.b.c`: reading `a.b.c` reads the value each of them holds."""
    parts = name.split(".")
    return [".".join(parts[: index + 1]) for index in range(len(parts))]


def names_in(node: cst.CSTNode) -> Iterator[str]:
    """Dotted names (`loss`, `self.total`) read anywhere inside `node`."""
    key = dotted_name(node) if isinstance(node, cst.BaseExpression) else None
    if key is not None:
        yield key
        return
    for child in children(node):
        yield from names_in(child)


def operand_names(node: cst.CSTNode, modules: Collection[str]) -> Iterator[str]:
    """Like `names_in`, without the functions called: only `x`, `y` in `F.cross_entropy(model(x), y)`.

    `modules` are the names imports bind (`F`, `torch`), which are never operands.
    """
    if isinstance(node, cst.Call):
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        key = dotted_name(receiver) if receiver is not None else None
        if receiver is not None and key is None:
            yield from operand_names(receiver, modules)  # the receiver of out.view(-1).mean()
        elif key is not None and key.split(".")[0] not in (*modules, "self"):
            yield key  # loss.mean(), but not F.mse_loss(...) or self.criterion(...)
        for arg in node.args:
            yield from operand_names(arg.value, modules)  # not the keyword's name
        return
    if isinstance(node, cst.BaseExpression) and dotted_name(node) is not None:
        yield from names_in(node)
        return
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, SCALING_OPERATORS):
        yield from operand_names(node.left, modules)  # `loss / n`: n is a count, not a graph
        return
    for child in children(node):
        yield from operand_names(child, modules)


def unpacked_index(statement: cst.CSTNode, key: str) -> int | None:
    """Which element of an unpacking assignment (`a, b = pair`) binds `key`, if one does."""
    targets: list[cst.BaseExpression] = []
    if isinstance(statement, cst.Assign):
        targets = [target.target for target in statement.targets]
    for target in targets:
        if isinstance(target, (cst.Tuple, cst.List)):
            for index, element in enumerate(target.elements):
                if dotted_name(element.value) == key:
                    return index
    return None
