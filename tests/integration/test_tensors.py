"""torch tensors round trip with dtype and shape, and serve as plain buffers, on a real cluster."""

from __future__ import annotations

import struct
import subprocess
import sys
import uuid

import pytest

from kvpool import Client
from kvpool.client import tensors
from kvpool.errors import BufferTooSmall, InvalidArgument, ObjectNotFound

torch = pytest.importorskip("torch")

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
]
SHAPES = [(), (0,), (7,), (3, 4, 5)]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random values covering the dtype's bits (floats: any bit pattern but NaNs' payloads)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator) * 1000).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=dtype)


@pytest.fixture(scope="module")
def client(shared_cluster):
    with Client(shared_cluster.master_address, timeout=30) as client:
        yield client


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_tensor_comes_back_with_its_dtype_shape_and_values(client, dtype, shape):
    key = unique("tensor")
    tensor = sample(dtype, shape)
    assert client.put_tensor(key, tensor) == 1
    back = client.get_tensor(key)
    assert back.dtype == dtype
    assert back.shape == tensor.shape
    assert back.device.type == "cpu"
    assert torch.equal(back, tensor)
    client.remove(key, force=True)


def test_a_large_tensor_round_trips(client):
    key = unique("large")
    tensor = sample(torch.float32, (4, 1 << 20), seed=1)  # 16 MiB
    client.put_tensor(key, tensor, replicas=2, checksum=True)
    back = client.get_tensor(key, verify=True)
    assert back.shape == (4, 1 << 20) and torch.equal(back, tensor)
    target = torch.empty_like(tensor)
    assert client.get_tensor_into(key, target) is target
    assert torch.equal(target, tensor)
    client.remove(key, force=True)


def test_tensors_move_over_ucx_as_well(shared_cluster):
    """Without same-host mapping: the tensors' memory goes to UCX by address."""
    with Client(shared_cluster.master_address, timeout=30, same_host_mapping=False) as ucx:
        assert ucx.mapped_segments == []
        key, raw = unique("ucx"), unique("ucx-raw")
        tensor = sample(torch.bfloat16, (1 << 20,), seed=4)  # 2 MiB
        ucx.put_tensor(key, tensor)
        assert torch.equal(ucx.get_tensor(key), tensor)
        ucx.put(raw, tensor)
        target = torch.empty_like(tensor)
        assert ucx.get_into(raw, target) == tensor.nbytes and torch.equal(target, tensor)
        ucx.remove_many([key, raw], force=True)


def test_the_tensor_returned_is_writable_and_its_own(client):
    key = unique("own")
    tensor = torch.arange(10, dtype=torch.int64)
    client.put_tensor(key, tensor)
    first, second = client.get_tensor(key), client.get_tensor(key)
    first += 1
    assert torch.equal(second, tensor) and torch.equal(first, tensor + 1)
    client.remove(key, force=True)


def test_the_object_is_a_header_then_the_raw_bytes(client):
    key = unique("layout")
    tensor = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    client.put_tensor(key, tensor)
    data = client.get(key)
    assert data[:4] == b"KVPT" and len(data) == 64 + tensor.nbytes
    assert data[64:] == tensor.numpy().tobytes()
    client.remove(key, force=True)


def test_get_tensor_into_fills_a_matching_tensor(client):
    key = unique("into")
    tensor = sample(torch.bfloat16, (3, 4, 5), seed=2)
    client.put_tensor(key, tensor)
    target = torch.zeros(3, 4, 5, dtype=torch.bfloat16)
    assert client.get_tensor_into(key, target) is target
    assert torch.equal(target, tensor)
    client.remove(key, force=True)


@pytest.mark.parametrize(
    "target",
    [
        torch.zeros(3, 4, 5, dtype=torch.float16),  # same size in bytes, other dtype
        torch.zeros(4, 3, 5, dtype=torch.bfloat16),  # same count, other shape
        torch.zeros(60, dtype=torch.bfloat16),
        torch.zeros(2, dtype=torch.bfloat16),
    ],
    ids=["dtype", "shape", "flat", "smaller"],
)
def test_get_tensor_into_refuses_a_tensor_that_does_not_match(client, target):
    key = unique("mismatch")
    client.put_tensor(key, torch.ones(3, 4, 5, dtype=torch.bfloat16))
    before = target.clone()
    with pytest.raises(InvalidArgument, match=r"bfloat16 tensor of shape \(3, 4, 5\)") as error:
        client.get_tensor_into(key, target)
    assert "pass a matching tensor" in str(error.value) and error.value.key == key
    assert torch.equal(target, before)  # left as it was
    client.remove(key, force=True)


def test_get_tensor_into_refuses_a_non_contiguous_target(client):
    target = torch.zeros(4, 4).t()
    with pytest.raises(InvalidArgument, match=r"not contiguous.*call \.contiguous\(\) first"):
        client.get_tensor_into(unique("any"), target)


def test_an_object_not_put_as_a_tensor_is_refused_clearly(client):
    key = unique("bytes")
    client.put(key, b"plain bytes, no tensor header")
    with pytest.raises(InvalidArgument, match="not a tensor stored by put_tensor"):
        client.get_tensor(key)
    client.remove(key, force=True)
    with pytest.raises(ObjectNotFound):
        client.get_tensor(key)


