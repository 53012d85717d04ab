"""`[tool.gradlint]` in pyproject.toml and command-line flags, merged into a frozen Config."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from gradlint.catalog import rule_infos

if TYPE_CHECKING:
    import pathspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    ".bzr",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".eggs",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".gradlint_cache",
    ".ipynb_checkpoints",
    "node_modules",
    "site-packages",
    "build",
    "dist",
)

# Set (to anything but 0), the rules in preview run unless a configuration or flag says otherwise.
PREVIEW_VARIABLE = "GRADLINT_PREVIEW"
KNOWN_KEYS = frozenset({"select", "ignore", "exclude", "extend-exclude", "per-file-ignores", "preview"})


class ConfigError(Exception):
    """A configuration that cannot be used; the CLI reports it and exits with 2."""


@dataclass(frozen=True)
class Config:
    """The effective settings of one run. `root` anchors relative exclude patterns."""

    select: tuple[str, ...] = ("ALL",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    preview: bool = field(default_factory=lambda: os.environ.get(PREVIEW_VARIABLE, "") not in ("", "0"))
    root: Path = field(default_factory=Path.cwd, compare=False)

    def runs_preview(self, code: str) -> bool:
        """Whether a rule in preview runs: with `preview`, or when `select` names its code exactly."""
        return self.preview or code in self.select

    def is_enabled(self, code: str, path: str | None = None) -> bool:
        """Whether findings of `code` are reported (for `path`, if given)."""
        if not _matches(code, self.select) or _matches(code, self.ignore):
            return False
        if path is None or not self.per_file_ignores:
            return True
        relative = _relative(Path(path), self.root)
        for pattern, codes in self.per_file_ignores:
            if _matches(code, codes) and _pattern(pattern).match_file(relative):
                return False
        return True

    def exclude_spec(self) -> pathspec.GitIgnoreSpec:
        """The exclude patterns, with gitignore semantics."""
        import pathspec  # here: `--version`, `--help` and `rules` need no pattern (30 ms of their start)

        return pathspec.GitIgnoreSpec.from_lines([*self.exclude, *self.extend_exclude])

    def with_overrides(self, **overrides: object) -> Config:
        """A copy with the given non-None fields replaced (command-line flags win).

        A `select` given replaces the configured selection whole, its `ignore` included,
        as in Ruff; an `ignore` given with it still applies. per-file-ignores stay.
        """
        given = {key: value for key, value in overrides.items() if value is not None}
        if "select" in given:
            given.setdefault("ignore", ())
        config = replace(self, **given)  # type: ignore[arg-type]  # keys are checked by dataclasses.replace
        validate_codes(config)
        return config


@cache
def _pattern(pattern: str) -> pathspec.GitIgnoreSpec:
    """A compiled per-file-ignores pattern: asked for every rule of every file linted."""
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines([pattern])


def _matches(code: str, selectors: Iterable[str]) -> bool:
    return any(selector == "ALL" or code.startswith(selector) for selector in selectors)


def _relative(path: Path, root: Path) -> str:
    try:
        return resolve(path).relative_to(resolve(root)).as_posix()
    except ValueError:
        return path.as_posix()


def resolve(path: Path) -> Path:
    """`path.resolve()`, or the absolute path where a symlink loop makes that fail."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # Python before 3.13 raises RuntimeError on a loop
        return path.absolute()


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start` that has a [tool.gradlint] table."""
    directory = resolve(start)
    if not directory.is_dir():
        directory = directory.parent
    for candidate in (directory, *directory.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            tool = _read_toml(pyproject).get("tool")
            if isinstance(tool, dict) and "gradlint" in tool:
                return pyproject
    return None


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as handle:
            data: dict[str, object] = tomllib.load(handle)
            return data
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read configuration: {error}") from error


def load_config(start: Path, explicit: Path | None = None) -> Config:
    """The Config from `explicit`, or from the nearest pyproject.toml above `start`."""
    path = explicit or find_pyproject(start)
    if path is None:
        return Config(root=Path.cwd())
    data = _read_toml(path)
    tool = data.get("tool")
    if isinstance(tool, dict) and "gradlint" in tool:
        table = tool["gradlint"]
    elif explicit is not None and path.name != "pyproject.toml":
        table = data  # a standalone gradlint.toml holds the keys at top level
    else:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.gradlint] must be a table")
    return parse_table(table, path)


def parse_table(table: Mapping[str, object], source: Path) -> Config:
    """A Config from the keys of a [tool.gradlint] table; unknown keys are errors."""
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        known = ", ".join(sorted(KNOWN_KEYS))
        raise ConfigError(f"{source}: unknown key(s) in [tool.gradlint]: {', '.join(unknown)} (known: {known})")
    config = Config(
        select=_string_list(table, "select", source) or ("ALL",),
        ignore=_string_list(table, "ignore", source),
        exclude=_string_list(table, "exclude", source) or DEFAULT_EXCLUDE,
        extend_exclude=_string_list(table, "extend-exclude", source),
        per_file_ignores=_per_file_ignores(table.get("per-file-ignores", {}), source),
        preview=_flag(table, "preview", source, Config().preview),
        root=source.parent.resolve(),
    )
    validate_codes(config, source)
    return config


def _string_list(table: Mapping[str, object], key: str, source: Path) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{source}: '{key}' must be a list of strings")
    return tuple(value)


def _flag(table: Mapping[str, object], key: str, source: Path, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: '{key}' must be true or false")
    return value


def _per_file_ignores(value: object, source: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: 'per-file-ignores' must be a table of glob = [codes]")
    entries = []
    for pattern, codes in value.items():
        if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
            raise ConfigError(f"{source}: per-file-ignores '{pattern}' must be a list of codes")
        entries.append((pattern, tuple(codes)))
    return tuple(entries)


def validate_codes(config: Config, source: Path | None = None) -> None:
    """Raise ConfigError for a selector that matches no known code."""
    known = [*rule_infos(), "GL000", "GL999"]
    selectors = [*config.select, *config.ignore, *(code for _, codes in config.per_file_ignores for code in codes)]
    for selector in selectors:
        if selector != "ALL" and not any(code.startswith(selector) for code in known):
            where = f"{source}: " if source else ""
            raise ConfigError(f"{where}unknown rule code or prefix '{selector}' (see `gradlint rules`)")
