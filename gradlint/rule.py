"""The Rule base class, the Diagnostic it produces, and the registry of rules."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, metadata
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urljoin

from gradlint.measured import in_preview, precision_text

if TYPE_CHECKING:
    import libcst as cst

    from gradlint.analysis import ModuleAnalysis
    from gradlint.analysis.facts.steps import TrainingStep

# The labels of gradlint's `[project.urls]` entries that say where docs/ is published and
# where the project lives; packaging tools may lowercase labels (PEP 753).
DOCUMENTATION_LABELS = ("documentation", "docs")
HOMEPAGE_LABELS = ("homepage", "repository", "source")
# The two codes that are not rules: a file that cannot be read or parsed, and gradlint's own failure.
PARSE_ERROR = ("GL000", "parse-error")
INTERNAL_ERROR = ("GL999", "internal-error")


@dataclass(frozen=True)
class Edit:
    """Replace the text between two 1-based (line, column) positions with `text`."""

    line: int
    column: int
    end_line: int
    end_column: int
    text: str


@dataclass(frozen=True)
class Fix:
    """A change that resolves a diagnostic; `safe` fixes are applied by `--fix`."""

    description: str
    edits: tuple[Edit, ...]
    safe: bool = True


@dataclass(frozen=True)
class Related:
    """Another place in the code that explains a finding: where a value got its graph, the backward that freed it.

    `path` is the finding's file unless the place is in another; `cell` as in Diagnostic.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    note: str
    cell: int | None = None


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding. Lines and columns are 1-based, as flake8, ruff and SARIF print them.

    In a notebook, `cell` is the 1-based index of the cell among all cells of the file and
    `line` counts within that cell; it sits right after `path` so findings sort by cell.
    """

    path: str
    cell: int | None = field(default=None, kw_only=True)
    line: int
    column: int
    code: str
    end_line: int = field(compare=False)
    end_column: int = field(compare=False)
    name: str = field(compare=False)
    message: str = field(compare=False)
    fix: Fix | None = field(default=None, compare=False)
    related: tuple[Related, ...] = field(default=(), compare=False, kw_only=True)


def tool_diagnostic(kind: tuple[str, str], path: str, line: int, column: int, message: str) -> Diagnostic:
    """A finding of gradlint itself (PARSE_ERROR or INTERNAL_ERROR): one position, no fix."""
    code, name = kind
    return Diagnostic(path, line, column, code, end_line=line, end_column=column, name=name, message=message)


@dataclass(frozen=True)
class Reported:
    """What a rule reported, before the engine turns nodes into positions."""

    node: cst.CSTNode
    message: str
    fix: Fix | None
    related: tuple[tuple[cst.CSTNode, str], ...]


QUIET_IN_TESTS = (
    "Not reported inside tests, as pytest and unittest collect them (a `test*` function or `Test*` class\n"
    "of a `test_*.py` file, by the project's own pytest patterns, or a `test*` method of a `TestCase`):\n"
    "a test runs a tiny model once, and often does on purpose what a training loop must not. A script's\n"
    "`def test(epoch):` is evaluation code. See docs/how-it-works.md."
)


class Rule:
    """Base class of every rule; subclasses are registered when they are defined.

    A rule implements any of `check_module()`, `check_step(step)` and typed
    `visit_<LibCST node>(node)` hooks. The engine calls them once the shared analysis
    of the module is complete, so every hook can query `self.analysis`.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    example: ClassVar[str]
    use_instead: ClassVar[str]
    # Byte strings that must all occur in a file for this rule to be able to fire; an
    # entry that is a tuple of byte strings needs any one of them. The engine runs a rule
    # only on files that hold them, and parses no file that no enabled rule could fire on.
    requires: ClassVar[tuple[bytes | tuple[bytes, ...], ...]] = ()
    # The name of a screen in `gradlint.screens`: a shape, read with CPython's parser, that a
    # file must have for this rule's own findings (GL009's evaluation loops). A file that only
    # screened rules could fire on is parsed with LibCST only when one of their screens passes.
    screen: ClassVar[str] = ""
    # A rule about waste or loop hygiene (a kept graph, a missing no_grad, a retained graph)
    # stays quiet inside test functions, which run a tiny model once and often do on purpose
    # what a training loop must not (two backwards to test accumulation).
    quiet_in_tests: ClassVar[bool] = False

    registry: ClassVar[dict[str, type[Rule]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.code in Rule.registry:
            raise TypeError(f"duplicate rule code {cls.code}: {cls.__name__}")
        Rule.registry[cls.code] = cls

    def __init__(self, analysis: ModuleAnalysis) -> None:
        self.analysis = analysis
        self.reported: list[Reported] = []

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        fix: Fix | None = None,
        related: Sequence[tuple[cst.CSTNode, str]] = (),
    ) -> None:
        """Record a finding at `node`, with this rule's message unless a variant is given.

        `related` are (node, note) pairs: the other places of this module that explain the
        finding, in the order a reader should visit them.
        """
        if self.quiet_in_tests and self.analysis.in_test(node):
            return
        self.reported.append(Reported(node, message or self.message, fix, tuple(related)))

    def check_module(self) -> None:
        """Hook: called once per module."""

    def check_step(self, step: TrainingStep) -> None:
        """Hook: called once for every training step the analysis found."""

    @classmethod
    def summary(cls) -> str:
        """The first line of the rule's documentation."""
        lines = (cls.__doc__ or "").strip().splitlines()
        return lines[0] if lines else ""  # a plugin's rule may have no docstring

    @classmethod
    def documentation(cls) -> str:
        """The rule's full user documentation: docstring, example and fix, then where it is published."""
        return with_docs_link(cls.documentation_body(), cls.anchor())

    @classmethod
    def documentation_body(cls) -> str:
        """The documentation without the link to where it is published (which the installed metadata names)."""
        return (
            f"{cls.code} {cls.name}\n\n{cls._doc()}\n\n"
            f"Example\n{textwrap.indent(textwrap.dedent(cls.example).strip(), '    ')}\n\n"
            f"Use instead\n{textwrap.indent(textwrap.dedent(cls.use_instead).strip(), '    ')}\n"
        )

    @classmethod
    def _doc(cls) -> str:
        doc = inspect.cleandoc(cls.__doc__ or "")
        doc = f"{doc}\n\nIn tests\n{QUIET_IN_TESTS}" if cls.quiet_in_tests else doc
        return f"{doc}\n\nPrecision on fresh code\n{textwrap.fill(precision_text(cls.code), 88)}"

    @classmethod
    def in_preview(cls) -> bool:
        """Whether the rule is off by default (`gradlint.measured`): it runs with `--preview` or its code selected."""
        return in_preview(cls.code)

    @classmethod
    def anchor(cls) -> str:
        """The rule's anchor in docs/rules.md: its heading as GitHub links it."""
        return rule_anchor(cls.code, cls.name)

    @classmethod
    def docs_url(cls) -> str | None:
        """The rule's section of docs/rules.md where it is published, or None if no one says where."""
        return docs_url(cls.anchor())

    @classmethod
    def markdown(cls) -> str:
        """The rule's documentation as a Markdown section of docs/rules.md."""
        summary, _, body = cls._doc().partition("\n")
        body = re.sub(
            r"^(Why is this bad\?|Known problems|Fix safety|Options|References|In tests)$",
            r"\n### \1\n",
            body,
            flags=re.M,
        )
        return (
            f"## {cls.code} {cls.name}\n\n{summary}\n{body}\n\n"
            f"Example:\n\n```python\n{textwrap.dedent(cls.example).strip()}\n```\n\n"
            f"Use instead:\n\n```python\n{textwrap.dedent(cls.use_instead).strip()}\n```\n"
        )


def rule_anchor(code: str, name: str) -> str:
    """The anchor of a rule's section of docs/rules.md: its heading, as GitHub links it."""
    return f"{code}-{name}".lower()


def is_builtin(rule: type[Rule]) -> bool:
    """Whether `rule` is one of gradlint's own rules, not registered by a plugin or a test."""
    return rule.__module__.startswith(f"{__package__}.rules.")


def docs_url(anchor: str) -> str | None:
    """The URL of the section `anchor` of docs/rules.md where it is published, or None if no one says where.

    The `Documentation` URL of gradlint's `[project.urls]` names where the docs/ folder
    is published; without one no link is made up, and `gradlint rule CODE` prints
    the same text.
    """
    base = project_url(*DOCUMENTATION_LABELS)
    return None if base is None else urljoin(base.rstrip("/") + "/", f"rules.md#{anchor}")


def with_docs_link(body: str, anchor: str) -> str:
    """A rule's documentation `body`, followed by the link to its published section when there is one."""
    url = docs_url(anchor)
    return f"{body}\nDocumentation: {url}\n" if url else body


@cache
def project_url(*labels: str) -> str | None:
    """The URL of gradlint's first `[project.urls]` entry labelled one of `labels` (lowercase), or None.

    Read from the installed package metadata, where pyproject.toml's table ends up.
    """
    try:
        entries: list[str] = metadata("gradlint").get_all("Project-URL") or []
    except PackageNotFoundError:  # run from a source tree that was never installed
        return None
    for entry in entries:
        label, _, url = entry.partition(",")
        if label.strip().lower() in labels and url.strip():
            return url.strip()
    return None


def all_rules() -> dict[str, type[Rule]]:
    """Every registered rule by code, sorted by code."""
    import gradlint.rules  # noqa: F401  (importing registers the rules)

    return dict(sorted(Rule.registry.items()))
