"""Which files a run lints: recursion into directories, excludes and .gitignore."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

from gradlint.config import Config, resolve

SOURCE_SUFFIXES = (".py", ".pyi", ".ipynb")


@dataclass(frozen=True)
class Missing:
    """A path given on the command line that does not exist or cannot be listed."""

    path: str
    reason: str


@dataclass(frozen=True)
class _Ignore:
    base: Path
    spec: pathspec.GitIgnoreSpec

    def matches(self, path: Path, is_dir: bool) -> bool:
        try:
            relative = path.relative_to(self.base).as_posix()
        except ValueError:
            return False
        return self.spec.match_file(relative + "/" if is_dir else relative)


def discover(paths: list[Path], config: Config) -> Iterator[Path | Missing]:
    """Yield every file to lint under `paths`, in a deterministic order.

    Files named explicitly are linted unless the configured excludes match them;
    directories are walked skipping excluded paths, virtualenvs and what .gitignore ignores.
    """
    excludes = _Ignore(resolve(config.root), config.exclude_spec())
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            seen.add(resolve(path))  # so that a symlink back to it is not walked again
            yield from _walk(path, excludes, _gitignores_above(resolve(path)), seen)
            continue
        resolved = resolve(path)
        if resolved in seen:
            continue
        seen.add(resolved)
        problem = _not_a_file(path)
        if problem is not None:
            yield Missing(str(path), problem)
        elif not _excluded(path, resolved, excludes, is_dir=False):
            yield path


def _not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as a source file (missing, a symlink loop, a pipe), if it cannot."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        return (error.strerror or str(error)).lower()
    return None if stat.S_ISREG(mode) else "not a regular file"


def _excluded(path: Path, resolved: Path, excludes: _Ignore, is_dir: bool) -> bool:
    # A bare pattern like "build" matches the name wherever it is, as in ruff and flake8.
    return excludes.matches(resolved, is_dir) or excludes.spec.match_file(path.name + ("/" if is_dir else ""))


def _gitignores_above(directory: Path) -> list[_Ignore]:
    ignores = []
    for parent in reversed((directory, *directory.parents)):
        ignore = _read_gitignore(parent)
        if ignore:
            ignores.append(ignore)
        if (parent / ".git").exists():
            ignores = [ignore] if ignore else []  # a repository root starts afresh
    return ignores


def _read_gitignore(directory: Path) -> _Ignore | None:
    try:
        lines = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    # A pattern git cannot read (`configs/user.jsonnet\\`, a trailing backslash) matches nothing in git either.
    return _Ignore(directory, pathspec.GitIgnoreSpec.from_lines(line for line in lines if _valid_pattern(line)))


def _valid_pattern(line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except ValueError:  # pathspec's GitIgnorePatternError
        return False
    return True


def _walk(root: Path, excludes: _Ignore, ignores: list[_Ignore], seen: set[Path]) -> Iterator[Path | Missing]:
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as error:
        yield Missing(str(root), error.strerror or str(error))
        return
    local = _read_gitignore(root)
    active = [*ignores, local] if local else ignores
    for entry in entries:
        path = Path(root, entry.name)
        try:
            is_dir = entry.is_dir()
        except OSError:  # a symlink loop
            is_dir = False
        if not is_dir and not entry.name.endswith(SOURCE_SUFFIXES):
            continue
        resolved = resolve(path)
        if _excluded(path, resolved, excludes, is_dir) or any(ignore.matches(resolved, is_dir) for ignore in active):
            continue
        if is_dir:
            if (path / "pyvenv.cfg").exists() or resolved in seen:
                continue  # a virtualenv, or a symlink back into the tree
            seen.add(resolved)
            yield from _walk(path, excludes, active, seen)
        elif resolved not in seen:
            seen.add(resolved)
            problem = _not_a_file(path)
            yield path if problem is None else Missing(str(path), problem)
