"""Output formats: SARIF against its schema, GitHub annotations, JSON Lines, --show-source."""

from __future__ import annotations

import email.message
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest
from click.testing import CliRunner

from gradlint import Diagnostic
from gradlint import rule as rule_module
from gradlint.cli import main
from gradlint.formats import formats, github, json_lines, sarif, text
from gradlint.rule import Related, all_rules

SCHEMA = Path(__file__).parent.parent.parent / "shared" / "schemas" / "sarif-2.1.0.json"
LEAK = """\
import torch

total_loss = 0
for x, y in loader:
\toptimizer.zero_grad()
\tloss = criterion(model(x), y)
\tloss.backward()
\toptimizer.step()
\ttotal_loss += loss
"""


RELATED = (
    Related("src/train.py", 6, 5, 6, 35, "`loss` gets its autograd graph here"),
    Related("src/train.py", 4, 1, 9, 23, "each iteration of this loop adds another graph"),
)


def diagnostic(**changes: object) -> Diagnostic:
    fields: dict[str, object] = {
        "path": "src/train.py",
        "line": 9,
        "column": 5,
        "code": "GL001",
        "end_line": 9,
        "end_column": 23,
        "name": "loss-accumulation",
        "message": "a tensor with autograd history is accumulated",
    }
    return Diagnostic(**{**fields, **changes})  # type: ignore[arg-type]  # keys are Diagnostic's fields


def test_every_format_module_is_registered_under_its_cli_name() -> None:
    assert {"text", "json", "json-lines", "sarif", "github"} <= set(formats())


def test_sarif_is_valid_against_the_official_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        # CI provides shared/ beside the clone: there a missing schema is a broken setup, not a skip.
        if os.environ.get("CI"):
            pytest.fail(f"no SARIF schema at {SCHEMA}")
        pytest.skip(f"no SARIF schema at {SCHEMA}")
    log = json.loads(
        sarif.render(
            [
                diagnostic(),
                diagnostic(related=RELATED),
                diagnostic(path="/abs/dir with space/nb.ipynb", cell=3, related=(replace(RELATED[0], cell=3),)),
                diagnostic(code="GL000", name="parse-error", message="syntax error"),
            ]
        )
    )
    jsonschema.Draft4Validator(json.loads(SCHEMA.read_text())).validate(log)


def test_sarif_describes_every_rule_with_its_help_link() -> None:
    [run] = json.loads(sarif.render([diagnostic()]))["runs"]
    rules = run["tool"]["driver"]["rules"]
    by_id = {rule["id"]: rule for rule in rules}
    for code, rule in all_rules().items():
        assert by_id[code].get("helpUri") == rule.docs_url()
        assert by_id[code]["name"] == rule.name
        assert by_id[code]["shortDescription"]["text"] == rule.summary()
    [result] = run["results"]
    assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == "GL001"
    # Every finding fails the gate: code scanning shows `error`, and so do the rules' defaults.
    assert result["level"] == "error"
    assert {rule["defaultConfiguration"]["level"] for rule in rules} == {"error"}
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 9, "startColumn": 5, "endLine": 9, "endColumn": 23}


@pytest.fixture
def project_urls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Sets the `Project-URL` entries of gradlint's metadata: `[project.urls]` of its pyproject.toml."""

    def set_entries(*entries: str) -> None:
        message = email.message.Message()
        for entry in entries:
            message["Project-URL"] = entry
        monkeypatch.setattr(rule_module, "metadata", lambda name: message)
        rule_module.project_url.cache_clear()

    yield set_entries
    rule_module.project_url.cache_clear()


def test_no_documentation_url_means_no_link_anywhere(project_urls: Callable[..., None]) -> None:
    project_urls("Source, https://example.org/gradlint")
    rule = all_rules()["GL001"]
    assert rule.docs_url() is None
    assert "Documentation:" not in rule.documentation()
    [run] = json.loads(sarif.render([diagnostic()]))["runs"]
    assert not any("helpUri" in descriptor for descriptor in run["tool"]["driver"]["rules"])
    assert run["tool"]["driver"]["informationUri"] == "https://example.org/gradlint"
    result = CliRunner().invoke(main, ["rule", "GL001"])
    assert result.exit_code == 0 and "Documentation:" not in result.stdout


