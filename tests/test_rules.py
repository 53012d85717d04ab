"""Every rule against its fixtures (both ways), its documentation and its examples."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gradlint import Config, lint_paths, lint_source
from gradlint.rule import Rule, all_rules

FIXTURES = Path(__file__).parent.parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>GL\d{3}(?:\s*,\s*GL\d{3})*)")
RULES = list(all_rules().values())


def module_stem(rule: type[Rule]) -> str:
    return rule.__module__.rsplit(".", 1)[-1]


def expected_findings(source: str) -> set[tuple[int, str]]:
    expected = set()
    for number, line in enumerate(source.splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            expected.update((number, code.strip()) for code in match["codes"].split(","))
    return expected


def fixture_files() -> list[Path]:
    return sorted(path for path in FIXTURES.glob("*/*.py") if path.parent.name != "runtime")


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_rule_has_fixtures_with_positive_and_clean_cases(rule: type[Rule]) -> None:
    folder = FIXTURES / module_stem(rule)
    assert folder.is_dir(), f"missing fixture folder {folder}"
    sources = [path.read_text() for path in folder.glob("*.py")]
    assert any(f"expect: {rule.code}" in source for source in sources)
    assert any(f"expect: {rule.code}" not in source for source in sources), "no clean look-alike fixture"


@pytest.mark.parametrize("path", fixture_files(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_fixture_findings_match_markers_exactly(path: Path) -> None:
    """Every marked line is reported and every unmarked line stays quiet, for every rule."""
    source = path.read_text()
    found = {(d.line, d.code) for d in lint_source(source, str(path), Config())}
    assert found == expected_findings(source)


def project_fixtures() -> list[Path]:
    """Fixtures of several modules: `fixtures/<rule>/<case>/`, linted as one project."""
    return sorted(path for path in FIXTURES.glob("*/*") if path.is_dir() and path.parent.name != "runtime")


@pytest.mark.parametrize("folder", project_fixtures(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_project_fixture_findings_match_markers_exactly(folder: Path) -> None:
    """A project's modules linted together (the whole-program model): every marked line and nothing else."""
    found = {(Path(d.path).relative_to(folder), d.line, d.code) for d in lint_paths([folder], Config(), jobs=1)}
    expected = {
        (path.relative_to(folder), line, code)
        for path in sorted(folder.rglob("*.py"))
        for line, code in expected_findings(path.read_text())
    }
    assert found == expected


def test_project_fixtures_need_the_whole_program() -> None:
    """Each project fixture has findings that only calls across its modules explain (found, or proven wrong: an
    evaluation helper that every caller in another module runs under no_grad)."""
    for folder in project_fixtures():
        alone = {
            (path, d.line, d.code)
            for path in folder.rglob("*.py")
            for d in lint_source(path.read_text(), str(path), Config())
        }
        whole = {(Path(d.path), d.line, d.code) for d in lint_paths([folder], Config(), jobs=1)}
        assert alone != whole, folder


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_documented_example_fires_and_fix_is_quiet(rule: type[Rule]) -> None:
    only = Config(select=(rule.code,))
    header = "import torch\n"
    bad = lint_source(header + textwrap.dedent(rule.example), "example.py", only)
    good = lint_source(header + textwrap.dedent(rule.use_instead), "use_instead.py", only)
    assert [d.code for d in bad] and {d.code for d in bad} == {rule.code}
    assert good == []


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_documentation_follows_the_house_style(rule: type[Rule]) -> None:
    doc = rule.__doc__ or ""
    assert doc.startswith("Checks for")
    assert "Why is this bad?" in doc
    assert re.fullmatch(r"GL\d{3}", rule.code)
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name)
    assert rule.message[0].islower() and not rule.message.endswith(".")
    assert rule.code not in rule.message


def test_codes_and_names_are_unique() -> None:
    assert len({rule.name for rule in RULES}) == len(RULES)
    assert len({rule.code for rule in RULES}) == len(RULES)


def test_a_duplicate_code_fails_at_definition() -> None:
    with pytest.raises(TypeError, match="duplicate rule code"):
        type("Clash", (Rule,), {"code": RULES[0].code})


RELATED = re.compile(r"#\s*related:\s*(?P<codes>GL\d{3}(?:\s*,\s*GL\d{3})*)")


@pytest.mark.parametrize("code", sorted(all_rules()))
def test_findings_explain_themselves_with_related_locations(code: str) -> None:
    # A line marked `# related: GL001` must be a related location of a GL001 finding in its file.
    rule = all_rules()[code]
    marked, related = set(), set()
    for path in sorted((FIXTURES / rule.__module__.rsplit(".", 1)[-1]).glob("*.py")):
        source = path.read_text()
        for number, line in enumerate(source.splitlines(), start=1):
            match = RELATED.search(line)
            if match and code in match["codes"]:
                marked.add((path.name, number))
        for diagnostic in lint_source(source, str(path)):
            if diagnostic.code != code:
                continue
            for place in diagnostic.related:
                assert place.path == diagnostic.path and place.note and 0 < place.line <= len(source.splitlines())
                related.add((path.name, place.line))
    assert marked, f"no fixture of {code} marks a related location"
    assert marked <= related
