"""Bearer tokens: ``kvp1.<token id>.<secret>``, stored only as a hash of the secret.

The credentials file holds, per token, its id, the SHA-256 of its secret and whom it stands
for; a token is shown once, when created, and a copy of the file gives nobody a token. The
secret is 256 random bits, so a plain hash is enough (no slow password hash: nothing to
guess), compared in constant time.

A master checks a token on every call: the answer for a token seen lately is a dictionary
lookup. The file is looked at again once a second at most: a token created or revoked with
``kvpool token`` takes effect within about a second, without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvpool.common.keys import key_problem
from kvpool.common.logging import get_logger
from kvpool.security.file_lock import LOCK_SUFFIX, exclusive_change
from kvpool.security.identity import Identity, Role, name_problem, tenant_problem
from kvpool.security.tls import write_atomically

log = get_logger(__name__)

#: The first part of every token: the format's version.
TOKEN_PREFIX = "kvp1"
TOKEN_ID_PATTERN = re.compile(r"[0-9a-f]{12}")
#: ``secrets.token_urlsafe(32)`` gives 43 characters; a little room either side.
SECRET_PATTERN = re.compile(r"[A-Za-z0-9_-]{32,128}")
DIGEST_PATTERN = re.compile(r"[0-9a-f]{64}")
FILE_VERSION = 1
#: Tokens in one credentials file, at most.
MAX_TOKENS = 100_000
#: Tokens whose identity is remembered (the hot path: a dictionary lookup).
CACHE_SIZE = 4096
#: How often (seconds) the store looks at its file again, at most.
CHECK_INTERVAL = 1.0
#: The latest ``created`` a record may have (Unix time; the end of year 9998): any later, or
#: not finite, and it is no time a listing could show.
MAX_CREATED = 253_370_764_800.0


class CredentialError(ValueError):
    """A token or credentials file that cannot be used; the message says what to fix."""


def token_problem(token: object) -> str | None:
    """Why ``token`` is not shaped like a kvpool token, or None when it is. Never repeats
    the token: it may be a secret pasted in the wrong place."""
    if not isinstance(token, str):
        return f"a token is a string, not {type(token).__name__}"
    if not token:
        return "the token is empty"
    parts = token.split(".")
    if parts[0] != TOKEN_PREFIX:
        return (
            f"this is not a kvpool token: tokens start with '{TOKEN_PREFIX}.' "
            "(create one with `kvpool token create`)"
        )
    if len(parts) != 3:
        return (
            f"the token has {len(parts)} parts; a kvpool token has three, "
            f"'{TOKEN_PREFIX}.<token id>.<secret>': was it cut short or joined to something?"
        )
    if not TOKEN_ID_PATTERN.fullmatch(parts[1]):
        return "the token's id (its second part) is not 12 hex digits: was it copied whole?"
    if not SECRET_PATTERN.fullmatch(parts[2]):
        return (
            "the token's secret (its third part) is not 32 to 128 characters of A-Z, a-z, "
            "0-9, '_' and '-': was it copied whole?"
        )
    return None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def identity_problem(
    name: str, role: Role | str, tenant: str = "", node_id: str = ""
) -> str | None:
    """Why these do not make an identity, or None when they do: clients belong to a tenant,
    nodes to a node id, admins to neither."""
    if (problem := name_problem(name)) is not None:
        return problem
    try:
        role = Role(role)
    except ValueError:
        return f"role {role!r} is not one of {', '.join(r.value for r in Role)}"
    if role is Role.CLIENT:
        if not tenant:
            return "a client token belongs to a tenant: give --tenant"
        if (problem := tenant_problem(tenant)) is not None:
            return problem
    elif tenant:
        return f"a {role} token belongs to no tenant: leave --tenant out"
    if role is Role.NODE:
        if not node_id:
            return "a node token is bound to one node id: give --node-id (the node's --node-id)"
        if (problem := key_problem(node_id)) is not None:
            return f"node id {node_id!r} is not valid: {problem}"
    elif node_id:
        return f"a {role} token is bound to no node id: leave --node-id out"
    return None


@dataclass(frozen=True)
class TokenRecord:
    """What the credentials file holds of one token: never its secret."""

    token_id: str
    #: Hex SHA-256 of the token's secret.
    digest: str
    name: str
    role: Role
    tenant: str = ""
    node_id: str = ""
    #: When it was created (Unix time).
    created: float = field(default_factory=time.time)

    def identity(self) -> Identity:
        return Identity(name=self.name, role=self.role, tenant=self.tenant, node_id=self.node_id)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["role"] = self.role.value
        return record

    @classmethod
    def from_json(cls, entry: object) -> TokenRecord:
        """A record of the file; CredentialError saying what is wrong with it."""
        if not isinstance(entry, dict):
            raise CredentialError(f"a token entry is {type(entry).__name__}, not an object")
        try:
            token_id, digest = entry["token_id"], entry["digest"]
            name, role = entry["name"], entry["role"]
        except KeyError as missing:
            raise CredentialError(f"a token entry has no {missing.args[0]!r}") from None
        tenant, node_id = entry.get("tenant", ""), entry.get("node_id", "")
        created = entry.get("created", 0.0)
        if not isinstance(token_id, str) or not TOKEN_ID_PATTERN.fullmatch(token_id):
            raise CredentialError(f"token id {token_id!r} is not 12 hex digits")
        if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
            raise CredentialError(f"token {token_id}: its digest is not 64 hex digits")
        if (problem := _created_problem(created)) is not None:
            raise CredentialError(f"token {token_id}: {problem}")
        if not isinstance(tenant, str) or not isinstance(node_id, str):
            raise CredentialError(f"token {token_id}: tenant and node id are strings")
        if (problem := identity_problem(name, role, tenant, node_id)) is not None:
            raise CredentialError(f"token {token_id}: {problem}")
        return cls(token_id, digest, name, Role(role), tenant, node_id, float(created))


def _created_problem(created: object) -> str | None:
    """Why ``created`` is not a time of the file, or None: a number from 0 to MAX_CREATED
    (an edited 1e300 or NaN would pass a type check and crash ``kvpool token list``)."""
    if not isinstance(created, int | float) or isinstance(created, bool):
        return "'created' is not a number"
    if not 0 <= created <= MAX_CREATED:  # (NaN too: no comparison with it holds)
        return f"'created' ({repr(created)[:24]}) is not a time from 0 to {MAX_CREATED:.0f}"
    return None


def new_token(
    name: str, role: Role, tenant: str = "", node_id: str = ""
) -> tuple[str, TokenRecord]:
    """A new token and the record to store of it. The token exists only in what this
    returns: show it once, keep the record."""
    if (problem := identity_problem(name, role, tenant, node_id)) is not None:
        raise CredentialError(problem)
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    record = TokenRecord(token_id, _digest(secret), name, Role(role), tenant, node_id)
    return f"{TOKEN_PREFIX}.{token_id}.{secret}", record


def _json_problem(error: Exception) -> str:
    """What ``json.loads`` found wrong, said so a person can fix it."""
    if isinstance(error, RecursionError):
        return "it is nested too deeply to read"
    return str(error) or type(error).__name__


def _parse_file(data: bytes, path: Path) -> dict[str, TokenRecord]:
    """The records of a credentials file; CredentialError, whatever is wrong with it: a
    RecursionError (deeply nested JSON) or OverflowError escaping here would reach the
    master's event loop, or crash its start."""
    try:
        content = json.loads(data)
    except Exception as error:  # (RecursionError too: any file must get a clear answer)
        raise CredentialError(
            f"credentials file {path} is not JSON: {_json_problem(error)}"
        ) from None
    try:
        return _records_of(content, path)
    except CredentialError:
        raise
    except Exception as error:
        raise CredentialError(
            f"credentials file {path} is not a usable credentials file: "
            f"{type(error).__name__}: {error}"
        ) from None