def test_the_documentation_url_of_the_metadata_links_every_rule(project_urls: Callable[..., None]) -> None:
    project_urls("documentation, https://example.org/gradlint/docs")
    rule = all_rules()["GL001"]
    assert rule.docs_url() == "https://example.org/gradlint/docs/rules.md#gl001-loss-accumulation"
    assert rule.documentation().endswith(
        "\nDocumentation: https://example.org/gradlint/docs/rules.md#gl001-loss-accumulation\n"
    )
    [run] = json.loads(sarif.render([diagnostic()]))["runs"]
    by_id = {descriptor["id"]: descriptor for descriptor in run["tool"]["driver"]["rules"]}
    assert by_id["GL001"]["helpUri"] == rule.docs_url()
    assert "informationUri" not in run["tool"]["driver"]  # no homepage given


def test_uninstalled_gradlint_has_no_links(project_urls: Callable[..., None], monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(rule_module, "metadata", not_installed)
    rule_module.project_url.cache_clear()
    assert all_rules()["GL001"].docs_url() is None


def test_the_lsp_links_a_code_to_its_documentation_only_when_it_is_published(project_urls: Callable[..., None]) -> None:
    pytest.importorskip("pygls")
    from pygls.workspace import PositionCodec

    from gradlint.lsp import to_lsp

    lines = ["import torch"] * 10 + [""]
    project_urls()
    assert to_lsp(diagnostic(), lines, PositionCodec()).code_description is None
    project_urls("Documentation, https://example.org/gradlint/docs/")
    description = to_lsp(diagnostic(), lines, PositionCodec()).code_description
    assert description is not None
    assert description.href == "https://example.org/gradlint/docs/rules.md#gl001-loss-accumulation"


def test_sarif_uris_are_percent_encoded_and_absolute_paths_are_file_uris() -> None:
    relative = diagnostic(path="my dir/a%b.py")
    absolute = diagnostic(path="/work/my dir/a.py")
    [run] = json.loads(sarif.render([relative, absolute]))["runs"]
    uris = [result["locations"][0]["physicalLocation"]["artifactLocation"] for result in run["results"]]
    assert uris == [{"uri": "my%20dir/a%25b.py", "uriBaseId": "%SRCROOT%"}, {"uri": "file:///work/my%20dir/a.py"}]


def test_github_annotations() -> None:
    assert github.render([diagnostic()]) == (
        "::error file=src/train.py,line=9,col=5,endLine=9,endColumn=23,title=GL001 loss-accumulation"
        "::a tensor with autograd history is accumulated\n"
    )


def test_github_escapes_what_would_end_a_property_or_the_message() -> None:
    [line] = github.render([diagnostic(path="a,b:c%.py", message="50% done\nnext")]).splitlines()
    assert line.startswith("::error file=a%2Cb%3Ac%25.py,line=9,")
    assert line.endswith("::50%25 done%0Anext")


def test_github_annotates_a_notebook_finding_on_the_file_with_its_cell() -> None:
    # Annotation lines would be lines of the notebook's JSON, not of the cell.
    assert github.render([diagnostic(path="nb.ipynb", cell=2, line=7)]) == (
        "::error file=nb.ipynb,title=GL001 loss-accumulation"
        "::cell 2, line 7: a tensor with autograd history is accumulated\n"
    )


def test_json_lines_holds_the_json_objects_one_per_line() -> None:
    diagnostics = [diagnostic(), diagnostic(path="nb.ipynb", cell=2)]
    lines = json_lines.render(diagnostics).splitlines()
    assert [json.loads(line) for line in lines] == json.loads(formats()["json"](diagnostics))
    assert json_lines.render([]) == ""


def test_text_shows_source_with_a_caret_under_the_span() -> None:
    lines = {9: "\ttotal_loss += loss", 4: "for x, y in loader:"}
    rendered = text.render(
        [diagnostic(column=2, end_column=20), diagnostic(line=4, column=1, end_line=8, end_column=9)],
        source_line=lambda d: lines[d.line],
    )
    assert rendered.splitlines()[1:3] == ["    \ttotal_loss += loss", "    \t^^^^^^^^^^^^^^^^^^"]
    # A span that runs past its line is underlined to the end of the line.
    assert rendered.splitlines()[4:6] == ["    for x, y in loader:", "    ^^^^^^^^^^^^^^^^^^^"]


def test_show_source_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("leak.py").write_text(LEAK)
    result = CliRunner().invoke(main, ["--show-source", "leak.py"])
    assert result.exit_code == 1
    # The offending line, then each related place with its note, its line and carets.
    assert result.stdout.splitlines()[1:] == [
        "    \ttotal_loss += loss",
        "    \t^^^^^^^^^^^^^^^^^^",
        "  leak.py:6:2: note: `loss` gets its autograd graph here",
        "    \tloss = criterion(model(x), y)",
        "    \t^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "  leak.py:4:1: note: each iteration of this loop adds another graph",
        "    for x, y in loader:",
        "    ^^^^^^^^^^^^^^^^^^^",
        "  leak.py:7:2: note: backward frees the step's buffers, but the graph stays referenced",
        "    \tloss.backward()",
        "    \t^^^^^^^^^^^^^^^",
    ]


def test_show_source_is_refused_with_other_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["--show-source", "--format", "json", "."])
    assert result.exit_code == 2
    assert "--show-source works with the text format only" in result.stderr


