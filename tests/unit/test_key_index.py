"""The published-key index: ordered reads see every key added, wherever it waits."""

from __future__ import annotations

import pytest

from kvpool.master.key_index import KeyIndex


def test_keys_come_back_in_order_however_they_were_added_and_removed():
    index = KeyIndex()
    for key in ("b", "d", "a"):
        index.add(key)
    assert list(index.irange("")) == ["a", "b", "d"]  # the first ordered read sorts them in
    index.add("c")
    index.remove("b")  # sorted already
    index.remove("c")  # still waiting
    index.add("e")
    assert len(index) == 3 and "e" in index and "c" not in index
    assert list(index.irange("b")) == ["d", "e"]
    assert list(index.irange("d", inclusive=(False, True))) == ["e"]


def test_removing_a_key_that_is_not_there_is_an_error():
    index = KeyIndex()
    index.add("a")
    with pytest.raises(ValueError):
        index.remove("z")
