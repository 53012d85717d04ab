"""Where the modules of the linted project are on disk, found from the linted files' paths.

Plain path arithmetic, no LibCST: the engine uses it before it knows whether anything
needs a parse. Only directories of the project are searched, never site-packages.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

SUFFIX = ".py"
# Files that mark the top of a project: a namespace package (a directory without `__init__.py`) is imported from
# the directory that holds them, where its scripts run.
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# How far above a root a namespace package's directory is looked for, lacking a marker.
MAX_OUTER_LEVELS = 3


class Project:
    """Where the modules of the linted project are on disk, by dotted name."""

    def __init__(self, roots: Iterable[Path] = ()) -> None:
        self.roots: list[Path] = []
        self._located: dict[str, Path | None] = {}
        self._names: dict[Path, tuple[Path, str]] = {}
        self._tops: dict[Path, Path | None] = {}  # a file's directory -> the checkout's top (`project_top`)
        self._searched: list[Path] | None = None
        for root in roots:
            self.add_root(root)

    def add_root(self, root: Path) -> None:
        """Look for modules under `root` too (after the roots added before it)."""
        root = root.resolve()
        if root not in self.roots:
            self.roots.append(root)
            self._located.clear()
            self._searched = None

    def add_file(self, path: Path) -> str:
        """Make the roots of `path` known and return its dotted module name."""
        path = path.resolve()
        package_root, name = self.name_of(path)
        self.add_root(package_root)  # a script's own directory, or the one above its top package
        for layout in (package_root / "src", package_root.parent / "src"):
            if layout.is_dir():
                self.add_root(layout)
        if path.parent not in self._tops:  # one walk per directory, not per file
            self._tops[path.parent] = project_top(path.parent, package_root)
        top = self._tops[path.parent]
        if top is not None:
            self.add_root(top)  # a checkout that is a package itself: its scripts run from it
        return name

    def name_of(self, path: Path) -> tuple[Path, str]:
        """`module_name(path)`, remembered per file."""
        if path not in self._names:
            self._names[path] = module_name(path)
        return self._names[path]

    def locate(self, module: str) -> Path | None:
        """The file that defines the module `module`, or None when it is not the project's."""
        if module not in self._located:
            self._located[module] = self._find(module)
        return self._located[module]

    def _find(self, module: str) -> Path | None:
        parts = module.split(".")
        if not all(part.isidentifier() for part in parts):
            return None
        head = module.rpartition(".")[0]
        if (
            head
            and self.locate(head) is None
            and not any(os.path.isdir(os.path.join(root, *head.split("."))) for root in self._search_roots())
        ):
            return None  # Ex) torch.cat: no directory torch/cat, and the parent decides the rest
        for root in self._search_roots():
            base = os.path.join(root, *parts)
            for candidate in (base + SUFFIX, os.path.join(base, "__init__.py")):
                if os.path.isfile(candidate):
                    return Path(candidate)
        return None

    def _search_roots(self) -> list[Path]:
        """The roots, then the directories above them (`_outer_roots`)."""
        if self._searched is None:
            self._searched = [*self.roots, *self._outer_roots()]
        return self._searched

    def _outer_roots(self) -> list[Path]:
        """The directories above the roots, up to the project's top (a `PROJECT_MARKERS` file) or
        `MAX_OUTER_LEVELS` up: where a script runs that imports `runners.misc` from a directory `runners/` that
        has no `__init__.py` (a namespace package)."""
        found: dict[Path, None] = {}
        for root in self.roots:
            directory = root
            for _ in range(MAX_OUTER_LEVELS):
                if any((directory / marker).exists() for marker in PROJECT_MARKERS) or directory.parent == directory:
                    break
                directory = directory.parent
                if directory not in self.roots:
                    found[directory] = None
        return list(found)


def project_top(directory: Path, package_root: Path) -> Path | None:
    """The directory between `directory` and `package_root` that holds a `PROJECT_MARKERS` file (a checkout whose
    top has an `__init__.py`: its scripts import `common.evaluators` from there), if there is one."""
    while directory != package_root and directory.parent != directory:
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory
        directory = directory.parent
    return None


def module_name(path: Path) -> tuple[Path, str]:
    """(the directory above its top package, the dotted name) of the module file `path`."""
    path = path.resolve()
    parts = [] if path.name == "__init__.py" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file() and directory.parent != directory:
        parts.insert(0, directory.name)
        directory = directory.parent
    return directory, ".".join(parts) or path.stem


def content_hash(data: bytes) -> str:
    """What a cached result records of a module it read: a hash of its content."""
    return hashlib.sha256(data).hexdigest()[:32]
