"""What the first-look draws of fresh code measured for each rule: the data behind preview and the rules' docs.

A draw (benchmarks/fresh/) lints PyTorch libraries gradlint had never been run on, and a
person judges every finding before anything is changed for them. Each draw measures the
rules as they were at its commit; the analysis learns between draws, so a rule is judged
by its newest measurements: its findings in the newest draws, counted back from the
latest until they add up to at least `SAMPLE` findings (all the draws when they never
do). A rule whose findings there were right less than four times in five is in
*preview*: off by default, on with `--preview` (or `preview = true`), until a later draw
shows it better; a rule that leaves preview goes back the first time a draw shows it
worse. A rule that never fired in a draw has no measured precision and stays on. The
tests check these numbers against benchmarks/fresh/drawN.json.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """A rule's findings in some draws, and how many of them were right (a bug, a waste or a nit)."""

    findings: int
    right: int

    @property
    def trusted(self) -> bool:
        """Whether the findings were right at least four times in five."""
        return self.right * 5 >= self.findings * 4

    def __add__(self, other: Measured) -> Measured:
        return Measured(self.findings + other.findings, self.right + other.right)


# The draws these numbers come from, oldest first; each rule's counts below follow this order.
DRAWS = (
    "draw 1 of 2026-12-04: 20 libraries, 1.34 million lines, gradlint 29e1c15",
    "draw 2 of 2026-12-04: 26 libraries, 1.24 million lines, gradlint 560bfe7",
    "draw 3 of 2026-12-05: 46 libraries, 1.34 million lines, gradlint 6afe991",
    "draw 4 of 2026-12-05: 44 libraries, 1.44 million lines, gradlint 1ce8f3f",
    "draw 5 of 2026-12-06: 46 libraries, 2.74 million lines, gradlint 8ccf58a",
    "draw 6 of 2026-12-06: 48 libraries, 1.32 million lines, gradlint 0fc1967",
    "draw 7 of 2026-12-06: 45 libraries, 2.15 million lines, gradlint 5bbbfda",
    "draw 8 of 2026-12-06: 53 libraries, 1.23 million lines, gradlint 3ce4752",
    "draw 9 of 2026-12-06: 61 libraries, 2.36 million lines, gradlint e5c945d",
    "draw 10 of 2026-12-07: 61 libraries, 0.97 million lines, gradlint c13eb6b",
    "draw 11 of 2026-12-07: 66 libraries, 1.03 million lines, gradlint b0cd1cc",
    "draw 12 of 2026-12-07: 32 libraries, 0.86 million lines, gradlint ac6ea37",
    "draw 13 of 2026-12-07: 48 libraries, 1.12 million lines, gradlint 3260568",
    "draw 14 of 2026-12-07: 22 libraries, 0.70 million lines, gradlint 9e22e30",
    "draw 15 of 2026-12-07: 39 libraries, 1.13 million lines, gradlint ffdf156",
    "draw 16 of 2026-12-07: 43 libraries, 0.92 million lines, gradlint c8c85c3",
    "draw 17 of 2026-12-08: 47 libraries, 1.02 million lines, gradlint 856c293",
    "draw 18 of 2026-12-08: 47 libraries, 1.13 million lines, gradlint f13784b",
)
LINES = "24.05 million"
# The fewest findings a precision is measured on: fewer newest findings reach back to older draws.
SAMPLE = 5

