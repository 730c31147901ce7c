"""The settings the LMCache, vLLM and SGLang adapters take are refused at start, naming the
setting, when they would fail every request later or mean something else than they say."""

from __future__ import annotations

import pytest

from kvpool.common import integration_settings as check


@pytest.mark.parametrize(
    "value", [0, -1, float("nan"), float("inf"), 1e10, True, "5", None], ids=repr
)
def test_a_duration_is_a_positive_finite_number_of_seconds_the_wire_holds(value):
    with pytest.raises(ValueError, match="lock_ttl_s"):
        check.seconds("lock_ttl_s", value)


def test_a_duration_up_to_the_wires_limit_is_taken():
    assert check.seconds("t", 0.5) == 0.5
    assert check.seconds("t", check.MAX_SECONDS) == check.MAX_SECONDS


@pytest.mark.parametrize("value", ["no", "0", 0, 1, None], ids=repr)
def test_a_flag_is_true_or_false_only(value):
    with pytest.raises(ValueError, match="register_l1 must be true or false"):
        check.flag("register_l1", value)


@pytest.mark.parametrize("value", [-1, 9, 2**64, True, 1.0, "2"], ids=repr)
def test_replicas_are_a_whole_number_a_master_takes(value):
    """(9: more than any master keeps; before, the engine started and every store failed)"""
    with pytest.raises(ValueError, match=r"replicas must be an integer from 0 .* to 8"):
        check.replicas("replicas", value)
    assert [check.replicas("replicas", n) for n in (0, 1, 8)] == [0, 1, 8]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("\ud800", "not valid UTF-8"),
        ("x" * 257, "at most 256 leave room"),
        ("a@b", "must not contain '@'"),
        (5, "must be a string"),
    ],
)
def test_a_key_prefix_is_text_every_key_can_start_with(value, message):
    with pytest.raises(ValueError, match=message):
        check.key_prefix("key_prefix", value, forbidden="@")


def test_an_empty_prefix_is_refused_only_where_the_adapter_needs_one():
    assert check.key_prefix("key_prefix", "") == ""
    with pytest.raises(ValueError, match="non-empty string"):
        check.key_prefix("key_prefix", "", empty_allowed=False)


@pytest.mark.parametrize("value", [[("TLS", "tcp")], {"TLS": 1}, "TLS=tcp"], ids=repr)
def test_library_settings_map_strings_to_strings(value):
    with pytest.raises(ValueError, match="ucx_config must map strings to strings"):
        check.string_map("ucx_config", value)


def test_settings_are_a_mapping_or_none():
    assert check.settings_dict("adapter_params", None) == {}
    with pytest.raises(ValueError, match="adapter_params must be a mapping"):
        check.settings_dict("adapter_params", ["master"])
