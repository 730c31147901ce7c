"""torch tensors in kvpool: as plain buffers, and as self-describing objects.

Plain buffers: ``put(key, tensor)`` and ``get_into(key, tensor)`` take a contiguous CPU tensor
of any dtype as they take a numpy array, zero-copy (its raw bytes; nothing records dtype or
shape). ``buffers.py`` turns to :func:`tensor_address` when an object is a tensor.

Self-describing objects: ``put_tensor`` stores one object, a header and then the tensor's raw
bytes, and ``get_tensor`` gives back a tensor of the same dtype and shape. The header
(version 1, little-endian) is::

    magic b"KVPT" | u16 version | u16 header length | u8 ndim | u8 dtype name length |
    6 zero bytes | ndim x u64 dims | dtype name (ASCII, as torch spells it: "bfloat16") |
    zeros up to the header length, a multiple of 64

so the data starts 64-byte aligned, and a tensor can view it in place. The object's size is
the header length plus the tensor's bytes, exactly.

What copies: ``put_tensor`` stages header and bytes in one buffer (one copy of the tensor)
because a put takes one contiguous buffer. ``get_tensor`` reads the whole object into a new
uint8 tensor and returns a view of it past the header: no copy. ``get_tensor_into`` reads
into such a staging tensor and copies into the caller's (one copy), because the caller's
tensor has no room for the header.

torch is imported only here, and only when a tensor call runs: ``import kvpool`` does not
import it, and a tensor passed as a buffer is recognised only where torch is already loaded
(it must be, for the caller to hold a tensor).
"""

from __future__ import annotations

import math
import struct
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvpool.client import arguments, get_path
from kvpool.client.cancellation import checkpoint
from kvpool.common.keys import shown_key
from kvpool.errors import InvalidArgument, KVPoolError
from kvpool.transport import ucp

if TYPE_CHECKING:
    import torch

    from kvpool.client.client import Client

MAGIC = b"KVPT"
VERSION = 1
#: magic, version, header length, ndim, dtype name length, 6 reserved bytes.
FIXED = struct.Struct("<4sHHBB6x")
#: The header, and so the data after it, ends on a multiple of this.
ALIGNMENT = 64
#: The largest dimension torch can index (an int64).
MAX_DIMENSION = 2**63 - 1
TORCH_MISSING = "pip install torch: kvpool's tensor calls need it"


def _torch() -> Any:
    """torch, imported on first use (never by ``import kvpool``)."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"{TORCH_MISSING} ({error})", name="torch") from None
    return torch


def is_tensor(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor; False at no cost where torch was never imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


# ---------------------------------------------------------------------- tensors as buffers


def check_buffer_tensor(tensor: torch.Tensor, what: str = "tensor") -> None:
    """Raises InvalidArgument unless ``tensor``'s memory can be handed to a transfer as is:
    a dense, contiguous tensor in CPU memory (pinned or not)."""
    device = tensor.device
    if tensor.is_cuda or device.type == "cuda":
        raise InvalidArgument(
            f"{what} is a CUDA tensor ({device}): moving GPU memory needs kvpool's UCX data "
            "path with CUDA support, which is designed but not available in this version. "
            "Copy it to CPU memory first (tensor.cpu(), or into a pinned CPU tensor)"
        )
    if device.type != "cpu":
        raise InvalidArgument(
            f"{what} is on device {device}: kvpool moves CPU memory only; copy it to the CPU "
            "first (tensor.cpu())"
        )
    torch = _torch()
    if tensor.layout != torch.strided:
        raise InvalidArgument(
            f"{what} has layout {tensor.layout}: only dense tensors can be used as buffers; "
            "call .to_dense() first"
        )
    if tensor.is_quantized:
        raise InvalidArgument(f"{what} is quantized ({tensor.dtype}): dequantize it first")
    if not tensor.is_contiguous():
        raise InvalidArgument(
            f"{what} is not contiguous (shape {tuple(tensor.shape)}, strides "
            f"{tuple(tensor.stride())}): call .contiguous() first"
        )
    if tensor.is_conj() or tensor.is_neg():
        raise InvalidArgument(
            f"{what} has a lazy conjugate or negative bit: call .resolve_conj() / "
            ".resolve_neg() first"
        )


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a checked tensor, as a flat uint8 tensor over the same memory."""
    return tensor.detach().reshape(-1).view(_torch().uint8)


