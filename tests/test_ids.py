import pytest

from webapp.kernel.ids import parse_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [("42", 42), (42, 42), ("0", 0), ("9" * 18, 10**18 - 1), (10**18 - 1, 10**18 - 1)],
)
def test_an_id_is_ascii_digits_or_an_int_that_a_bigint_holds(value, expected):
    assert parse_id(value) == expected


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "9" * 19, 10**18, -1, "-1", " 1", "", True, 1.0, None, [1]])
def test_anything_else_is_not_an_id(value):
    assert parse_id(value) is None
