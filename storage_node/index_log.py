"""The file format of a durable index: a log of framed records, and how it is read back.

Every record is framed by a magic number, the length of its body and a CRC-32C. A log
(format 2) starts with two identical copies of its header, each a record padded to fill a
slot of ``HEADER_SLOT`` bytes, so that damage to one copy is recovered from the other at a
known place. The header (JSON) carries the segment's identity, the format and a salt: random
bytes, drawn for each log, that every entry record's CRC covers ahead of its body. Entries
(puts and deletes) follow, appended one record each.

Reading trusts nothing: a frame whose magic, length or CRC is wrong is skipped and counted
(damaged). The scan goes on after the damaged record's declared span when that span is
plausible (the length of an entry, ending at the end of the log or at the next magic number),
else at the next magic number, never before; in a salted log, a plausible span that a
damaged length stretched over intact records resumes at the first of them. Keys come from
clients and may spell out a whole record; without the log's salt, which never leaves the
node, such a record's CRC is wrong, so a scan that resynchronises inside a key still adopts
nothing from it. A record whose CRC holds but whose body does not decode (short, an unknown
operation, a key that is not a valid key) is skipped and counted too (undecodable). A log
whose header cannot be read in either copy is refused as a whole (``LogDamaged``): without
it nothing says what the segment is.

**Damage in the middle of a log.** A damaged record may have been a delete: the entries
recorded before it may have been removed since, and a node that reported them would bring a
removed object back (a tenant's prompts, say, that were meant to be gone). So every entry
whose record lies before the last damaged (or undecodable) record that intact records follow
is *unconfirmed* (``Scan.unconfirmed_before``): the node reports it as such, and a master
adopts it only as a copy of an object it still knows. A torn last record is no such damage:
it was never acknowledged (its append did not return). Once a log is rewritten (compacted),
its unconfirmed entries go first, followed by a marker record (``UNCONFIRMED_ABOVE``), so that
they stay unconfirmed until a master has confirmed them (``DurableIndex.confirm``). A
kvpool that predates the marker skips it as undecodable, as it did every damaged record.

A log may end in zero bytes: room its writer allocated ahead of its appends (see
object_index), which ends the log where it begins and is not a record; a record torn inside
it (its end still zero) is damaged as any other.

An entry is an operation, the object's offset, size, generation and checksum, and its key
to the end of the body. A put that knows how many replicas its object should have (the count
its put got, so that a master adopting it after a failover restores that many) is
recorded as ``OP_PUT_COUNTED``: the count follows the fixed fields, ahead of the key (a put
with no count, 0, is a plain ``OP_PUT``).

Format 3 added ``OP_PUT_COUNTED``; nothing else changed, so formats 1 and 2 read as before
(their puts record no count: 0, unknown) and a log of format 3 is refused by a kvpool that
predates it (it would skip the counted puts, and so forget objects). Format 1, written by
kvpool before format 2, has one header with no ``format`` field and no salt; it is read as
such (a damaged header is then not recoverable). Older logs are rewritten in the current
format when their index is opened. A log of a later format is refused.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import google_crc32c

from kvpool.common.keys import STORED_KEY_BYTES, key_problem

MAGIC = 0x4B56504C  # "KVPL"
MAGIC_BYTES = struct.pack("<I", MAGIC)
FRAME = struct.Struct("<III")  # magic, body length, crc32c(salt + body)
ENTRY = struct.Struct("<BQQQIB")  # op, offset, size, generation, crc32c, has_crc
COUNT = struct.Struct("<I")  # replicas wanted, after ENTRY in an OP_PUT_COUNTED record
OP_HEADER, OP_PUT, OP_DELETE, OP_PUT_COUNTED, OP_UNCONFIRMED_ABOVE = 0, 1, 2, 3, 4
#: The body of the marker record: every entry recorded above it is unconfirmed.
UNCONFIRMED_ABOVE = bytes([OP_UNCONFIRMED_ABOVE])
FORMAT = 3
#: Formats whose header carries a salt (format 1's does not).
SALTED_FORMATS = (2, 3)
SALT_BYTES = 8
HEADER_SLOT = 4096
HEADER_BODY = HEADER_SLOT - FRAME.size  # a format-2 header's body: always exactly this long
MAX_ENTRY_BODY = ENTRY.size + COUNT.size + STORED_KEY_BYTES
MAX_FORMAT1_HEADER = 1 << 16


class Entry(NamedTuple):
    """One recorded object (a named tuple: one is made per object of every command)."""

    key: str
    offset: int
    size: int
    generation: int
    crc32c: int | None = None
    #: Replicas the object should have (its put's count); 0: not recorded (taken as 1).
    replicas: int = 0


class LogDamaged(ValueError):
    """A log that cannot be read: its header is lost, or it is of a later format."""


@dataclass
class Scan:
    """What a log holds: its header, its salt and its entry records in order."""

    header: dict
    salt: bytes
    records: list[tuple[int, Entry]] = field(default_factory=list)
    #: Records skipped: a damaged frame (magic, length or CRC), a torn end, a bad header copy.
    damaged: int = 0
    #: Records skipped whose CRC held but whose body does not decode.
    undecodable: int = 0
    #: How many of ``records`` (the first ones) lie above damage that intact records follow,
    #: or above a marker: the entries they leave live are unconfirmed.
    unconfirmed_before: int = 0
    #: The format of the header read (1: the unsalted first one).
    version: int = 1
    #: Where the last intact record (or the header) ends: where an intact log is appended
    #: to. (Not where the zeros after it begin: a record may end in zeros of its own.)
    end: int = 0


def header_slots(header: dict, salt: bytes) -> bytes:
    """The two copies of a log's header, as a format-2 log starts."""
    text = json.dumps({**header, "format": FORMAT, "salt": salt.hex()}).encode()
    body = bytes([OP_HEADER]) + text
    if len(body) > HEADER_BODY:
        raise ValueError(f"an index header takes at most {HEADER_BODY} bytes, not {len(body)}")
    return frame(body.ljust(HEADER_BODY, b" "), b"") * 2


