"""Who maps a node's memory on its host: only identities the master names, only segments of
their own tenant, read-only for reads, and only a file the node itself hands over under the
master's grant (security/mapping_grants.py, storage_node/mapping_server.py)."""

from __future__ import annotations

import dataclasses
import mmap
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from kvpool import Client
from kvpool.client.data_path import segment_file
from kvpool.errors import NoSpace
from kvpool.proto import master_pb2 as pb
from kvpool.security import mapping_grants
from kvpool.security.identity import Role
from kvpool.security.tokens import new_token
from kvpool.transport.shared_memory import MAPPINGS, MappingRefused

ALLOWED, OTHER = (
    new_token("mapper", Role.CLIENT, tenant="a"),
    new_token("plain", Role.CLIENT, tenant="a"),
)
STRANGER = new_token("stranger", Role.CLIENT, tenant="b")


def _client(cluster, token: str) -> Client:
    return Client(cluster.master_address, token=token, tls_ca=str(cluster.pki.ca))


def _one_tenant_cluster(cluster_factory, **kwargs):
    """One node holding tenant a's objects alone; the master lets "mapper" map."""
    return cluster_factory(
        1,
        "64MiB",
        same_host=False,
        tokens=(ALLOWED[1], OTHER[1], STRANGER[1]),
        master_args=["--same-host-clients", "mapper"],
        node_args=["--tenant", "a"],
        **kwargs,
    )


def _descriptor(client: Client):
    """The descriptor (pb.Segment) of the one segment this client has learnt of."""
    (descriptor,) = client._session.data._descriptors.values()
    return descriptor


def _put_mapped(cluster, key: str, data: bytes):
    """Puts ``key`` as the mapping client: the segment's descriptor, and where the object is."""
    with _client(cluster, ALLOWED[0]) as mapper:
        mapper.put(key, data)
        (address,) = [r.address for r in mapper.stat(key).replicas]
        return _descriptor(mapper), address


