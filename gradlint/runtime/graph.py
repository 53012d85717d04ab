"""Walks over autograd graphs: the nodes a tensor's history reaches."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.graph import Node

# Enough for the graph of a large model's step; a leak is visible long before this.
NODE_LIMIT = 20_000


def nodes(root: Node | None, limit: int = NODE_LIMIT) -> Iterator[Node]:
    """The nodes reachable from `root` (itself included), depth first, at most `limit`."""
    if root is None:
        return
    seen = {id(root)}
    stack = [root]
    while stack and limit > 0:
        node = stack.pop()
        limit -= 1
        yield node
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)


def is_accumulate(node: Node) -> bool:
    """Whether `node` is the AccumulateGrad node of a leaf (shared by every graph of a model)."""
    return type(node).__name__ == "AccumulateGrad"


def grad_tensors(value: object, limit: int = 1000) -> list[torch.Tensor]:
    """The tensors with autograd history in `value` or in its items (lists, tuples, dict values)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.grad_fn is not None else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [item for item in value[:limit] if isinstance(item, torch.Tensor) and item.grad_fn is not None]
    return []
