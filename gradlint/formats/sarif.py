"""SARIF 2.1.0, the format GitHub code scanning and other result viewers import."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import PurePath
from urllib.parse import quote

from gradlint import __version__
from gradlint.rule import HOMEPAGE_LABELS, INTERNAL_ERROR, PARSE_ERROR, Diagnostic, Related, all_rules, project_url

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
# Findings that are not rules still need a reporting descriptor for their ruleIndex.
NON_RULES = {
    PARSE_ERROR: "Reports a file that cannot be read or parsed; the rest of the run goes on.",
    INTERNAL_ERROR: "Reports an internal error of a rule on one file; please report it.",
}


def render(diagnostics: Sequence[Diagnostic]) -> str:
    """The findings as one SARIF run whose driver lists every rule."""
    rules = _rules()
    index = {rule["id"]: position for position, rule in enumerate(rules)}
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": _driver(rules)},
                "columnKind": "unicodeCodePoints",
                "results": [_result(d, index[d.code]) for d in diagnostics],
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def _driver(rules: list[dict[str, object]]) -> dict[str, object]:
    """The tool's descriptor; its informationUri only where `[project.urls]` names a homepage."""
    driver: dict[str, object] = {"name": "gradlint", "version": __version__, "rules": rules}
    homepage = project_url(*HOMEPAGE_LABELS)
    if homepage is not None:
        driver["informationUri"] = homepage
    return driver


def _rules() -> list[dict[str, object]]:
    descriptors: list[dict[str, object]] = [
        {
            "id": code,
            "name": name,
            "shortDescription": {"text": description},
            "defaultConfiguration": {"level": "error"},
        }
        for (code, name), description in NON_RULES.items()
    ]
    for rule in all_rules().values():
        descriptors.append(
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary()},
                "fullDescription": {"text": inspect.cleandoc(rule.__doc__ or "")},
                "help": {"text": rule.documentation()},
                **({"helpUri": url} if (url := rule.docs_url()) else {}),
                "defaultConfiguration": {"level": "error"},
                "properties": {"tags": ["pytorch", "correctness"]},
            }
        )
    return sorted(descriptors, key=lambda descriptor: str(descriptor["id"]))


def _result(diagnostic: Diagnostic, rule_index: int) -> dict[str, object]:
    region = {
        "startLine": diagnostic.line,
        "startColumn": diagnostic.column,
        "endLine": diagnostic.end_line,
        "endColumn": diagnostic.end_column,
    }
    location: dict[str, object] = {"artifactLocation": _artifact(diagnostic.path), "region": region}
    result: dict[str, object] = {
        "ruleId": diagnostic.code,
        "ruleIndex": rule_index,
        "level": "error",
        "message": {"text": diagnostic.message},
        "locations": [{"physicalLocation": location}],
    }
    if diagnostic.cell is not None:
        # A SARIF region counts the lines of the file, which in a notebook are JSON: the
        # finding points at the whole file and its place in the cell goes in properties.
        del location["region"]
        result["properties"] = {"cell": diagnostic.cell, **region}
        result["message"] = {"text": f"cell {diagnostic.cell}, line {diagnostic.line}: {diagnostic.message}"}
    if diagnostic.related:
        places = [_related(index, place) for index, place in enumerate(diagnostic.related, start=1)]
        result["relatedLocations"] = places
        # The story of the finding, step by step: each related place, then the finding itself.
        steps = [{"location": {k: v for k, v in place.items() if k != "id"}} for place in places]
        steps.append({"location": {"physicalLocation": location, "message": result["message"]}})
        result["codeFlows"] = [{"threadFlows": [{"locations": steps}]}]
    return result


def _related(index: int, place: Related) -> dict[str, object]:
    """A relatedLocation: where, and the note that says why it matters."""
    physical: dict[str, object] = {"artifactLocation": _artifact(place.path)}
    text = place.note
    if place.cell is None:
        physical["region"] = {
            "startLine": place.line,
            "startColumn": place.column,
            "endLine": place.end_line,
            "endColumn": place.end_column,
        }
    else:
        text = f"cell {place.cell}, line {place.line}: {text}"
    return {"id": index, "physicalLocation": physical, "message": {"text": text}}


def _artifact(path: str) -> dict[str, str]:
    """A relative path becomes a URI under %SRCROOT%, the checkout root in code scanning."""
    if PurePath(path).is_absolute():
        return {"uri": PurePath(path).as_uri()}
    return {"uri": quote(PurePath(path).as_posix()), "uriBaseId": "%SRCROOT%"}
