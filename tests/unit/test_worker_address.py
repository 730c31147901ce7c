"""A worker address is checked for UCX's packed shape before anything hands it to UCX.

``ucp_ep_create`` reads a worker address without knowing its length and aborts the process on
a version it does not know; the addresses come from storage nodes, which may be broken or
taken over, so the master refuses malformed ones at mount and clients and nodes check again.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.transport import ucp
from kvpool.transport.worker_address import MAX_BYTES, MalformedWorkerAddress, check_worker_address

#: Transport sets and address versions a deployment may run with.
CONFIGS = [
    {},
    {"TLS": "tcp"},
    {"TLS": "tcp,cma"},
    {"TLS": "sm"},
    {"ADDRESS_VERSION": "v2"},
    {"TLS": "tcp", "ADDRESS_VERSION": "v2"},
    {"ADDRESS_DEBUG_INFO": "y"},
]


@pytest.fixture(scope="module")
def real_addresses() -> list[bytes]:
    addresses, keep = [], []
    for config in CONFIGS:
        context = ucp.Context(config)
        worker = ucp.Worker(context)
        keep.append((context, worker))
        addresses.append(worker.address)
    return addresses


def test_the_addresses_ucx_packs_pass(real_addresses: list[bytes]) -> None:
    for address in real_addresses:
        check_worker_address(address)


def test_a_cut_or_padded_address_is_refused(real_addresses: list[bytes]) -> None:
    for address in real_addresses:
        for end in range(len(address)):
            with pytest.raises(MalformedWorkerAddress):
                check_worker_address(address[:end])
        with pytest.raises(MalformedWorkerAddress, match="after its last device"):
            check_worker_address(address + b"\0")


def test_an_address_version_ucx_does_not_pack_is_refused(real_addresses: list[bytes]) -> None:
    address = real_addresses[0]
    for version in range(2, 16):
        edited = bytes([(address[0] & 0xF0) | version]) + address[1:]
        with pytest.raises(MalformedWorkerAddress, match=f"version {version}"):
            check_worker_address(edited)


def test_an_address_with_no_transport_or_too_many_bytes_is_refused() -> None:
    with pytest.raises(MalformedWorkerAddress, match="names no transport"):
        check_worker_address(bytes([0x20]) + b"\0" * 8 + b"\xff")
    with pytest.raises(MalformedWorkerAddress, match="is empty"):
        check_worker_address(b"")
    with pytest.raises(MalformedWorkerAddress, match="more than"):
        check_worker_address(b"\x20" * (MAX_BYTES + 1))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_either_taken_or_refused_with_a_reason(data: bytes) -> None:
    try:
        check_worker_address(data)
    except MalformedWorkerAddress as error:
        assert str(error)


def test_connecting_to_malformed_bytes_raises_instead_of_aborting() -> None:
    context = ucp.Context({"TLS": "tcp"})
    worker = ucp.Worker(context)
    try:
        for garbage in (b"\x05", b"\x20abc", b"evil-worker"):
            with pytest.raises(ucp.UcxError, match="worker address") as caught:
                worker.connect(garbage)
            assert caught.value.status == ucp.UCS_ERR_INVALID_ADDR
    finally:
        worker.close()
        context.close()
