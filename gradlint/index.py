"""The outline of a module: what it defines and imports, read with the standard `ast` parser.

Resolving a call across the project (`trainlib.train_step` -> `trainlib/engine.py`)
needs only a module's outline: its top-level functions and classes, their parameters,
the bases of its classes and the names it imports. CPython's parser builds that in a
fraction of a LibCST parse, so the whole-program model outlines every module it passes
through and analyses with LibCST only the functions a call may take gradient effects
from (`FunctionOutline.maybe_effects`, or a call of one that may). Nothing is imported
or run.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TypeGuard

from gradlint.frameworks import KNOWN_OPTIMIZERS, OTHER_FRAMEWORKS, TORCH_MODULES
from gradlint.project import Project, content_hash

# What a gradient effect looks like in source: a backward, a step, a clear, a clip, an
# unscale, an optimizer or scaler built, a use of `.grad`, a switch to eval or train mode.
# A function whose code has none of these (and calls no project function that has) does
# nothing to gradient state.
EFFECT = re.compile(
    rb"backward\(|\.step\(|zero_grad|clear_grads?\(|clip_grad|clip_gradients|unscale_|optim\.|GradScaler|\.grad\b"
    rb"|\.eval\(\s*\)|\.train\(\s*(?:\)|True\b|False\b|mode\b|\w*(?:train|mode|flag)\w*\s*\))"
    rb"|\b(?:" + b"|".join(sorted(name.encode() for name in KNOWN_OPTIMIZERS)) + rb"|\w*Optimizer)\("
)
# A method that adds onto or appends to an attribute of its object (`self.sum += val`,
# `self.values[key].append(val)`): it may keep what a caller passes it (`facts.keeping`).
# Code that may cut autograd history: what `facts.terms` calls a cut, and grad mode switched off.
CUTS = re.compile(rb"\.(?:detach|item|numpy|tolist|data)\b|\btorch\.(?:tensor|Tensor)\(|\b(?:no_grad|inference_mode)\b")
KEEPS = re.compile(
    rb"self\.(\w+)\s*=\s*self\.\1\s*[+-]|self\.\w+(?:\[[^\]\n]*\])*\s*[+-]=\s*[A-Za-z_(]|self\.\w+(?:\[[^\]\n]*\]|\.(?:setdefault|get)\([^)\n]*\))*\.(?:append|extend|insert|appendleft)\("
)
# Code that returns what a constructor call (a capitalized callee) builds, directly or through a name bound to it:
# its summary proves or not what it returns (`returns_role`).
RETURNED_CONSTRUCTION = re.compile(rb"\breturn\s+(?:[a-z_]\w*\.)*[A-Z]\w*\(")
RETURNED_NAME = re.compile(rb"(?m)\breturn\s+([A-Za-z_]\w*)\s*$")
# Functions whose name says their result is a loss or a model's output: their summary says what they return.
RETURNS_GRAPH = re.compile(r"loss|criterion|objective|forward|_step$|^step$")
MAX_OUTLINE_BYTES = 2 << 20
# How many re-export hops (`from .core import train` in an `__init__`) a name is followed through.
MAX_REEXPORTS = 8
# How many calls away the callers of a function are followed to prove it runs with autograd off, and in how many of
# the run's files a function's name may appear for its calls to be looked for (a common name is left unknown).
MAX_CALLER_HOPS = 4
MAX_MENTIONING = 40
# The name under which a cached judgement records that it read the callers of the functions called `name`, and the
# path it gives for them: the run's files as a whole (`Outlines.members_digest`).
CALLERS = "<callers>:"
MEMBERS = "<the run's files>"


@dataclass(frozen=True)
class Ref:
    """A callee named in one module, to be resolved in the whole program.

    kind: "local" (`name` is a qualname of the same module), "absolute" (`name` is a
    dotted import path), "relative" (`name` relative to the module's package, `level`
    dots up), "star" (a bare name a `from x import *` may bind), "class" (the method
    `method` of the class `name` of this module, through its bases) or "super" (the
    method of a base of class `name`). With another kind, `method` is the method called
    on an instance of the class `name` refers to (`Trainer(...).fit()`).
    """

    kind: str
    name: str
    level: int = 0
    method: str = ""


@dataclass(frozen=True)
class FunctionOutline:
    """A function's parameters, whether its code shows a gradient effect, and the calls it makes."""

    params: tuple[str, ...]  # filled by position, `self` included
    keyword_only: tuple[str, ...] = ()
    defaults_off: tuple[tuple[str, bool], ...] = ()  # parameter -> whether its default is None (else False)
    method: bool = False
    varargs: str | None = None  # the name of `*args`
    varkw: str | None = None  # the name of `**kwargs`
    maybe_effects: bool = False
    calls: tuple[Ref, ...] = ()
    maybe_keeps: bool = False  # a method whose code may keep an argument on its object
    maybe_builds: bool = False  # code that may return an object it builds (`return torch.optim.Adam(...)`)
    maybe_cuts: bool = False  # code that may return a value cut from autograd history (`return out.detach()`)


@dataclass(frozen=True)
class ClassOutline:
    """A class's bases (as refs), method names, and the attributes of `self` its methods bind to something that is
    neither a `Parameter(...)` nor None (`self.weight = FactorizedTensor.new(...)`)."""

    bases: tuple[Ref, ...] = ()
    methods: tuple[str, ...] = ()
    binds_other: tuple[str, ...] = ()


