"""What names and attributes hold: optimizers, GradScalers, models and loss functions."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from enum import Enum
from functools import cached_property

import libcst as cst

from gradlint.analysis.syntax.collect import Collected
from gradlint.analysis.syntax.names import ImportMap, dotted_name, last_name
from gradlint.analysis.syntax.refs import all_params, arguments_of
from gradlint.analysis.syntax.tree import descendants
from gradlint.frameworks import KNOWN_OPTIMIZERS


class Role(Enum):
    """The kind of object a symbol holds, as far as gradient bugs are concerned."""

    OPTIMIZER = "optimizer"
    SCALER = "scaler"
    MODEL = "model"
    LOSS_FN = "loss function"
    OTHER = "other"  # known to be something else: blocks guesses from the name


# torch.distributed.optim.DistributedOptimizer keeps gradients per autograd context.
NOT_OPTIMIZERS = frozenset({"DistributedOptimizer"})
SCALERS = frozenset({"GradScaler", "ShardedGradScaler"})
# Method calls that return the module they are called on.
MODULE_PASSTHROUGH = frozenset(
    {"to", "cuda", "cpu", "train", "eval", "float", "half", "double", "bfloat16", "requires_grad_", "to_empty"}
)
# Calls that hand back the object they wrap, with the same role.
# `copy.deepcopy(model)` (a target or EMA network) is a model of its own with the same role.
WRAPPERS = frozenset({"compile", "prepare", "DataParallel", "DistributedDataParallel", "DDP", "deepcopy"})
MODEL_BASES = frozenset(
    {
        "Module",
        "LightningModule",
        "PreTrainedModel",
        "Sequential",
        "ModuleList",
        "ModuleDict",
        "DistributedDataParallel",
        "DataParallel",
    }
)
NON_MODEL_NN = frozenset({"Parameter", "ParameterList", "ParameterDict", "Buffer", "init", "functional", "utils"})
# Expressions whose value is computed data: arithmetic, a sign, a comparison.
COMPUTED = (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison)
ARGUMENT_PARSERS = re.compile(r"parse_(known_)?args|parse_opts?|get_args|get_opts|get_config|Namespace|EasyDict")

# What only a torch module answers to together: a mode switch and its parameters or state, or a switch, a move
# and a call.
MODE_SWITCHES = frozenset({"eval", "train"})
# Methods only an nn.Module has: an object they are called on is one.
MODULE_ONLY_METHODS = frozenset(
    {
        "parameters", "named_parameters", "children", "named_children", "modules", "named_modules",
        "register_buffer", "register_parameter", "register_forward_hook", "register_forward_pre_hook", "add_module",
    }
)  # fmt: skip
# With a mode switch, a module's state too (an optimizer has these, but no `eval()`).
MODULE_STATE_METHODS = MODULE_ONLY_METHODS | {"state_dict", "load_state_dict", "zero_grad", "requires_grad_"}
MOVES = frozenset({"to", "cuda", "cpu", "half"})
OPTIMIZER_NAME = re.compile(
    r"(optimizer|optimiser|optim|opt)s?"
    r"(_?[A-Z]|_?\d+|_(g|d|gen|disc|generator|discriminator|enc|dec|encoder|decoder|actor|critic|policy|value|q|pi|v|model|net|main|alpha|[a-z]))?"
    r"|[A-Za-z0-9]+_(optimizer|optimiser|optim|opt)|optimizer[A-Z]\w*"
)
SCALER_NAME = re.compile(r"(grad_|amp_|loss_)?scaler")
MODEL_NAME = re.compile(
    r"(?i)(\w+_)?(model|net|network|encoder|decoder|generator|discriminator|critic|actor|policy|backbone|classifier|"
    r"unet|vae|student|teacher|transformer|qnet|q_net)(_\w+)?\d*|net[GD]|[GD]|[GD]_[A-Za-z]+"
)
# `encoder_out`, `model_outputs`, `policy_loss`: named after a model, holding what it computed.
COMPUTED_SUFFIX = re.compile(
    r"(?i).*_(out|outs|output|outputs|logits|feat|feats|features|loss|losses|pred|preds|state|states|hidden|emb|"
    r"embeds?|embedding|embeddings|path|dir|name|cfg|config|type|args|kwargs|dim|lr|params|grads?|inputs?|mask|"
    r"tokens?|ids|weights?|value|values|probs|scores?|result|results)"
)
# `save_model`, `load_encoder`, `build_network`: a method or function named for what it does to a model.
ACTION_PREFIX = re.compile(
    r"(?i)(save|load|get|set|build|make|create|init|initialize|reset|update|export|print|log|freeze|unfreeze|"
    r"copy|clone|wrap|prepare|setup|compile|sync|to|from|num|count)_"
)
# Callables named like loss functions; `evaluate_loss(...)`, `log_loss(...)` report numbers.
LOSS_NAME = re.compile(
    r"(?i)(?!(eval|evaluate|val|valid|validate|validation|test|log|print|plot|report|record|track|avg|average|mean)_)"
    r"(criterion|crit|loss|loss_?fn|loss_?func(tion)?|(compute|calc|calculate|get)_loss|\w+_criterion|\w+_loss(_fn|_func)?)"
)

ANNOTATION_ROLES = {
    "Optimizer": Role.OPTIMIZER,
    "GradScaler": Role.SCALER,
    "Module": Role.MODEL,
    "LightningModule": Role.MODEL,
}


# How many attributes deep `Roles.values_of` follows the classes that built each object (`model.encoder.embedding`).
MAX_ATTRIBUTE_CHAIN = 4


class Roles:
    """Answers which role an expression's symbol holds, from assignments, annotations and names."""

    def __init__(
        self,
        collected: Collected,
        project_bases: Callable[[str], tuple[str, ...] | None] | None = None,
        project_returns: Callable[[str], str | None] | None = None,
    ) -> None:
        self.imports: ImportMap = collected.imports
        self.collected = collected
        # The bases of a class another module of the project defines (from the whole-program model).
        self.project_bases = project_bases
        # The role (a `Role` value) of what a function of another module of the project returns, from its summary.
        self.project_returns = project_returns
        self._returned: dict[cst.FunctionDef, Role | None] = {}
        self.values: dict[str, list[cst.BaseExpression]] = {}
        # What the methods of each class of the module bind `self.<attribute>` to.
        self._attributes: dict[tuple[cst.ClassDef, str], list[cst.BaseExpression]] = {}
        self.annotations: dict[str, Role] = {}
        self.classes = {cls.name.value: cls for cls in collected.classes}
        self.module_functions = {
            f.name.value: f for f in collected.functions if collected.def_scopes.get(f) is collected.module
        }
        # Names the module binds by `def` or by an import: functions and other modules' objects, whose name proves
        # nothing about what they are (`save_best_model(...)` saves a checkpoint).
        self.not_by_name = frozenset(
            {f.name.value for f in collected.functions if collected.def_scopes.get(f) is collected.module}
            | set(collected.imports.aliases)
            | set(collected.imports.relative)
        )
        # Names given to more than one class (a `ToyModel` in each test): which one a call builds is unknown.
        counts = Counter(cls.name.value for cls in collected.classes)
        self.redefined = frozenset(name for name, count in counts.items() if count > 1)
        self._cache: dict[str, Role | None] = {}
        self._computing: set[str] = set()
        for statement in collected.statements:
            self._record_statement(statement)
        for function in collected.functions:
            for param in (*function.params.params, *function.params.kwonly_params, *function.params.posonly_params):
                self._record_annotation(param.name.value, param.annotation)
        for loop in collected.loops:
            if isinstance(loop, cst.For):
                self._record_for(loop)
        self.optimized = self._optimized_modules(collected.calls)

    @cached_property
    def used_as_modules(self) -> frozenset[str]:
        """Names the module uses as torch modules, whatever they are called (see `_used_as_modules`); read only
        where neither a construction nor an annotation decides."""
        return _used_as_modules(self.collected.calls)

    def _optimized_modules(self, calls: list[cst.Call]) -> frozenset[str]:
        """Names whose `.parameters()` an optimizer is built on: modules, whatever they are called."""
        found: set[str] = set()
        for call in calls:
            qualified = self.imports.resolve(call.func) or ""
            name = qualified.rsplit(".", 1)[-1] if qualified else last_name(call.func) or ""
            if not _is_optimizer_constructor(qualified, name) or not call.args:
                continue
            # Ex) torch.optim.Adam(params=self.agent.parameters(), lr=...)
            first = call.args[0].value
            if not isinstance(first, cst.Call) or first.args or not isinstance(first.func, cst.Attribute):
                continue
            if first.func.attr.value == "parameters":
                found.add(dotted_name(first.func.value) or "")
        return frozenset(found - {"", "self"})  # `self` is judged by its class, not by its optimizer

    def _record_statement(self, statement: cst.BaseSmallStatement) -> None:
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                self._record_target(target.target, statement.value, statement)
        elif isinstance(statement, cst.AnnAssign):
            self._record_annotation(dotted_name(statement.target), statement.annotation)
            if statement.value is not None:
                self._record_target(statement.target, statement.value, statement)

    def _record_target(self, target: cst.BaseExpression, value: cst.BaseExpression, at: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            # Each name takes its own element; what a call returns as a whole (`optimizer, scheduler =
            # model.get_optimizer()`) says nothing of one element.
            sources = _elements(_unwrap_prepare(value))
            if sources and len(sources) == len(target.elements):
                for element, source in zip(target.elements, sources, strict=True):
                    self._record_target(element.value, source, at)
            return
        key = dotted_name(target)
        if key is not None:
            given = self._constructor_arguments(value, at) or [value]
            self.values.setdefault(key, []).extend(given)
            owner = self._method_owner(at)
            if owner is not None and key.startswith("self.") and key.count(".") == 1:
                self._attributes.setdefault((owner, key[len("self.") :]), []).extend(given)

    def _method_owner(self, at: cst.CSTNode) -> cst.ClassDef | None:
        """The class whose method `at` is written in."""
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        return self.collected.owners.get(function) if function is not None else None

    def values_of(self, key: str) -> list[cst.BaseExpression]:
        """What the module binds `key` to: its own assignments, or, for an attribute of an object built by one class
        of the module (`model.encoder.embedding` after `model = Recommender()`), what that class's methods bind
        `self.<attribute>` to (`self.embedding = nn.Embedding(n, d)` in the class that built `model.encoder`)."""
        if key in self.values:
            return self.values[key]
        owner, _, attribute = key.rpartition(".")
        if not owner or owner == "self" or key.count(".") > MAX_ATTRIBUTE_CHAIN:
            return []
        built = {
            value.func.value
            for value in self.values_of(owner)
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
        }
        values = self.values_of(owner)
        if len(built) != 1 or len(values) != sum(isinstance(v, cst.Call) for v in values):
            return []  # built by other means too, or by two classes: which attributes it has is unknown
        (name,) = built
        cls = self.classes.get(name)
        if cls is None or name in self.redefined:
            return []
        return self._attributes.get((cls, attribute), [])

    def _constructor_arguments(self, value: cst.BaseExpression, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """What this module's constructions of a class pass for the `__init__` parameter that `value` names
        (`self.denoiser = denoiser` in `Sampler.__init__`, `Sampler(UNet(...))`): the object the attribute holds.
        Empty where the module never builds the class, or `value` is no parameter of a constructor."""
        if not isinstance(value, cst.Name):
            return []
        context = self.collected.contexts.get(at)
        function = context.function if context is not None else None
        if function is None or function.name.value != "__init__" or value.value not in all_params(function):
            return []
        owner = self.collected.owners.get(function)
        if owner is None or owner.name.value in self.redefined:
            return []
        passed = (
            arguments_of(function, call, constructor=True).get(value.value)
            for call in self._constructions.get(owner.name.value, [])
        )
        return [argument for argument in passed if argument is not None]

    @cached_property
    def _constructions(self) -> dict[str, list[cst.Call]]:
        """The calls of this module that build one of its classes (`Trainer(net, opt)`), by class name."""
        found: dict[str, list[cst.Call]] = {}
        for call in self.collected.calls:
            if isinstance(call.func, cst.Name) and call.func.value in self.classes:
                found.setdefault(call.func.value, []).append(call)
        return found

    def _record_annotation(self, key: str | None, annotation: cst.Annotation | None) -> None:
        if key is None or annotation is None:
            return
        name = last_name(annotation.annotation)
        if name in ANNOTATION_ROLES:
            self.annotations[key] = ANNOTATION_ROLES[name]

    def _record_for(self, loop: cst.For) -> None:
        pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = [(loop.target, loop.iter)]
        if isinstance(loop.target, (cst.Tuple, cst.List)) and isinstance(loop.iter, cst.Call):
            # Ex) for head, stride in zip(self.heads, strides); for i, head in enumerate(self.heads)
            targets: list[cst.BaseExpression] = [element.value for element in loop.target.elements]
            iterables = [arg.value for arg in loop.iter.args if not arg.star and arg.keyword is None]
            if last_name(loop.iter.func) == "zip":
                pairs = list(zip(targets, iterables, strict=False))
            elif last_name(loop.iter.func) == "enumerate" and len(targets) == 2 and iterables:
                pairs = [(targets[1], iterables[0])]
        for target, iterable in pairs:
            elements = _elements(iterable) or self._container_items(iterable)
            if elements and isinstance(target, (cst.Name, cst.Attribute)):
                for element in elements:
                    self._record_target(target, element, loop)

    def _container_items(self, iterable: cst.BaseExpression) -> list[cst.BaseExpression]:
        """What iterating a torch module container yields, where the module shows how it was built:
        `self.heads = nn.ModuleList(nn.Conv2d(c, 24, 1) for c in channels)`, then `for head in self.heads`."""
        key = dotted_name(iterable)
        items: list[cst.BaseExpression] = []
        for value in self.values_of(key) if key is not None else []:
            if not isinstance(value, cst.Call):
                continue
            container = self.imports.resolve(value.func) or ""
            given = [arg.value for arg in value.args if not arg.star and arg.keyword is None]
            if container == "torch.nn.ModuleList" and len(given) == 1:
                listed = given[0]
                items += [listed.elt] if isinstance(listed, (cst.ListComp, cst.GeneratorExp)) else _elements(listed)
            elif container == "torch.nn.Sequential":
                items += given
        return items

    def role(self, node: cst.BaseExpression) -> Role | None:
        """The role of the object `node` evaluates to, or None when unknown."""
        key = dotted_name(node)
        if key is None:
            return self.role_of_value(node)
        if key not in self._cache:
            if key in self._computing:
                return None
            self._computing.add(key)
            self._cache[key] = self._role_of_key(key)
            self._computing.discard(key)
        return self._cache[key]

    def runs_model(self, callee: cst.BaseExpression, call: cst.Call, roles: tuple[Role, ...] = (Role.MODEL,)) -> bool:
        """Whether `call` of `callee` runs a module (a model, or with `roles` a loss too): `callee` holds one. A
        forward takes inputs: a call with no arguments (`quantizer.true_model_size()`) runs one only where the
        module is proven, never by a name alone."""
        role = self.role(callee)
        return role in roles and (bool(call.args) or self.proven_role(callee) is role)

    def proven_role(self, node: cst.BaseExpression) -> Role | None:
        """The role of `node` when an annotation or the call that built it shows it; never a guess from a name."""
        return self._proven_role(node, set())

    def _proven_role(self, node: cst.BaseExpression, seen: set[str]) -> Role | None:
        value = _unwrap_passthrough(node)
        key = dotted_name(value)
        if key is None:
            if not isinstance(value, cst.Call):
                return None
            qualified = self.imports.resolve(value.func) or ""
            name = qualified.rsplit(".", 1)[-1] if qualified else last_name(value.func) or ""
            if name in WRAPPERS and len(value.args) == 1:
                return self._proven_role(value.args[0].value, seen)
            return self._role_of_constructor(qualified, name, dotted_name(value.func))
        if key in self.annotations:
            return self.annotations[key]
        if key in seen:
            return None
        seen.add(key)
        roles = {self._proven_role(source, seen) for source in self.values_of(key)}
        return roles.pop() if len(roles) == 1 else None

    def _role_of_key(self, key: str) -> Role | None:
        if key in self.annotations:
            return self.annotations[key]
        roles = {self.role_of_value(value, factories=True) for value in self.values_of(key)} - {None}
        if key in self.optimized and not roles & {Role.OPTIMIZER, Role.SCALER}:
            # What an optimizer trains is a model, whatever its class is called (`ModelWithLoss`).
            return Role.MODEL
        for role in (Role.OPTIMIZER, Role.SCALER, Role.LOSS_FN, Role.MODEL, Role.OTHER):
            if role in roles:
                return role
        if "." not in key and key in self.classes:
            return None  # a class, not an instance of it
        if key.partition(".")[0] in self.not_by_name:
            return Role.MODEL if key in self.optimized else None
        named = _role_from_name(key.rsplit(".", 1)[-1])
        if named is None and (key in self.optimized or key in self.used_as_modules):
            return Role.MODEL
        return named

    def role_of_value(self, value: cst.BaseExpression, *, factories: bool = False) -> Role | None:
        """The role of the object an expression creates or refers to. `factories`: a call of a function of another
        module counts as what its summary proves it returns (asked for what a name is bound to, where a role
        matters, since it may read that module)."""
        value = _unwrap_passthrough(value)
        if isinstance(value, cst.Subscript) and _lightning_optimizers(value.value):
            return Role.OPTIMIZER  # self.optimizers()[0]
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self.role(value) if dotted_name(value) else None
        if _lightning_optimizers(value):
            return Role.OPTIMIZER  # a LightningModule's accessor of the optimizers it configured
        if not isinstance(value, cst.Call):
            # Arithmetic and comparisons compute data (`g = x @ self.w`), never a module, whatever the name says.
            return Role.OTHER if isinstance(value, (cst.BaseNumber, cst.BaseString, cst.Dict, *COMPUTED)) else None
        qualified = self.imports.resolve(value.func) or ""
        name = qualified.rsplit(".", 1)[-1] if qualified else last_name(value.func) or ""
        if name in WRAPPERS and len(value.args) == 1:
            inner = self.role_of_value(value.args[0].value, factories=factories)
            if inner is not None:
                return inner
        return self._role_of_constructor(qualified, name, dotted_name(value.func), factories=factories)

    def _role_of_constructor(
        self, qualified: str, name: str, local: str | None = None, *, factories: bool = True
    ) -> Role | None:
        if name in NOT_OPTIMIZERS or ARGUMENT_PARSERS.fullmatch(name):
            return Role.OTHER
        if name in SCALERS:
            return Role.SCALER
        if _is_optimizer_constructor(qualified, name):
            return Role.OPTIMIZER
        if name.endswith("Loss") or (name in self.classes and self._inherits(name, ("Loss",))):
            return Role.LOSS_FN
        if name in self.classes:
            if self._inherits(name, tuple(MODEL_BASES)):
                return Role.MODEL
            # A class of this module with no base (or only `object`) is no torch object, whatever it is called.
            return Role.OTHER if name not in self.redefined and _plain_class(self.classes[name]) else None
        if _is_model_constructor(qualified, name):
            return Role.MODEL
        if self.project_bases is not None and local is not None:
            # A class is known by what it derives from, not by a capital letter (`conv2DBatchNormRelu(...)`).
            bases = self.project_bases(local) or ()
            if any(base.endswith("Loss") for base in bases):
                return Role.LOSS_FN
            if any(base in MODEL_BASES for base in bases):
                return Role.MODEL  # Ex) from treelstm.model import SimilarityTreeLSTM (an nn.Module)
        # A factory proves what it builds by what it returns: `make_optimizer(model)` returning `torch.optim.Adam(...)`.
        if not factories or local is None:
            return None
        if local in self.module_functions and local not in self.imports.aliases:
            return self.returned_role(self.module_functions[local])
        if self.project_returns is not None:
            returned = self.project_returns(local)
            return Role(returned) if returned is not None else None
        return None

    def returned_role(self, function: cst.FunctionDef) -> Role | None:
        """The role of what a function of this module returns, when every `return` proves the same one
        (an optimizer, a GradScaler, a model): a factory that builds the object, or a name bound to one."""
        if function in self._returned:
            return self._returned[function]
        self._returned[function] = None  # recursion guard
        returned = [
            node.value
            for node in descendants(function)
            if isinstance(node, cst.Return)
            and node.value is not None
            and (context := self.collected.contexts.get(node)) is not None
            and context.scope is function
        ]
        roles = {self.proven_role(value) for value in returned}
        found = roles.pop() if len(roles) == 1 else None
        self._returned[function] = found if found in (Role.OPTIMIZER, Role.SCALER, Role.MODEL) else None
        return self._returned[function]

    def _inherits(self, class_name: str, suffixes: tuple[str, ...], depth: int = 0) -> bool:
        cls = self.classes.get(class_name)
        if cls is None or depth > 8:
            return False
        for base in cls.bases:
            base_name = last_name(base.value) or ""
            dotted = dotted_name(base.value)
            elsewhere = (
                self.project_bases(dotted)
                if self.project_bases is not None and dotted is not None and base_name not in self.classes
                else None
            )
            if base_name in self.classes and base_name != class_name:
                # A class of this module is known by what it derives from, not by its name.
                if self._inherits(base_name, suffixes, depth + 1):
                    return True
            elif elsewhere is not None:
                # So is a class of another module of the project: `class BaseModule:` (a plain class) makes no
                # model of `SpectrogramModule(BaseModule)`.
                if any(name.endswith(suffixes) for name in elsewhere):
                    return True
            elif base_name.endswith(suffixes):
                return True  # torch's, a framework's, or a library's class gradlint cannot read: by its name
        return False

    def lineage(self, cls: cst.ClassDef) -> set[cst.ClassDef]:
        """`cls` and the classes of this module it derives from, by name."""
        found, pending = set(), [cls]
        while pending:
            current = pending.pop()
            if current not in found:
                found.add(current)
                pending.extend(
                    self.classes[name] for base in current.bases if (name := dotted_name(base.value)) in self.classes
                )
        return found

    def constructors(self, node: cst.BaseExpression) -> list[cst.Call]:
        """The calls that built the object `node`'s symbol holds anywhere in the module."""
        key = dotted_name(node)
        built = [constructor_of(value) for value in self.values_of(key)] if key else []
        return [call for call in built if call is not None]

    def is_model_class(self, cls: cst.ClassDef) -> bool:
        """True for a class of this module that subclasses nn.Module (directly or not)."""
        return self._inherits(cls.name.value, tuple(MODEL_BASES))

    def is_optimizer(self, node: cst.BaseExpression) -> bool:
        """True when `node` holds an optimizer."""
        return self.role(node) is Role.OPTIMIZER

    def is_scaler(self, node: cst.BaseExpression) -> bool:
        """True when `node` holds a GradScaler."""
        return self.role(node) is Role.SCALER


def _is_optimizer_constructor(qualified: str, name: str) -> bool:
    if qualified.startswith("torch.optim.") and "lr_scheduler" not in qualified and "swa_utils" not in qualified:
        return name[:1].isupper()
    if name in KNOWN_OPTIMIZERS or name.endswith("Optimizer"):
        return True
    lowered = name.lower()
    return ("optimizer" in lowered or "optimiser" in lowered) and not lowered.endswith(("step", "zero_grad"))


def _is_model_constructor(qualified: str, name: str) -> bool:
    if qualified.startswith(("torch.nn.", "nn.")) and name[:1].isupper():
        return name not in NON_MODEL_NN
    if qualified.startswith(("torchvision.models.", "timm.")) or name == "create_model":
        return True
    if name == "from_pretrained":
        owner = qualified.rsplit(".", 2)[-2] if qualified.count(".") else ""
        return "Model" in owner or "For" in owner
    return False


def _used_as_modules(calls: list[cst.Call]) -> frozenset[str]:
    """Names the module uses as torch modules, whatever they are called: switched to `eval()` or `train()` and
    asked for their parameters or state, or switched, moved and called (`trainedModel.to(device);
    trainedModel.eval(); trainedModel(x)`). A switch and a move alone prove nothing (a graph object of a graph
    library has both), nor a switch and a call (a project object may have its own `eval`)."""
    switched: set[str] = set()
    stated: set[str] = set()
    moved: set[str] = set()
    called: set[str] = set()
    for call in calls:
        func = call.func
        key = dotted_name(func.value) if isinstance(func, cst.Attribute) else dotted_name(func)
        if key is None:
            continue
        if not isinstance(func, cst.Attribute):
            called.add(key)
        elif func.attr.value in MODE_SWITCHES and (not call.args or _is_bool_literal(call.args[0].value)):
            switched.add(key)
        elif func.attr.value in MODULE_STATE_METHODS:
            stated.add(key)
        elif func.attr.value in MOVES:
            moved.add(key)
    return frozenset((switched & (stated | (moved & called))) - {"self"})


def _is_bool_literal(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value in ("True", "False")


def _role_from_name(name: str) -> Role | None:
    if OPTIMIZER_NAME.fullmatch(name):
        return Role.OPTIMIZER
    if SCALER_NAME.fullmatch(name):
        return Role.SCALER
    if LOSS_NAME.fullmatch(name):
        return Role.LOSS_FN
    if MODEL_NAME.fullmatch(name) and not COMPUTED_SUFFIX.fullmatch(name) and not ACTION_PREFIX.match(name):
        return Role.MODEL  # `model`, `netD`; not `encoder_out`, `model_path` or `save_model`
    return None


def _plain_class(cls: cst.ClassDef) -> bool:
    """A class that derives from nothing but `object`, nor takes a metaclass."""
    return (
        all(
            isinstance(base.value, cst.Name) and base.value.value == "object" and base.keyword is None
            for base in cls.bases
        )
        and not cls.keywords
    )


def constructor_of(value: cst.BaseExpression) -> cst.Call | None:
    """The call that built the object `value` evaluates to, seen through `.to(device)` and wrappers."""
    value = _unwrap_passthrough(value)
    while isinstance(value, cst.Call) and last_name(value.func) in WRAPPERS and len(value.args) == 1:
        value = _unwrap_passthrough(value.args[0].value)
    return value if isinstance(value, cst.Call) else None


def _lightning_optimizers(value: cst.BaseExpression) -> bool:
    """`self.optimizers()`: Lightning hands back the optimizer (or the list of them) it configured."""
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "optimizers"
        and isinstance(value.func.value, cst.Name)
        and value.func.value.value == "self"
    )


def _unwrap_passthrough(value: cst.BaseExpression) -> cst.BaseExpression:
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in MODULE_PASSTHROUGH
    ):
        value = value.func.value
    return value


def _unwrap_prepare(value: cst.BaseExpression) -> cst.BaseExpression:
    # `model, opt = accelerator.prepare(model, opt)` hands back its arguments in order.
    if isinstance(value, cst.Call) and last_name(value.func) in ("prepare", "setup", "initialize"):
        return cst.Tuple([cst.Element(arg.value) for arg in value.args if arg.keyword is None])
    return value


def _elements(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(value, (cst.Tuple, cst.List)):
        return [element.value for element in value.elements]
    return []
