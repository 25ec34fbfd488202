"""JSON read with limits: hostile documents get one error naming them."""

from __future__ import annotations

import json

import pytest

from anekit import jsonio


def test_a_document_is_read_and_strings_do_not_count_as_nesting():
    assert jsonio.loads('{"a": [1, "]]][[{"], "b": {"c": null}}', "[t] doc") == {
        "a": [1, "]]][[{"],
        "b": {"c": None},
    }
    assert jsonio.depth('["\\"[[[", [[]]]') == 3


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
        ('{"a": ', "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_hostile_documents_get_one_error_naming_them(text, says):
    with pytest.raises(jsonio.JsonError, match=r"^\[t\] doc: ") as info:
        jsonio.loads(text, "[t] doc")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_size_is_checked_before_parsing():
    with pytest.raises(jsonio.JsonError, match="more than the 10 allowed"):
        jsonio.loads(json.dumps(list(range(100))), "[t] doc", max_bytes=10)


def test_an_integer_past_pythons_digit_limit_is_a_json_error_not_a_value_error():
    with pytest.raises(jsonio.JsonError, match="not JSON"):
        jsonio.loads('{"n": ' + "9" * 5000 + "}", "[test] doc")
