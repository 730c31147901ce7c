"""Python face of our libucp binding: context, worker, endpoint, memory region, remote key.

The objects here are thin owners of UCX handles; the loops that matter for speed run in C
(``ucp_helpers.c``) with the GIL released. Create every UCX object after ``fork()``: a child
must never use a context its parent created. UCX's own log lines go to kvpool's structured
log, not to the process's output (``ucx_log.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import libucx

libucx.load_library()

from kvpool.common.logging import get_logger  # noqa: E402
from kvpool.transport import ucx_log  # noqa: E402  (UCX's log lines go to structlog from now on)
from kvpool.transport._ucp_cffi import ffi, lib  # noqa: E402  (needs libucp loaded first)
from kvpool.transport.worker_address import MalformedWorkerAddress, check_worker_address  # noqa: E402

log = get_logger("kvpool.ucx")

#: UCX settings kvpool applies unless the environment already sets them. 256 KiB TCP segments
#: give UCX's TCP transport much more bandwidth than its default segment size.
DEFAULT_UCX_CONFIG: dict[str, str] = {
    "TCP_TX_SEG_SIZE": "256k",
    "TCP_RX_SEG_SIZE": "256k",
}

#: After a missed deadline, how long a transfer that cannot be cancelled (same-host CMA) may
#: keep running to completion before its worker is given up.
DRAIN_GRACE = 5.0

UCS_OK = lib.UCS_OK
UCS_ERR_TIMED_OUT = lib.UCS_ERR_TIMED_OUT
UCS_ERR_UNREACHABLE = lib.UCS_ERR_UNREACHABLE
#: ``UCS_ERR_INVALID_ADDR`` (a literal: the binding's cdef does not declare it).
UCS_ERR_INVALID_ADDR = -7


class UcxError(RuntimeError):
    """A UCX call failed; ``status`` is the ucs_status_t value."""

    def __init__(self, what: str, status: int) -> None:
        self.status = status
        super().__init__(f"{what}: {status_string(status)} (ucs status {status})")


def status_string(status: int) -> str:
    if status < -1000 or status > 1:
        return os.strerror(-status) if status < 0 else "unknown"
    return ffi.string(lib.kv_status_string(status)).decode()


def _check(what: str, status: int) -> None:
    if status != UCS_OK:
        ucx_log.drain()  # what UCX said about it, logged before the error travels on
        raise UcxError(what, status)


def _effective_config(overrides: Mapping[str, str] | None) -> dict[str, str]:
    config = {
        key: value for key, value in DEFAULT_UCX_CONFIG.items() if f"UCX_{key}" not in os.environ
    }
    config.update(overrides or {})
    return config


class Context:
    """A UCP context with RMA and wakeup features; owns memory registrations.

    ``rma=False, active_messages=True`` makes a context for a storage node that serves only
    checked requests (``ucp_am.AmServer``): UCP then runs no peer's software RMA on it."""

    def __init__(
        self,
        config: Mapping[str, str] | None = None,
        *,
        rma: bool = True,
        active_messages: bool = False,
    ) -> None:
        settings = _effective_config(config)
        keys = [ffi.new("char[]", k.encode()) for k in settings]
        values = [ffi.new("char[]", v.encode()) for v in settings.values()]
        out = ffi.new("ucp_context_h *")
        c_keys, c_values = ffi.new("const char *[]", keys), ffi.new("const char *[]", values)
        if rma and not active_messages:
            status = lib.kv_context_create(out, c_keys, c_values, len(keys))
        else:
            features = (lib.KV_FEATURE_RMA if rma else 0) | (
                lib.KV_FEATURE_AM if active_messages else 0
            )
            status = lib.kv_context_create_features(out, c_keys, c_values, len(keys), features)
        _check("ucp_init", status)
        self._handle = out[0]
        self._closed = False
        #: Whether peers' one-sided operations reach this context's memory (UCP runs a
        #: peer's software RMA only on a context with the RMA feature).
        self.serves_rma = rma

    @property
    def handle(self) -> Any:
        return self._handle

    def register(self, buffer: Any) -> MemoryRegion:
        """Registers caller memory (anything exposing a writable buffer) for one-sided access."""
        pointer = ffi.from_buffer(buffer, require_writable=True)
        return self.register_address(int(ffi.cast("uintptr_t", pointer)), len(pointer), pointer)

    def register_address(self, address: int, length: int, owner: Any = None) -> MemoryRegion:
        out = ffi.new("ucp_mem_h *")
        _check(
            "ucp_mem_map", lib.kv_mem_map(self._handle, ffi.cast("void *", address), length, out)
        )
        return MemoryRegion(self, out[0], address, length, owner)

    def create_worker(self) -> Worker:
        return Worker(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            lib.kv_context_destroy(self._handle)


class MemoryRegion:
    """Registered memory: ``address`` .. ``address + length``; ``rkey`` lets peers reach it
    (``peer_rkey``: b"" where no peer can, on a context that serves no RMA)."""

    def __init__(self, context: Context, memh: Any, address: int, length: int, owner: Any):
        self._context = context
        self.memh = memh
        self.address = address
        self.length = length
        self._owner = owner  # keeps the underlying buffer alive while registered
        self._rkey: bytes | None = None

    def contains(self, address: int, length: int) -> bool:
        return self.address <= address and address + length <= self.address + self.length

    @property
    def rkey(self) -> bytes:
        if self._rkey is None:
            buf = ffi.new("void **")
            size = ffi.new("size_t *")
            _check("ucp_rkey_pack", lib.kv_rkey_pack(self._context.handle, self.memh, buf, size))
            self._rkey = bytes(ffi.buffer(buf[0], size[0]))
            lib.kv_rkey_buffer_release(buf[0])
        return self._rkey

    @property
    def peer_rkey(self) -> bytes:
        """What to hand peers: ``rkey``, or b"" when the context serves no peer's RMA (a
        peer given a key would wait out its deadline on every transfer)."""
        return self.rkey if self._context.serves_rma else b""

    def close(self) -> None:
        if self.memh is not None:
            lib.kv_mem_unmap(self._context.handle, self.memh)
            self.memh = None
            self._owner = None


@dataclass(slots=True)
class Op:
    """One one-sided transfer: ``length`` bytes between local ``buffer`` and remote memory."""

    endpoint: Endpoint
    rkey: RemoteKey
    local_address: int
    remote_address: int
    length: int
    memh: Any = None


class Worker:
    """A UCP worker with an event fd. Not thread-safe: callers serialise access."""

    def __init__(self, context: Context) -> None:
        self.context = context
        out = ffi.new("ucp_worker_h *")
        efd = ffi.new("int *")
        _check("ucp_worker_create", lib.kv_worker_create(context.handle, out, efd))
        self._handle = out[0]
        self.efd = efd[0]
        self._closed = False
        #: Set when a timed-out operation could be neither cancelled nor drained: progressing
        #: this worker again could let it write into memory its caller has moved on from.
        self.tainted = False

    @property
    def handle(self) -> Any:
        return self._handle

    @property
    def address(self) -> bytes:
        buf = ffi.new("void **")
        size = ffi.new("size_t *")
        _check("ucp_worker_get_address", lib.kv_worker_address(self._handle, buf, size))
        try:
            return bytes(ffi.buffer(buf[0], size[0]))
        finally:
            lib.kv_worker_address_release(self._handle, buf[0])

    def connect(self, worker_address: bytes, *, peer_errors: bool = False) -> Endpoint:
        """An endpoint to a remote worker. ``peer_errors`` makes it force-closable (its
        operations can be cancelled) at the price of software RMA and no shared memory."""
        try:
            check_worker_address(worker_address)
        except MalformedWorkerAddress as error:
            # (UCX would read past the bytes or abort the process on them)
            raise UcxError(
                f"ucp_ep_create: the worker address {error}", UCS_ERR_INVALID_ADDR
            ) from None
        out = ffi.new("ucp_ep_h *")
        status = lib.kv_ep_create(self._handle, worker_address, int(peer_errors), out)
        _check("ucp_ep_create", status)
        return Endpoint(self, out[0], peer_errors)

    def transfer(
        self, ops: Sequence[Op], *, is_get: bool, timeout: float, grace: float = DRAIN_GRACE
    ) -> list[int]:
        """Runs ``ops`` to completion or until ``timeout`` seconds pass; returns statuses.

        When this returns, no operation touches local memory any more. On a timeout,
        force-closable endpoints with work pending are closed (marked ``closed``: drop them
        and their rkeys, and reconnect); the others are drained for up to ``grace`` seconds.
        If that is not enough, ``tainted`` is set and the worker must never be used again.
        """
        n = len(ops)
        if n == 0:
            return []
        c_ops = ffi.new("kv_op_t[]", n)
        for c_op, op in zip(c_ops, ops, strict=True):
            c_op.ep = op.endpoint.handle
            c_op.rkey = op.rkey.handle
            c_op.local = ffi.cast("void *", op.local_address)
            c_op.remote = op.remote_address
            c_op.length = op.length
            if op.memh is not None:
                c_op.memh = op.memh
        statuses = ffi.new("int[]", n)
        closed = ffi.new("ucp_ep_h[]", n)
        n_closed = ffi.new("size_t *")
        tainted = ffi.new("int *")
        try:
            lib.kv_transfer(
                self._handle,
                self.efd,
                int(is_get),
                c_ops,
                n,
                timeout,
                grace,
                statuses,
                closed,
                n_closed,
                tainted,
            )
        finally:  # (an interrupt raised as the call returns must not skip what C reported)
            self.tainted = self.tainted or bool(tainted[0])
            if n_closed[0]:
                dead = {closed[i] for i in range(n_closed[0])}
                for op in ops:
                    if op.endpoint.handle in dead:
                        op.endpoint.mark_closed()
        return list(statuses)

    def progress_until(self, stop_fd: int) -> int:
        """Progresses this worker until ``stop_fd`` is readable (blocks; run in a thread)."""
        return lib.kv_progress_loop(self._handle, self.efd, stop_fd)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            lib.kv_worker_destroy(self._handle)


class Endpoint:
    """A connection to one remote worker; unpacks that worker's remote keys."""

    def __init__(self, worker: Worker, handle: Any, peer_errors: bool = False) -> None:
        self.worker = worker
        self.handle = handle
        self.peer_errors = peer_errors
        self.closed = False
        self._rkeys: list[RemoteKey] = []

    def uses_transport(self, name: str) -> bool:
        """Whether one of this endpoint's lanes runs over transport ``name`` (e.g. "cma")."""
        return bool(lib.kv_ep_uses_transport(self.handle, name.encode()))

    def unpack_rkey(self, packed: bytes) -> RemoteKey:
        out = ffi.new("ucp_rkey_h *")
        _check("ucp_ep_rkey_unpack", lib.kv_rkey_unpack(self.handle, packed, out))
        rkey = RemoteKey(out[0])
        self._rkeys.append(rkey)
        return rkey

    def mark_closed(self) -> None:
        """Called when the C layer force-closed this endpoint after a timeout."""
        if not self.closed:
            self.closed = True
            self._destroy_rkeys()

    def _destroy_rkeys(self) -> None:
        for rkey in self._rkeys:
            rkey.destroy()
        self._rkeys.clear()

    def close(self, timeout: float = 1.0) -> bool:
        """Closes the endpoint; False when a peer did not let it finish within ``timeout``."""
        if self.closed:
            return True
        self.closed = True
        self._destroy_rkeys()
        return lib.kv_ep_close(self.worker.handle, self.worker.efd, self.handle, timeout) == UCS_OK


class RemoteKey:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def destroy(self) -> None:
        if self.handle is not None:
            lib.kv_rkey_destroy(self.handle)
            self.handle = None


class ProgressThread:
    """Keeps a worker progressing on its event fd until ``stop()``; used by storage nodes."""

    def __init__(self, worker: Worker, name: str = "ucx-progress") -> None:
        self._worker = worker
        self._stop_r, self._stop_w = os.pipe()
        self.result: int | None = None
        #: Loops that ended with an error (each is logged at first, then every thousandth).
        self.failures = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # (a failure to arm the worker or to poll ends one loop; the worker must go on
        # progressing, or transfers that need this process, TCP's software RMA, stall)
        while True:
            self.result = self._worker.progress_until(self._stop_r)
            if self.result == 0 or self._stopping:
                return
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.error("UCX progress failed; going on", status=self.result, times=self.failures)
            time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> bool:
        """Ends the thread; False when it did not end within ``timeout`` (busy in UCX: the
        worker and the memory it reaches must then be left to the process's exit)."""
        self._stopping = True
        os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False  # (its stop pipe stays open: the thread may still look at it)
        os.close(self._stop_r)
        os.close(self._stop_w)
        return True


def address_of(buffer: Any, *, writable: bool) -> tuple[int, int, Any]:
    """(address, length, keepalive) of a buffer-protocol object, without copying it."""
    pointer = ffi.from_buffer(buffer, require_writable=writable)
    return int(ffi.cast("uintptr_t", pointer)), len(pointer), pointer


def view_of(address: int, length: int) -> Any:
    """A read-only buffer over ``length`` bytes at ``address`` (no copy)."""
    return ffi.buffer(ffi.cast("char *", address), length)