def test_a_missing_schema_fails_the_schema_test_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys.modules[__name__], "SCHEMA", tmp_path / "missing.json")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no SARIF schema"):
        test_sarif_is_valid_against_the_official_schema()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        test_sarif_is_valid_against_the_official_schema()


def test_sarif_carries_related_locations_and_the_findings_story_as_a_code_flow() -> None:
    [run] = json.loads(sarif.render([diagnostic(related=RELATED)]))["runs"]
    [result] = run["results"]
    first, second = result["relatedLocations"]
    assert first["id"] == 1 and first["message"] == {"text": "`loss` gets its autograd graph here"}
    assert first["physicalLocation"]["region"] == {"startLine": 6, "startColumn": 5, "endLine": 6, "endColumn": 35}
    assert second["physicalLocation"]["region"]["startLine"] == 4
    [flow] = result["codeFlows"]
    steps = [step["location"] for step in flow["threadFlows"][0]["locations"]]
    assert [step["physicalLocation"]["region"]["startLine"] for step in steps] == [6, 4, 9]  # then the finding
    assert steps[-1]["message"] == result["message"]


def test_a_finding_without_related_places_has_no_related_keys_in_sarif() -> None:
    [result] = json.loads(sarif.render([diagnostic()]))["runs"][0]["results"]
    assert "relatedLocations" not in result and "codeFlows" not in result


def test_github_annotations_fold_the_notes_into_the_message() -> None:
    line = github.render([diagnostic(related=RELATED)])
    assert line.endswith(
        "::a tensor with autograd history is accumulated"
        "%0Aline 6: `loss` gets its autograd graph here%0Aline 4: each iteration of this loop adds another graph\n"
    )


def test_json_and_json_lines_list_the_related_places() -> None:
    [found] = json.loads(formats()["json"]([diagnostic(related=RELATED)]))
    assert found["related"][0] == {
        "path": "src/train.py",
        "line": 6,
        "column": 5,
        "end_line": 6,
        "end_column": 35,
        "note": "`loss` gets its autograd graph here",
    }
    [line] = json_lines.render([diagnostic(related=RELATED)]).splitlines()
    assert json.loads(line)["related"] == found["related"]