def _records_of(content: Any, path: Path) -> dict[str, TokenRecord]:
    if not isinstance(content, dict) or not isinstance(content.get("tokens"), list):
        raise CredentialError(
            f"credentials file {path} is not a kvpool credentials file (no 'tokens' list); "
            "make one with `kvpool token create`"
        )
    if content.get("version") != FILE_VERSION:
        raise CredentialError(
            f"credentials file {path} is of version {content.get('version')!r}; this kvpool "
            f"reads version {FILE_VERSION}"
        )
    if len(content["tokens"]) > MAX_TOKENS:
        raise CredentialError(
            f"credentials file {path} holds {len(content['tokens'])} tokens; the limit is "
            f"{MAX_TOKENS}: revoke the ones no longer used"
        )
    records: dict[str, TokenRecord] = {}
    for entry in content["tokens"]:
        try:
            record = TokenRecord.from_json(entry)
        except CredentialError as error:
            raise CredentialError(f"credentials file {path}: {error}") from None
        if record.token_id in records:
            raise CredentialError(f"credentials file {path}: token id {record.token_id} twice")
        records[record.token_id] = record
    return records


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    """What changes when the file is replaced or written: inode, modification time, size."""
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


#: The signature of a file that is not there.
MISSING = (-1, -1, -1)


