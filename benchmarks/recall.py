"""First-look recall on real bugs: lint each row's file before and after its fix, inside its whole tree.

A batch is a Markdown table of rows (`benchmarks/real-bugs.md` has the format: `| # |
Repository | Fixing commit | Path : line (before) | Rule | ... |`) and a folder holding, for
each row, the repository's Python files at the commit before the fix and at the fix
(`ROW/before/`, `ROW/after/`, exported with `git archive`). Each file is linted as a user
would lint it in its checkout (`gradlint check FILE`: the whole program reached from it; an
empty `.git` folder marks each tree's top as a checkout's is marked),
with every rule on (`--preview`). A row is **reported** when a finding of its rule points
at one of the row's lines (the buggy line, or the calls the cell names); after the fix it
is **quiet** when no finding of its rule stands on a line whose text a reported finding
had before. The table it prints is the first look when it runs before any change made for
the batch; a person then reads the misses.

    python benchmarks/recall.py ROWS.md TREES/ [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gradlint import Config, Diagnostic, lint_paths

ROW = re.compile(r"^\|\s*(?P<id>[a-z]\d+)\s*\|")
FILE_AND_LINES = re.compile(r"^\s*(?P<path>[^\s:]+\.py)\s*:\s*(?P<rest>.*)$")
OTHER_FILE = re.compile(r"[\w/.-]+\.py\s*:\s*[\d, -]+")
NUMBER = re.compile(r"(\d+)(?:\s*-\s*(\d+))?")
EARLY = frozenset(f"GL{number:03d}" for number in range(1, 16))  # the families measured apart from GL016-GL022


@dataclass(frozen=True)
class Row:
    """One maintainer-fixed bug: where it was, and the rule that should report it."""

    id: str
    repository: str
    commit: str
    path: str
    lines: tuple[int, ...]
    rule: str


@dataclass(frozen=True)
class Result:
    """What gradlint said about a row before and after its fix."""

    row: Row
    reported: bool
    quiet_after: bool
    before: tuple[str, ...]  # `CODE line` of every finding in the file before the fix
    after: tuple[str, ...]
    error: str = ""


def parse_rows(table: Path) -> list[Row]:
    """The rows of a batch's Markdown table (columns: #, repository, commit, path : lines, rule, ...)."""
    rows = []
    for line in table.read_text().splitlines():
        if not ROW.match(line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        located = FILE_AND_LINES.match(cells[3].replace("`", ""))
        rule = re.search(r"GL\d{3}", cells[4])
        if located is None or rule is None:
            print(f"skipped (cannot read path or rule): {cells[0]}", file=sys.stderr)
            continue
        rest = OTHER_FILE.sub("", located["rest"])  # lines in other files name calls elsewhere
        lines: list[int] = []
        for first, last in NUMBER.findall(rest):
            lines.extend(range(int(first), int(last or first) + 1))
        rows.append(Row(cells[0], cells[1], cells[2].strip("`"), located["path"], tuple(lines), rule[0]))
    return rows


def _findings(tree: Path, path: str) -> list[Diagnostic]:
    # An exported tree lacks the checkout's `.git`, which marks where its scripts run (gradlint.project.project_top).
    (tree / ".git").mkdir(exist_ok=True)
    config = Config(preview=True, root=tree)
    return list(lint_paths([tree / path], config, jobs=1))


def score(row: Row, trees: Path) -> Result:
    """Lint the row's file in its tree before and after the fix."""
    before_file = trees / row.id / "before" / row.path
    after_file = trees / row.id / "after" / row.path
    if not before_file.is_file():
        return Result(row, False, True, (), (), f"missing {before_file}")
    before = _findings(trees / row.id / "before", row.path)
    after = _findings(trees / row.id / "after", row.path) if after_file.is_file() else []
    hits = [d for d in before if d.code == row.rule and d.line in row.lines]
    old_text = before_file.read_text(errors="replace").splitlines()
    new_text = after_file.read_text(errors="replace").splitlines() if after_file.is_file() else []
    hit_texts = {old_text[d.line - 1].strip() for d in hits if d.line <= len(old_text)}
    standing = [
        d for d in after if d.code == row.rule and d.line <= len(new_text) and new_text[d.line - 1].strip() in hit_texts
    ]
    return Result(
        row,
        bool(hits),
        not standing,
        tuple(f"{d.code} {d.line}" for d in before if d.code.startswith("GL")),
        tuple(f"{d.code} {d.line}" for d in after if d.code.startswith("GL")),
    )


def _verdict(result: Result) -> str:
    return f"not linted: {result.error}" if result.error else "**reported**" if result.reported else "missed"


def render(results: list[Result]) -> str:
    """The per-row table and the recall of each group of rules."""
    out = [
        "| # | Repository | Rule | Lines | Reported | Quiet after | Before | After |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        row = result.row
        out.append(
            f"| {row.id} | {row.repository} | {row.rule} | {', '.join(map(str, row.lines))} | "
            f"{_verdict(result)} | {'quiet' if result.quiet_after else 'still reported'} | "
            f"{', '.join(result.before) or '-'} | {', '.join(result.after) or '-'} |"
        )
    out.append("")
    for name, group in (
        ("GL001-GL015", [r for r in results if r.row.rule in EARLY]),
        ("GL016-GL022", [r for r in results if r.row.rule not in EARLY]),
    ):
        found = sum(r.reported for r in group)
        share = f"{found / len(group):.2f}" if group else "-"
        quiet = sum(r.quiet_after for r in group)
        out.append(f"- {name}: reported {found} of {len(group)} ({share}); quiet after the fix {quiet} of {len(group)}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path, help="a Markdown table of rows")
    parser.add_argument("trees", type=Path, help="a folder with ROW/before and ROW/after for each row")
    parser.add_argument("--out", type=Path, help="write every result as JSON here too")
    args = parser.parse_args()
    results = [score(row, args.trees) for row in parse_rows(args.rows)]
    print(render(results))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(result) for result in results], indent=1) + "\n")


if __name__ == "__main__":
    main()