NONE = Measured(0, 0)  # a draw in which the rule never fired
FRESH: dict[str, tuple[Measured, ...]] = {
    "GL001": (
        Measured(1, 0),
        NONE,
        Measured(3, 1),
        Measured(7, 6),
        Measured(10, 2),
        Measured(1, 0),
        Measured(23, 23),
        Measured(4, 3),
        Measured(2, 2),
        Measured(1, 0),
        Measured(2, 1),
        NONE,
        NONE,
        Measured(5, 5),
        Measured(24, 23),
        Measured(1, 1),
        Measured(3, 2),
        Measured(2, 1),
    ),
    "GL002": (
        Measured(3, 0),
        Measured(4, 0),
        Measured(1, 1),
        Measured(4, 0),
        Measured(29, 0),
        NONE,
        Measured(3, 0),
        Measured(2, 0),
        Measured(1, 0),
        Measured(1, 0),
        Measured(3, 0),
        Measured(1, 0),
        Measured(1, 1),
        Measured(1, 0),
        Measured(6, 1),
        Measured(5, 3),
        Measured(4, 1),
        Measured(6, 1),
    ),
    "GL003": (
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        NONE,
        NONE,
    ),
    "GL004": (
        Measured(2, 0),
        Measured(9, 0),
        Measured(2, 2),
        Measured(1, 0),
        Measured(3, 0),
        NONE,
        NONE,
        Measured(2, 0),
        Measured(4, 0),
        Measured(1, 0),
        Measured(1, 1),
        Measured(5, 5),
        Measured(1, 0),
        Measured(2, 2),
        Measured(6, 2),
        Measured(9, 0),
        Measured(2, 2),
        Measured(4, 3),
    ),
    "GL005": (
        Measured(1, 0),
        NONE,
        Measured(6, 6),
        Measured(5, 4),
        Measured(4, 2),
        Measured(1, 1),
        Measured(24, 20),
        NONE,
        Measured(5, 2),
        NONE,
        Measured(2, 2),
        Measured(1, 0),
        Measured(3, 1),
        NONE,
        Measured(5, 1),
        Measured(1, 1),
        Measured(3, 3),
        Measured(5, 4),
    ),
    "GL006": (
        NONE,
        Measured(15, 0),
        NONE,
        NONE,
        Measured(2, 0),
        NONE,
        Measured(2, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(2, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        Measured(1, 1),
    ),
    "GL007": (
        NONE,
        Measured(4, 4),
        NONE,
        NONE,
        Measured(6, 6),
        NONE,
        Measured(3, 3),
        NONE,
        NONE,
        Measured(3, 2),
        Measured(3, 1),
        NONE,
        NONE,
        Measured(10, 10),
        Measured(1, 0),
        Measured(1, 1),
        Measured(2, 2),
        NONE,
    ),
    "GL008": (
        Measured(5, 0),
        Measured(5, 0),
        Measured(7, 0),
        Measured(9, 0),
        Measured(5, 0),
        Measured(1, 0),
        Measured(1, 0),
        Measured(2, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(4, 0),
        Measured(3, 0),
        Measured(1, 0),
        Measured(13, 0),
    ),
    "GL009": (
        Measured(6, 0),
        Measured(6, 4),
        Measured(14, 6),
        Measured(35, 33),
        Measured(18, 8),
        Measured(3, 1),
        Measured(25, 22),
        Measured(46, 42),
        Measured(6, 4),
        Measured(6, 3),
        Measured(27, 11),
        NONE,
        Measured(5, 1),
        Measured(8, 8),
        Measured(31, 25),
        Measured(20, 12),
        Measured(34, 31),
        Measured(56, 45),
    ),
    "GL010": (
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(3, 3),
        NONE,
        NONE,
        NONE,
    ),
    "GL011": (
        Measured(1, 0),
        NONE,
        Measured(1, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(2, 0),
        NONE,
        Measured(3, 0),
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
    ),
    "GL013": (
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        Measured(1, 0),
        NONE,
        Measured(2, 1),
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(7, 0),
    ),
    "GL014": (
        NONE,
        NONE,
        NONE,
        Measured(2, 0),
        NONE,
        Measured(1, 1),
        Measured(1, 1),
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        Measured(1, 1),
        Measured(1, 0),
    ),
    "GL016": (
        Measured(1, 0),
        Measured(3, 2),
        Measured(3, 1),
        Measured(3, 2),
        Measured(2, 1),
        NONE,
        Measured(4, 0),
        Measured(1, 0),
        Measured(6, 2),
        NONE,
        Measured(1, 1),
        NONE,
        Measured(1, 0),
        NONE,
        Measured(10, 6),
        Measured(3, 3),
        Measured(2, 0),
        Measured(3, 0),
    ),
    "GL017": (
        Measured(2, 0),
        Measured(3, 0),
        Measured(2, 0),
        Measured(2, 0),
        Measured(4, 0),
        Measured(1, 0),
        Measured(4, 1),
        Measured(2, 0),
        Measured(1, 0),
        Measured(1, 1),
        Measured(2, 1),
        NONE,
        Measured(1, 0),
        Measured(1, 0),
        Measured(7, 0),
        Measured(2, 2),
        Measured(4, 0),
        NONE,
    ),
    "GL018": (
        Measured(2, 0),
        Measured(13, 0),
        NONE,
        NONE,
        NONE,
        Measured(2, 2),
        NONE,
        Measured(1, 0),
        NONE,
        NONE,
        Measured(2, 0),
        NONE,
        Measured(1, 0),
        NONE,
        Measured(4, 1),
        Measured(1, 1),
        NONE,
        NONE,
    ),
    "GL019": (
        Measured(3, 0),
        NONE,
        Measured(1, 0),
        NONE,
        Measured(1, 1),
        Measured(2, 0),
        Measured(2, 2),
        Measured(1, 0),
        Measured(1, 0),
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        Measured(4, 0),
        NONE,
        NONE,
        NONE,
    ),
    "GL020": (
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        NONE,
        Measured(4, 0),
        NONE,
        Measured(1, 1),
        Measured(1, 1),
    ),
    "GL022": (
        Measured(2, 1),
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        Measured(1, 1),
        NONE,
        Measured(4, 2),
        NONE,
        Measured(2, 0),
        NONE,
        NONE,
        NONE,
        Measured(1, 0),
        NONE,
        Measured(1, 0),
        Measured(1, 1),
    ),
}


def total(code: str) -> Measured:
    """The rule's findings over every draw."""
    return sum(FRESH.get(code, ()), NONE)


def newest(code: str) -> tuple[Measured, int]:
    """The rule's findings in its newest draws (back from the latest until `SAMPLE` findings), and how many draws."""
    counted, draws = NONE, 0
    for measured in reversed(FRESH.get(code, ())):
        if counted.findings >= SAMPLE:
            break
        counted, draws = counted + measured, draws + 1
    return counted, draws


def in_preview(code: str) -> bool:
    """Whether the rule `code` is off by default: its newest findings were right less than four times in five."""
    counted, _draws = newest(code)
    return counted.findings > 0 and not counted.trusted


def precision_text(code: str) -> str:
    """The documentation's account of what the draws measured for the rule `code`."""
    counted, draws = newest(code)
    if counted.findings == 0:
        return f"No finding in the draws of fresh code so far ({LINES} lines): not measured yet. On by default."
    status = (
        "On by default." if counted.trusted else "In preview: off by default, on with `--preview` or `preview = true`."
    )
    every = total(code)
    if draws == len(DRAWS):
        where = f"over all {len(DRAWS)} draws ({LINES} lines)"
    else:
        where = "in the latest draw" if draws == 1 else f"in the latest {draws} draws"
    text = (
        f"Right {counted.right} of {counted.findings} times on fresh code {where} (libraries nobody had tuned "
        f"the rules to, judged at first look; benchmarks/fresh/)"
    )
    if draws < len(DRAWS):
        text += f"; {every.right} of {every.findings} over all {len(DRAWS)} draws ({LINES} lines)"
    return f"{text}. {status}"
