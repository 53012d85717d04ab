"""The single traversal of a module: imports, scopes, loops, grad mode and node indexes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache, cached_property
from typing import cast

import libcst as cst

from gradlint.analysis.syntax.names import ImportMap, dotted_name, last_name
from gradlint.analysis.syntax.tree import TRIVIA_NAMES, child_fields, descendants, field_children, is_node, is_trivia
from gradlint.frameworks import DRIVING, TORCH_MODULES, Framework

Loop = cst.For | cst.While
# Bases that are Python's own, never a framework's.
BUILTIN_BASES = frozenset({"object", "Exception", "BaseException", "dict", "list", "tuple", "str", "int", "float"})
Scope = cst.FunctionDef | cst.Module

# A class whose base gradlint cannot follow (a class of another module, or of a package it has no contract for):
# the framework that may drive it is unknown.
UNFOLLOWED = "unfollowed"
# Hooks some framework runs under torch.no_grad() (Lightning's validation_step, ...).
WITHOUT_GRAD_HOOKS = frozenset(name for f in DRIVING if f.hooks is not None for name in f.hooks.without_grad)
MAX_BASE_DEPTH = 8
# The tensor type an `isinstance` test names, through the imports: a value that fails the test is no tensor.
TENSOR_TYPE = "torch.Tensor"


class GradMode(Enum):
    """Whether autograd records operations at a point of the program."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    UNKNOWN = "unknown"  # not proven either way: set_grad_enabled(flag), a decorator gradlint cannot read


@dataclass(frozen=True)
class Context:
    """Where a node sits: its function, class, loops and ifs (innermost last), grad mode."""

    scope: Scope
    class_def: cst.ClassDef | None = None
    loops: tuple[Loop, ...] = ()
    ifs: tuple[cst.CSTNode, ...] = ()
    grad_mode: GradMode = GradMode.ENABLED
    class_body: bool = False  # directly in a class body, where a def is a method
    profiled: bool = False  # inside `with torch.profiler.profile(...)` or `record_function(...)`
    # The `if` statements before this node in its loop's body that `continue` (`if accumulating: continue`):
    # it runs only in the iterations where each of their tests fails.
    skips: tuple[cst.If, ...] = ()

    @property
    def no_grad(self) -> bool:
        """True inside no_grad/inference_mode/set_grad_enabled(False) or a decorated function."""
        return self.grad_mode is GradMode.DISABLED

    @property
    def function(self) -> cst.FunctionDef | None:
        """The innermost enclosing function, if any."""
        return self.scope if isinstance(self.scope, cst.FunctionDef) else None


PROFILERS = frozenset({"profile", "record_function"})


# What switches grad mode: a decorator of the module's own that names none of these leaves it alone.
GRAD_MODE_NAMES = frozenset({"no_grad", "inference_mode", "enable_grad", "set_grad_enabled", "grad_mode"})
# Decorators of Python itself, of its standard library and of the test runners, which never switch grad mode;
# torch's own are read by `grad_mode_of` (and its others, `torch.jit.script` or `torch.compile`, leave it alone).
PLAIN_DECORATOR_MODULES = frozenset(
    {
        "functools", "abc", "typing", "typing_extensions", "contextlib", "dataclasses", "enum", "atexit",
        "warnings", "unittest", "pytest", "torch",
    }
)  # fmt: skip
BUILTIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
PROPERTY_PARTS = frozenset({"setter", "getter", "deleter"})


def grad_mode_of(call: cst.BaseExpression, disabling: frozenset[str] = frozenset()) -> GradMode | None:
    """The grad mode a `with` item or decorator switches to, or None if it is not one.

    `disabling` names the module's own context managers and decorators that disable grad
    (see `grad_disabling_names`).
    """
    func = call.func if isinstance(call, cst.Call) else call
    name = last_name(func)
    if isinstance(func, cst.Name) and name in disabling:
        return GradMode.DISABLED
    if name in ("no_grad", "inference_mode"):
        if isinstance(call, cst.Call) and call.args and _is_false(call.args[0].value):
            return GradMode.ENABLED if name == "inference_mode" else None
        return GradMode.DISABLED
    if name == "enable_grad":
        return GradMode.ENABLED
    if name == "set_grad_enabled" and isinstance(call, cst.Call) and call.args:
        value = call.args[0].value
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            return GradMode.ENABLED if value.value == "True" else GradMode.DISABLED
        return GradMode.UNKNOWN
    return None


