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


def test_readme_links_each_rule_to_its_section_of_docs_rules_md_by_relative_path() -> None:
    links = re.findall(r"\| \[(GL\d{3})\]\(([^)]*)\)", README.read_text())
    headings = re.findall(r"^## (GL\d{3}) (\S+)$", (ROOT / "docs" / "rules.md").read_text(), re.MULTILINE)
    # GitHub's anchor for `## GL001 loss-accumulation` is `gl001-loss-accumulation`.
    assert links == [(code, f"docs/rules.md#{code.lower()}-{name}") for code, name in headings]


def test_docs_rules_md_is_generated_from_the_rules() -> None:
    generated = (ROOT / "docs" / "rules.md").read_text()
    assert generated == rules_markdown(), "run `gradlint rules --docs > docs/rules.md`"


def test_every_rule_that_builds_fixes_documents_what_its_fix_assumes() -> None:
    import inspect

    from gradlint.rule import all_rules

    for rule in all_rules().values():
        builds_fixes = "from gradlint.fixes import" in inspect.getsource(inspect.getmodule(rule))  # type: ignore[arg-type]
        assert builds_fixes == ("\nFix safety\n" in inspect.cleandoc(rule.__doc__ or "")), rule.code
