"""Typed exceptions for everything a kvpool user can run into.

Every message says what happened and what to do about it. Batch calls (``put_many``,
``get_many``, ...) do not raise these for per-key failures: they return the exception
instance in that key's slot, so one missing key does not hide the others' results.
"""

from __future__ import annotations


class KVPoolError(Exception):
    """Base class of every kvpool error. ``key`` names the object, when there is one."""

    retryable: bool = False

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ClientClosed(KVPoolError, RuntimeError):
    """The client (or the adapter over it) was closed: make a new one."""


class ClientForked(ClientClosed):
    """A client made before ``fork()`` was used in the child process. Its connections, threads
    and mappings are the parent's (calls from both would share one stream and read each
    other's answers), so the child may not use it: make a new client in the child."""


class InvalidKey(KVPoolError, ValueError):
    """The key is empty, longer than 1024 bytes of UTF-8, or not valid UTF-8."""


class InvalidArgument(KVPoolError, ValueError):
    """An argument other than the key is wrong (size, replica count, buffer, address)."""


class ObjectNotFound(KVPoolError, KeyError):
    """No published object has this key."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ObjectNotReady(ObjectNotFound):
    """The object is being written and not yet published; readers cannot see it yet."""


class ObjectExists(KVPoolError):
    """A put of a key that is published or being written: objects are immutable."""


class ObjectBeingWritten(ObjectExists):
    """A put of a key that another put is still writing. Unlike a published object, this
    one may never be: if that other put fails, the key stays absent. An ``ObjectExists``
    still (older callers catch that), but not proof that the object is stored."""


class NoSpace(KVPoolError):
    """No segment can hold the object, even after eviction."""


class ObjectHasLease(KVPoolError):
    """A remove was refused because a reader holds a lease on the object."""


class LeaseExpired(KVPoolError):
    """The read lease may have run out before the transfer finished; the bytes were discarded."""

    retryable = True


class TransferError(KVPoolError):
    """Moving bytes to or from a storage node failed or missed its deadline."""

    retryable = True


class PutAborted(KVPoolError):
    """The master no longer holds this put's reservation (it timed out or its node died)."""

    retryable = True


class Fenced(KVPoolError):
    """A new master is fencing writes until writers of the old term are surely done."""

    retryable = True


class BufferTooSmall(InvalidArgument):
    """``get_into`` was given a buffer smaller than the object."""


class MasterUnavailable(KVPoolError):
    """The master could not be reached (or kept refusing) within the deadline."""

    retryable = True


class MasterNotTrusted(MasterUnavailable):
    """The master's certificate failed this client's TLS check (not signed by the CA it
    trusts, or not for the address dialled). No retry fixes that: the client's CA or the
    master's certificate has to change. Raised at once."""

    retryable = False


class PutOutcomeUnknown(MasterUnavailable):
    """A put's commit (PutEnd) was sent, or may have been, but its answer never came: the
    master may have published the object, or may yet (a commit still on its way), or not.
    A ``MasterUnavailable`` still (callers that catch that keep working), but not proof that
    nothing was stored. ``keys``: every key of the commit whose outcome is unknown (``key``
    too, where it is one). A batch put raises it only where no commit of the call was
    answered; else the results known are kept, and each key of the unanswered commit gets
    one of its own. Find out with ``exists(key)`` or ``get(key)`` once the master answers; a
    ``Reservation`` learns it from ``commit()`` called again (the master answers a repeated
    commit with the first one's outcome), and its ``revoke()`` after such a commit raises it
    where the master no longer holds the reservation. A put of the key again gets
    ``ObjectExists`` where the first one was published (objects are immutable: to store
    other bytes under it, ``remove`` it first)."""

    def __init__(self, message: str, *, key: str | None = None, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message, key=key)
        self.keys = keys or ((key,) if key is not None else ())


class ChecksumMismatch(KVPoolError):
    """The bytes read do not match the checksum their writer recorded."""

    retryable = True


class NotVerifiable(KVPoolError):
    """``verify=True`` on an object that carries no checksum: it was put without
    ``checksum=True`` on a tier that keeps none (DRAM). Its bytes were read but not checked,
    so they are not returned as if they had been."""


class NotAuthenticated(KVPoolError):
    """The master did not accept the caller's credentials (none, unknown, revoked or
    malformed token; a certificate naming no kvpool identity)."""


class PermissionDenied(KVPoolError):
    """The caller's identity may not make this call (another role's, another node's)."""


class QuotaExceeded(KVPoolError):
    """The caller's tenant reached one of its quotas; the message names it."""