def grad_disabling_names(module: cst.Module) -> frozenset[str]:
    """The module's own grad-disabling context managers, decorators and aliases.

    A `@contextmanager` function that yields inside `with torch.no_grad():` (or
    `inference_mode()`), a decorator whose wrapper calls the decorated function under one
    (or is decorated with one), and a plain alias (`no_grad = torch.inference_mode`).
    """
    names: set[str] = set()
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            if _yields_without_grad(statement) or _wraps_without_grad(statement):
                names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                    and not isinstance(small.value, cst.Call)
                    and grad_mode_of(small.value) is GradMode.DISABLED
                ):
                    names.add(small.targets[0].target.value)
    return frozenset(names)


def _yields_without_grad(function: cst.FunctionDef) -> bool:
    if not any(last_name(decorator.decorator) == "contextmanager" for decorator in function.decorators):
        return False
    return any(
        any(isinstance(node, cst.Yield) for node in descendants(block.body))
        for block in descendants(function.body)
        if isinstance(block, cst.With) and any(grad_mode_of(item.item) is GradMode.DISABLED for item in block.items)
    )


def _wraps_without_grad(function: cst.FunctionDef) -> bool:
    # def no_grad_method(fn): def wrapper(*a, **k): with torch.no_grad(): return fn(*a, **k); return wrapper
    params = function.params.params
    if not params or not isinstance(function.body, cst.IndentedBlock):
        return False
    wrapped = params[0].name.value
    for inner in function.body.body:
        if not isinstance(inner, cst.FunctionDef):
            continue
        if any(grad_mode_of(decorator.decorator) is GradMode.DISABLED for decorator in inner.decorators):
            return True
        for block in descendants(inner.body):
            if (
                isinstance(block, cst.With)
                and any(grad_mode_of(item.item) is GradMode.DISABLED for item in block.items)
                and any(isinstance(n, cst.Call) and last_name(n.func) == wrapped for n in descendants(block.body))
            ):
                return True
    return False


def _is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