def _ask(descriptor, request: bytes) -> tuple[bytes, list[int]]:
    """Sends ``request`` to the node's mapping socket; its answer and any descriptors."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.settimeout(5)
        connection.connect("\0" + descriptor.shared_memory.socket)
        connection.send(request)
        message, fds, _, _ = socket.recv_fds(connection, 1024, 4)
    return message, fds


def test_only_identities_the_master_names_map_and_the_others_move_the_same_bytes(
    cluster_factory,
):
    cluster = _one_tenant_cluster(cluster_factory)
    data = os.urandom(3 << 20)
    with _client(cluster, ALLOWED[0]) as mapper, _client(cluster, OTHER[0]) as plain:
        mapper.put("by-mapper", data)
        plain.put("by-plain", data[::-1])
        assert plain.get("by-mapper") == data and mapper.get("by-plain") == data[::-1]
        assert mapper.mapped_segments != []
        assert plain.mapped_segments == [], "not named in --same-host-clients: checked stream"
        assert not _descriptor(plain).HasField("shared_memory"), "told nothing to map with"
        assert _descriptor(mapper).map_capability


def test_a_segment_shared_by_tenants_is_never_mapped_and_a_tenant_s_node_holds_its_own_only(
    cluster_factory,
):
    cluster = cluster_factory(
        1,
        "64MiB",
        same_host=False,
        tokens=(ALLOWED[1], STRANGER[1]),
        master_args=["--same-host-clients", "*"],
    )
    with _client(cluster, ALLOWED[0]) as a, _client(cluster, STRANGER[0]) as b:
        a.put("k", b"x" * 100_000)
        assert a.get("k") == b"x" * 100_000
        assert a.mapped_segments == [], "the node holds any tenant's objects: not mapped"
        cluster.add_node(extra=["--tenant", "a", "--node-id", "node-a"])
        for n in range(40):  # (placement is random: some land on tenant a's node)
            a.put(f"a-{n}", b"a" * 50_000)
            b.put(f"b-{n}", b"b" * 50_000)
        holders = {node for n in range(40) for node in _nodes_of(b, f"b-{n}")}
        assert "node-a" not in holders, "tenant b's objects never go to tenant a's node"
        assert any("node-a" in _nodes_of(a, f"a-{n}") for n in range(40))
        assert a.get("a-0") == b"a" * 50_000
        assert [s for s in a.mapped_segments if s.startswith("node-a/")], "its own node: mapped"
        assert b.mapped_segments == []


def _nodes_of(client: Client, key: str) -> set[str]:
    return {r.node_id for r in client.stat(key).replicas}


def test_tenant_b_gets_no_space_on_nodes_that_hold_tenant_a_s_objects_alone(cluster_factory):
    cluster = _one_tenant_cluster(cluster_factory)
    with _client(cluster, STRANGER[0]) as b, pytest.raises(NoSpace):
        b.put("nowhere", b"b" * 1000)


def test_reads_map_read_only_and_the_node_hands_a_read_only_file_for_them(cluster_factory):
    cluster = _one_tenant_cluster(cluster_factory)
    descriptor, address = _put_mapped(cluster, "k", b"k" * 4096)
    answer, fds = _ask(descriptor, mapping_grants.request(False, descriptor.map_capability))
    assert answer[:1] == bytes([mapping_grants.HANDED_OVER]) and len(fds) == 1
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fds[0], descriptor.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.write(fds[0], b"x")
        view = mmap.mmap(fds[0], descriptor.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        offset = address - descriptor.base_address
        assert view[offset : offset + 4096] == b"k" * 4096
        view.close()
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(
    "change",
    ["forged", "truncated", "unknown mode", "transfer capability", "other tenant's grant"],
)
def test_the_node_hands_nothing_over_without_a_valid_grant_and_stays_up(cluster_factory, change):
    cluster = _one_tenant_cluster(cluster_factory)
    with _client(cluster, ALLOWED[0]) as mapper:
        mapper.put("k", b"k" * 4096)
        descriptor = _descriptor(mapper)
        grant = descriptor.map_capability
        if change == "forged":
            request = mapping_grants.request(True, grant[:-1] + bytes([grant[-1] ^ 1]))
        elif change == "truncated":
            request = mapping_grants.request(True, grant)[:-5]
        elif change == "unknown mode":
            request = mapping_grants.REQUEST_MAGIC + b"x" + grant
        elif change == "transfer capability":  # (a write grant from PutStart, or a lease's)
            request = mapping_grants.request(True, _transfer_capability(mapper, "other"))
        else:
            request = mapping_grants.request(True, _grant_for_tenant(cluster, descriptor, "b"))
        answer, fds = _ask(descriptor, request)
        assert answer[:1] == bytes([mapping_grants.REFUSED]) and fds == []
        assert len(answer) > 1, "a refusal says why"
        assert mapper.get("k") == b"k" * 4096, "the node still serves"


def _transfer_capability(client: Client, key: str) -> bytes:
    client.put(key, b"t" * 4096)
    answer = client._session.link.call(
        "GetReplicas", _get_replicas_request([key]), time.monotonic() + 10
    )
    return answer.objects[0].replicas[0].capability


def _get_replicas_request(keys):
    from kvpool.proto import master_pb2 as pb

    return pb.GetReplicasRequest(keys=keys)


def _grant_for_tenant(cluster, descriptor, tenant: str) -> bytes:
    """A map grant signed with the cluster's real key (the segment's node's), for another
    tenant."""
    from kvpool.master.capability_keys import read_key_file
    from kvpool.security.capabilities import KeyRing, node_purpose

    keys = read_key_file(cluster.run_dir / "capability-keys.json")
    ring = KeyRing(keys.keys, current=keys.current).derived(node_purpose(descriptor.node_id))
    capability = mapping_grants.grant(
        ring,
        segment_id=descriptor.segment_id,
        size=descriptor.size,
        tenant=tenant,
        term=2**40,
        expiry_ms=2**50,
    )
    return capability


def test_a_renewed_grant_keeps_the_mapping_in_place(cluster_factory):
    """The master renews map grants every half minute: a client keeps its mappings."""
    cluster = _one_tenant_cluster(cluster_factory)
    with _client(cluster, ALLOWED[0]) as mapper:
        mapper.put("k", b"k" * 4096)
        assert mapper.get("k") == b"k" * 4096
        data_path = mapper._session.data
        mappings = dict(data_path._mapped)
        assert all(mappings.values()) and len(mappings) == 1  # (gets read through it)
        renewed = pb.Segment()
        renewed.CopyFrom(_descriptor(mapper))
        renewed.map_capability = bytes(len(renewed.map_capability))
        data_path.learn([renewed])
        assert data_path._mapped == mappings, "not unmapped"
        assert mapper.get("k") == b"k" * 4096


def test_a_client_maps_only_a_file_the_named_node_process_hands_over(cluster_factory):
    cluster = _one_tenant_cluster(cluster_factory)
    with _client(cluster, ALLOWED[0]) as mapper:
        mapper.put("k", b"k" * 4096)
        descriptor = _descriptor(mapper)
    # (a live process, not the node: as a false descriptor would say)
    false = dataclasses.replace(segment_file(descriptor), pid=os.getppid())
    with pytest.raises(MappingRefused, match="not the node process"):
        MAPPINGS.acquire(false, writable=False)


NOBODY = 65534

#: Runs as root until it has imported what it needs (the interpreter lives where other users
#: may not read), then as nobody: takes the segment's file from the node for a read grant.
CHILD = textwrap.dedent(
    """
    import mmap, os, socket, sys
    from kvpool.security import mapping_grants
    name, grant, node_pid, node_fd, size, offset, length = sys.argv[1:8]
    size, offset, length = int(size), int(offset), int(length)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    for path in (f"/proc/{node_pid}/fd/{node_fd}",):
        try:
            os.open(path, os.O_RDONLY)
        except PermissionError:
            pass
        else:
            raise SystemExit(f"opened {path} as another user")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.settimeout(5)
        connection.connect("\\0" + name)
        connection.send(mapping_grants.request(False, bytes.fromhex(grant)))
        message, fds, _, _ = socket.recv_fds(connection, 1024, 1)
    assert message[:1] == bytes([mapping_grants.HANDED_OVER]), message
    view = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    assert view[offset : offset + length] == b"u" * length, "bytes differ"
    try:
        mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
    except PermissionError:
        pass
    else:
        raise SystemExit("mapped a read-only handover writable")
    try:
        os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
    except PermissionError:
        pass
    else:
        raise SystemExit("reopened a read-only handover read-write")
    print("ok")
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_client_under_another_user_maps_read_only_through_the_handover_only(cluster_factory):
    cluster = _one_tenant_cluster(cluster_factory)
    descriptor, address = _put_mapped(cluster, "u", b"u" * 100_000)
    shared = descriptor.shared_memory
    argv = [
        shared.socket,
        descriptor.map_capability.hex(),
        str(shared.pid),
        str(shared.fd),
        str(descriptor.size),
        str(address - descriptor.base_address),
        "100000",
    ]
    result = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
