"""The README and the rules cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradlint.catalog import DATA, RuleInfo, generate, rule_infos
from gradlint.cli import rule_table, rules_markdown
from gradlint.measured import DRAWS, FRESH, Measured, in_preview, newest, total
from gradlint.rule import Rule

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


def test_the_catalog_is_generated_from_the_rules() -> None:
    assert DATA.read_text(encoding="utf-8") == generate(), "run `python -m gradlint.catalog`"


def test_a_catalog_entry_loads_its_rule_and_tells_what_the_rule_tells() -> None:
    for code, info in rule_infos().items():
        rule = info.load()
        assert (rule.code, rule.name, rule.requires, rule.summary()) == (code, info.name, info.requires, info.summary)
        assert info.documentation() == rule.documentation()


def test_rules_registered_by_other_code_join_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    class Registered(Rule):
        """Checks for nothing; a rule that only this test registers."""

        code = "GL988"
        name = "registered-by-a-test"
        message = "never reported"
        example = use_instead = "pass"
        requires = (b"never",)

    del Rule.registry[Registered.code]  # defining it registered it: leave the registry as it was
    monkeypatch.setitem(Rule.registry, Registered.code, Registered)
    assert rule_infos()["GL988"] == RuleInfo.of(Registered)
    assert rule_infos()["GL988"].load() is Registered


def test_every_rule_that_builds_fixes_documents_what_its_fix_assumes() -> None:
    import inspect

    from gradlint.rule import all_rules

    for rule in all_rules().values():
        builds_fixes = "from gradlint.fixes import" in inspect.getsource(inspect.getmodule(rule))  # type: ignore[arg-type]
        assert builds_fixes == ("\nFix safety\n" in inspect.cleandoc(rule.__doc__ or "")), rule.code


DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and inline code spans, where links and headings live."""
    return re.sub(r"`[^`\n]*`", "code", FENCE.sub("", markdown))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    slugs: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?)[ #]*$", FENCE.sub("", path.read_text()), re.MULTILINE):
        slug = github_slug(heading)
        n = 0
        while (slug if n == 0 else f"{slug}-{n}") in slugs:  # GitHub numbers repeated headings
            n += 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("GL001 loss-accumulation", "gl001-loss-accumulation"),
        ("`text` (default)", "text-default"),
        ("Editor integration (LSP)", "editor-integration-lsp"),
        (
            "Leaves, in-place operations and retained graphs (GL003\N{EN DASH}GL005)",
            "leaves-in-place-operations-and-retained-graphs-gl003gl005",
        ),
        ("Runtime companion: `gradlint trace`", "runtime-companion-gradlint-trace"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(prose(README.read_text()))}
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


def test_the_pre_commit_examples_run_the_hook_that_pre_commit_hooks_yaml_defines() -> None:
    yaml = pytest.importorskip("yaml")
    hooks_file = ROOT / ".pre-commit-hooks.yaml"
    if not hooks_file.exists():  # a partial copy of the tree (mutmut's mutants/ holds docs/ and README.md only)
        pytest.skip("no .pre-commit-hooks.yaml in this copy")
    (hook,) = yaml.safe_load(hooks_file.read_text())
    examples = []
    for page in [README, *DOCS]:
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL):
            config = yaml.safe_load(block)
            if isinstance(config, dict) and "repos" in config:
                examples += [(page.name, repo) for repo in config["repos"]]
    assert examples, "no .pre-commit-config.yaml example in the README or docs/"
    for name, repo in examples:
        # Only the local form: it names no repository URL, so it cannot point at one that does not exist.
        assert repo["repo"] == "local", name
        (local,) = repo["hooks"]
        assert local["language"] in ("system", "python"), name
        assert (local["id"], local["entry"], local["types_or"]) == (hook["id"], hook["entry"], hook["types_or"]), name


def test_the_precision_the_rules_document_is_what_the_judged_draws_measured() -> None:
    # gradlint/measured.py (preview, each rule's "Precision on fresh code") against benchmarks/fresh/drawN.json.
    fresh = Path(__file__).parents[1] / "benchmarks" / "fresh"
    draws = sorted(fresh.glob("draw*.json"), key=lambda path: int(path.stem[4:]))
    assert len(draws) == len(DRAWS)
    findings: dict[str, list[Measured]] = {}
    for index, draw in enumerate(draws):
        for finding in json.loads(draw.read_text()):
            counts = findings.setdefault(finding["code"], [Measured(0, 0)] * len(draws))
            counts[index] += Measured(1, finding["verdict"] in ("bug", "waste", "nit"))
    assert {code: list(per_draw) for code, per_draw in FRESH.items()} == findings
    preview = {code for code, rule in rule_infos().items() if rule.preview}
    assert preview == {code for code in findings if in_preview(code)}
    # GL001, GL005 and GL009 left preview on draw 7's findings; draw 9 sent GL005 (2 of 5) and GL009 (4 of 6)
    # back; draw 10 sent GL001 back (5 of 7 over draws 8 to 10); draw 11 sends GL007 back (3 of 6 over draws 10
    # and 11); draw 12 takes GL004 out (5 of 5): it is the one rule that has fired on fresh code and is on, and
    # draw 13's one wrong GL004 finding leaves it on (5 of 6); draw 14 takes GL001 (5 of 5), GL007 (10 of 10) and
    # GL009 (8 of 8) out, each on the findings of that one draw; draw 15, the first to measure them on by default,
    # keeps them (23 of 24, 10 of 11 over draws 14 and 15, 25 of 31) and GL010 (3 of 3, its first findings) on, and
    # sends GL004 (2 of 6) and GL020 (0 of 4, its first findings) to preview; draw 16 sends GL009 (12 of 20) back;
    # draw 17 takes it out again (31 of 34); draw 18 keeps it (45 of 56), takes GL004 (5 of 6 over draws 17 and
    # 18) and GL005 (4 of 5) out, and sends GL001 (3 of 5 over draws 17 and 18) to preview.
    assert {"GL001", "GL002", "GL016", "GL017", "GL020"} <= preview
    assert preview == set(findings) - {"GL004", "GL005", "GL007", "GL009", "GL010"}
    assert newest("GL001") == (Measured(5, 3), 2)
    assert total("GL009").right * 5 < total("GL009").findings * 4  # over all the draws it is still under 0.8
