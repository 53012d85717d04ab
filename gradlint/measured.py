"""What the first-look draws of fresh code measured for each rule: the data behind preview and the rules' docs.

A draw (benchmarks/fresh/) lints PyTorch libraries gradlint had never been run on, with
its defaults, and a person judges every finding before anything is changed for them. A
rule whose findings there were right less than four times in five is in *preview*: off
by default, on with `--preview` (or `preview = true`), until a later draw shows it better.
A rule that never fired in a draw has no measured precision and stays on. The tests check
these numbers against benchmarks/fresh/draws.json.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """A rule's findings in the draws so far, and how many of them were right (a bug, a waste or a nit)."""

    findings: int
    right: int

    @property
    def trusted(self) -> bool:
        """Whether the findings were right at least four times in five."""
        return self.right * 5 >= self.findings * 4


# The draws these numbers add up, newest last.
DRAWS = (
    "draw 1 of 2026-12-04: 20 libraries, 1.34 million lines, gradlint 29e1c15",
    "draw 2 of 2026-12-04: 26 libraries, 1.24 million lines, gradlint 560bfe7",
    "draw 3 of 2026-12-05: 46 libraries, 1.34 million lines, gradlint 6afe991",
    "draw 4 of 2026-12-05: 44 libraries, 1.44 million lines, gradlint 1ce8f3f",
)
LINES = "5.37 million"

FRESH: dict[str, Measured] = {
    "GL001": Measured(11, 7),
    "GL002": Measured(12, 1),
    "GL003": Measured(1, 0),
    "GL004": Measured(14, 2),
    "GL005": Measured(12, 10),
    "GL006": Measured(15, 0),
    "GL007": Measured(4, 4),
    "GL008": Measured(26, 0),
    "GL009": Measured(61, 43),
    "GL011": Measured(2, 0),
    "GL013": Measured(1, 0),
    "GL014": Measured(2, 0),
    "GL016": Measured(10, 5),
    "GL017": Measured(9, 0),
    "GL018": Measured(15, 0),
    "GL019": Measured(4, 0),
    "GL022": Measured(2, 1),
}


def in_preview(code: str) -> bool:
    """Whether the rule `code` is off by default: measured on fresh code and right less than four times in five."""
    measured = FRESH.get(code)
    return measured is not None and not measured.trusted


def precision_text(code: str) -> str:
    """The documentation's account of what the draws measured for the rule `code`."""
    measured = FRESH.get(code)
    if measured is None:
        return f"No finding in the draws of fresh code so far ({LINES} lines): not measured yet. On by default."
    status = (
        "In preview: off by default, on with `--preview` or `preview = true`."
        if not measured.trusted
        else "On by default."
    )
    return (
        f"Right {measured.right} of {measured.findings} times on fresh code ({LINES} lines nobody had "
        f"tuned the rules to, judged at first look; benchmarks/fresh/). {status}"
    )
