"""The master's capability keys: where they are kept, when a new one signs, what nodes get.

Every master of a cluster must sign with keys every storage node holds, so the keys live in
a file the masters share (``--capability-key-file``; created, mode 0600, with one fresh key
when absent; HA masters are given the same file, as they are the same credentials file).
Nodes receive keys over their authenticated session (MountSegment and Heartbeat answers:
``delivery``), never from the network otherwise, and **each node only its own**: keys
derived from the file's for that node id (``caps.node_purpose``), which sign the
capabilities and map grants for that node's segments alone. A node's keys let whoever holds
them forge access to that node's bytes, which it holds anyway, and to no other node's: a
node (or a stolen node token) reads no other node's objects.

**Rotation** (``rotate``): a new key is added to the file and named current; the older keys
stay (at most ``caps.MAX_KEYS`` in all, the oldest dropped), so capabilities they signed stay
valid until they expire. A master re-reads the file when it changes (``MasterKeys.reload``)
and delivers the new key at once, but signs with it only ``activate_after`` seconds after it
first saw it: by then every live node has heartbeated and holds it, so no node refuses a
capability for want of its key. Should the file drop the key a master signs with (rotated
``caps.MAX_KEYS`` times within ``activate_after``), it signs with the newest key it has held
that long, else the one it saw first, never with one just seen as if nodes held it.
``MasterKeys`` is sans-IO (time passed in).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.common.file_writes import write_all
from kvpool.proto import master_pb2 as pb
from kvpool.security import capabilities as caps
from kvpool.security.tls import keep_owner_and_mode

#: Nodes whose keys a master keeps made (past it they are made again as needed).
MAX_NODE_RINGS = 1024


class KeyFileError(ValueError):
    """The capability key file cannot be read as one."""


@dataclass(frozen=True, slots=True)
class KeyFile:
    """The keys in the file, oldest first, and the one it names current."""

    keys: tuple[tuple[int, bytes], ...]
    current: int


def _encode(keys: KeyFile) -> bytes:
    body = {
        "keys": [{"id": key_id, "secret": secret.hex()} for key_id, secret in keys.keys],
        "current": keys.current,
    }
    return json.dumps(body, indent=1).encode() + b"\n"


def read_key_file(path: Path) -> KeyFile:
    """The keys of the file; KeyFileError whatever is wrong with it (an ``int(1e400)``
    OverflowError or deeply nested JSON's RecursionError too: a master re-reads the file
    while it serves, and must keep its keys rather than stop)."""
    try:
        data = path.read_bytes()
    except OSError as error:  # (no key file to judge: advice to remove it would be wrong)
        raise KeyFileError(_unreadable(path, error)) from None
    body: Any = None  # (what was read, for the message: None until it is)
    try:
        body = json.loads(data)
        keys = tuple((int(k["id"]), bytes.fromhex(k["secret"])) for k in body["keys"])
        current = int(body["current"])
        caps.KeyRing(keys, current=current)  # (checks ids, sizes, count and current)
    except Exception as error:
        raise KeyFileError(
            f"capability key file {path}: {_problem(error, body)}. If it is the key file: "
            "Remove it to start with a fresh key (every node and master must then get the new "
            "file), or restore it. If it is another file, give the key file's path instead"
        ) from None
    return KeyFile(keys, current)


def _unreadable(path: Path, error: OSError) -> str:
    """Why the key file cannot be read, and what to do."""
    if isinstance(error, IsADirectoryError):
        return (
            f"capability key file {path} is a directory: give the path of the key file itself "
            f"(`kvpool capability-keys create {path}/capability-keys.json` makes one there)"
        )
    if isinstance(error, FileNotFoundError):
        return (
            f"capability key file {path} does not exist: restore it, or make one with "
            f"`kvpool capability-keys create {path}` (every node and master must then get it)"
        )
    return f"cannot read capability key file {path}: {error.strerror or error}"


#: What a JSON value that is not an object is, by the Python type it is read as.
_JSON_KINDS = {
    list: "a JSON array",
    str: "a JSON string",
    int: "a JSON number",
    float: "a JSON number",
    bool: "a JSON boolean",
    type(None): "JSON null",
}
#: The fields of the key file, and of each of its keys.
_FIELDS = ("keys", "current")
_KEY_FIELDS = ("id", "secret")


def _problem(error: Exception, body: object = None) -> str:
    """What was wrong with the file, said so a person can fix it (an exception's own text
    names no field: a KeyError's is only the missing name, quoted)."""
    if isinstance(error, RecursionError):
        return "it is nested too deeply to read"
    if isinstance(error, UnicodeDecodeError):
        return "it is not text (a key file is JSON)"
    if isinstance(error, json.JSONDecodeError):
        return f"it is not JSON ({error})"
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), "a JSON value")
        return f'it holds {kind}, not an object with "keys" and "current"'
    missing = [name for name in _FIELDS if name not in body]
    if missing:
        return f'it has no field "{missing[0]}" (a key file has "keys" and "current")'
    if isinstance(error, KeyError) and error.args and error.args[0] in _KEY_FIELDS:
        return f'a key in "keys" has no field "{error.args[0]}" (each has "id" and "secret")'
    if isinstance(error, TypeError):
        return (
            f'a field has the wrong type ({error}): "keys" is a list of {{"id": NUMBER, '
            '"secret": HEX}, "current" the id of one of them'
        )
    if isinstance(error, OSError | ValueError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def load_or_create(path: Path) -> KeyFile:
    """The keys in ``path``; a fresh file with one new key (mode 0600) when it is absent.
    Masters starting together agree: the file is created whole or not at all (link(2))."""
    if not path.exists():
        fresh = KeyFile(((1, caps.KeyRing.new_secret()),), 1)
        try:
            _write_new(path, _encode(fresh))
        except OSError as error:  # (a one-line error at a master's start, no traceback)
            raise KeyFileError(
                f"cannot create capability key file {path}: {error.strerror or error}"
            ) from None
    return read_key_file(path)


def rotate(path: Path) -> KeyFile:
    """Adds a new key to ``path`` and names it current (the oldest goes when the file holds
    ``caps.MAX_KEYS``); masters sign with it once every node has it. The file's lock is held
    from the read to the write: two rotations at once add two keys, not one of them."""
    from kvpool.security.file_lock import exclusive_change

    def cannot(error: OSError) -> KeyFileError:
        return KeyFileError(f"cannot lock capability key file {path}: {error.strerror}")

    with exclusive_change(path, cannot):
        old = read_key_file(path)
        key_id = (max(k for k, _ in old.keys) % caps.MAX_KEY_ID) + 1
        kept = [k for k in old.keys if k[0] != key_id][-(caps.MAX_KEYS - 1) :]
        new = KeyFile((*kept, (key_id, caps.KeyRing.new_secret())), key_id)
        _write_new(path, _encode(new), replace=path)
    return new


def _write_new(path: Path, data: bytes, replace: Path | None = None) -> None:
    # (a name nobody can plant a file or link at beforehand, made mode 0600 by this call)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.new.", dir=path.parent)
    temporary = Path(name)
    try:
        try:
            if replace is not None:  # (a rotation run by root keeps the masters' file theirs)
                keep_owner_and_mode(fd, os.stat(replace), replace)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace is not None:
            os.replace(temporary, replace)
        else:
            # (link fails when another master made the file meanwhile: theirs stands)
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


@dataclass(slots=True)
class MasterKeys:
    """The keys a master signs with and delivers (sans-IO: ``now`` in seconds)."""

    keys: KeyFile
    #: A new key signs only this long after the master first saw it.
    activate_after: float
    max_skew_ms: int = caps.DEFAULT_MAX_SKEW_MS
    #: When each key was first seen (keys of the file at start: long ago).
    _seen: dict[int, float] = field(default_factory=dict)
    _ring: caps.KeyRing = field(default_factory=caps.KeyRing)
    #: Each node's keys (``for_node``), made again when the file's keys or the signing one change.
    _node_rings: dict[str, caps.KeyRing] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._seen = {key_id: float("-inf") for key_id, _ in self.keys.keys}
        self._ring = caps.KeyRing(self.keys.keys, current=self.keys.current)

    def reload(self, keys: KeyFile, now: float) -> None:
        """The file changed: deliver its keys from now on; sign with its current key once
        ``activate_after`` has passed."""
        if keys == self.keys:
            return
        before, held = dict(self.keys.keys), dict(keys.keys)
        # (a key first seen now: a new one, or an id back with another secret, a remade
        # file, which nodes hold the old secret of; dropped keys are forgotten)
        self._seen = {
            key_id: self._seen[key_id] if before.get(key_id) == secret else now
            for key_id, secret in keys.keys
        }
        self.keys = keys
        signing = self._ring.current
        if signing is None or held.get(signing) != before.get(signing):
            signing = self._delivered_longest(now)  # (the file dropped the key we sign with)
        self._ring = caps.KeyRing(keys.keys, current=signing)
        self._node_rings.clear()
        self.tick(now)

    def _delivered_longest(self, now: float) -> int:
        """The key to sign with when the file dropped the signing one: the newest that every
        live node has had ``activate_after`` to get; else the one seen first, the likeliest
        delivered (not the file's brand-new current, which no node holds yet). Rotating
        ``caps.MAX_KEYS`` times within ``activate_after`` can leave no key surely delivered:
        nodes that have not heartbeated since the first of those refuse until they do."""
        order = {key_id: place for place, (key_id, _) in enumerate(self.keys.keys)}
        settled = [k for k in order if now - self._seen[k] >= self.activate_after]
        if settled:
            return max(settled, key=lambda k: (self._seen[k], order[k]))
        return min(order, key=lambda k: (self._seen[k], -order[k]))

    def tick(self, now: float) -> None:
        """Makes the file's current key the signing key once nodes have had time to get it."""
        wanted = self.keys.current
        if self._ring.current != wanted and now - self._seen.get(wanted, now) >= (
            self.activate_after
        ):
            self._ring.activate(wanted)
            self._node_rings.clear()

    @property
    def ring(self) -> caps.KeyRing:
        """The file's keys: never signs for a node itself (``for_node`` does)."""
        return self._ring

    def for_node(self, node_id: str) -> caps.KeyRing:
        """The keys that sign for ``node_id``'s segments, the ones that node holds."""
        ring = self._node_rings.get(node_id)
        if ring is None:
            if len(self._node_rings) >= MAX_NODE_RINGS:
                self._node_rings.clear()  # (nodes that went: each is made again when needed)
            ring = self._node_rings[node_id] = self._ring.derived(caps.node_purpose(node_id))
        return ring

    def delivery(self, term: int, node_id: str) -> pb.CapabilityKeys:
        """What ``node_id`` gets over its session: its own keys, the term, the skew allowance."""
        ring = self.for_node(node_id)
        return pb.CapabilityKeys(
            keys=[pb.CapabilityKey(key_id=k, secret=ring.secret(k)) for k in ring.key_ids()],
            term=term,
            max_skew_ms=self.max_skew_ms,
        )
