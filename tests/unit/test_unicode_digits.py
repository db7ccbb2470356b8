"""``"²".isdigit()`` is True but ``int("²")`` fails: every digit check before an ``int()`` is ASCII-only.

Found by tests/security/test_fuzz.py (``limit=²`` answered 500 by the proxy); these pin each parser.
"""

from __future__ import annotations

import pytest

from range_filter_proxy.cached import parse_rv
from range_filter_proxy.errors import ApiError
from rangeshard.core.listoptions import parse_limit
from rangeshard.core.tables import _json_path

ODD_DIGITS = ["²", "¹⁰", "٣", "①", "7²"]


@pytest.mark.parametrize("raw", ODD_DIGITS)
def test_limit_with_non_ascii_digits_is_a_400(raw: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_limit(raw)
    assert caught.value.code == 400 and "limit" in caught.value.message


@pytest.mark.parametrize("raw", ODD_DIGITS)
def test_resource_version_with_non_ascii_digits_is_invalid(raw: str) -> None:
    with pytest.raises(ValueError, match="invalid resource version"):
        parse_rv(raw)


def test_ascii_digits_still_parse() -> None:
    assert parse_limit("25") == 25 and parse_limit("0") is None and parse_rv("123") == 123


def test_printer_column_json_path_index_with_non_ascii_digits_is_empty() -> None:
    assert _json_path({"a": [1, 2, 3]}, ".a[²]") is None
    assert _json_path({"a": [1, 2, 3]}, ".a[1]") == 2
