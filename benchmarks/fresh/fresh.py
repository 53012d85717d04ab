"""First look at fresh code: lint PyTorch libraries gradlint has never been run on, for a person to judge.

The precision that counts is measured on code nobody tuned the rules to. A draw is a list
of pinned PyPI libraries (`drawN-libraries.txt`, one `name==version` a line) chosen before
anything is changed for them: model zoos, RL, audio, tabular, time series, trainers,
their tests with them (source archives first). This script downloads and unpacks each,
lints it with gradlint's defaults (as a user would, preview rules off) and writes every
finding with its source line (`drawN-findings.md`). A person then judges each finding,
bug, waste, nit or wrong with a one-sentence reason, in `drawN.json` and `drawN.md`,
before any change is made for them; the libraries then join the ecosystem check
(`benchmarks/ecosystem.py --set fresh`) and the next measurement needs a new draw.

    python benchmarks/fresh/fresh.py benchmarks/fresh/draw2-libraries.txt --out benchmarks/fresh/draw2-findings.md
    python benchmarks/fresh/fresh.py --tally    # per-rule counts of the judged draws (gradlint/measured.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the ecosystem check's download and report

from ecosystem import FetchError, fetch, libraries, lint_tree, render  # noqa: E402

RIGHT = frozenset({"bug", "waste", "nit"})


def tally(draws: list[Path]) -> dict[str, tuple[int, int]]:
    """{code: (findings, right)} over the judged findings of `draws` (drawN.json files)."""
    findings: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for draw in draws:
        for finding in json.loads(draw.read_text()):
            findings[finding["code"]] += 1
            right[finding["code"]] += finding["verdict"] in RIGHT
    return {code: (findings[code], right[code]) for code in sorted(findings)}


def main() -> None:
    """Lint a draw's libraries and write its findings, or tally the judged draws."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("listing", type=Path, nargs="?", help="drawN-libraries.txt")
    parser.add_argument("--out", type=Path, help="where to write the findings (default: beside the listing)")
    parser.add_argument("--tally", action="store_true", help="print the per-rule counts of the judged draws")
    args = parser.parse_args()
    if args.tally:
        for code, (found, right) in tally(sorted(HERE.glob("draw*.json"))).items():
            print(f"{code}: right {right} of {found}")
        return
    if args.listing is None:
        parser.error("a listing of libraries is needed (or --tally)")
    results = []
    for name, version in libraries(args.listing):
        try:
            root = fetch(name, version, source_first=True)
        except FetchError as error:  # reported, and the draw goes on: the listing's header records the swap
            print(f"not linted: {error}", file=sys.stderr)
            continue
        results.append(lint_tree(name, version, root))
    out = args.out or args.listing.with_name(args.listing.name.replace("-libraries.txt", "-findings.md"))
    out.write_text(render(results))
    for result in results:
        print(f"{result.name} {result.version}: {len(result.diagnostics)} findings in {result.lines} lines")


if __name__ == "__main__":
    main()