@dataclass
class Collected:
    """Everything the traversal recorded, in source order."""

    module: cst.Module
    imports: ImportMap = field(default_factory=ImportMap)
    contexts: dict[cst.CSTNode, Context] = field(default_factory=dict)
    order: dict[cst.CSTNode, int] = field(default_factory=dict)
    calls: list[cst.Call] = field(default_factory=list)
    statements: list[cst.BaseSmallStatement] = field(default_factory=list)
    functions: list[cst.FunctionDef] = field(default_factory=list)
    classes: list[cst.ClassDef] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    by_type: dict[str, list[cst.CSTNode]] = field(default_factory=dict)
    def_scopes: dict[cst.FunctionDef, Scope] = field(default_factory=dict)
    owners: dict[cst.FunctionDef, cst.ClassDef] = field(default_factory=dict)
    statement_of: dict[cst.Call, cst.CSTNode] = field(default_factory=dict)
    grad_statements: set[cst.CSTNode] = field(default_factory=set)  # the statements that name some `.grad`
    disabling: frozenset[str] = frozenset()  # the module's own grad-disabling wrappers
    _bodies: dict[cst.If, frozenset[cst.CSTNode]] = field(default_factory=dict, repr=False)

    def tested_types(self, key: str, at: cst.CSTNode) -> frozenset[str]:
        """The types `key` is proven an instance of at statement `at`: the qualified names of the
        `isinstance(key, T)` tests of the `if`s whose body holds it (`if isinstance(m, nn.Parameter):`)."""
        context = self.contexts.get(at)
        found: set[str] = set()
        for branch in context.ifs if context is not None else ():
            if not isinstance(branch, cst.If):
                continue
            tested = self.isinstance_test(branch.test)
            if tested is not None and tested[0] == key and any(node is at for node in descendants(branch.body)):
                found.update(tested[1])
        return frozenset(found)

    def isinstance_test(self, test: cst.BaseExpression) -> tuple[str, frozenset[str]] | None:
        """The name an `isinstance(key, T)` call tests and the qualified names of its types (a tuple of them
        too), resolved through the imports."""
        if not (isinstance(test, cst.Call) and last_name(test.func) == "isinstance" and len(test.args) == 2):
            return None
        key = dotted_name(test.args[0].value)
        tested = test.args[1].value
        types = [element.value for element in tested.elements] if isinstance(tested, cst.Tuple) else [tested]
        return (key, frozenset(n for n in map(self.imports.resolve, types) if n is not None)) if key else None

    def no_tensor_when(self, test: cst.BaseExpression) -> tuple[str, bool] | None:
        """(name, outcome): the name that is proven no tensor where `test` has that outcome. `isinstance(val,
        torch.Tensor)` (a tuple of types naming it too) and `torch.is_tensor(val)` are False for anything but a
        tensor; `not` turns the outcome round."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.no_tensor_when(test.expression)
            return (inner[0], not inner[1]) if inner is not None else None
        tested = self.isinstance_test(test)
        if tested is not None:
            return (tested[0], False) if TENSOR_TYPE in tested[1] else None
        if isinstance(test, cst.Call) and self.imports.resolve(test.func) == "torch.is_tensor" and len(test.args) == 1:
            key = dotted_name(test.args[0].value)
            return (key, False) if key is not None else None
        return None

    def framework_of(self, owner: cst.ClassDef, depth: int = 0) -> Framework | str | None:
        """The framework that drives the class (`gradlint.frameworks.Hooks`): one of its bases is the framework's,
        imported from it, or a class of this module that is. UNFOLLOWED when a base cannot be followed (a class of
        another module or of a package without a contract); None when every base is known and none is driven
        (no base, `nn.Module`, Python's own classes)."""
        unfollowed = False
        for base in owner.bases:
            name = last_name(base.value) or ""
            resolved = self.imports.resolve(base.value)
            if resolved is not None:
                top, last = resolved.split(".")[0], resolved.rsplit(".", 1)[-1]
                driving = next((f for f in DRIVING if f.hooks and top in f.modules and last in f.hooks.bases), None)
                if driving is not None:
                    return driving
                unfollowed = unfollowed or not (top in TORCH_MODULES or top in sys.stdlib_module_names)
                continue
            local = next((cls for cls in self.classes if cls.name.value == name and cls is not owner), None)
            if local is not None and depth < MAX_BASE_DEPTH:
                found = self.framework_of(local, depth + 1)
                if isinstance(found, Framework):
                    return found
                unfollowed = unfollowed or found == UNFOLLOWED
            elif name not in BUILTIN_BASES:
                unfollowed = True
        return UNFOLLOWED if unfollowed else None

    def statements_in_scope(self, scope: Scope) -> list[cst.BaseSmallStatement]:
        """The simple statements whose innermost function (or the module) is `scope`, in order."""
        return self._statements_by_scope.get(scope, [])

    def statements_in_loop(self, loop: Loop) -> list[cst.BaseSmallStatement]:
        """The simple statements anywhere inside `loop`'s body, in order."""
        return self._statements_by_loop.get(loop, [])

    def calls_in_scope(self, scope: Scope) -> list[cst.Call]:
        """The calls whose innermost function (or the module) is `scope`, in evaluation order."""
        return self._calls_by_scope.get(scope, [])

    def calls_in_statement(self, statement: cst.CSTNode) -> list[cst.Call]:
        """The calls of a simple statement, in evaluation order."""
        return self._calls_by_statement.get(statement, [])

    @cached_property
    def _calls_by_statement(self) -> dict[cst.CSTNode, list[cst.Call]]:
        grouped: dict[cst.CSTNode, list[cst.Call]] = {}
        for call in self.calls:
            statement = self.statement_of.get(call)
            if statement is not None:
                grouped.setdefault(statement, []).append(call)
        return grouped

    def enables_grad(self, scope: Scope) -> bool:
        """Whether `scope` turns autograd back on itself (`with torch.enable_grad():`, `set_grad_enabled`)."""
        return any(last_name(call.func) in ("enable_grad", "set_grad_enabled") for call in self.calls_in_scope(scope))

    def calls_in_loop(self, loop: Loop) -> list[cst.Call]:
        """The calls anywhere inside `loop`'s body, in evaluation order."""
        return self._calls_by_loop.get(loop, [])

    @cached_property
    def _calls_by_scope(self) -> dict[Scope, list[cst.Call]]:
        grouped: dict[Scope, list[cst.Call]] = {}
        for call in self.calls:
            grouped.setdefault(self.contexts[call].scope, []).append(call)
        return grouped

    @cached_property
    def _calls_by_loop(self) -> dict[Loop, list[cst.Call]]:
        grouped: dict[Loop, list[cst.Call]] = {}
        for call in self.calls:
            for loop in self.contexts[call].loops:
                grouped.setdefault(loop, []).append(call)
        return grouped

    def in_body(self, branch: cst.If, node: cst.CSTNode) -> bool:
        """Whether `node`, inside `branch`, is in its body rather than its `else`/`elif`."""
        if branch not in self._bodies:
            self._bodies[branch] = frozenset(descendants(branch.body))
        return node in self._bodies[branch]

    def exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether two statements or calls lie in different branches of one `if`, so one run sees one of them."""
        shared = [b for b in self.contexts[first].ifs if isinstance(b, cst.If) and b in self.contexts[second].ifs]
        return any(self.in_body(branch, first) != self.in_body(branch, second) for branch in shared)

    # Indexed once: scanning every statement of the module per region is quadratic.
    @cached_property
    def _statements_by_scope(self) -> dict[Scope, list[cst.BaseSmallStatement]]:
        grouped: dict[Scope, list[cst.BaseSmallStatement]] = {}
        for statement in self.statements:
            grouped.setdefault(self.contexts[statement].scope, []).append(statement)
        return grouped

    @cached_property
    def _statements_by_loop(self) -> dict[Loop, list[cst.BaseSmallStatement]]:
        grouped: dict[Loop, list[cst.BaseSmallStatement]] = {}
        for statement in self.statements:
            for loop in self.contexts[statement].loops:
                grouped.setdefault(loop, []).append(statement)
        return grouped


class Collector:
    """Walks a module once, read-only (see `tree`), recording each call's and statement's Context."""

    def __init__(self, module: cst.Module, wanted_types: frozenset[str]) -> None:
        self.result = Collected(module)
        self.wanted_types = wanted_types
        # Half the nodes of a module are whitespace, mostly inside operators and brackets:
        # the traversal skips them unless a rule asked for such nodes.
        self.skip_trivia = not wanted_types & TRIVIA_NAMES
        self.context = Context(scope=module)
        self.statements: list[cst.CSTNode] = []
        self.counter = 0
        self._plain: dict[str, bool] = {}
        self._handed: dict[cst.FunctionDef, frozenset[str]] = {}
        self.switched: GradMode | None = None  # the mode a statement just walked switched to, for what follows

    def walk(self, node: cst.CSTNode) -> None:
        """Record `node` and everything below it, in LibCST's visiting order."""
        traits = _traits(type(node))
        result = self.result
        if traits.name in self.wanted_types:
            result.by_type.setdefault(traits.name, []).append(node)
        if traits.trivia:
            if not self.skip_trivia:
                for name in traits.fields:
                    for child in field_children(node, name):
                        self.walk(child)
            return
        if traits.has_context:
            result.contexts[node] = self.context
        if traits.ordered_on_visit:
            self.counter += 1
            result.order[node] = self.counter
        if traits.statement:
            self.statements.append(node)
        elif traits.call and self.statements:
            result.statement_of[cast(cst.Call, node)] = self.statements[-1]
        elif traits.name == "Attribute" and self.statements and cast(cst.Attribute, node).attr.value == "grad":
            result.grad_statements.add(self.statements[-1])
        outer = self.context
        if traits.enter is not None:
            traits.enter(self, node)
        inside = self.context
        for name in traits.fields:
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for item in value:
                    if is_node(type(item)):
                        self.walk(item)
                        if self.switched is not None and type(item) is cst.SimpleStatementLine:
                            # the line just walked was `torch.set_grad_enabled(...)`: what follows it in the block
                            self.context = replace(self.context, grad_mode=self.switched)
                            self.switched = None
                        elif type(item) is cst.If and self.context.loops and _continues(item):
                            # `if accumulating: continue`: what follows it in the block runs when the test fails
                            self.context = replace(self.context, skips=(*self.context.skips, item))
            elif is_node(kind):
                if name in traits.scoped_fields:
                    self.context = _field_context(self, node)
                self.walk(value)
                self.context = inside
        self.context = outer
        if traits.statement:
            self.statements.pop()
        if traits.ordered_on_leave:
            self.counter += 1
            result.order[node] = self.counter
        if traits.call:
            # Recorded on leave, so calls are in evaluation order: arguments first.
            result.calls.append(cast(cst.Call, node))

    def enter_import(self, node: cst.CSTNode) -> None:
        self.result.imports.add(cast(cst.Import | cst.ImportFrom, node))

    def enter_line(self, node: cst.CSTNode) -> None:
        body = cast(cst.SimpleStatementLine, node).body
        self.result.statements.extend(body)
        # `torch.set_grad_enabled(False)` written as a statement switches grad mode for the statements after it
        # in its block (and, in truth, until it is switched back: beyond the block is not assumed).
        for small in body:
            if (
                type(small) is cst.Expr
                and isinstance(small.value, cst.Call)
                and last_name(small.value.func) == "set_grad_enabled"
            ):
                self.switched = grad_mode_of(small.value)

    def enter_class(self, node: cst.CSTNode) -> None:
        self.result.classes.append(cast(cst.ClassDef, node))
        self.context = replace(self.context, class_def=cast(cst.ClassDef, node), class_body=True)

    def _decorated_mode(self, decorator: cst.BaseExpression) -> GradMode | None:
        """The grad mode a decorator runs the function in: None when it leaves it as it is, UNKNOWN when no one
        can say (a decorator of another module or package, or one of this module that switches grad mode itself)."""
        mode = grad_mode_of(decorator, self.result.disabling)
        if mode is not None:
            return mode
        func = decorator.func if isinstance(decorator, cst.Call) else decorator
        if isinstance(func, cst.Attribute) and func.attr.value in PROPERTY_PARTS:
            return None  # Ex) @value.setter
        name = dotted_name(func)
        if name is None:
            return GradMode.UNKNOWN
        if self._plain_definition(name) or (name in BUILTIN_DECORATORS and not self._bound(name)):
            return None
        resolved = self.result.imports.resolve(func) or name
        return None if resolved.split(".")[0] in PLAIN_DECORATOR_MODULES else GradMode.UNKNOWN

    def _plain_definition(self, name: str) -> bool:
        """Whether `name` is a top-level function or class of the module that leaves grad mode alone: nothing in it
        names a grad mode (one that disables grad is in `disabling`)."""
        if name not in self._plain:
            definition = next(
                (
                    statement
                    for statement in self.result.module.body
                    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.name.value == name
                ),
                None,
            )
            self._plain[name] = definition is not None and not any(
                isinstance(node, cst.Name) and node.value in GRAD_MODE_NAMES for node in descendants(definition)
            )
        return self._plain[name]

    def _callbacks(self, scope: cst.FunctionDef) -> frozenset[str]:
        """`_handed_on(scope)`, once per function however many functions it nests."""
        if scope not in self._handed:
            self._handed[scope] = _handed_on(scope)
        return self._handed[scope]

    def _bound(self, name: str) -> bool:
        return name in self.result.imports.aliases or name in self.result.imports.relative

    def enter_function(self, node: cst.CSTNode) -> None:
        function = cast(cst.FunctionDef, node)
        self.result.functions.append(function)
        self.result.def_scopes[function] = self.context.scope
        if self.context.class_body and self.context.class_def is not None:
            self.result.owners[function] = self.context.class_def
        mode = self.context.grad_mode
        for decorator in function.decorators:
            mode = self._decorated_mode(decorator.decorator) or mode
        owner = self.context.class_def
        if function.name.value in WITHOUT_GRAD_HOOKS and owner is not None and self.context.class_body:
            # A hook its framework runs under no_grad (Lightning's validation_step); one that may be (its class
            # has a base gradlint cannot follow) runs in a grad mode nobody can tell.
            driving = self.result.framework_of(owner)
            if isinstance(driving, Framework) and driving.hooks and function.name.value in driving.hooks.without_grad:
                mode = GradMode.DISABLED
            elif driving == UNFOLLOWED:
                mode = GradMode.UNKNOWN
        scope = self.context.scope
        if isinstance(scope, cst.FunctionDef) and function.name.value in self._callbacks(scope):
            mode = GradMode.UNKNOWN  # a callback: it runs where the code it is handed to runs it
        self.context = Context(scope=function, class_def=self.context.class_def, grad_mode=mode)


def _continues(statement: cst.If) -> bool:
    """True for an `if` with no `else` whose body ends by going on to the loop's next iteration."""
    if statement.orelse is not None:
        return False
    body = statement.body
    last = body.body[-1] if isinstance(body, cst.IndentedBlock) and body.body else body
    small = last.body if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
    return bool(small) and isinstance(small[-1], cst.Continue)


def _handed_on(scope: cst.FunctionDef) -> frozenset[str]:
    """The names `scope` passes to calls and never calls itself (`mtq.quantize(model, config, forward_loop)`): a
    nested function among them is a callback, which runs in the grad mode of the code it is handed to."""
    handed: set[str] = set()
    called: set[str] = set()
    for node in descendants(scope.body):
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name):
                called.add(node.func.value)
            handed.update(arg.value.value for arg in node.args if isinstance(arg.value, cst.Name))
    return frozenset(handed - called)


