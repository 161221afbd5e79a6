"""``gpufeed.errors.check_int``: the one int check every argument goes through."""

from __future__ import annotations

import pytest

from gpufeed.errors import check_int, is_int


def test_an_int_in_range_is_returned_and_a_bool_is_no_int():
    assert check_int("n", 3, 1) == 3
    assert check_int("port", 65535, 0, 65535) == 65535
    assert is_int(0) and not is_int(True) and not is_int(1.0)
    with pytest.raises(ValueError, match=r"^`n` must be an int >= 1\. Found: True\.$"):
        check_int("n", True, 1)


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({"minimum": 1}, 0, "`n` must be an int >= 1. Found: 0."),
    ({"minimum": 0, "maximum": 9}, 10, "`n` must be an int in 0-9. Found: 10."),
    ({"minimum": 1, "rule": "> 0"}, "2", "`n` must be an int > 0. Found: '2'."),
    ({"minimum": 1, "kind": "None or an int", "rule": "> 0"}, 0, "`n` must be None or an int > 0. Found: 0."),
    ({"minimum": 0, "subject": "the dataset's "}, -1, "the dataset's `n` must be an int >= 0. Found: -1."),
])
def test_the_message_names_the_argument_the_rule_and_the_value(kwargs, value, message):
    with pytest.raises(ValueError) as info:
        check_int("n", value, **kwargs)
    assert str(info.value) == message


def test_typed_separates_the_type_from_the_range():
    with pytest.raises(TypeError) as info:
        check_int("seed", 1.5, typed=True)
    assert str(info.value) == "`seed` must be an int. Found: 1.5 (float)."
    with pytest.raises(ValueError) as info:
        check_int("rank", -1, 0, typed=True)
    assert str(info.value) == "`rank` must be >= 0. Found: -1."
    assert check_int("seed", -7, typed=True) == -7
