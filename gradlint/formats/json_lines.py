"""One JSON object per line (JSON Lines), with the keys of the `json` format."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gradlint.formats.json import as_dict
from gradlint.rule import Diagnostic


def render(diagnostics: Sequence[Diagnostic]) -> str:
    """The findings as JSON Lines: one compact object per finding, nothing for none."""
    return "".join(json.dumps(as_dict(d)) + "\n" for d in diagnostics)
