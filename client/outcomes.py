"""Per-key master outcomes turned into the typed errors users catch, with what to do."""

from __future__ import annotations

from kvpool.common.keys import shown_key
from kvpool.common.status import OWN_RESERVATION, OWN_RESERVATION_END, KeyStatus
from kvpool.errors import (
    Fenced,
    InvalidArgument,
    InvalidKey,
    KVPoolError,
    NoSpace,
    ObjectBeingWritten,
    ObjectExists,
    ObjectHasLease,
    ObjectNotFound,
    ObjectNotReady,
    PutAborted,
    QuotaExceeded,
    TransferError,
)


def error_for(status: int, key: str, message: str = "") -> KVPoolError:
    """The exception for a non-OK KeyStatus of ``key``."""
    detail = f" ({message})" if message else ""
    shown = shown_key(key)
    try:
        known = KeyStatus(status)
    except ValueError:  # (protobuf passes a status it does not know through as an int)
        return KVPoolError(
            f"the master answered status {status} for {shown}, which this client does not "
            f"know{detail}: upgrade the client to the master's version",
            key=key,
        )
    match known:
        case KeyStatus.NOT_FOUND:
            return ObjectNotFound(
                f"no object with key {shown}: it was never put, was removed, or lost its last "
                "replica",
                key=key,
            )
        case KeyStatus.NOT_READY:
            return ObjectNotReady(
                f"object {shown} is being written and not yet published; retry shortly",
                key=key,
            )
        case KeyStatus.ALREADY_EXISTS:
            # (the master's message says which of the two: it would only repeat the key)
            # (the master's words come after the key it quotes, which may hold any of them:
            # only the message's end tells the cases apart)
            if message.endswith(OWN_RESERVATION_END):  # (most likely a put whose answer was lost)
                why = message[message.rfind(OWN_RESERVATION) :]
                return ObjectBeingWritten(f"object {shown}{why}", key=key)
            if message.endswith(" is being written"):
                return ObjectBeingWritten(
                    f"object {shown} is already being written by another put: objects "
                    "are immutable; use another key, or remove it (force=True) and put again",
                    key=key,
                )
            return ObjectExists(
                f"object {shown} already exists: objects are immutable; remove it "
                "first or use another key",
                key=key,
            )
        case KeyStatus.NO_SPACE:
            return NoSpace(f"no room for {shown}: {message}", key=key)
        case KeyStatus.INVALID_KEY:
            return InvalidKey(f"invalid key {shown}: {message}", key=key)
        case KeyStatus.HAS_LEASE:
            # (this client's own get or exists leased it, often: the caller can end that
            # lease itself, which it would not guess from "a reader". The master does not
            # say whose lease it is, so the message does not claim it is the caller's.)
            return ObjectHasLease(
                f"object {shown} is leased by a reader, this client included (its gets and "
                "exists() lease what they find): end this client's lease with "
                "client.release_leases([key]), or retry once the lease runs out (its TTL: "
                "the client's lease_ttl, else the master's default), or remove with "
                "force=True",
                key=key,
            )
        case KeyStatus.INVALID_ARGUMENT:
            return InvalidArgument(f"bad request for {shown}: {message}", key=key)
        case KeyStatus.STALE_PUT:
            return PutAborted(
                f"the reservation for {shown} ended before it was committed (it timed out, or "
                "its storage node died); nothing was published: put it again",
                key=key,
            )
        case KeyStatus.FENCED:
            return Fenced(f"cannot place {shown} yet: {message}", key=key)
        case KeyStatus.QUOTA_EXCEEDED:
            # (a put's message names the quota; a read's is always the one of leases)
            why = message or (
                "its leases quota (objects under read lease) is reached: release leases "
                "(close readers) or wait for them to end, or ask an admin for more"
            )
            return QuotaExceeded(f"{shown} refused: {why}", key=key)
        case KeyStatus.NO_REPLICA:
            return TransferError(
                f"no replica of {shown} could be written; nothing was published{detail}",
                key=key,
            )
    raise AssertionError(f"no error for status {status}")
