"""What a method keeps: arguments it stores on its object, where they outlive the call.

A meter's `update(self, val, n)` that runs `self.sum += val * n`, a history's
`add(self, value)` that appends to `self.values`, a statistics collector whose
`__setitem__` appends to a list per key: whatever a caller passes them stays referenced
by the object after the call returns. The fact is read from the method's own code, so
it travels in the method's summary to callers in other modules.
"""

from __future__ import annotations

import libcst as cst

from gradlint.analysis.facts.values import ADDING_METHODS, CONTAINER_METHODS, GradValues
from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import dotted_name
from gradlint.analysis.syntax.refs import all_params

# Methods that add their argument to the container they are called on.
# Calls on a container attribute that hand back one of its entries: `self.data.setdefault(key, [])`.
ENTRY_METHODS = frozenset({"setdefault", "get"})


def kept_parameters(collected: Collected, values: GradValues, function: cst.FunctionDef) -> tuple[tuple[str, str], ...]:
    """(parameter, attribute) for each parameter whose graph `function` adds onto or appends to an attribute of
    `self`: `self.sum += val * n` keeps `val` in `sum` (not `self.sum += val.item()`, nor `float(val)`);
    `self._sum[i] += v` inside `for i, v in enumerate(values)` keeps `values` in `_sum`;
    `self.data.setdefault(key, []).append(value)` keeps `value` in `data`; a parameter the body first rebinds
    to a number where it is a tensor (`if isinstance(val, torch.Tensor): val = val.item()`) keeps nothing."""
    params = all_params(function) - {"self", "cls"}
    if not params:
        return ()
    found: dict[str, str] = {}
    every = dict.fromkeys(params, True)
    for statement in collected.statements_in_scope(function):
        for kept, attribute in kept_values(statement):
            if not values.evaluate_assuming(kept, statement, every, function):
                continue  # no graph even were every parameter to carry one: one walk answers for all of them
            for param in sorted(params - set(found)):
                if values.evaluate_assuming(kept, statement, {param: True}, function):
                    found[param] = attribute
    return tuple(found.items())


def kept_values(statement: cst.BaseSmallStatement) -> list[tuple[cst.BaseExpression, str]]:
    """What a statement adds onto or appends to an attribute of `self`, with the attribute: `val * n` in `sum`
    for `self.sum += val * n`, `self.sum.add_(val * n)` or `self.sum = self.sum + val * n`, `val` in `values`
    for `self.values.append(val)` or `self.values[key].append(val)`."""
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, (cst.AddAssign, cst.SubtractAssign)):
        attribute = _self_attribute(statement.target)
        return [(statement.value, attribute)] if attribute is not None else []
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        # Ex) self.sum = self.sum + val * n, as `+=` does
        attribute = _self_attribute(statement.targets[0].target)
        added = added_to(statement.value, f"self.{attribute}") if attribute is not None else None
        return [(added, attribute)] if added is not None and attribute is not None else []
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        call = statement.value
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in CONTAINER_METHODS:
            attribute = _self_attribute(call.func.value)
            if attribute is not None:
                return [(arg.value, attribute) for arg in call.args]
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ADDING_METHODS and call.args:
            # Ex) self.total.add_(val * n), as `self.total += val * n` does
            attribute = _self_attribute(call.func.value)
            if attribute is not None:
                return [(call.args[0].value, attribute)]
    return []


def _self_attribute(target: cst.BaseExpression) -> str | None:
    """`sum` for `self.sum`, `self.sum[i]` or `self.data.setdefault(key, [])`: the attribute of `self` that
    holds what the statement adds to."""
    while True:
        if isinstance(target, cst.Subscript):
            target = target.value
        elif (
            isinstance(target, cst.Call)
            and isinstance(target.func, cst.Attribute)
            and target.func.attr.value in ENTRY_METHODS
        ):
            target = target.func.value
        else:
            break
    key = dotted_name(target) or ""
    return key[len("self.") :] if key.startswith("self.") and key.count(".") == 1 else None


def added_to(value: cst.BaseExpression, key: str) -> cst.BaseExpression | None:
    """What `key = value` adds onto the old `key`: `loss` in `total = total + loss` and in an exponential
    average `avg = 0.9 * avg + 0.1 * loss`, whose old value (scaled, not detached) keeps every graph."""
    terms = _terms(value)
    if len(terms) > 1 and any(_scaled_name(term) == key for term in terms):
        others = [term for term in terms if _scaled_name(term) != key]
        if others:
            return others[0] if len(others) == 1 else cst.List([cst.Element(other) for other in others])
    if (
        isinstance(value, cst.Call)
        and dotted_name(value.func) in ("torch.cat", "torch.stack", "torch.concat")
        and value.args
    ):
        items = value.args[0].value
        if isinstance(items, (cst.List, cst.Tuple)):
            others = [element.value for element in items.elements if dotted_name(element.value) != key]
            if len(others) < len(items.elements):
                return cst.List([cst.Element(other) for other in others])
    return None


def _terms(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms of a sum or difference (`a + b - c`: a, b, c); one term for anything else."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
        return [*_terms(value.left), *_terms(value.right)]
    return [value]


def _scaled_name(term: cst.BaseExpression) -> str | None:
    """The name a term is, or is a multiple of: `avg`, `0.9 * avg`, `avg * beta`, `avg / 2`."""
    if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Multiply, cst.Divide)):
        right = dotted_name(term.right) if isinstance(term.operator, cst.Multiply) else None
        return dotted_name(term.left) or right
    return dotted_name(term)
