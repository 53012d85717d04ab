"""The read-only walk (`analysis/syntax/tree.py`) follows LibCST's traversal exactly, without rebuilding nodes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import libcst as cst
import pytest

from gradlint.analysis.syntax.tree import TRIVIA, child_fields, children, descendants, is_trivia

ROOT = Path(__file__).resolve().parent.parent
# Every construct of the grammar the fixtures and examples use, plus the project's own code.
FILES = sorted(
    [*ROOT.glob("fixtures/**/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("gradlint/**/*.py")],
)
SYNTAX = """
@decorator(arg)
async def f[T](a: int = 1, /, *args: T, b, **kw) -> "T":
    async with a as (b, c), d:
        async for x in y:
            yield x
    global g
    nonlocal_ = lambda q, *r: q if r else -q
    match a:
        case [1, *rest] | {"k": v, **more} if v:
            pass
        case Point(x=0) as p:
            raise E from p
    try:
        del a[1:2:3], b.c
    except* (A, B) as e:
        print(f"{a!r:>{w}} {b=}", *c, **d)
    finally:
        assert a, "m"
    return [i async for i in x if i] + {k: v for k, v in z} + {*s} + (await t)
type Alias = list[int]
x: int = (yield)
a @= b; a, *b = c = d
"""


def _modules() -> list[cst.Module]:
    return [cst.parse_module(SYNTAX), *(cst.parse_module(path.read_text(encoding="utf-8")) for path in FILES)]


def test_children_are_libcsts_children_without_trivia_in_the_same_order() -> None:
    seen: set[type[cst.CSTNode]] = set()
    for module in _modules():
        pending: list[cst.CSTNode] = [module]
        while pending:
            node = pending.pop()
            seen.add(type(node))
            expected = [child for child in node.children if not is_trivia(type(child))]
            assert [id(child) for child in children(node)] == [id(child) for child in expected], type(node).__name__
            pending.extend(node.children)
    assert len(seen) > 100  # the test saw most of the grammar


def test_every_field_that_holds_a_child_is_walked() -> None:
    for module in _modules()[:5]:
        for node in descendants(module):
            fields = set(child_fields(type(node)))
            for name in (field.name for field in dataclasses.fields(node)):
                value = getattr(node, name)
                holds = isinstance(value, cst.CSTNode) or (
                    isinstance(value, (tuple, list)) and any(isinstance(item, cst.CSTNode) for item in value)
                )
                assert not holds or name in fields, f"{type(node).__name__}.{name}"


def test_descendants_are_pre_order_and_leave_out_trivia() -> None:
    module = cst.parse_module("x = f(a + b)  # note\n")
    found = descendants(module)
    assert found[0] is module
    assert not any(isinstance(node, TRIVIA) for node in found)
    names = [node.value for node in found if isinstance(node, cst.Name)]
    assert names == ["x", "f", "a", "b"]  # source order


@pytest.mark.parametrize("kind", [cst.FunctionDef, cst.IfExp, cst.Call, cst.DictComp, cst.Module])
def test_field_order_is_source_order_where_declaration_order_is_not(kind: type[cst.CSTNode]) -> None:
    fields = child_fields(kind)
    expected = {
        cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
        cst.IfExp: ("body", "test", "orelse"),
        cst.Call: ("func", "args"),
        cst.DictComp: ("key", "value", "for_in"),
        cst.Module: ("header", "body", "footer"),
    }[kind]
    assert [name for name in fields if name in expected] == list(expected)


def test_no_analysis_or_rule_walks_through_libcsts_visitor_protocol() -> None:
    # `.children`, `.visit()` and the matchers' findall rebuild every node they pass: the
    # analyses and rules walk with `tree` instead (fixes, which replace nodes, may use them).
    walking = re.compile(r"\.children\b(?!\(\))|\.visit\(|CSTVisitor|CSTTransformer|findall\(|\bm\.matches\(")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted([*ROOT.glob("gradlint/analysis/**/*.py"), *ROOT.glob("gradlint/rules/*.py")])
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if walking.search(line) and not line.lstrip().startswith(("#", '"', "`"))
    ]
    assert offenders == []


def test_positions_are_libcsts_and_lines_its_code() -> None:
    # ModuleAnalysis runs PositionProvider's codegen itself, without MetadataWrapper's extra walk.
    from libcst.metadata import MetadataWrapper, PositionProvider

    from gradlint.analysis import analyze
    from gradlint.decoding import LINE_BREAK

    for path in [*ROOT.glob("examples/*.py"), *sorted(ROOT.glob("fixtures/**/*.py"))[:40]]:
        module = cst.parse_module(path.read_text(encoding="utf-8"))
        analysis = analyze(module)
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert dict(analysis.positions) == dict(expected), path
        assert analysis.lines == LINE_BREAK.split(module.code), path
