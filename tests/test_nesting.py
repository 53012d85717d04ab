"""The nesting guard: files nested more than 100 brackets deep never reach LibCST.

LibCST's time grows quadratically with bracket nesting and its parser crashes (SIGSEGV)
beyond about 2,000 levels, so the engine counts the nesting of the code first. Only the
brackets of code count: those in strings and comments do not, and a closing bracket in a
string must not hide real nesting. The code inside f-string replacement fields counts.
"""

from __future__ import annotations

import pytest

from gradlint import lint_source
from gradlint.decoding import MAX_NESTING

STEP = "import torch\nloss.backward()\n"  # a file some rule could fire on: the guard runs
REFUSED = f"cannot parse: brackets are nested more than {MAX_NESTING} deep"


def refused(code: str) -> bool:
    """Whether linting `code` stops at the nesting guard."""
    found = lint_source(STEP + code, "nested.py")
    return any(d.code == "GL000" and d.message == REFUSED and d.line == 1 for d in found)


def nested(levels: int, middle: str = "") -> str:
    """`x = ` and `levels` parentheses, with `middle` written after the first half of them."""
    half = levels // 2
    return "x = " + "(" * half + middle + "(" * (levels - half) + "1" + ")" * levels + "\n"


@pytest.mark.parametrize("opening", ["(", "[", "{"])
def test_the_limit_is_one_hundred_levels_of_any_bracket(opening: str) -> None:
    closing = {"(": ")", "[": "]", "{": "}"}[opening]
    assert not refused("x = " + opening * MAX_NESTING + "1" + closing * MAX_NESTING + "\n")
    assert refused("x = " + opening * (MAX_NESTING + 1) + "1" + closing * (MAX_NESTING + 1) + "\n")


# Each literal holds closing brackets and sits inside the nesting: a count that read them
# would go down by five and let 101 levels through.
HIDING = {
    "string": '")))))", ',
    "single-quoted string": "')))))', ",
    "string with an escaped quote": '"\\")))))", ',
    "raw string with an escaped quote": 'r"\\")))))", ',
    "bytes": 'Rb")))))", ',
    "comment": "# )))))\n",
    "triple-quoted string": '"""\n)))))\n""", ',
    "triple-quoted single quotes": "'''\n)))))\n''', ",
    "f-string text": 'f")))))", ',
    "f-string with an escaped quote": 'f"\\")))))", ',
    "f-string after doubled braces": 'f"{{)))))", ',
    "upper-case f-string": 'F")))))", ',
    "raw f-string": 'rf")))))", ',
    "triple-quoted f-string over lines": "f'''\n)))))\n''', ",
    "string in a replacement field": "f\"{')))))'}\", ",
    "same quotes in a replacement field": 'f"{")))))"}", ',
    "comment in a replacement field": "f'''{a  # )))))\n}''', ",
    "keyword before a string": '1 if")))))" else 2, ',
}


@pytest.mark.parametrize("middle", list(HIDING.values()), ids=list(HIDING))
def test_closing_brackets_in_literals_hide_no_nesting(middle: str) -> None:
    assert refused(nested(MAX_NESTING + 1, middle))
    assert not refused(nested(MAX_NESTING, middle))


# Each literal holds 150 opening brackets, which must not count either.
OPENING_IN_LITERALS = {
    "string": '"' + "(" * 150 + '"',
    "comment": "0  # " + "(" * 150,
    "triple-quoted string": '"""\n' + "[" * 150 + '\n"""',
    "f-string text": 'f"' + "(" * 150 + '"',
    "doubled braces of an f-string": 'f"' + "{{" * 150 + '"',
    "bytes": 'b"{' + "(" * 150 + '"',
    "a string after a keyword": '1 if"{' + "(" * 150 + '" else 2',
    "unicode string": 'u"{' + "(" * 150 + '"',
}


@pytest.mark.parametrize("literal", list(OPENING_IN_LITERALS.values()), ids=list(OPENING_IN_LITERALS))
def test_opening_brackets_in_literals_do_not_count(literal: str) -> None:
    assert not refused(f"s = {literal}\n")


