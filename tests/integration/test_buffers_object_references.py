"""Buffers of Python object references are refused both ways, whoever exports them.

A ctypes ``py_object`` array has the buffer protocol (format ``'<O'``) and no numpy dtype:
its bytes are pointers into this process. Stored, they mean nothing to another process; read
into, they overwrite references and the interpreter crashes at their next use.
"""

from __future__ import annotations

import array
import ctypes
import uuid

import pytest

from kvpool import Client
from kvpool.client.buffers import readable_address, writable_address
from kvpool.errors import InvalidArgument


def py_objects() -> ctypes.Array:
    return (ctypes.py_object * 2)(1, 2)


@pytest.mark.parametrize("wrap", [lambda b: b, memoryview], ids=["ctypes", "memoryview"])
@pytest.mark.parametrize("address_of", [readable_address, writable_address])
def test_a_ctypes_array_of_py_objects_is_refused(wrap, address_of):
    with pytest.raises(InvalidArgument, match="Python object references"):
        address_of(wrap(py_objects()))


@pytest.mark.parametrize(
    "buffer",
    [
        (ctypes.c_int * 4)(),
        array.array("d", [1.0, 2.0]),
        memoryview(bytearray(8)),
    ],
    ids=["ctypes-int", "array", "memoryview"],
)
def test_buffers_of_data_are_taken(buffer):
    assert writable_address(buffer)[1] == memoryview(buffer).nbytes


def test_a_struct_field_whose_name_has_an_o_is_data():
    np = pytest.importorskip("numpy")
    records = np.zeros(2, dtype=[("Offset", "<i4"), ("Other", "<f8")])
    assert "O" in memoryview(records).format  # (in the field names alone)
    assert writable_address(records)[1] == records.nbytes
    assert writable_address(memoryview(records))[1] == records.nbytes


def test_a_struct_with_an_object_field_is_refused():
    np = pytest.importorskip("numpy")
    records = np.zeros(2, dtype=[("n", "<i8"), ("o", "O")])
    with pytest.raises(InvalidArgument, match="Python object references"):
        readable_address(memoryview(records))


def test_put_and_get_into_refuse_a_py_object_array_and_leave_it_whole(shared_cluster):
    key = f"py-objects-{uuid.uuid4().hex}"
    with Client(shared_cluster.master_address) as client:
        with pytest.raises(InvalidArgument, match="Python object references"):
            client.put(key, py_objects())
        client.put(key, bytes(16))
        target = py_objects()
        with pytest.raises(InvalidArgument, match="Python object references"):
            client.get_into(key, target)
    assert (target[0], target[1]) == (1, 2)  # (no reference was overwritten)