def _field_context(collector: Collector, node: cst.CSTNode) -> Context:
    """The context inside a loop's body, an `if`'s body or else, an `except` body or a `with` body."""
    context = collector.context
    if isinstance(node, (cst.For, cst.While)):
        collector.result.loops.append(node)
        return replace(context, loops=(*context.loops, node))
    if isinstance(node, cst.With):
        mode = context.grad_mode
        profiled = context.profiled
        for item in node.items:
            mode = grad_mode_of(item.item, collector.result.disabling) or mode
            if isinstance(item.item, cst.Call) and last_name(item.item.func) in PROFILERS:
                profiled = profiled or (collector.result.imports.resolve(item.item.func) or "").startswith("torch.")
        return replace(context, grad_mode=mode, profiled=profiled)
    return replace(context, ifs=(*context.ifs, node))


@dataclass(frozen=True)
class _Traits:
    """What the collector records for nodes of one type, and how it walks them."""

    name: str
    trivia: bool
    has_context: bool
    ordered_on_visit: bool
    statement: bool
    call: bool
    ordered_on_leave: bool
    fields: tuple[str, ...]  # the fields holding children, in LibCST's order
    scoped_fields: frozenset[str]  # the fields walked in a context of their own (see `_field_context`)
    enter: Callable[[Collector, cst.CSTNode], None] | None