def frame(body: bytes, salt: bytes) -> bytes:
    return FRAME.pack(MAGIC, len(body), _crc(salt, body)) + body


def encode(op: int, entry: Entry) -> bytes:
    """The body of a record: a put of an entry with a count is ``OP_PUT_COUNTED``."""
    has_crc = entry.crc32c is not None
    crc = entry.crc32c if has_crc else 0
    counted = op == OP_PUT and entry.replicas > 0
    fixed = ENTRY.pack(
        OP_PUT_COUNTED if counted else op, entry.offset, entry.size, entry.generation, crc, has_crc
    )
    if counted:
        fixed += COUNT.pack(entry.replicas)
    return fixed + entry.key.encode()


def read_log(data: bytes, path: Path) -> Scan:
    """Reads a whole log (``path`` only names it in errors)."""
    scan, start = _read_header(data, path)
    _read_entries(data, start, scan)
    return scan


def _read_header(data: bytes, path: Path) -> tuple[Scan, int]:
    """The header, and where the entries start."""
    body = _intact(data, 0, b"", MAX_FORMAT1_HEADER)
    first = _header(body)
    if body is not None and first is not None and "format" not in first:
        return Scan(first, b""), FRAME.size + len(body)  # format 1: one header
    found: Scan | None = None
    damaged = 0
    for slot in (0, HEADER_SLOT):
        body = _intact(data, slot, b"", HEADER_BODY)
        header = _header(body) if body is not None and len(body) == HEADER_BODY else None
        version = header.get("format") if header is not None else None
        if isinstance(version, int) and version > FORMAT:
            raise LogDamaged(
                f"{path} is an index of format {version}, written by a later kvpool than this "
                f"one (format {FORMAT}): run that version, or delete the segment's directory to "
                "start afresh"
            )
        salted = header is not None and version in SALTED_FORMATS
        salt = _salt(header.get("salt")) if header is not None and salted else None
        if header is None or salt is None:
            damaged += 1  # this copy is lost (the other may hold); the open rewrites both
        elif found is None:
            identity = {k: v for k, v in header.items() if k not in ("format", "salt")}
            found = Scan(identity, salt, version=int(version or 1))
    if found is None:
        raise LogDamaged(
            f"{path} is damaged beyond repair: neither copy of its header can be read, so "
            "nothing says which segment it describes. Delete the segment's directory to start "
            "afresh (its objects are lost)"
        )
    found.damaged = damaged
    return found, 2 * HEADER_SLOT