def tensor_address(tensor: torch.Tensor, *, writable: bool) -> tuple[int, int, Any]:
    """(address, length, keepalive) of a contiguous CPU tensor's bytes, without a copy."""
    check_buffer_tensor(tensor)
    array = raw_bytes(tensor).numpy()  # (its base is the tensor: the keepalive keeps both)
    return ucp.address_of(array, writable=writable)


# ---------------------------------------------------------------------- the header


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_header(dtype: torch.dtype, shape: Sequence[int]) -> bytes:
    name = _dtype_name(dtype).encode("ascii")
    if len(shape) > 255:
        raise InvalidArgument(f"a tensor of {len(shape)} dimensions has too many (255 at most)")
    body = FIXED.size + 8 * len(shape) + len(name)
    length = -(-body // ALIGNMENT) * ALIGNMENT
    header = FIXED.pack(MAGIC, VERSION, length, len(shape), len(name))
    header += struct.pack(f"<{len(shape)}Q", *shape) + name
    return header + bytes(length - body)


def decode_header(key: str, data: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], int]:
    """(dtype, shape, header length) of a whole tensor object read into ``data`` (uint8),
    checked against its size. InvalidArgument when it is not one ``put_tensor`` stored."""
    shown = shown_key(key)
    size = data.numel()
    fixed = bytes(data[: FIXED.size].numpy()) if size >= FIXED.size else b""
    if fixed[:4] != MAGIC:
        raise InvalidArgument(
            f"object {shown} ({size} bytes) is not a tensor stored by put_tensor (no kvpool "
            "tensor header): read it with get() or get_into()",
            key=key,
        )
    _, version, length, ndim, name_length = FIXED.unpack(fixed)
    if version != VERSION:
        raise InvalidArgument(
            f"object {shown} is a tensor of header version {version}; this kvpool reads "
            f"version {VERSION}: upgrade kvpool",
            key=key,
        )
    body = FIXED.size + 8 * ndim + name_length
    # (put_tensor aligns the data: a header of any other length, or a dimension past what
    # torch can index, was not written by it)
    if length < body or length > size or length % ALIGNMENT:
        raise InvalidArgument(f"object {shown} has a damaged tensor header", key=key)
    header = bytes(data[:body].numpy())
    shape = struct.unpack_from(f"<{ndim}Q", header, FIXED.size)
    if any(dimension > MAX_DIMENSION for dimension in shape):
        raise InvalidArgument(f"object {shown} has a damaged tensor header", key=key)
    name = header[FIXED.size + 8 * ndim : body].decode("ascii", errors="replace")
    torch = _torch()
    dtype = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgument(
            f"object {shown} holds a tensor of dtype {name!r}, which this torch "
            f"({torch.__version__}) does not have",
            key=key,
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if length + nbytes != size:
        raise InvalidArgument(
            f"object {shown} is {size} bytes, but its header says {length} + {nbytes} "
            f"({name}, shape {shape}): it is damaged",
            key=key,
        )
    return dtype, shape, length


def _view(data: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], length: int) -> Any:
    """The tensor in ``data`` past its header: a view, no copy (the data is 64-byte aligned)."""
    return data[length:].view(dtype).view(shape)


# ---------------------------------------------------------------------- puts