TOP_LEVEL = "<module>"  # the qualname under which an outline keeps the module's own statements
# A call in source text: a dotted name and its opening parenthesis (`engine.train_step(`), or `super().m(`.
_CALL = re.compile(rb"(?<![\w.])(super\(\)\.\w+|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
# The function `functools.partial(train_step, model)` wraps: it runs where the partial is called.
_PARTIAL = re.compile(rb"(?<![\w.])(?:functools\.)?partial\(\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*[,)]")
# An assignment of a constructor call: `model = JointEmbedding(` (a name that starts upper-case).
_INSTANCE = re.compile(rb"(?m)^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=[ \t]*((?:[A-Za-z_]\w*\.)*[A-Z]\w*)\(")
_STRINGS = re.compile(rb'(?s)"""(?:[^\\]|\\.)*?"""|\'\'\'(?:[^\\]|\\.)*?\'\'\'|#[^\r\n]*')
# An import statement anywhere in a module, at any indentation: `import a.b as c, d` or `from ..a import b`.
_IMPORT = re.compile(
    rb"(?m)^(?:\xef\xbb\xbf)?[ \t]*"
    rb"(?:import[ \t]+([^\r\n#;]+)|from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]+([^\r\n#;]*))"
)
# The context managers and decorators that switch autograd off (`torch.no_grad`, `torch.inference_mode`).
GRAD_OFF = frozenset({"no_grad", "inference_mode"})
_NOT_CALLS = frozenset(
    {"if", "elif", "while", "for", "return", "and", "or", "not", "in", "is", "lambda", "yield", "await", "assert",
     "print", "del", "with", "as", "except", "raise", "def", "class", "from", "import", "else"}
)  # fmt: skip


@dataclass(frozen=True)
class Span:
    """Where a function's code is (lines `start` to `end`, one-based), and its class."""

    start: int
    end: int
    owner: str | None
    params: tuple[str, ...]
    keyword_only: tuple[str, ...]
    defaults_off: tuple[tuple[str, bool], ...]
    varargs: str | None = None
    varkw: str | None = None
    # Grad mode: decorated `@torch.no_grad()` or `@torch.inference_mode()`; the methods it calls on `self` (`super`
    # for `super().<its own name>(...)`) only inside `with torch.no_grad():` or `torch.inference_mode()` blocks.
    without_grad: bool = False
    calls_without_grad: tuple[str, ...] = ()
    # The method of `self` whose result is all the function does and returns (`return self.quantize(x)`).
    delegates_to: str | None = None


@dataclass
class ModuleOutline:
    """What a module defines at its top level (`f`, `Class.method`) and the names it imports.

    A function's effects and calls are read from its source text when first asked for:
    most functions a run passes by are never asked about, and no syntax tree is kept.
    """

    classes: dict[str, ClassOutline] = field(default_factory=dict)
    names: dict[str, Ref] = field(default_factory=dict)
    stars: tuple[Ref, ...] = ()
    spans: dict[str, Span] = field(default_factory=dict)
    top_level: tuple[tuple[int, int], ...] = ()  # the lines of the statements outside any def or class
    lines: list[bytes] = field(default_factory=list)
    _functions: dict[str, FunctionOutline] = field(default_factory=dict)

    def defines(self, name: str) -> bool:
        """Whether `name` is a function or class of the module's top level."""
        return name in self.classes or name in self.spans

    def code(self, qualname: str) -> bytes:
        """The source of a function or method (or TOP_LEVEL, the module's own statements)."""
        if qualname == TOP_LEVEL:
            return b"".join(b"".join(self.lines[start - 1 : end]) for start, end in self.top_level)
        span = self.spans.get(qualname)
        return b"".join(self.lines[span.start - 1 : span.end]) if span is not None else b""

    def interface(self) -> str:
        """A digest of what other modules' judgements can read from this outline: names, imports, classes,
        parameters, calls and which functions may affect gradients, but not where things are in the file."""
        functions = sorted(
            (name, astuple(replace(span, start=0, end=0)), astuple(self.function(name) or FunctionOutline(())))
            for name, span in self.spans.items()
        )
        data = (
            sorted((name, astuple(ref)) for name, ref in self.names.items()),
            [astuple(ref) for ref in self.stars],
            sorted((name, astuple(cls)) for name, cls in self.classes.items()),
            functions,
            astuple(self.function(TOP_LEVEL) or FunctionOutline(())),
            sorted(astuple(ref) for ref in imported_modules(b"".join(self.lines))),  # what decides torch scope
        )
        return hashlib.sha256(repr(data).encode()).hexdigest()

    def qualnames(self) -> list[str]:
        """Every function and method, and TOP_LEVEL."""
        return [*self.spans, TOP_LEVEL]

    def function(self, qualname: str) -> FunctionOutline | None:
        """The outline of the function `f` or method `Class.method`, or the module's own code (TOP_LEVEL)."""
        if qualname not in self._functions:
            if qualname == TOP_LEVEL:
                code = b"".join(b"".join(self.lines[start - 1 : end]) for start, end in self.top_level)
                self._functions[qualname] = FunctionOutline(
                    (), maybe_effects=_effects(code), calls=self._calls(code, None)
                )
            elif qualname in self.spans:
                span = self.spans[qualname]
                code = b"".join(self.lines[span.start - 1 : span.end])
                self._functions[qualname] = FunctionOutline(
                    span.params,
                    span.keyword_only,
                    span.defaults_off,
                    method=span.owner is not None,
                    varargs=span.varargs,
                    varkw=span.varkw,
                    maybe_effects=_effects(code),
                    calls=self._calls(code, span.owner),
                    maybe_keeps=span.owner is not None
                    and len(span.params) > 1
                    and KEEPS.search(_STRINGS.sub(b"", code)) is not None,
                    maybe_builds=_builds(_STRINGS.sub(b"", code)),
                    maybe_cuts=span.without_grad or CUTS.search(_STRINGS.sub(b"", code)) is not None,
                )
            else:
                return None
        return self._functions[qualname]

    def _calls(self, code: bytes, owner: str | None) -> tuple[Ref, ...]:
        found = []
        code = _STRINGS.sub(b"", code)
        for match in (*_CALL.finditer(code), *_PARTIAL.finditer(code)):
            text = match[1].decode("ascii", "replace")
            ref = self.ref_of(text, owner) if text not in _NOT_CALLS else None
            if ref is not None:
                found.append(ref)
        return tuple(dict.fromkeys(found))

    def ref_of(self, text: str, owner: str | None) -> Ref | None:
        """The reference a call of the dotted name `text` (`utils.evaluate`, `self.step`, `super().forward`) makes
        from a function of the class `owner` (None: a plain function or the module's own code)."""
        if text.startswith("super()."):
            return Ref("super", owner, method=text.rpartition(".")[2]) if owner is not None else None
        head, _, rest = text.partition(".")
        if head in ("self", "cls"):
            return Ref("class", owner, method=rest) if owner is not None and rest and "." not in rest else None
        ref = name_ref(text, self.names, self._local_functions)
        if ref is None and rest and "." not in rest and head in self.instances:
            built = self.instances[head]  # Ex) model.val_start() where the module builds model = Wrapper(...)
            ref = Ref(built.kind, built.name, built.level, rest)
        return ref

    @cached_property
    def _local_functions(self) -> frozenset[str]:
        """The module's own top-level functions, which a bare call may name."""
        return frozenset(name for name in self.spans if "." not in name)

    @cached_property
    def instances(self) -> dict[str, Ref]:
        """Names the module binds, anywhere, to an instance of one class it defines or imports (`model =
        JointEmbedding(...)`): what `model.method()` runs, as the analysis's `EventIndex.instance_class` takes it."""
        built: dict[str, set[Ref | None]] = {}
        for match in _INSTANCE.finditer(_STRINGS.sub(b"", b"".join(self.lines))):
            name, cls = match[1].decode("ascii", "replace"), match[2].decode("ascii", "replace")
            built.setdefault(name, set()).add(
                name_ref(cls, self.names) or (Ref("class", cls) if cls in self.classes else None)
            )
        return {name: ref for name, refs in built.items() if len(refs) == 1 and (ref := next(iter(refs))) is not None}


def _builds(code: bytes) -> bool:
    """Whether the code may return an object a constructor call builds: `return Adam(...)`, or `return model`
    after `model = Net(...)`."""
    if RETURNED_CONSTRUCTION.search(code):
        return True
    return any(
        re.search(rb"\b" + re.escape(name) + rb"\s*=\s*(?:[a-z_]\w*\.)*[A-Z]\w*\(", code)
        for name in RETURNED_NAME.findall(code)
    )


def _effects(code: bytes) -> bool:
    return EFFECT.search(_STRINGS.sub(b"", code)) is not None


def imported_modules(data: bytes) -> frozenset[Ref]:
    """Every module a module's source imports, anywhere in it (inside functions and `try` too), as refs.

    Read from the text with strings and comments left out, so that it costs no parse and
    reads files CPython cannot parse as well.
    """
    found: set[Ref] = set()
    for match in _IMPORT.finditer(_STRINGS.sub(b"", data)):
        if match[1] is not None:
            found.update(Ref("absolute", name) for name in _imported_names(match[1]))
            continue
        level, module = len(match[2]), match[3].decode("ascii", "replace")
        kind = "relative" if level else "absolute"
        found.add(Ref(kind, module, level))
        # `from . import utils`: the names may be modules themselves.
        found.update(Ref(kind, f"{module}.{name}" if module else name, level) for name in _imported_names(match[4]))
    return frozenset(found)


def _imported_names(listed: bytes) -> list[str]:
    """The names an import statement lists (`a.b as c, d` -> a.b, d), without a `*`."""
    names = (item.split(" as ")[0].strip() for item in listed.decode("ascii", "replace").strip("()\\ ").split(","))
    return [name for name in names if name and name != "*" and all(part.isidentifier() for part in name.split("."))]


def imports_torch(refs: Iterable[Ref]) -> bool:
    """Whether one of the imports `refs` is of torch or of a package built on it (`gradlint.frameworks`)."""
    return any(ref.kind == "absolute" and ref.name.split(".")[0] in TORCH_MODULES for ref in refs)


def imports_other_framework(refs: Iterable[Ref]) -> bool:
    """Whether one of the imports `refs` is of another array framework (MXNet, JAX, NVIDIA Warp, ...)."""
    return any(ref.kind == "absolute" and ref.name.split(".")[0] in OTHER_FRAMEWORKS for ref in refs)


def outline(data: bytes) -> ModuleOutline | None:
    """The outline of the module file holding `data`, or None when CPython cannot parse it."""
    if len(data) > MAX_OUTLINE_BYTES:
        return None
    with collector_paused():
        tree = standard_tree(data)
        return _outline(tree, data) if tree is not None else None


def standard_tree(data: bytes) -> ast.Module | None:
    """CPython's syntax tree of `data`, or None when CPython cannot parse it."""
    with collector_paused():
        try:
            return ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run without the cyclic garbage collector: a syntax tree is dropped soon and has no cycles, and the
    collector would only walk every live object of the run again for each burst of allocations it makes."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _outline(tree: ast.Module, data: bytes) -> ModuleOutline:
    result = ModuleOutline(lines=data.splitlines(keepends=True))
    stars: list[Ref] = []
    for node in tree.body:
        _record_import(node, result.names, stars)
    result.stars = tuple(stars)
    top_level = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            result.spans[node.name] = _span(node, None)
        elif isinstance(node, ast.ClassDef):
            methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
            bases = tuple(ref for base in node.bases if (ref := _class_ref(base, result.names)) is not None)
            names = tuple(item.name for item in methods)
            result.classes[node.name] = ClassOutline(bases, names, _binds_other(methods))
            for item in methods:
                result.spans[f"{node.name}.{item.name}"] = _span(item, node.name)
        else:
            top_level.append((node.lineno, node.end_lineno or node.lineno))
    result.top_level = tuple(top_level)
    return result


def _binds_other(methods: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> tuple[str, ...]:
    """The attributes of `self` that `methods` bind to a value other than `Parameter(...)` or None."""
    found: set[str] = set()
    for method in methods:
        for node in ast.walk(method):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            if isinstance(value, ast.Call) and (_dotted(value.func) or "").rpartition(".")[2] == "Parameter":
                continue
            found.update(target.attr for target in targets if _on_self(target))
    return tuple(sorted(found))


def _on_self(target: ast.expr) -> TypeGuard[ast.Attribute]:
    """Whether `target` is an attribute of `self` (`self.weight`)."""
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> Span:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    names = [arg.arg for arg in positional]
    defaults = dict(zip(names[len(names) - len(args.defaults) :], args.defaults, strict=True))
    defaults |= {arg.arg: default for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default}
    defaults_off = tuple(
        (name, value.value is None)
        for name, value in defaults.items()
        if isinstance(value, ast.Constant) and (value.value is None or value.value is False)
    )
    body = node.body[1:] if node.body and _is_docstring(node.body[0]) else node.body
    start = body[0].lineno if body else node.lineno
    end = node.end_lineno or node.lineno
    keyword_only = tuple(arg.arg for arg in args.kwonlyargs)
    varargs, varkw = (star.arg if star is not None else None for star in (args.vararg, args.kwarg))
    without_grad = any(_switches_grad_off(decorator) for decorator in node.decorator_list)
    inside, outside = _self_calls_by_grad_mode(node)
    calls_without_grad = tuple(sorted(inside - outside))
    return Span(
        start,
        end,
        owner,
        tuple(names),
        keyword_only,
        defaults_off,
        varargs,
        varkw,
        without_grad,
        calls_without_grad,
        _delegate(body) if owner is not None else None,
    )


def _delegate(body: list[ast.stmt]) -> str | None:
    """The method of `self` a body of one `return self.<method>(...)` hands its work to."""
    if len(body) != 1 or not isinstance(returned := body[0], ast.Return) or not isinstance(returned.value, ast.Call):
        return None
    func = returned.value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return None


def _switches_grad_off(node: ast.expr) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()` (or the bare decorator forms): autograd off inside."""
    if isinstance(node, ast.Call):
        if node.args or any(keyword.arg == "mode" for keyword in node.keywords):
            return False  # `inference_mode(False)`, `inference_mode(mode=...)`: not surely off
        node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in GRAD_OFF


def _self_calls_by_grad_mode(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], set[str]]:
    """(methods of `self` called inside `no_grad`/`inference_mode` blocks, those called outside any), `super` standing
    for `super().<function's name>(...)`; nested functions and classes are left out."""
    inside: set[str] = set()
    outside: set[str] = set()
    pending: list[tuple[ast.AST, bool]] = [(statement, False) for statement in function.body]
    while pending:
        node, off = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.With, ast.AsyncWith)):
            off = off or any(_switches_grad_off(item.context_expr) for item in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id == "self":
                (inside if off else outside).add(node.func.attr)
            elif (
                isinstance(receiver, ast.Call)
                and isinstance(receiver.func, ast.Name)
                and receiver.func.id == "super"
                and node.func.attr == function.name
            ):
                (inside if off else outside).add("super")
        pending.extend((child, off) for child in ast.iter_child_nodes(node))
    return inside, outside


@dataclass(frozen=True)
class Mention:
    """One place a module's code names a function: a call (`text` is the dotted callee, `off` whether it surely runs
    with autograd off: inside a `no_grad`/`inference_mode` block or a function decorated so), or a plain reference
    (`passed`: the function handed on, imported under another name, or named inside a nested function or lambda,
    where who runs it, and how, is not read)."""

    qualname: str  # the caller: `f`, `Class.method` or TOP_LEVEL; a class body's own code counts as TOP_LEVEL
    owner: str | None
    text: str = ""
    off: bool = False
    passed: bool = False


def mentions(tree: ast.Module, name: str) -> list[Mention]:
    """Every call and reference of `name` (as a bare name or an attribute) in the module `tree`; its own `def name`
    and imports of it under its own name are neither."""
    found: list[Mention] = []
    pending: list[tuple[ast.AST, str, str | None, bool, bool]] = [
        (node, TOP_LEVEL, None, False, False) for node in tree.body
    ]
    while pending:
        node, qualname, owner, off, nested = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorated = any(_switches_grad_off(decorator) for decorator in node.decorator_list)
            for decorator in node.decorator_list:
                pending.append((decorator, qualname, owner, off, nested))
            if qualname == TOP_LEVEL and not nested:
                inner = f"{owner}.{node.name}" if owner is not None else node.name
                pending.extend((child, inner, owner, decorated, False) for child in node.body)
            else:  # a nested function runs where it is called, in a grad mode not read here
                pending.extend((child, qualname, owner, off, True) for child in node.body)
            continue
        if isinstance(node, ast.ClassDef):
            inside = node.name if qualname == TOP_LEVEL and owner is None and not nested else None
            pending.extend(
                (child, TOP_LEVEL if inside else qualname, inside, off, nested or inside is None) for child in node.body
            )
            continue
        if isinstance(node, ast.Lambda):
            pending.append((node.body, qualname, owner, off, True))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(
                (alias.name.rpartition(".")[2] == name) != ((alias.asname or alias.name) == name)
                for alias in node.names
            ):
                found.append(Mention(qualname, owner, passed=True))  # imported under another name
            continue
        if isinstance(node, (ast.With, ast.AsyncWith)):
            off = off or any(_switches_grad_off(item.context_expr) for item in node.items)
        if isinstance(node, ast.Call) and _names(node.func, name):
            text = _dotted(node.func) or ""
            found.append(Mention(qualname, owner, text, off and not nested, passed=nested or not text))
            pending.extend((child, qualname, owner, off, nested) for child in (*node.args, *node.keywords))
            if isinstance(node.func, ast.Attribute):
                pending.append((node.func.value, qualname, owner, off, nested))
            continue
        if _names(node, name):
            found.append(Mention(qualname, owner, passed=True))
        pending.extend((child, qualname, owner, off, nested) for child in ast.iter_child_nodes(node))
    return found


def _names(node: ast.AST, name: str) -> bool:
    """Whether `node` is the bare name `name` or an attribute `.name`."""
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _record_import(node: ast.stmt, names: dict[str, Ref], stars: list[Ref]) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                names[alias.asname] = Ref("absolute", alias.name)
            else:
                head = alias.name.split(".")[0]
                names.setdefault(head, Ref("absolute", head))
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        kind = "relative" if node.level else "absolute"
        for alias in node.names:
            if alias.name == "*":
                stars.append(Ref(kind, module, node.level))
            else:
                target = f"{module}.{alias.name}" if module else alias.name
                names[alias.asname or alias.name] = Ref(kind, target, node.level)
    elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / `try: import x except ImportError:`
        for inner in (*node.body, *getattr(node, "orelse", ()), *getattr(node, "finalbody", ())):
            _record_import(inner, names, stars)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def name_ref(dotted: str, names: dict[str, Ref], local: set[str] | frozenset[str] = frozenset()) -> Ref | None:
    """The reference the dotted name `dotted` makes through a module's imports (or its own functions)."""
    head, _, rest = dotted.partition(".")
    if head in names:
        base = names[head]
        return Ref(base.kind, f"{base.name}.{rest}" if rest else base.name, base.level)
    if not rest and head in local:
        return Ref("local", head)
    return None


def _class_ref(base: ast.expr, names: dict[str, Ref]) -> Ref | None:
    dotted = _dotted(base)
    if dotted is None:
        return None
    return name_ref(dotted, names) or Ref("class", dotted)


class Outlines:
    """The outlines of the project's modules, read on demand, and the calls resolved through them.

    `overlay` holds unsaved editor buffers by path, read in place of the files. Every
    module read between `record()` and `stop()` is recorded, so that a cached result
    can name what it depends on (`used`).
    """

    def __init__(
        self, project: Project, overlay: Mapping[Path, bytes] | None = None, members: Iterable[Path] = ()
    ) -> None:
        self.project = project
        self.overlay = {path.resolve(): data for path, data in (overlay or {}).items()}
        # The files of the run, where the callers of a function are looked for (`callers_without_grad`).
        self.members = tuple(members)
        self._member_data: dict[Path, bytes] | None = None
        self._member_hashes: dict[Path, str] | None = None
        self._member_modules: dict[Path, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}  # the modules `mentions_of` read, parsed once each
        self._mentioning: dict[tuple[str, str], list[str] | None] = {}
        self._mentions: dict[tuple[str, str], list[Mention] | None] = {}
        self._sites: dict[tuple[str, str], list[tuple[str, str, bool]] | None] = {}
        self._sources: dict[str, tuple[Path, bytes] | None] = {}
        self._outlines: dict[str, ModuleOutline | None] = {}
        self._affects: dict[tuple[str, str], bool] = {}
        self._deciding: set[tuple[str, str]] = set()
        self._read_undecided = False
        self._recording: list[set[str]] = []
        self._calls_effects: dict[tuple[Path, str], bool] = {}
        self._resolved: dict[tuple[Ref, str], tuple[tuple[str, str] | None, frozenset[str]]] = {}
        self._definitions: dict[str, tuple[tuple[str, str] | None, frozenset[str]]] = {}
        self._defining: set[str] = set()
        self._imports: dict[str, frozenset[Ref]] = {}
        self._interfaces: dict[str, str] = {}  # outline interfaces, for the cache (the files do not change in a run)
        self._torch: dict[str, tuple[bool, frozenset[str]]] = {}

    def note(self, modules: Iterable[str]) -> None:
        """Record `modules` as read by every recording in progress."""
        for reads in self._recording:
            reads.update(modules)

    def calls_effects(self, path: Path, data: bytes) -> bool:
        """Whether the module file `path` (holding `data`) calls a project function of another module that may
        affect gradients: then its findings may come from there, whatever its own text says."""
        key = (path.resolve(), content_hash(data))
        if key not in self._calls_effects:
            self._calls_effects[key] = self._calls_effects_of(self.project.add_file(path), data)
        return self._calls_effects[key]

    def _calls_effects_of(self, module: str, data: bytes) -> bool:
        found = self._outlines.get(module) if (self._sources.get(module) or (None, None))[1] == data else outline(data)
        if found is None:
            return False
        return any(
            self._reaches_effects(ref, module)
            for name in found.qualnames()
            if (function := found.function(name)) is not None
            for ref in function.calls
        )

    def _reaches_effects(self, ref: Ref, module: str) -> bool:
        """Whether the project function `ref` names may affect gradients; for a class, any of its methods."""
        target = self.resolve(ref, module)
        if target is not None and target[0] != module and self.affects(*target):
            return True
        if ref.kind not in ("absolute", "relative") or ref.method:
            return False
        dotted = self._absolute(ref, module)
        defined = self._definition(dotted, 0) if dotted is not None else None
        if defined is None or defined[0] == module:
            return False
        owner = self.outline(defined[0])
        cls = owner.classes.get(defined[1]) if owner is not None else None
        return cls is not None and any(self.affects(defined[0], f"{defined[1]}.{method}") for method in cls.methods)

    # Torch scope: whether torch reaches a module through its imports.

    def torch_reaches(self, path: Path, data: bytes) -> bool:
        """Whether torch reaches the module file `path` (holding `data`): it imports torch or a package built on
        it, or a project module that torch reaches, however many imports away, and does not import another array
        framework itself without torch. Only such files get findings."""
        refs = imported_modules(data)
        if imports_torch(refs):
            return True
        if imports_other_framework(refs):
            return False
        module = self.project.add_file(path)
        return any(self._reaches(target) for target in self._project_modules(refs, module))

    def _reaches(self, start: str) -> bool:
        """`torch_reaches` for a project module, searched breadth first; the answer and what it read are kept."""
        if start in self._torch:
            found, read = self._torch[start]
            self.note(read)
            return found
        seen, queue, found = {start}, [start], False
        for module in queue:  # grows as it goes
            known = self._torch.get(module) if module != start else None
            if known is not None:
                seen.update(known[1])
                if known[0]:
                    found = True
                    break
                continue  # nothing it reaches imports torch
            refs = self._module_imports(module)
            if imports_torch(refs):
                found = True
                break
            for target in self._project_modules(refs, module):
                if target not in seen:
                    seen.add(target)
                    queue.append(target)
        self._torch[start] = (found, frozenset(seen))
        self.note(seen)
        return found

    def _module_imports(self, module: str) -> frozenset[Ref]:
        if module not in self._imports:
            source = self.source(module)
            self._imports[module] = imported_modules(source[1]) if source is not None else frozenset()
        return self._imports[module]

    def _project_modules(self, refs: Iterable[Ref], module: str) -> list[str]:
        """The project modules among the imports `refs` of `module`."""
        found = []
        for ref in refs:
            dotted = self._absolute(ref, module)
            if dotted and self.project.locate(dotted) is None and ref.kind == "absolute":
                folder = self._folder(module)  # Ex) `from utils import AverageMeter` beside a script
                dotted = f"{folder}.{dotted}" if folder is not None else dotted
            if dotted and self.project.locate(dotted) is not None and dotted != module:
                found.append(dotted)
        return found

    # Reading modules, and recording what was read.

    def source(self, module: str) -> tuple[Path, bytes] | None:
        if module not in self._sources:
            path = self.project.locate(module)
            data = self.overlay.get(path.resolve()) if path is not None else None
            if path is not None and data is None:
                try:
                    data = path.read_bytes()
                except OSError:
                    path = None
            self._sources[module] = (path, data) if path is not None and data is not None else None
        for reads in self._recording:
            reads.add(module)
        return self._sources[module]

    def outline(self, module: str) -> ModuleOutline | None:
        """What a project module defines and imports, or None when it is not the project's or cannot be parsed."""
        if module not in self._outlines:
            source = self.source(module)
            self._outlines[module] = outline(source[1]) if source is not None else None
        else:
            self.source(module)  # recorded as read
        return self._outlines[module]

    def record(self) -> set[str]:
        """Start recording the modules read from now on; stop with `stop`. Returns the set it fills."""
        reads: set[str] = set()
        self._recording.append(reads)
        return reads

    def stop(self, reads: set[str]) -> None:
        """Stop the recording `record` started."""
        index = next(index for index, active in enumerate(self._recording) if active is reads)  # sets compare equal
        del self._recording[index]

    def used(self, modules: Iterable[str]) -> dict[str, tuple[str, str]]:
        """{module: (path, content hash)} for the project modules among `modules`: what a cached result depends on."""
        found = {}
        for module in sorted(modules):
            source = self._sources.get(module)
            if module.startswith(CALLERS):
                found[module] = (MEMBERS, self.members_digest())  # unchanged while no file of the run is
            elif source is not None:
                found[module] = (str(source[0]), content_hash(source[1]))
        return found

    def outline_interface(self, module: str) -> str:
        """The digest of what a judgement can read of `module` through its outline alone (`o:`, see
        `Program.interface`); a module that cannot be read has the empty one."""
        if module not in self._interfaces and module.startswith(CALLERS):
            recording, self._recording = self._recording, []
            try:
                self._interfaces[module] = f"o:{self.callers_interface(module.removeprefix(CALLERS))}"
            finally:
                self._recording = recording
        elif module not in self._interfaces:
            found = self.read(module)
            self._interfaces[module] = f"o:{found.interface() if found is not None else ''}"
        return self._interfaces[module]

    def read(self, module: str) -> ModuleOutline | None:
        """The module's outline, like `outline`, without recording a read (for the cache's own checks)."""
        recording, self._recording = self._recording, []
        try:
            return self.outline(module)
        finally:
            self._recording = recording

    # Resolution of references, through outlines.

    def resolve(self, ref: Ref, module: str) -> tuple[str, str] | None:
        """(module, qualname) of the project function `ref`, made in `module`, names."""
        key = (ref, module)  # an absolute name may also name a module beside a script (`_beside`)
        if key in self._resolved:
            target, read = self._resolved[key]
            self.note(read)
            return target
        reads = self.record()
        try:
            target = self._resolve(ref, module)
        finally:
            self.stop(reads)
        self._resolved[key] = target, frozenset(reads)
        self.note(reads)
        return target

    def _resolve(self, ref: Ref, module: str) -> tuple[str, str] | None:
        if ref.kind == "local":
            return module, ref.name
        if ref.kind in ("class", "super"):
            return self._method(module, ref.name, ref.method, skip_own=ref.kind == "super", seen=set())
        if ref.kind == "star":
            return self._star(module, ref.name)
        dotted = self._absolute(ref, module)
        target = self._definition(dotted, 0) if dotted is not None else None
        if target is None and ref.kind == "absolute" and dotted is not None:
            target = self._beside(dotted, module)
        if target is None:
            return None
        owner, name = target
        found = self.outline(owner)
        if ref.method:
            return self._method(owner, name, ref.method, skip_own=False, seen=set())
        if found is not None and name in found.classes:
            return self._method(owner, name, "__init__", skip_own=False, seen=set())
        return target

    def _absolute(self, ref: Ref, module: str) -> str | None:
        if ref.kind != "relative":
            return ref.name
        package = module.split(".")
        source = self._sources.get(module) or self.source(module)
        if source is None or source[0].name != "__init__.py":
            package = package[:-1]
        if ref.level - 1 > len(package):
            return None
        base = package[: len(package) - (ref.level - 1)]
        return ".".join([*base, ref.name]) if ref.name else ".".join(base)

    def _beside(self, dotted: str, module: str) -> tuple[str, str] | None:
        """Where `dotted` is defined when it names a module in the importing file's own folder: a script run as
        `python train.py` imports `from utils import AverageMeter` from beside it (its folder comes first on
        `sys.path`), even where that folder is also a package whose modules are named `pkg.utils`."""
        folder = self._folder(module)
        return self._definition(f"{folder}.{dotted}", 0) if folder is not None else None

    def _folder(self, module: str) -> str | None:
        """The package that is the folder of `module`'s file (`pkg` for `pkg.train`, `pkg` for `pkg/__init__.py`);
        None at the top."""
        source = self._sources.get(module) or self.source(module)
        if source is None or ("." not in module and source[0].name != "__init__.py"):
            return None
        return module if source[0].name == "__init__.py" else module.rsplit(".", 1)[0]

    def _definition(self, dotted: str, hops: int) -> tuple[str, str] | None:
        """(module, qualname) where `dotted` is defined, following re-exports.

        Each dotted name is looked up once (star imports that import each other would
        otherwise fan out at every hop); one being looked up again while its lookup runs
        is not defined along that path.
        """
        if dotted in self._definitions:
            target, read = self._definitions[dotted]
            self.note(read)
            return target
        if dotted in self._defining or hops > MAX_REEXPORTS:
            return None
        self._defining.add(dotted)
        reads = self.record()
        try:
            target = self._define(dotted, hops)
        finally:
            self.stop(reads)
            self._defining.discard(dotted)
        self._definitions[dotted] = target, frozenset(reads)
        self.note(reads)
        return target

    def _define(self, dotted: str, hops: int) -> tuple[str, str] | None:
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module, rest = ".".join(parts[:cut]), parts[cut:]
            if self.outline(module) is not None:
                return self._in_module(module, rest, hops)
        return None

    def _in_module(self, module: str, rest: list[str], hops: int) -> tuple[str, str] | None:
        """Where `rest` (`name` or `Class.method`) seen from `module` is defined: there, where an import of it
        points, or in a module its star imports reach (each module visited once)."""
        head, pending, visited = rest[0], [module], {module}
        while pending:
            current = pending.pop(0)
            found = self.outline(current)
            if found is None:
                continue
            if found.defines(head):
                return current, ".".join(rest)
            if head in found.names:
                target = self._absolute(found.names[head], current)
                return self._definition(".".join([target, *rest[1:]]), hops + 1) if target is not None else None
            for star in found.stars:
                base = self._absolute(star, current)
                if base is not None and base not in visited:
                    visited.add(base)
                    pending.append(base)
        return None

    def _star(self, module: str, name: str) -> tuple[str, str] | None:
        """A bare name of `module` that only its star imports can bind."""
        return self._in_module(module, [name], 0)

    def _method(self, module: str, cls: str, method: str, *, skip_own: bool, seen: set[str]) -> tuple[str, str] | None:
        """Where `method` of class `cls` (of `module`) is defined, through the project's base classes."""
        found = self.outline(module)
        if found is None or f"{module}.{cls}" in seen or cls not in found.classes:
            return None
        seen.add(f"{module}.{cls}")
        info = found.classes[cls]
        if not skip_own and method in info.methods:
            return module, f"{cls}.{method}"
        for base in info.bases:
            if base.kind == "class":
                located = self._method(module, base.name, method, skip_own=False, seen=seen)
            else:
                dotted = self._absolute(base, module)
                target = self._definition(dotted, 0) if dotted is not None else None
                located = self._method(*target, method, skip_own=False, seen=seen) if target is not None else None
            if located is not None:
                return located
        return None

    def hierarchy_without_grad(self, module: str, cls: str, method: str) -> bool | None:
        """Whether every call of `self.<method>` that the class `cls` of `module` and its project base classes (in
        any module) make runs with autograd off; None when they make none. A caller runs it with autograd off when
        it is decorated `@torch.no_grad()`, calls it inside a `no_grad` block, or is a base class's method that a
        class nearer `cls` overrides and reaches only through `super()` from a caller that runs with autograd off
        (hanlp's `Component.__call__`, run by `TorchComponent.__call__` under `@torch.no_grad()`). Calls from
        outside the hierarchy are not seen."""
        order = self._hierarchy(module, cls)
        verdicts = [
            self._runs_without_grad(order, index, name, method)
            for index, (owner, owner_cls) in enumerate(order)
            if (outlined := self.outline(owner)) is not None
            for name in outlined.classes[owner_cls].methods
            if (function := outlined.function(f"{owner_cls}.{name}")) is not None
            and Ref("class", owner_cls, method=method) in function.calls
        ]
        return all(verdicts) if verdicts else None

    def runs_without_grad(self, ref: Ref, module: str, method: str) -> bool:
        """Whether `method` of the project class `ref` names (from `module`) runs with autograd off whoever calls
        it: it, as the class or its project bases define it, is decorated `@torch.no_grad()` or
        `@torch.inference_mode()`, or only returns what such a method of the same object returns (`def forward(self,
        x): return self.quantize(x)` with `quantize` decorated)."""
        target = self._class_target(ref, module)
        for _ in range(MAX_REEXPORTS):
            located = self._method(*target, method, skip_own=False, seen=set()) if target is not None else None
            outlined = self.outline(located[0]) if located is not None else None
            span = outlined.spans.get(located[1]) if outlined is not None and located is not None else None
            if span is None or span.without_grad:
                return span is not None
            if span.delegates_to is None:
                return False
            method = span.delegates_to
        return False

    def _class_target(self, ref: Ref, module: str) -> tuple[str, str] | None:
        """(module, class name) of the project class `ref` names from `module`."""
        if ref.kind == "class":
            return module, ref.name
        if ref.kind == "star":
            return self._star(module, ref.name)  # Ex) from .utils import * ... conv2DBatchNormRelu(...)
        dotted = self._absolute(ref, module)
        return self._definition(dotted, 0) if dotted is not None else None

    def _runs_without_grad(self, order: list[tuple[str, str]], index: int, name: str, callee: str) -> bool:
        """Whether the method `name` of the `index`-th class of `order` calls `self.<callee>` with autograd off."""
        owner, cls = order[index]
        outlined = self.outline(owner)
        span = outlined.spans.get(f"{cls}.{name}") if outlined is not None else None
        if span is None:
            return False
        if span.without_grad or callee in span.calls_without_grad:
            return True
        nearer = [
            position
            for position, (other, other_cls) in enumerate(order[:index])
            if (found := self.outline(other)) is not None and name in found.classes[other_cls].methods
        ]
        # Overridden nearer `cls`: run only through `super().<name>(...)` from the override next in line.
        return bool(nearer) and self._runs_without_grad(order, nearer[-1], name, "super")

    def _hierarchy(self, module: str, cls: str) -> list[tuple[str, str]]:
        """`cls` of `module` and its project base classes, nearest first (depth first, as Python's order is for
        single inheritance)."""
        order: list[tuple[str, str]] = []
        pending = [(module, cls)]
        while pending and len(order) < MAX_REEXPORTS * 4:
            owner, name = pending.pop(0)
            outlined = self.outline(owner)
            if (owner, name) in order or outlined is None or name not in outlined.classes:
                continue
            order.append((owner, name))
            bases = [self.class_of(base, owner) for base in outlined.classes[name].bases]
            pending[:0] = [base for base in bases if base is not None]
        return order

    # Callers across the run's files.

    def callers_without_grad(self, module: str, qualname: str) -> bool:
        """Whether every call of the function `qualname` of `module` that the run's files make runs with autograd
        off, and there is one: inside a `no_grad` block or a function decorated so, or in a function whose own
        callers all run it so (up to `MAX_CALLER_HOPS` calls away). A reference that is not a call (a callback, a
        partial, an import under another name), a call in a nested function or through an object that cannot be
        resolved (`registry[k](...).tune()`), or a name in more than `MAX_MENTIONING` files leaves it unknown: no."""
        return self._callers_off(module, qualname, ())

    def _callers_off(self, module: str, qualname: str, path: tuple[tuple[str, str], ...]) -> bool:
        sites = self.call_sites(module, qualname)
        if not sites:
            return False
        for caller, caller_qualname, off in sites:
            if off:
                continue
            if caller_qualname == TOP_LEVEL or len(path) + 1 >= MAX_CALLER_HOPS or (caller, caller_qualname) in path:
                return False
            if not self._callers_off(caller, caller_qualname, (*path, (module, qualname))):
                return False
        return True

    def call_sites(self, module: str, qualname: str) -> list[tuple[str, str, bool]] | None:
        """(caller module, caller qualname, whether autograd is surely off there) for every call of the function
        `qualname` of `module` in the run's files; None when one of its mentions is not a call that resolves."""
        key = (module, qualname)
        if self.members:
            self.note([f"{CALLERS}{module}:{qualname}"])  # what a cached judgement depends on: the files naming it
        if key not in self._sites:
            self._sites[key] = self._call_sites(module, qualname)
        return self._sites[key]

    def _call_sites(self, module: str, qualname: str) -> list[tuple[str, str, bool]] | None:
        name = qualname.rpartition(".")[2]
        candidates = self._mentioning_modules(module, qualname)
        if name.startswith("__") or candidates is None or module not in candidates:
            return None  # a dunder runs implicitly; a function outside the run's files is not looked for
        sites = []
        for member in candidates:
            outlined = self.outline(member)
            found = self.mentions_of(member, name)
            if outlined is None or found is None:
                return None
            for mention in found:
                if not mention.passed and "." not in qualname and self._other_than_function(mention.text, member):
                    continue  # Ex) model.eval() beside a function `eval`: a method of another object
                ref = outlined.ref_of(mention.text, mention.owner) if not mention.passed else None
                if ref is None and not mention.passed and outlined.stars and "." not in mention.text:
                    ref = Ref("star", mention.text)  # bound by a star import (`_other_than_function` checked it)
                target = self.resolve(ref, member) if ref is not None else None
                if target is None:
                    return None  # passed on, or a call of something unresolved that may be this function
                if target == (module, qualname):
                    sites.append((member, mention.qualname, mention.off))
        return sites

    def _other_than_function(self, text: str, module: str) -> bool:
        """Whether a call of `text` in `module` cannot run a function of a module's top level: a method of an object
        that is no imported module (`model.eval()`, `self.evaluate()`), or a bare name that the module neither
        imports nor defines, nor binds by a star import (a builtin: `eval(source)`)."""
        outlined = self.outline(module)
        head, _, rest = text.partition(".")
        if outlined is None or head in outlined.names:
            return False
        if rest:
            return True
        return not outlined.defines(head) and (not outlined.stars or self._star(module, head) is None)

    @cached_property
    def _members_digest(self) -> str:
        files = sorted((str(path), self._member_hash(path)) for path in self._members_read())
        return hashlib.sha256(repr(files).encode()).hexdigest()

    def members_digest(self) -> str:
        """A digest of the run's files and their content: while it holds, so do the callers read from them."""
        return self._members_digest

    def _member_hash(self, path: Path | None) -> str:
        """The content hash of one of the run's files, computed once."""
        if self._member_hashes is None:
            self._member_hashes = {found: content_hash(data) for found, data in self._members_read().items()}
        return self._member_hashes.get(path, "") if path is not None else ""

    def _members_read(self) -> dict[Path, bytes]:
        """The run's files and their content, read once."""
        if self._member_data is None:
            self._member_data = {}
            for path in self.members:
                try:
                    self._member_data[path.resolve()] = path.read_bytes()
                except OSError:
                    continue  # reported by the run itself
        return self._member_data

    def _member_module(self, path: Path) -> str | None:
        """The module name of one of the run's files, or None when that name locates another file (two scripts
        `train.py` in different folders): computed once."""
        if path not in self._member_modules:
            module = self.project.add_file(path)
            self._member_modules[path] = module if self.project.locate(module) == path else None
        return self._member_modules[path]

    def _mentioning_modules(self, module: str, qualname: str) -> list[str] | None:
        """The modules of the run's files that may call the function `qualname` of `module`; None when there are
        too many, or one of them is a file that its module name does not locate (`_member_module`). A method may
        be called wherever its name appears; a function of the module's top level only where its name appears
        bare (`evaluate(...)`, an import of it) or after a dot in a file that imports its module
        (`config.evaluate(...)`): a method of the same name elsewhere (`model.eval()` beside a function `eval`)
        leaves it alone."""
        key = (module, qualname)
        if key not in self._mentioning:
            name = qualname.rpartition(".")[2]
            token = name.encode()
            contents = self._members_read()
            holding = [path for path, data in contents.items() if token in data]  # a fast first sieve
            if "." not in qualname:
                bare = re.compile(rb"(?<![\w.])" + re.escape(name.encode()) + rb"(?!\w)")
                named = re.compile(rb"(?<!\w)" + re.escape(module.rpartition(".")[2].encode()) + rb"(?!\w)")
                dotted = b"." + name.encode()
                holding = [
                    path
                    for path in holding
                    if bare.search(data := contents[path])
                    or (dotted in data and any(named.search(found[0]) for found in _IMPORT.finditer(data)))
                ]
            if len(holding) > MAX_MENTIONING:
                self._mentioning[key] = None
                return None
            modules = [self._member_module(path) for path in holding]
            self._mentioning[key] = None if None in modules else [found for found in modules if found is not None]
        return self._mentioning[key]

    def mentions_of(self, module: str, name: str) -> list[Mention] | None:
        """`mentions` of `name` in the project module `module`; None when it cannot be read."""
        key = (module, name)
        if key not in self._mentions:
            if module not in self._trees:
                source = self.source(module)
                fits = source is not None and len(source[1]) <= MAX_OUTLINE_BYTES
                self._trees[module] = standard_tree(source[1]) if source is not None and fits else None
            else:
                self.source(module)  # recorded as read
            tree = self._trees[module]
            self._mentions[key] = mentions(tree, name) if tree is not None else None
        return self._mentions[key]

    def callers_interface(self, target: str) -> str:
        """The digest of what `call_sites` read for the function `target` (`module:qualname`): which files may call
        it, and their content (a hash, so that a warm run checks it without parsing them)."""
        module, _, qualname = target.partition(":")
        modules = self._mentioning_modules(module, qualname)
        data = [(module, self._member_hash(self.project.locate(module))) for module in modules or ()]
        return hashlib.sha256(repr((modules is None, data)).encode()).hexdigest()

    def affects(self, module: str, qualname: str) -> bool:
        """Whether the function may affect gradient state: its code shows it, or a project function it calls may.

        Read from outlines, so that only such functions' modules are analysed with LibCST.
        Calls that recurse are settled as a fixed point: a False that read a function still
        being decided is kept only once nothing is being decided any more.
        """
        key = (module, qualname)
        if key in self._affects:
            return self._affects[key]
        if key in self._deciding:
            self._read_undecided = True
            return False
        self._deciding.add(key)
        outer, self._read_undecided = self._read_undecided, False
        found = self.outline(module)
        function = found.function(qualname) if found is not None else None
        result = function is not None and (
            function.maybe_effects
            or any(
                (target := self.resolve(ref, module)) is not None and self.affects(*target) for ref in function.calls
            )
        )
        self._deciding.discard(key)
        if result or not self._read_undecided or not self._deciding:
            self._affects[key] = result
        self._read_undecided = outer or self._read_undecided
        return result

    def class_of(self, ref: Ref, module: str) -> tuple[str, str] | None:
        """(module, name) of the project class `ref`, made in `module`, names; None when it names no class."""
        target = self._class_target(ref, module)
        outlined = self.outline(target[0]) if target is not None else None
        return target if target is not None and outlined is not None and target[1] in outlined.classes else None

    def defines_class(self, ref: Ref, module: str) -> bool:
        """Whether `ref` names a class of the project (of `module`, or of another module it imports)."""
        target = self._class_target(ref, module)
        outlined = self.outline(target[0]) if target is not None else None
        return outlined is not None and target is not None and target[1] in outlined.classes

    def bases(self, ref: Ref, module: str) -> tuple[str, ...]:
        """The last names of every base class (transitively) of the project class `ref` names, or () if not one."""
        return tuple(base.name.rpartition(".")[2] for outlined in self._lineage(ref, module) for base in outlined.bases)

    def binds_other(self, ref: Ref, module: str, attribute: str) -> bool:
        """Whether the project class `ref` names, or a project class it derives from, binds `self.<attribute>` to
        something other than a Parameter (its own tensor-like object: `self.weight = FactorizedTensor.new(...)`)."""
        return any(attribute in outlined.binds_other for outlined in self._lineage(ref, module))

    def _lineage(self, ref: Ref, module: str) -> Iterator[ClassOutline]:
        """The outline of the project class `ref` names and of each project class it derives from."""
        target = self._class_target(ref, module)
        pending = [target] if target is not None else []
        seen: set[tuple[str, str]] = set()
        while pending and len(seen) < MAX_REEXPORTS * 4:
            owner, name = pending.pop()
            outlined = self.outline(owner)
            if (owner, name) in seen or outlined is None or name not in outlined.classes:
                continue
            seen.add((owner, name))
            yield outlined.classes[name]
            for base in outlined.classes[name].bases:
                if base.kind == "class":
                    pending.append((owner, base.name))
                else:
                    dotted = self._absolute(base, owner)
                    located = self._definition(dotted, 0) if dotted is not None else None
                    if located is not None:
                        pending.append(located)

    def reached_tokens(self, module: str, qualname: str, tokens: frozenset[bytes]) -> frozenset[bytes]:
        """Which of `tokens` the code of the function, and of the project functions it calls that may affect
        gradients, contains: what a caller's prefilter counts as written, since those functions run there."""
        found: set[bytes] = set()
        pending, seen = [(module, qualname)], {(module, qualname)}
        while pending and found != tokens:
            current = pending.pop()
            outlined = self.outline(current[0])
            function = outlined.function(current[1]) if outlined is not None else None
            if function is None or not self.affects(*current):
                continue
            code = outlined.code(current[1])  # type: ignore[union-attr]  # function is not None
            found.update(token for token in tokens if token in code)
            for ref in function.calls:
                target = self.resolve(ref, current[0])
                if target is not None and target not in seen:
                    seen.add(target)
                    pending.append(target)
        return frozenset(found)

    def analysed(self, module: str, qualname: str) -> bool:
        """Whether the function deserves a LibCST summary: it may affect gradients, or its name says it computes a
        loss or runs a forward or training step, whose returned value a caller may keep or backpropagate."""
        return self.affects(module, qualname) or RETURNS_GRAPH.search(qualname.rpartition(".")[2]) is not None

    def worth_reading(self, module: str, qualname: str) -> bool:
        """Whether a LibCST summary of the function may say more than `analysed` asks of it: it is a method that
        may keep what it is passed, it may return an object it builds, or a value cut from autograd history."""
        found = self.outline(module)
        function = found.function(qualname) if found is not None else None
        return function is not None and (function.maybe_keeps or function.maybe_builds or function.maybe_cuts)
