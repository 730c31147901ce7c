"""Sizes and keys: the small parsers every command line and API call goes through."""

from __future__ import annotations

import pytest

from kvpool.common.keys import key_problem, plainly_valid, valid_keys_of, valid_positions
from kvpool.common.master_address import host_of, resolve_master
from kvpool.common.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 << 30),
        ("512MiB", 512 << 20),
        ("1.5G", 1_500_000_000),
        ("4096", 4096),
        ("64 KiB", 64 << 10),
        ("1TB", 10**12),
        ("3mi", 3 << 20),
    ],
)
def test_sizes_parse_binary_and_decimal_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1GiB", "GiB", "1.2.3", "4 gigs", "1e9"])
def test_malformed_sizes_name_the_accepted_forms(text):
    with pytest.raises(ValueError, match=r"e\.g\. 4GiB"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9" * 400, "too large a size"),  # (read as a float, it overflowed)
        ("9" * 5000, "too large a size"),  # (Python refuses to read more than 4,300 digits)
        ("9" * 400 + ".5", "too large a size"),
        ("16EiB", "e.g. 4GiB"),
        ("18446744073709551616", "too large a size"),
        ("1.5", "not a whole number of bytes"),
        ("2.5B", "not a whole number of bytes"),
    ],
)
def test_sizes_past_64_bits_or_of_fractional_bytes_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)


def test_leading_zeros_do_not_count_against_a_size_s_digits():
    assert parse_size("0" * 30 + "4096") == 4096


def test_sizes_format_for_people():
    assert format_size(0) == "0 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(32 << 20) == "32.0 MiB"


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "empty"), ("x" * 1025, "1025 bytes"), ("\ud800", "UTF-8"), (7, "str")],
)
def test_invalid_keys_are_explained(key, problem):
    assert problem in key_problem(key)


def test_valid_keys_have_no_problem():
    assert key_problem("x" * 1024) is None
    assert key_problem("модель/слой/0") is None


@pytest.mark.parametrize(
    ("keys", "plain"),
    [
        (["a", "b/c", "x" * 1024], True),
        ([], True),
        (["a", ""], False),  # empty: invalid
        (["a", "x" * 1025], False),  # too long: invalid
        (["a", 7], False),  # not a str: invalid
        (["a", "\ud800"], False),  # lone surrogate: invalid
        (["a", "модель/0"], False),  # valid, but not plainly: looked at key by key
    ],
)
def test_a_batch_is_plainly_valid_only_when_every_key_surely_is(keys, plain):
    """The batch check callers take first: True only when key_problem would find nothing
    for any key; False sends them to key_problem, key by key."""
    assert plainly_valid(keys) is plain
    if plain:
        assert all(key_problem(key) is None for key in keys)


def test_calls_that_skip_invalid_keys_keep_the_valid_ones_in_order():
    keys = ["a", "", "é", "x" * 1025, "b", None]
    assert valid_positions(keys) == [0, 2, 4]
    assert valid_keys_of(keys) == ["a", "é", "b"]  # type: ignore[arg-type]
    assert valid_keys_of(["a", "b"]) == ["a", "b"] and valid_positions([]) == []


def test_master_address_comes_from_argument_or_environment(monkeypatch):
    monkeypatch.setenv("KVPOOL_MASTER", "10.0.0.1:50051")
    assert resolve_master(None) == "10.0.0.1:50051"
    assert resolve_master("m:1") == "m:1"
    with pytest.raises(ValueError, match="HOST:PORT"):
        resolve_master("m:notaport")
    monkeypatch.delenv("KVPOOL_MASTER")
    with pytest.raises(ValueError, match="KVPOOL_MASTER"):
        resolve_master("")


@pytest.mark.parametrize("scheme", ["http", "https", "grpc"])
def test_a_url_for_the_master_is_refused_saying_to_drop_its_scheme(scheme):
    """gRPC would look ``http://HOST`` up as a host name, and every call wait out its
    timeout to fail with "Misformatted domain name"."""
    with pytest.raises(ValueError, match=f"drop the {scheme}:// and give HOST:PORT"):
        resolve_master(f"{scheme}://127.0.0.1:50051")
    with pytest.raises(ValueError, match="write etcd:// in lower case"):
        resolve_master("ETCD://127.0.0.1:2379/cluster")


#: 38535 in Arabic-Indic digits, 50051 in full-width ones: ``str.isdigit`` takes both.
OTHER_DIGITS = ("\u0663\u0668\u0665\u0663\u0665", "\uff15\uff10\uff10\uff15\uff11")


@pytest.mark.parametrize("port", [*OTHER_DIGITS, "²", "0", "65536", "", "-1"])
def test_a_masters_port_is_a_number_from_1_to_65535_in_ascii_digits(port):
    """``str.isdigit`` takes other scripts' digits (gRPC cannot parse them) and "²" (which
    ``int`` refuses with a message that names no address)."""
    with pytest.raises(ValueError, match="port must be a number from 1 to 65535 in ASCII"):
        resolve_master(f"m:{port}")
    with pytest.raises(ValueError, match="1 to 65535 in ASCII digits"):
        resolve_master(f"etcd://e:{port}/cluster")


@pytest.mark.parametrize(
    "address",
    ["m:1", "m:65535", "[fd00::5]:50051", "a:1,b:2", "etcd://e:2379/c", "dns:///m:50051"],
)
def test_the_forms_of_a_master_address_are_taken_as_given(address):
    """etcd:// (kvpool asks etcd) and dns:/// (gRPC resolves it) are not URLs to refuse."""
    assert resolve_master(address) == address


def test_the_host_of_an_address_is_where_its_other_ports_are():
    assert host_of("10.0.0.5:50051") == "10.0.0.5"
    assert host_of("kvpool-master.ns.svc:50051") == "kvpool-master.ns.svc"
    assert host_of("[fd00::5]:50051") == "fd00::5"
