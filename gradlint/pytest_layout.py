"""Which functions are tests: pytest's collection patterns, read from the project's own configuration.

A test is what pytest would collect, not what is called `test`: a `test*` function of a
file that matches `python_files` (`test_*.py`, `*_test.py` by default), or a `test*`
method of a `Test*` class without `__init__` in such a file, each pattern as the project
sets it (`python_files`, `python_classes`, `python_functions` in `pytest.ini`,
`.pytest.ini`, `[tool.pytest.ini_options]` of `pyproject.toml`, `[pytest]` of `tox.ini`
or `[tool:pytest]` of `setup.cfg`, the nearest one above the file, as pytest finds its
configuration file). A script's `def test(epoch):` evaluation loop is evaluation code.

This module decides patterns only; which classes derive from `unittest.TestCase` (whose
`test*` methods are tests wherever they are) is for the analysis to prove.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePath

import tomllib

DEFAULT_FILES = ("test_*.py", "*_test.py")
DEFAULT_CLASSES = ("Test",)
DEFAULT_FUNCTIONS = ("test",)
# The configuration files pytest looks for in each directory, in its order, and the section it reads.
CONFIG_FILES = {
    "pytest.ini": "pytest",
    ".pytest.ini": "pytest",
    "pyproject.toml": "tool.pytest",
    "tox.ini": "pytest",
    "setup.cfg": "tool:pytest",
}
GLOB_CHARACTERS = frozenset("*?[")


@dataclass(frozen=True)
class TestLayout:
    """The collection patterns of one project: what pytest collects as test files, classes and functions."""

    __test__ = False  # a dataclass named like a test class: not one

    files: tuple[str, ...] = DEFAULT_FILES
    classes: tuple[str, ...] = DEFAULT_CLASSES
    functions: tuple[str, ...] = DEFAULT_FUNCTIONS

    def collects_file(self, path: str) -> bool:
        """Whether pytest collects the module file `path` (`conftest.py` holds fixtures, no tests)."""
        pure = PurePath(path)
        if pure.suffix != ".py" or pure.name == "conftest.py":
            return False
        for pattern in self.files:
            # As pytest's `fnmatch_ex`: a pattern without a separator matches the file name only.
            if os.sep not in pattern and "/" not in pattern:
                if fnmatch.fnmatch(pure.name, pattern):
                    return True
            elif fnmatch.fnmatch(pure.as_posix(), f"*/{pattern.lstrip('/')}") or fnmatch.fnmatch(
                pure.as_posix(), pattern
            ):
                return True
        return False

    def collects_class(self, name: str) -> bool:
        """Whether `name` matches `python_classes` (a prefix, or a glob where the pattern has one)."""
        return _prefix_or_glob(name, self.classes)

    def collects_function(self, name: str) -> bool:
        """Whether `name` matches `python_functions` (a prefix, or a glob where the pattern has one)."""
        return _prefix_or_glob(name, self.functions)


def _prefix_or_glob(name: str, patterns: tuple[str, ...]) -> bool:
    return any(
        name.startswith(pattern) or (bool(GLOB_CHARACTERS & set(pattern)) and fnmatch.fnmatch(name, pattern))
        for pattern in patterns
    )


DEFAULT = TestLayout()


def forget() -> None:
    """Look for configuration files afresh: at the start of each run, and before each lint of the LSP server."""
    _config_file.cache_clear()


def layout_for(path: str) -> TestLayout | None:
    """The collection patterns that apply to the module file `path`, or None when pytest would not collect it.

    A path that is no file on disk (`<string>`, an unsaved editor buffer) is judged by
    its name with the configuration of the directory it names, or the defaults.
    """
    layout = _layout_of_directory(str(Path(path).absolute().parent))
    return layout if layout.collects_file(path) else None


def _layout_of_directory(directory: str) -> TestLayout:
    found = _config_file(directory)
    if found is None:
        return DEFAULT
    try:
        changed = found.stat().st_mtime_ns  # read again when it changes (a long-running editor session)
    except OSError:
        return DEFAULT
    return _read(found, changed) or DEFAULT


@lru_cache(maxsize=1024)
def _config_file(directory: str) -> Path | None:
    """The nearest configuration file at or above `directory` that pytest would take its options from."""
    for folder in (Path(directory), *Path(directory).parents):
        for name in CONFIG_FILES:
            candidate = folder / name
            if candidate.is_file() and _read(candidate, _mtime(candidate)) is not None:
                return candidate
    return None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


@lru_cache(maxsize=256)
def _read(path: Path, changed: int) -> TestLayout | None:
    """The layout a configuration file sets (as of `changed`, its mtime), or None when it has no pytest
    section, and pytest looks further up.

    A file that cannot be read or parsed is passed over the same way: pytest would report
    it; gradlint judges with the defaults rather than fail a lint over it.
    """
    del changed  # part of the cache key only
    options: dict[str, object] | None
    try:
        if path.suffix == ".toml":
            with path.open("rb") as handle:
                tool = tomllib.load(handle).get("tool", {})
            pytest_table = tool.get("pytest") if isinstance(tool, dict) else None
            options = pytest_table if isinstance(pytest_table, dict) else None
            ini_options = options.get("ini_options") if options is not None else None
            if isinstance(ini_options, dict):
                options = ini_options  # [tool.pytest.ini_options]; pytest 9 also reads [tool.pytest]
        else:
            parser = configparser.ConfigParser(interpolation=None)
            parser.read(path, encoding="utf-8")
            section = CONFIG_FILES[path.name]
            options = dict(parser[section]) if parser.has_section(section) else None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error):
        return None
    if options is None:
        return TestLayout() if path.name in ("pytest.ini", ".pytest.ini") else None  # pytest.ini always counts
    return TestLayout(
        files=_patterns(options.get("python_files"), DEFAULT_FILES),
        classes=_patterns(options.get("python_classes"), DEFAULT_CLASSES),
        functions=_patterns(options.get("python_functions"), DEFAULT_FUNCTIONS),
    )


def _patterns(value: object, default: tuple[str, ...]) -> tuple[str, ...]:
    """An ini option's patterns: a whitespace-separated string, or a TOML list of strings."""
    if isinstance(value, str):
        return tuple(value.split()) or default
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value) or default
    return default
