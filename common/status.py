"""Per-key outcomes of master calls, shared by the sans-IO master core and the client.

The numeric values are the wire values of ``kvpool.v1.KeyStatus`` in ``proto/master.proto``
(a test keeps the two in step), so no translation table is needed on either side.
"""

from __future__ import annotations

from enum import IntEnum


class KeyStatus(IntEnum):
    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    NOT_READY = 3
    NO_SPACE = 4
    INVALID_KEY = 5
    HAS_LEASE = 6
    INVALID_ARGUMENT = 7
    STALE_PUT = 8
    NO_REPLICA = 9
    FENCED = 10
    QUOTA_EXCEEDED = 11


#: An ALREADY_EXISTS message's words where the reservation holding the key is the asking
#: client's own (most likely a put of it whose answer was lost): after the quoted key, and at
#: the message's end. The client tells the cases apart by the message's end only, since the
#: key it quotes may hold any words.
OWN_RESERVATION = " is being written by this client's own earlier put of it"
OWN_RESERVATION_END = "put the key again then"
#: How a node's failed Forget begins where a client on its host that writes the segment
#: itself still holds a lock on the range (storage_node/commands.py): the master sends such
#: a Forget again on a schedule of its own (master/forget_retries.py).
WRITER_HOLDS_RANGE = "a client on this host that writes the segment itself still holds"


class Tier(IntEnum):
    UNSPECIFIED = 0
    DRAM = 1
    NVME = 2


class Pin(IntEnum):
    NONE = 0
    SOFT = 1
    HARD = 2
