"""The per-file result cache in `.gradlint_cache/`: findings keyed by what decides them.

A key is the hash of the file's content, its path, the effective configuration and a
fingerprint of gradlint itself (its version and the source of every module, so a new or
changed rule invalidates every entry). Entries are JSON, written to a temporary file and
renamed into place, so several runs can share one cache: a reader sees a whole entry or
none, and an entry that cannot be read or decoded counts as a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, astuple
from functools import cache
from pathlib import Path
from typing import Any

from gradlint.config import Config
from gradlint.index import MEMBERS
from gradlint.project import content_hash
from gradlint.pytest_layout import layout_for
from gradlint.rule import Diagnostic, Edit, Fix, Related, Rule, is_builtin

CACHE_DIR = ".gradlint_cache"
_PACKAGE = Path(__file__).parent


def fingerprint() -> str:
    """A hash of gradlint's version, the source of its modules and the rules registered from outside it.

    The built-in rules are in the source; the others (a plugin, a test) are registered by
    the code that imported them. Nothing here imports a rule.
    """
    from gradlint import __version__  # here: the package imports this module while it initializes

    digest = hashlib.sha256(f"{__version__}\0{_source_digest()}\0".encode())
    for code, rule in sorted(Rule.registry.items()):
        if not is_builtin(rule):
            digest.update(f"{code}={rule.__module__}.{rule.__qualname__}\0".encode())
    return digest.hexdigest()


@cache
def _source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# {module: (path, content hash, interface)}: the other modules of the project a file's findings were judged with,
# and a digest of what the judgement could read of them (`Program.interface`).
Uses = dict[str, tuple[str, str, str]]
# The interface a module has now (`Program.interface_now`), given the interface a cached entry recorded; None when
# the module is gone or cannot be read.
Interface = Callable[[str, str], "str | None"]


class SummaryStore:
    """Module summaries (`gradlint.analysis.project.summaries`) as JSON data, keyed by the module file's content."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "summaries"
        self._salt = f"{fingerprint()}\0summary\0".encode()

    def key(self, data: bytes) -> str:
        """The entry name of the summary of a module file holding `data`."""
        return hashlib.sha256(self._salt + data).hexdigest()

    def get(self, key: str) -> Any:
        """The summary data stored under `key`, or None for a missing or unreadable entry."""
        try:
            return json.loads((self.directory / key[:2] / key[2:]).read_bytes())
        except (OSError, ValueError):
            return None

    def put(self, key: str, summary: Any) -> None:
        """Store a summary's data atomically; a cache that cannot be written is skipped."""
        _write_atomically(self.directory.parent, self.directory / key[:2] / key[2:], summary)


def _unchanged(path: str, digest: str) -> bool:
    try:
        return content_hash(Path(path).read_bytes()) == digest
    except OSError:
        return False


class MemoryStore(SummaryStore):
    """Summaries kept in memory for the life of a process (the language server's)."""

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {}
        self._salt = b"memory\0"

    def get(self, key: str) -> Any:
        """The summary data stored under `key`, or None."""
        return self._entries.get(key)

    def put(self, key: str, summary: Any) -> None:
        """Keep a summary's data."""
        self._entries[key] = summary


class ResultCache:
    """Findings of earlier runs, stored under `directory` (one file per entry).

    An entry also lists the other modules of the project its findings were judged with
    (their outlines or summaries); it is reused only while each of them is unchanged.
    """

    def __init__(
        self,
        directory: Path,
        config: Config,
        interface: Interface | None = None,
        members: Callable[[], str] | None = None,
    ) -> None:
        self.directory = directory
        self.summaries = SummaryStore(directory)
        self._salt = f"{fingerprint()}\0{config!r}\0".encode()
        self._interface = interface
        # The digest of the run's files (`Outlines.members_digest`): what the callers a judgement read depend on,
        # asked for only when an entry names them.
        self._members = members
        self._interfaces: dict[tuple[str, str], str | None] = {}

    def key(self, path: str, data: bytes) -> str:
        """The entry name for linting `data` as the file `path` under this run's settings."""
        digest = hashlib.sha256(self._salt)
        digest.update(path.encode("utf-8", "surrogateescape"))
        digest.update(f"\0{layout_for(path)!r}\0".encode())  # which of its functions are tests
        digest.update(data)
        return digest.hexdigest()

    def _entry(self, key: str) -> Path:
        return self.directory / key[:2] / key[2:]

    def get(self, key: str) -> list[Diagnostic] | None:
        """The stored findings for `key`, or None when there is no usable entry.

        An entry is unusable when a module its findings were judged with has changed what
        the judgement could read of it: its interface (an edit inside a function body that
        leaves the function's summary as it was keeps the entry).
        """
        try:
            entry = json.loads(self._entry(key).read_bytes())
            uses = {
                module: (str(path), str(digest), str(face)) for module, (path, digest, face) in entry["uses"].items()
            }
            found = [_decode(item) for item in entry["findings"]]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None  # missing, half-written by a crashed older version, or corrupt: a miss
        return found if all(self._unchanged(module, *use) for module, use in uses.items()) else None

    def _unchanged(self, module: str, path: str, digest: str, interface: str) -> bool:
        if path == MEMBERS:
            if self._members is not None and self._members() == digest:
                return True  # no file of the run changed, so no caller did
        elif _unchanged(path, digest):
            return True
        if self._interface is None:
            return False
        if (module, interface) not in self._interfaces:
            self._interfaces[(module, interface)] = self._interface(module, interface)
        return self._interfaces[(module, interface)] == interface

    def put(self, key: str, diagnostics: list[Diagnostic], uses: Uses | None = None) -> None:
        """Store findings for `key` atomically; a cache that cannot be written is skipped."""
        entry = {"findings": [_encode(diagnostic) for diagnostic in diagnostics], "uses": uses or {}}
        _write_atomically(self.directory, self._entry(key), entry)


def _write_atomically(directory: Path, entry: Path, content: object) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _ignore_from_version_control(directory)
        handle, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(content, stream)
            os.replace(temporary, entry)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        return  # a read-only or full disk makes the run slower, never wrong


def _ignore_from_version_control(directory: Path) -> None:
    gitignore = directory / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# Created by gradlint automatically.\n*\n", encoding="utf-8")


def _encode(diagnostic: Diagnostic) -> dict[str, object]:
    fields = {field.name: getattr(diagnostic, field.name) for field in dataclasses.fields(diagnostic)}
    fix = diagnostic.fix
    if fix is not None:
        fields["fix"] = {"description": fix.description, "safe": fix.safe, "edits": [astuple(e) for e in fix.edits]}
    fields["related"] = [asdict(place) for place in diagnostic.related]
    return fields


def _decode(item: Any) -> Diagnostic:
    fix = item.pop("fix")
    if fix is not None:
        edits = tuple(Edit(*edit) for edit in fix["edits"])
        item["fix"] = Fix(description=fix["description"], edits=edits, safe=fix["safe"])
    item["related"] = tuple(Related(**place) for place in item["related"])
    return Diagnostic(**item)