class CredentialStore:
    """The tokens of a credentials file, checked against the file as it is now (within
    ``check_interval`` seconds). A file that goes missing or unreadable keeps the tokens last
    read (a warning says so): a botched edit does not lock every caller out."""

    def __init__(self, path: str | Path, *, check_interval: float = CHECK_INTERVAL) -> None:
        self.path = Path(path)
        self._check_interval = check_interval
        self._lock = threading.Lock()
        self._cache: dict[str, Identity] = {}
        self._records: dict[str, TokenRecord] = {}
        self._signature = MISSING
        self._refused: tuple[int, int, int] | None = None
        self._checked = time.monotonic()
        try:
            data, stat = self._read()
        except FileNotFoundError:
            raise CredentialError(
                f"credentials file {self.path} does not exist: create it with `kvpool token "
                f"create --credentials {self.path} ...`"
            ) from None
        except OSError as error:
            raise CredentialError(
                f"cannot read credentials file {self.path}: {error.strerror}"
            ) from None
        self._records = _parse_file(data, self.path)
        self._signature = _signature(stat)

    @staticmethod
    def create(path: str | Path) -> CredentialStore:
        """A new, empty credentials file (readable by its owner only); never overwrites."""
        path = Path(path)
        with exclusive_change(path, _cannot("create", path)):
            _write_empty(path)
        return CredentialStore(path)

    @staticmethod
    def open_or_create(path: str | Path) -> tuple[CredentialStore, bool]:
        """The store of ``path``, made empty first when missing, and whether it was made:
        of several ``kvpool token create`` on a new file at once, one makes it, the others
        use it (never "exists already", never a file read half written)."""
        path = Path(path)
        with exclusive_change(path, _cannot("create", path)):
            made = not path.exists()
            if made:
                _write_empty(path)
        return CredentialStore(path), made

    def _read(self) -> tuple[bytes, os.stat_result]:
        with self.path.open("rb") as file:
            return file.read(), os.fstat(file.fileno())

    def _look_again(self) -> None:
        """Reads the file again if it changed since it was last read (or refused)."""
        now = time.monotonic()
        if now - self._checked < self._check_interval:
            return
        with self._lock:
            self._checked = now
            try:
                seen = _signature(self.path.stat())
            except OSError:
                seen = MISSING
            if seen in (self._signature, self._refused):
                return
            try:
                data, stat = self._read()
                records = _parse_file(data, self.path)
            except Exception as error:  # (never into the caller: it is every call's check)
                log.warning(
                    "credentials file unusable; still using the tokens read from it before",
                    path=str(self.path),
                    error=error.strerror if isinstance(error, OSError) else str(error),
                )
                self._refused = seen  # warned once per version of the file
                return
            self._install(records, _signature(stat))

    def _install(self, records: dict[str, TokenRecord], signature: tuple[int, int, int]) -> None:
        self._records = records
        self._signature, self._refused = signature, None
        self._cache = {}  # a revoked token must not stay accepted

    def authenticate(self, token: str) -> Identity | None:
        """Whom ``token`` stands for, or None (malformed, unknown, wrong secret, revoked)."""
        if not isinstance(token, str):
            return None
        self._look_again()
        cache = self._cache
        identity = cache.get(token)
        if identity is not None:
            return identity
        if token_problem(token) is not None:
            return None
        _, token_id, secret = token.split(".")
        record = self._records.get(token_id)
        if record is None or not hmac.compare_digest(record.digest, _digest(secret)):
            return None
        identity = record.identity()
        with self._lock:
            if cache is self._cache:  # not reloaded meanwhile
                while len(cache) >= CACHE_SIZE:
                    del cache[next(iter(cache))]  # the oldest entry
                cache[token] = identity
        return identity

    @property
    def cached_tokens(self) -> int:
        """Tokens whose identity is remembered now (at most CACHE_SIZE)."""
        return len(self._cache)

    def records(self) -> list[TokenRecord]:
        """Every token of the file as it is now, oldest first."""
        self._checked = float("-inf")
        self._look_again()
        return sorted(self._records.values(), key=lambda record: record.created)

    def add(self, record: TokenRecord) -> None:
        def change(records: dict[str, TokenRecord]) -> None:
            if record.token_id in records:
                raise CredentialError(f"token id {record.token_id} is in the file already")
            if len(records) >= MAX_TOKENS:
                raise CredentialError(
                    f"credentials file {self.path} holds {MAX_TOKENS} tokens, the limit: "
                    "revoke the ones no longer used"
                )
            records[record.token_id] = record

        self._change(change)

    def revoke(self, token_id_or_name: str, *, every_identity: bool = False) -> list[TokenRecord]:
        """Removes the token of this id, or every token of this name; returns those removed.
        A name shared by tokens of different identities (a client and a node token both
        named ``node-a``) removes nothing unless ``every_identity``: revoking a node's token
        by mistake takes the node out of the cluster, and its only replicas with it."""
        removed: list[TokenRecord] = []

        def change(records: dict[str, TokenRecord]) -> None:
            matched = [
                (token_id, record)
                for token_id, record in records.items()
                if token_id_or_name in (token_id, record.name)
            ]
            identities = {record.identity() for _, record in matched}
            if len(identities) > 1 and not every_identity:
                shown = "; ".join(sorted(described(record) for _, record in matched))
                raise CredentialError(
                    f"{token_id_or_name!r} names tokens of {len(identities)} identities "
                    f"({shown}): revoke one by its id (`kvpool token list`), or all of them "
                    "with --every-identity"
                )
            for token_id, record in matched:
                del records[token_id]
                removed.append(record)

        self._change(change)
        return removed

    def _change(self, change: Callable[[dict[str, TokenRecord]], None]) -> None:
        """Applies ``change`` to the file as it is now and writes it back whole, holding the
        file's lock (``exclusive_change``) from the read to the write: a threading lock alone
        let another process's change, read before ours was written, write ours away."""
        with self._lock, exclusive_change(self.path, _cannot("lock", self.path)):
            try:
                data, _ = self._read()
            except OSError as error:
                raise CredentialError(
                    f"cannot read credentials file {self.path}: {error.strerror}"
                ) from None
            records = _parse_file(data, self.path)
            before = dict(records)
            change(records)
            if records == before:
                return
            content = {
                "version": FILE_VERSION,
                "tokens": [record.to_json() for record in records.values()],
            }
            try:
                write_atomically(self.path, json.dumps(content, indent=1).encode() + b"\n")
                stat = self.path.stat()
            except OSError as error:
                raise CredentialError(
                    f"cannot write credentials file {self.path}: {error.strerror}"
                ) from None
            self._install(records, _signature(stat))


