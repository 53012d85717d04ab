"""The README and the rules cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from gradlint.cli import rule_table, rules_markdown

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_readme_rule_table_is_generated_from_the_rules() -> None:
    text = README.read_text()
    block = re.search(r"<!-- rules:start -->\n(.*?)<!-- rules:end -->", text, re.DOTALL)
    assert block is not None, "README lacks the rules block"
    assert block.group(1) == rule_table(), "run `gradlint rules --markdown` and paste it into the README"


def test_docs_rules_md_is_generated_from_the_rules() -> None:
    generated = (ROOT / "docs" / "rules.md").read_text()
    assert generated == rules_markdown(), "run `gradlint rules --docs > docs/rules.md`"


def test_every_rule_that_builds_fixes_documents_what_its_fix_assumes() -> None:
    import inspect

    from gradlint.rule import all_rules

    for rule in all_rules().values():
        builds_fixes = "from gradlint.fixes import" in inspect.getsource(inspect.getmodule(rule))  # type: ignore[arg-type]
        assert builds_fixes == ("\nFix safety\n" in inspect.cleandoc(rule.__doc__ or "")), rule.code