@pytest.mark.parametrize("prefix", ["f", "F", "rf", "fR", "t"])
def test_brackets_in_replacement_fields_count_with_the_field(prefix: str) -> None:
    # The field itself is one level: 99 parentheses inside it make 100, 100 make 101.
    def field(levels: int) -> str:
        return f'x = {prefix}"{{' + "(" * levels + "1" + ")" * levels + '}"\n'

    assert not refused(field(MAX_NESTING - 1))
    assert refused(field(MAX_NESTING))


def test_a_replacement_field_ends_at_its_own_closing_brace() -> None:
    # After `{a}` the f-string's text goes on: its closing brackets are text again.
    assert refused(nested(MAX_NESTING + 1, 'f"{a}))))){b[0]}))))", '))
    assert not refused(nested(MAX_NESTING, 'f"{a}))))){b[0]}))))", '))


def test_a_field_nested_in_a_field_counts_both() -> None:
    inner = "(" * (MAX_NESTING - 2) + "1" + ")" * (MAX_NESTING - 2)
    assert not refused("x = f\"{f'{" + inner + "}'}\"\n")  # two fields and 98: 100
    inner = "(" * (MAX_NESTING - 1) + "1" + ")" * (MAX_NESTING - 1)
    assert refused("x = f\"{f'{" + inner + "}'}\"\n")  # two fields and 99: 101


@pytest.mark.parametrize("opening", ['"', "'", 'f"', "f'"])
def test_a_string_left_open_ends_at_its_line(opening: str) -> None:
    # The parser rejects the file anyway; the nesting on the next line must still be counted.
    assert refused(f"s = {opening}))))\n" + nested(MAX_NESTING + 1))


def test_stray_closing_brackets_before_the_nesting_lower_nothing() -> None:
    assert refused(")))))\n" + nested(MAX_NESTING + 1))


def test_a_file_with_few_brackets_is_not_scanned_and_is_linted() -> None:
    found = lint_source(STEP + "x = (((1)))\nfor x in loader:\n    total += criterion(model(x), y)\n", "few.py")
    assert all(d.code != "GL000" for d in found)


def test_nesting_at_the_very_start_of_the_file_counts_from_its_first_byte() -> None:
    deep = "(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1) + "\n"
    assert any(d.message == REFUSED for d in lint_source(deep + STEP, "nested.py"))
    field = 'f"{' + "(" * MAX_NESTING + "1" + ")" * MAX_NESTING + '}"\n'  # an f-string as the first bytes
    assert any(d.message == REFUSED for d in lint_source(field + STEP, "nested.py"))


def test_a_closing_bracket_between_openings_takes_back_one_level() -> None:
    # `(1)` opens and closes one level inside the outer one; 100 more make 101.
    assert refused("x = ((1), " + "(" * MAX_NESTING + "1" + ")" * (MAX_NESTING + 1) + "\n")
    assert not refused("x = ((1), " + "(" * (MAX_NESTING - 1) + "1" + ")" * MAX_NESTING + "\n")


def test_names_in_a_replacement_field_are_code_not_brackets() -> None:
    # `X` (or any letter) neither closes the field nor a bracket inside it.
    assert refused('x = f"{X + ' + "(" * MAX_NESTING + "X" + ")" * MAX_NESTING + '}"\n')


def test_a_triple_quoted_string_left_open_runs_to_the_end_of_the_file() -> None:
    # What follows the opening quotes is text: the parser, not the guard, rejects the file.
    found = lint_source(STEP + 's = """' + nested(MAX_NESTING + 1), "open.py")
    assert [d.code for d in found] == ["GL000"]
    assert found[0].message != REFUSED and found[0].message.startswith("syntax error")


def test_a_one_line_f_string_left_open_ends_at_a_carriage_return_too() -> None:
    assert refused('s = f"))))\r' + nested(MAX_NESTING + 1).replace("\n", "\r"))