def encode(key: str, tensor: Any) -> torch.Tensor:
    """One uint8 tensor holding the header and the bytes of ``tensor`` (one copy of them)."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(
            f"{shown_key(key)}: put_tensor takes a torch.Tensor, not {type(tensor).__name__}: "
            "use put() for bytes and other buffers",
            key=key,
        )
    try:
        check_buffer_tensor(tensor)
        header = encode_header(tensor.dtype, tuple(tensor.shape))
    except InvalidArgument as error:
        raise InvalidArgument(f"{shown_key(key)}: {error}", key=key) from None
    staged = torch.empty(len(header) + tensor.nbytes, dtype=torch.uint8)
    staged[: len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    staged[len(header) :] = raw_bytes(tensor)
    return staged


def put_tensors(
    client: Client, items: Mapping[str, Any] | Iterable[tuple[str, Any]], **options: Any
) -> list[int | KVPoolError]:
    """``put_many`` of tensors, each with its header: entry i is the replicas stored for key
    i, or its error. One master round trip for the batch, as ``put_many``."""
    from kvpool.client.client import _check_options, _refuse_repeats

    # (before any tensor is staged: else a misspelt option fails in put_many, which the
    # message names, or not at all where no tensor could be staged)
    _check_options("put_tensors", options)
    pairs, keys = arguments.pair_list("put_tensors", items, "tensor")
    results: list[Any] = [None] * len(pairs)
    staged: dict[int, tuple[str, torch.Tensor]] = {}
    for i, (key, tensor) in enumerate(pairs):
        try:
            staged[i] = (key, encode(key, tensor))
        except InvalidArgument as error:
            results[i] = error
    # (here, among the tensors encoded, numbered as the caller's entries: put_many would
    # number those it is given; a key whose first entry was refused is put by the next)
    _refuse_repeats(keys, staged, results)
    if staged:
        stored = client.put_many(
            [(key, raw_bytes(data)) for key, data in staged.values()], **options
        )
        for i, result in zip(staged, stored, strict=True):
            results[i] = result
    return results


# ---------------------------------------------------------------------- gets


def read_whole(client: Client, keys: Sequence[str], verify: bool) -> list[Any]:
    """Each object whole, in a new uint8 tensor of its size (or the error for it), in one
    master round trip: ``get_many``, with tensors in place of ``bytes``."""
    verify = arguments.flag("verify", verify)
    torch = _torch()
    session = client._session
    deadline = time.monotonic() + client.timeout
    results: list[Any] = [None] * len(keys)
    valid = client._valid_keys(keys, results)
    located, lease_deadline = client._locate(keys, valid, results, deadline)
    targets = {}
    for i, location in located.items():
        data = torch.empty(location.size, dtype=torch.uint8)
        results[i] = data
        targets[i] = (data.data_ptr(), location.size)
    get_path.read(session, keys, located, targets, results, deadline, lease_deadline)
    if verify:
        get_path.verify(keys, located, targets, results)
    return results


def get_tensors(client: Client, keys: Sequence[str], verify: bool = False) -> list[Any]:
    """Entry i is key i's tensor (dtype and shape as put) or its error; no copy."""
    keys = arguments.key_list("get_tensors", keys, "get_tensor(key)")
    results = read_whole(client, keys, verify)
    for i, data in enumerate(results):
        if isinstance(data, KVPoolError):
            continue
        try:
            results[i] = _view(data, *decode_header(keys[i], data))
        except InvalidArgument as error:
            results[i] = error
    return results


def get_tensor_into(client: Client, key: str, tensor: Any, verify: bool = False) -> Any:
    """Reads the tensor stored under ``key`` into ``tensor`` (same dtype and shape, contiguous,
    CPU); returns ``tensor``. One copy, from a staging tensor."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(
            f"get_tensor_into takes a torch.Tensor, not {type(tensor).__name__}: use "
            "get_into() for other buffers",
            key=key,
        )
    check_buffer_tensor(tensor, "the target tensor")
    verify = arguments.flag("verify", verify)
    [data] = read_whole(client, [key], verify)
    if isinstance(data, KVPoolError):
        raise data
    dtype, shape, length = decode_header(key, data)
    if dtype != tensor.dtype or shape != tuple(tensor.shape):
        raise InvalidArgument(
            f"object {shown_key(key)} holds a {_dtype_name(dtype)} tensor of shape "
            f"{shape}, but the target tensor is {_dtype_name(tensor.dtype)} of shape "
            f"{tuple(tensor.shape)}: pass a matching tensor, or use get_tensor()",
            key=key,
        )
    checkpoint()  # (a cancelled call leaves the caller's tensor alone)
    raw_bytes(tensor).copy_(data[length:])
    return tensor