def _cannot(doing: str, path: Path) -> Callable[[OSError], CredentialError]:
    """What ``exclusive_change`` raises when the lock of ``path`` cannot be taken."""

    def error(problem: OSError) -> CredentialError:
        return CredentialError(
            f"cannot {doing} credentials file {path} (its lock {path.name}{LOCK_SUFFIX}): "
            f"{problem.strerror}"
        )

    return error


def _write_empty(path: Path) -> None:
    """A new credentials file of no tokens, mode 0600; CredentialError when one is there."""
    content = json.dumps({"version": FILE_VERSION, "tokens": []}).encode()
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CredentialError(f"credentials file {path} exists already") from None
    except OSError as error:
        raise CredentialError(f"cannot create credentials file {path}: {error.strerror}") from None
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())


def _read_token_file(path: str, where: str) -> str:
    try:
        token = Path(path).expanduser().read_text().strip()
    except OSError as error:
        raise CredentialError(
            f"cannot read the token file {path} ({where}): {error.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise CredentialError(f"the token file {path} ({where}) is not text") from None
    if not token:
        raise CredentialError(f"the token file {path} ({where}) is empty")
    return token


def token_from(value: str | None, env: str = "KVPOOL_TOKEN") -> str | None:
    """The token to call with: ``value`` (``@FILE``: read from FILE), else the environment
    variable ``env`` (which may be ``@FILE`` too), else the file ``$<env>_FILE``; None when
    none is given. CredentialError when the one given is unreadable or not a token."""
    file_variable = f"{env}_FILE"
    if value:
        where = "given"
    elif os.environ.get(env):
        value, where = os.environ[env], f"${env}"
    elif os.environ.get(file_variable):
        value, where = "@" + os.environ[file_variable], f"${file_variable}"
    else:
        return None
    token = _read_token_file(value[1:], where) if value.startswith("@") else value.strip()
    if (problem := token_problem(token)) is not None:
        raise CredentialError(f"the token ({where}) is not usable: {problem}")
    return token


def described(record: TokenRecord) -> str:
    """One token as `kvpool token revoke` names it: id, name, role and whom it is bound to."""
    bound = f" of tenant {record.tenant}" if record.tenant else ""
    bound += f" for node {record.node_id}" if record.node_id else ""
    return f"{record.token_id} ({record.name}, {record.role.value}{bound})"