_ENTER: dict[type[cst.CSTNode], Callable[[Collector, cst.CSTNode], None]] = {
    cst.Import: Collector.enter_import,
    cst.ImportFrom: Collector.enter_import,
    cst.SimpleStatementLine: Collector.enter_line,
    cst.ClassDef: Collector.enter_class,
    cst.FunctionDef: Collector.enter_function,
}
_SCOPED: dict[type[cst.CSTNode], frozenset[str]] = {
    cst.For: frozenset({"body"}),
    cst.While: frozenset({"body"}),
    cst.If: frozenset({"body", "orelse"}),
    cst.ExceptHandler: frozenset({"body"}),
    cst.With: frozenset({"body"}),
}


@cache
def _traits(kind: type[cst.CSTNode]) -> _Traits:
    return _Traits(
        name=kind.__name__,
        trivia=is_trivia(kind),
        # Every statement: a call in a decorator or a default belongs to its `def` or `class`.
        has_context=issubclass(kind, (cst.Call, cst.BaseSmallStatement, cst.BaseCompoundStatement)),
        ordered_on_visit=issubclass(kind, (cst.For, cst.While, cst.FunctionDef)),
        statement=issubclass(kind, (cst.BaseSmallStatement, cst.BaseCompoundStatement)),
        call=issubclass(kind, cst.Call),
        ordered_on_leave=issubclass(kind, (cst.Call, cst.BaseSmallStatement)),
        fields=child_fields(kind),
        scoped_fields=_SCOPED.get(kind, frozenset()),
        enter=_ENTER.get(kind),
    )


def collect(module: cst.Module, wanted_types: frozenset[str] = frozenset()) -> Collected:
    """Traverse `module` once and return what was recorded."""
    collector = Collector(module, wanted_types)
    collector.result.disabling = grad_disabling_names(module)
    collector.walk(module)
    return collector.result
