"""Where each node of a module is in its source: LibCST's positions, one top-level statement at a time.

`PositionProvider` writes the whole module out once, recording each node's range on the
way (`libcst.metadata.MetadataWrapper` adds a second walk of the whole module, for
batchable providers, that rebuilds every node: it is not used). A module is written as
its header, each top-level statement, then its footer, and every top-level statement
starts at column 0 of a new line, so a statement written out alone records the same
ranges, shifted by the lines before it. So positions are recorded per statement and
kept while that statement object lives: the language server's incremental parse
(`gradlint.incremental`) reuses the statements an edit left alone, and only the edited
ones are written out again. Positions are computed only for files with findings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState


@dataclass(frozen=True)
class _Written:
    """One top-level statement (or the header, or the footer) written out alone."""

    style: tuple[str, str]  # the module's indent and line break it was written with
    ranges: Mapping[cst.CSTNode, CodeRange]  # as if it began on line 1
    code: str
    lines: int  # the line breaks it holds


class WrittenStatements:
    """The top-level statements of a document's last version, written out, for its next version to reuse.

    Only the incremental parse hands over the same statement objects twice; it keeps one of
    these per document (`IncrementalParser.written`), holding the statements of one module.
    """

    def __init__(self) -> None:
        self._written: dict[cst.CSTNode, _Written] = {}

    def get(self, statement: cst.CSTNode, style: tuple[str, str]) -> _Written | None:
        """The statement written with `style`, if it was."""
        written = self._written.get(statement)
        return written if written is not None and written.style == style else None

    def keep(self, written: dict[cst.CSTNode, _Written]) -> None:
        """Hold these statements, and no others."""
        self._written = written


class ModulePositions(Mapping[cst.CSTNode, CodeRange]):
    """`PositionProvider`'s ranges for every node of `module`, and the code they were measured on."""

    def __init__(self, module: cst.Module, reuse: WrittenStatements | None = None) -> None:
        self.module = module
        style = (module.default_indent, module.default_newline)
        body = [
            (reuse.get(statement, style) if reuse is not None else None) or _write(statement, style)
            for statement in module.body
        ]
        # The header's and footer's comment lines are written as parts of their own.
        self._parts = [_write(module.header, style), *body, _write(module.footer, style)]
        if reuse is not None:
            reuse.keep(dict(zip(module.body, body, strict=True)))
        self._starts: list[int] = []
        line = 0
        for written in self._parts:
            self._starts.append(line)
            line += written.lines
        self._owner: dict[cst.CSTNode, int] | None = None
        self._whole: Mapping[cst.CSTNode, CodeRange] | None = None

    @property
    def code(self) -> str:
        """The module's code, as LibCST writes it (`module.code`)."""
        code = "".join(written.code for written in self._parts)
        newline = self.module.default_newline
        if not self.module.has_trailing_newline:
            return code.removesuffix(newline)  # as `Module._codegen_impl` pops it
        return code or newline

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        if self._owner is None:
            self._owner = {inner: index for index, written in enumerate(self._parts) for inner in written.ranges}
        index = self._owner.get(node)
        if index is None:
            return self._module_ranges()[node]  # the module itself
        found, shift = self._parts[index].ranges[node], self._starts[index]
        return CodeRange(
            CodePosition(found.start.line + shift, found.start.column),
            CodePosition(found.end.line + shift, found.end.column),
        )

    def __iter__(self) -> Iterator[cst.CSTNode]:
        for written in self._parts:
            yield from written.ranges
        yield self.module

    def __len__(self) -> int:
        return sum(len(written.ranges) for written in self._parts) + 1

    def _module_ranges(self) -> Mapping[cst.CSTNode, CodeRange]:
        if self._whole is None:
            provider = PositionProvider()
            provider._gen_impl(self.module)  # the whole module written out, as MetadataWrapper would
            self._whole = cast(Mapping[cst.CSTNode, CodeRange], provider._computed)
        return self._whole


def _write(part: Sequence[cst.CSTNode] | cst.CSTNode, style: tuple[str, str]) -> _Written:
    provider = PositionProvider()
    state = PositionProvidingCodegenState(*style, provider=provider)
    for node in [part] if isinstance(part, cst.CSTNode) else part:
        node._codegen(state)
    ranges = cast(Mapping[cst.CSTNode, CodeRange], provider._computed)
    return _Written(style, ranges, "".join(state.tokens), state.line - 1)
