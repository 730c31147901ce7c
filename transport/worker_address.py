"""Checks that bytes a peer calls its UCX worker address have the shape UCX packs.

``ucp_ep_create`` takes a worker address without its length and trusts it: it reads past the
end of a short one and aborts the process (``ucs_assertv_always`` on the version nibble) on
bytes it does not recognise. A worker address reaches kvpool from storage nodes, through the
master, to clients and to other nodes (re-replication), so one broken or hostile node could
take down every process that connects to it. This module walks the packed layout the way
UCX 1.22 unpacks a worker address (``src/ucp/wireup/address.c``, non-unified mode, the
default) with every read bounds-checked, and refuses anything that does not end exactly where
the bytes end. The master runs it at mount, clients and nodes again before they connect.

It checks shape, not meaning: a well-formed address naming another host, or interface
capabilities the peer does not have, passes (see docs/security.md, "UCX peers").
"""

from __future__ import annotations

#: Longest worker address accepted: a UCX worker with every transport of a large host packs
#: a few KiB; more is not an address.
MAX_BYTES = 16 << 10

#: ``UCP_MAX_RESOURCES`` and ``UCP_MAX_LANES`` in UCX 1.22.
_MAX_TRANSPORTS = 128
_MAX_EP_ADDRESSES = 64

_VERSION_V1, _VERSION_V2 = 0, 1
_HEADER_DEBUG_INFO, _HEADER_WORKER_UUID, _HEADER_CLIENT_ID = 0x1, 0x2, 0x4
_NULL_RESOURCE = 0xFF
_LAST = 0x80
_HAS_EP_ADDRESS = 0x40
_NUM_PATHS = 0x40
_SYS_DEVICE = 0x20
_MD_EMPTY_DEVICE = 0x80
_MD_MASK = 0x7F
_DEVICE_LENGTH_MASK = 0x1F
_IFACE_LENGTH_MASK = 0x3F
#: Packed interface attributes: four 32-bit fields (v1), or fp8 x3, prio, u16 x2 (v2).
_IFACE_ATTR_BYTES = {_VERSION_V1: 16, _VERSION_V2: 8}


class MalformedWorkerAddress(ValueError):
    """The bytes are not a UCX worker address this build can connect to."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self, what: str) -> int:
        if self.at >= len(self.data):
            raise MalformedWorkerAddress(f"ends before its {what} (at byte {self.at})")
        value = self.data[self.at]
        self.at += 1
        return value

    def skip(self, count: int, what: str) -> None:
        if self.at + count > len(self.data):
            raise MalformedWorkerAddress(
                f"ends inside its {what} ({count} bytes from byte {self.at}, "
                f"{len(self.data)} in all)"
            )
        self.at += count

    def extended(self, first: int, mask: int, version: int, what: str) -> int:
        """A length or index that v2 continues in the next byte when it fills its mask."""
        value = first & mask
        if version == _VERSION_V2 and value == mask:
            value = self.byte(what)
        return value


def check_worker_address(address: bytes) -> None:
    """Raises MalformedWorkerAddress unless ``address`` is shaped like a UCX worker address."""
    if not address:
        raise MalformedWorkerAddress("is empty")
    if len(address) > MAX_BYTES:
        raise MalformedWorkerAddress(f"is {len(address)} bytes, more than {MAX_BYTES}")
    read = _Reader(address)
    header = read.byte("header")
    version = header & 0x0F
    if version == _VERSION_V1:
        flags = header >> 4
        has_uuid = True  # (v1 always carries it when asked for, and ucp_ep_create asks)
    elif version == _VERSION_V2:
        flags = read.byte("header flags")
        has_uuid = bool(flags & _HEADER_WORKER_UUID)
    else:
        raise MalformedWorkerAddress(f"has address version {version}; UCX packs 0 or 1")
    if has_uuid:
        read.skip(8, "worker uuid")
    if flags & _HEADER_CLIENT_ID:
        read.skip(8, "client id")
    if flags & _HEADER_DEBUG_INFO:
        read.skip(read.byte("worker name length"), "worker name")
    if read.byte("first device") == _NULL_RESOURCE:
        raise MalformedWorkerAddress("names no transport: nothing could reach its worker")
    read.at -= 1
    transports = 0
    last_device = False
    while not last_device:
        md = read.byte("device's memory domain")
        empty_device = bool(md & _MD_EMPTY_DEVICE)
        read.extended(md, _MD_MASK, version, "device's memory domain")
        length_byte = read.byte("device address length")
        last_device = bool(length_byte & _LAST)
        device_length = read.extended(
            length_byte, _DEVICE_LENGTH_MASK, version, "device address length"
        )
        if length_byte & _NUM_PATHS:
            read.byte("device's path count")
        if length_byte & _SYS_DEVICE:
            read.byte("device's system device")
        read.skip(device_length, "device address")
        last_transport = empty_device
        while not last_transport:
            transports += 1
            if transports > _MAX_TRANSPORTS:
                raise MalformedWorkerAddress(f"names more than {_MAX_TRANSPORTS} transports")
            read.skip(2, "transport name checksum")
            read.skip(_IFACE_ATTR_BYTES[version], "interface attributes")
            iface_byte = read.byte("interface address length")
            last_transport = bool(iface_byte & _LAST)
            iface_length = read.extended(
                iface_byte, _IFACE_LENGTH_MASK, version, "interface address length"
            )
            read.skip(iface_length, "interface address")
            _skip_endpoint_addresses(read, more=bool(iface_byte & _HAS_EP_ADDRESS))
    if read.at != len(address):
        raise MalformedWorkerAddress(
            f"has {len(address) - read.at} bytes after its last device ({len(address)} in all)"
        )
    if transports == 0:
        raise MalformedWorkerAddress("names no transport: nothing could reach its worker")


def _skip_endpoint_addresses(read: _Reader, *, more: bool) -> None:
    count = 0
    while more:
        count += 1
        if count > _MAX_EP_ADDRESSES:
            raise MalformedWorkerAddress(f"has more than {_MAX_EP_ADDRESSES} endpoint addresses")
        read.skip(read.byte("endpoint address length"), "endpoint address")
        more = not read.byte("endpoint lane") & _LAST