def _read_entries(data: bytes, position: int, scan: Scan) -> None:
    end_of_log = len(data.rstrip(b"\0"))  # zeros after the last record: room, not records
    records = scan.records
    scan.end = position
    #: Records before the last damage seen, until an intact record follows it.
    damage_after: int | None = None
    while position < end_of_log:
        if len(data) - position < FRAME.size:
            scan.damaged += 1  # a torn end
            return
        magic, length, crc = FRAME.unpack_from(data, position)
        end = position + FRAME.size + length
        if magic == MAGIC and 0 < length <= MAX_ENTRY_BODY and end <= len(data):
            body = data[position + FRAME.size : end]
            if _crc(scan.salt, body) == crc:
                if body == UNCONFIRMED_ABOVE:
                    scan.unconfirmed_before = len(records)
                elif (record := _decode(body)) is None:
                    scan.undecodable += 1
                    damage_after = len(records)
                else:
                    if damage_after is not None:  # damage that intact records follow
                        scan.unconfirmed_before = damage_after
                        damage_after = None
                    records.append(record)
                position = scan.end = end
                continue
        scan.damaged += 1
        damage_after = len(records)
        plausible = (
            magic == MAGIC
            and ENTRY.size < length <= MAX_ENTRY_BODY
            and (end == len(data) or data[end : end + len(MAGIC_BYTES)] == MAGIC_BYTES)
        )
        if plausible and scan.salt:  # a damaged length may span records that are intact
            end = _first_intact(data, position + 1, end, scan.salt)
        position = end if plausible else _next_magic(data, position + 1)


def _first_intact(data: bytes, start: int, end: int, salt: bytes) -> int:
    """Where the first intact record between ``start`` and ``end`` begins, else ``end``
    (only with a salt: a record spelled in a key does not carry it)."""
    position = _next_magic(data, start)
    while position < end:
        if _intact(data, position, salt, MAX_ENTRY_BODY) is not None:
            return position
        position = _next_magic(data, position + 1)
    return end


def _intact(data: bytes, position: int, salt: bytes, limit: int) -> bytes | None:
    """The body of the record at ``position`` if its frame is whole and right, else None."""
    if position + FRAME.size > len(data):
        return None
    magic, length, crc = FRAME.unpack_from(data, position)
    body = data[position + FRAME.size : position + FRAME.size + length]
    if magic != MAGIC or not 0 < length <= limit or len(body) != length:
        return None
    return body if _crc(salt, body) == crc else None


def _header(body: bytes | None) -> dict | None:
    if not body or body[0] != OP_HEADER:
        return None
    try:
        header = json.loads(body[1:])
    except (UnicodeDecodeError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _salt(text: object) -> bytes | None:
    if not isinstance(text, str) or len(text) != 2 * SALT_BYTES:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def _decode(body: bytes) -> tuple[int, Entry] | None:
    """A record's operation (OP_PUT for a counted put too) and entry, or None."""
    if len(body) <= ENTRY.size:
        return None
    op, offset, size, generation, crc, has_crc = ENTRY.unpack_from(body)
    if op not in (OP_PUT, OP_DELETE, OP_PUT_COUNTED) or has_crc not in (0, 1):
        return None
    if crc and not has_crc:
        return None
    start, replicas = ENTRY.size, 0
    if op == OP_PUT_COUNTED:
        if len(body) <= start + COUNT.size:
            return None
        (replicas,) = COUNT.unpack_from(body, start)
        start += COUNT.size
        op = OP_PUT
    try:
        key = body[start:].decode()
    except UnicodeDecodeError:
        return None
    if key_problem(key, STORED_KEY_BYTES) is not None:
        return None
    return op, Entry(key, offset, size, generation, crc if has_crc else None, replicas)


def _crc(salt: bytes, body: bytes) -> int:
    return (
        google_crc32c.extend(google_crc32c.value(salt), body) if salt else google_crc32c.value(body)
    )


def _next_magic(data: bytes, start: int) -> int:
    found = data.find(MAGIC_BYTES, start)
    return len(data) if found < 0 else found
