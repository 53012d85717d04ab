"""Where the modules of the linted project are on disk, found from the linted files' paths.

Plain path arithmetic, no LibCST: the engine uses it before it knows whether anything
needs a parse. Only directories of the project are searched, never site-packages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SUFFIX = ".py"


class Project:
    """Where the modules of the linted project are on disk, by dotted name."""

    def __init__(self, roots: Iterable[Path] = ()) -> None:
        self.roots: list[Path] = []
        self._located: dict[str, Path | None] = {}
        self._reaches: dict[frozenset[bytes], Reach] = {}
        for root in roots:
            self.add_root(root)

    def add_root(self, root: Path) -> None:
        """Look for modules under `root` too (after the roots added before it)."""
        root = root.resolve()
        if root not in self.roots:
            self.roots.append(root)
            self._located.clear()

    def add_file(self, path: Path) -> str:
        """Make the roots of `path` known and return its dotted module name."""
        package_root, name = module_name(path)
        self.add_root(package_root)
        self.add_root(path.resolve().parent)
        for layout in (package_root / "src", package_root.parent / "src"):
            if layout.is_dir():
                self.add_root(layout)
        return name

    def reach(self, tokens: frozenset[bytes]) -> Reach:
        """The `Reach` of `tokens` through this project's imports, shared by every file of a run."""
        if tokens not in self._reaches:
            self._reaches[tokens] = Reach(self, tokens)
        return self._reaches[tokens]

    def locate(self, module: str) -> Path | None:
        """The file that defines the module `module`, or None when it is not the project's."""
        if module not in self._located:
            self._located[module] = self._find(module)
        return self._located[module]

    def _find(self, module: str) -> Path | None:
        parts = module.split(".")
        if not all(part.isidentifier() for part in parts):
            return None
        for root in self.roots:
            base = root.joinpath(*parts)
            for candidate in (base.with_name(base.name + SUFFIX), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
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


# `import a.b as c, d` and `from .a import (b, c)`: enough to follow a module's imports from its bytes.
_IMPORT = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[\w., \t]*(?:\\\r?\n[\w., \t]*)*)"
    rb"|import[ \t]+([\w., \t]+))",
    re.M,
)


class Reach:
    """Which tokens a module and the project modules it imports (transitively) contain, from bytes alone.

    The prefilter asks it for a file that calls into other modules: a rule may fire on
    `train.py` because of a `backward()` in the `engine.py` it imports.
    """

    def __init__(self, project: Project, tokens: frozenset[bytes]) -> None:
        self.project = project
        self.tokens = tokens
        self._own: dict[Path, tuple[frozenset[bytes], tuple[Path, ...]]] = {}
        self._reach: dict[Path, frozenset[bytes]] = {}

    def of(self, path: Path, data: bytes | None = None) -> frozenset[bytes]:
        """The tokens in `path` (whose bytes are `data`, if given) and every project module it imports."""
        path = path.resolve()
        if path in self._reach:
            return self._reach[path]
        seen: set[Path] = set()
        found: set[bytes] = set()
        pending = [(path, data)]
        while pending:
            current, content = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in self._reach:
                found |= self._reach[current]
                continue
            own, imported = self._scan(current, content)
            found |= own
            pending.extend((module, None) for module in imported)
            if found >= self.tokens:
                break
        self._reach[path] = frozenset(found)
        return self._reach[path]

    def _scan(self, path: Path, data: bytes | None) -> tuple[frozenset[bytes], tuple[Path, ...]]:
        if path not in self._own:
            if data is None:
                try:
                    data = path.read_bytes()
                except OSError:
                    data = b""
            own = frozenset(token for token in self.tokens if token in data)
            self._own[path] = own, tuple(self._imported(path, data))
        return self._own[path]

    def _imported(self, path: Path, data: bytes) -> list[Path]:
        _, name = module_name(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = []
        for match in _IMPORT.finditer(data):
            dots, module, names, plain = (group.decode("ascii", "replace") if group else "" for group in match.groups())
            candidates: list[str] = []
            if plain:
                candidates = [part.split()[0] for part in plain.split(",") if part.strip()]
            else:
                base = module
                if dots:
                    up = len(dots) - 1
                    if up > len(package):
                        continue
                    base = ".".join([*package[: len(package) - up], *([module] if module else [])])
                candidates = [base] + [
                    f"{base}.{part.split()[0]}"
                    for part in names.strip("()").replace("\\", " ").split(",")
                    if part.split()
                ]
            for candidate in candidates:
                located = self.project.locate(candidate) if candidate else None
                if located is not None:
                    found.append(located.resolve())
        return found
