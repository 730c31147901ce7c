"""Addresses of caller memory, and fresh ``bytes`` that a transfer can fill without a copy."""

from __future__ import annotations

import re
from typing import Any

from kvpool.client import tensors
from kvpool.errors import InvalidArgument
from kvpool.transport import ucp


def readable_address(data: Any) -> tuple[int, int, Any]:
    """(address, length, keepalive) of any contiguous buffer: bytes, bytearray, numpy, mmap,
    a contiguous CPU torch tensor."""
    try:
        found = ucp.address_of(data, writable=False)
    except (TypeError, ValueError, BufferError) as error:
        problem = error
    else:
        _refuse_pointers(data, "data")
        return found
    if tensors.is_tensor(data):  # (no buffer protocol: taken by its data pointer)
        return tensors.tensor_address(data, writable=False)
    raise InvalidArgument(
        f"data must be bytes or a contiguous buffer, not {type(data).__name__} ({problem})"
    )


def writable_address(buffer: Any) -> tuple[int, int, Any]:
    """(address, length, keepalive) of a writable contiguous buffer (bytearray, numpy, mmap, a
    contiguous CPU torch tensor)."""
    try:
        found = ucp.address_of(buffer, writable=True)
    except (TypeError, ValueError, BufferError) as error:
        problem = error
    else:
        _refuse_pointers(buffer, "buffer")
        return found
    if tensors.is_tensor(buffer):
        return tensors.tensor_address(buffer, writable=True)
    raise InvalidArgument(
        f"buffer must be writable and contiguous (bytearray, memoryview, numpy array, "
        f"mmap, CPU torch tensor), not {type(buffer).__name__} ({problem})"
    )


def _refuse_pointers(buffer: Any, name: str) -> None:
    """Refuses a buffer of Python object references (a numpy array of dtype object, a ctypes
    ``py_object`` array, a memoryview of either): its bytes are pointers into this process.
    Stored, they mean nothing elsewhere; read into, they would overwrite references and crash
    the interpreter."""
    kind = type(buffer)
    if kind is bytes or kind is bytearray:  # (the common case, at once)
        return
    if _holds_objects(buffer):
        raise InvalidArgument(
            f"{name} holds Python object references (numpy dtype object, ctypes py_object), "
            "not data: pass an array of a numeric dtype, or bytes"
        )


def _holds_objects(buffer: Any) -> bool:
    """Whether the buffer's items are object references. A numpy dtype says so itself; any
    other exporter (ctypes, memoryview, array, ...) by an 'O' in its buffer format ('<O' from
    ctypes), field names of a struct format ('T{<i:Offset:}') aside."""
    holds = getattr(getattr(buffer, "dtype", None), "hasobject", None)
    if isinstance(holds, bool):
        return holds
    try:
        view = memoryview(buffer)
    except (TypeError, ValueError, BufferError):
        return False
    with view:
        return "O" in _FIELD_NAMES.sub("", view.format)


#: The field names of a struct buffer format (``:name:``), which may spell an 'O' themselves.
_FIELD_NAMES = re.compile(r":[^:]*:")


def new_bytes(size: int) -> tuple[bytes | bytearray, int]:
    """A new object of ``size`` bytes and the address a transfer may write it at.

    ``get`` returns ``bytes``; copying a 32 MiB object from a bytearray into bytes would cost
    as much as a third of the transfer itself. So for sizes above one byte this hands out a
    freshly made ``bytes`` object (large ones come from calloc as untouched zero pages) whose
    storage is filled before any other code can see it. Sizes 0 and 1 use a bytearray that
    the caller converts, because CPython shares those small ``bytes`` objects.
    """
    if size <= 1:
        data: bytes | bytearray = bytearray(size)
        address = ucp.address_of(data, writable=True)[0] if size else 0
        return data, address
    data = bytes(size)
    return data, ucp.address_of(data, writable=False)[0]
