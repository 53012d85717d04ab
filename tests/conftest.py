"""The suite tests what every rule finds, in preview or not: GRADLINT_PREVIEW is set for the whole session.

Tests of the default gate (what runs without `--preview`) clear it themselves, with
`monkeypatch.delenv(PREVIEW_VARIABLE)`; subprocesses (the CLI, flake8, the LSP server,
pre-commit, `gradlint trace`) inherit it. A `Config()` made at import, before the session
starts, does not see it: such a module-level constant says `preview=True` itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gradlint.config import PREVIEW_VARIABLE


@pytest.fixture(autouse=True, scope="session")
def every_rule() -> Iterator[None]:
    """Run the rules in preview too, from before the first fixture of any scope."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PREVIEW_VARIABLE, "1")
        yield