@pytest.mark.parametrize(
    ("header_length", "shape"),
    [(72, (2,)), (64, (2**64 - 1, 0))],
    ids=["a header not ending on 64 bytes", "a dimension past what torch indexes"],
)
def test_a_damaged_tensor_header_is_refused_and_the_rest_of_the_batch_read(
    client, header_length, shape
):
    damaged, whole = unique("damaged"), unique("whole")
    fixed = tensors.FIXED.pack(tensors.MAGIC, tensors.VERSION, header_length, len(shape), 5)
    header = fixed + struct.pack(f"<{len(shape)}Q", *shape) + b"uint8"
    header += bytes(header_length - len(header))
    data_bytes = 0 if 0 in shape else shape[0]
    client.put(damaged, header + bytes(data_bytes))
    client.put_tensor(whole, torch.arange(4, dtype=torch.uint8))
    first, second = client.get_tensors([damaged, whole])
    assert isinstance(first, InvalidArgument) and "damaged tensor header" in str(first)
    assert second.tolist() == [0, 1, 2, 3]
    for key in (damaged, whole):
        client.remove(key, force=True)


def test_batches_put_and_get_many_tensors(client):
    items = {unique(f"batch{i}"): sample(DTYPES[i], (i + 1, 3), seed=i) for i in range(7)}
    bad = unique("bad")
    results = client.put_tensors({**items, bad: torch.zeros(4, 4).t()})
    assert results[:7] == [1] * 7
    assert isinstance(results[7], InvalidArgument) and "contiguous" in str(results[7])
    missing = unique("missing")
    got = client.get_tensors([*items, missing])
    for (key, tensor), back in zip(items.items(), got[:-1], strict=True):
        assert back.dtype == tensor.dtype and torch.equal(back, tensor), key
    assert isinstance(got[-1], ObjectNotFound)
    client.remove_many(list(items), force=True)


def test_put_tensor_takes_only_tensors(client):
    with pytest.raises(InvalidArgument, match=r"takes a torch\.Tensor, not bytes"):
        client.put_tensor(unique("nt"), b"bytes")


# ------------------------------------------------------------------ tensors as plain buffers


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_contiguous_tensor_is_a_buffer_for_put_and_get_into(client, dtype):
    key = unique("buffer")
    tensor = sample(dtype, (5, 7), seed=3)
    client.put(key, tensor)
    assert client.get(key) == tensor.view(torch.uint8).numpy().tobytes()
    target = torch.zeros(5, 7, dtype=dtype)
    assert client.get_into(key, target) == tensor.nbytes
    assert torch.equal(target, tensor)
    client.remove(key, force=True)


def test_a_zero_dim_and_an_empty_tensor_are_buffers(client):
    key, empty = unique("scalar"), unique("empty")
    client.put_many({key: torch.tensor(2.5), empty: torch.zeros(0, dtype=torch.int64)})
    target = torch.tensor(0.0)
    assert client.get_into(key, target) == 4 and target.item() == 2.5
    assert client.get_into(empty, torch.zeros(0)) == 0
    client.remove_many([key, empty], force=True)


def test_a_tensor_too_small_for_the_object_is_refused(client):
    key = unique("small")
    client.put(key, torch.ones(8))
    with pytest.raises(BufferTooSmall):
        client.get_into(key, torch.zeros(7))
    client.remove(key, force=True)


def test_a_non_contiguous_tensor_is_refused_as_a_buffer(client):
    strided = torch.arange(16.0).reshape(4, 4).t()
    with pytest.raises(InvalidArgument, match=r"call \.contiguous\(\) first"):
        client.put(unique("strided"), strided)
    key = unique("strided-target")
    client.put(key, torch.zeros(16))
    with pytest.raises(InvalidArgument, match=r"call \.contiguous\(\) first"):
        client.get_into(key, strided)
    with pytest.raises(InvalidArgument, match=r"call \.contiguous\(\) first"):
        client.put_tensor(unique("strided"), strided)
    told = unique("contiguous")
    client.put(told, strided.contiguous())  # as told
    client.remove_many([key, told], force=True)


class _ReportsCuda(torch.Tensor):
    """A CPU tensor that says it lives on a GPU (no CUDA here to make a real one)."""

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def test_a_cuda_tensor_is_refused_with_what_it_needs(client):
    fake = torch.zeros(4).as_subclass(_ReportsCuda)
    needs = "UCX data path with CUDA support"
    with pytest.raises(InvalidArgument, match=needs):
        tensors.check_buffer_tensor(fake)
    with pytest.raises(InvalidArgument, match=needs):
        client.put(unique("gpu"), fake)
    with pytest.raises(InvalidArgument, match=needs):
        client.put_tensor(unique("gpu"), fake)
    with pytest.raises(InvalidArgument, match=needs):
        client.get_tensor_into(unique("gpu"), fake)


def test_a_tensor_on_another_device_is_refused(client):
    with pytest.raises(InvalidArgument, match="on device meta: kvpool moves CPU memory only"):
        client.put(unique("meta"), torch.empty(4, device="meta"))


def test_a_tensor_that_requires_grad_is_a_buffer(client):
    key = unique("grad")
    weights = torch.ones(6, requires_grad=True)
    client.put_tensor(key, weights)
    assert torch.equal(client.get_tensor(key), torch.ones(6))
    client.remove(key, force=True)


# ------------------------------------------------------------------ torch stays optional


def test_importing_kvpool_does_not_import_torch():
    code = (
        "import sys, kvpool; from kvpool import Client; import kvpool.client.client; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_torch_the_tensor_calls_say_what_to_install():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from kvpool.client import tensors\n"
        "try:\n"
        "    tensors._torch()\n"
        "except ImportError as error:\n"
        "    assert 'pip install torch' in str(error), error\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "assert not tensors.is_tensor(b'x')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
