"""No peer fills the master's metadata lane against the others (master/lane_server.py): a
real LaneServer on loopback that checks tokens, with the real handlers behind it, plain
sockets (or TLS ones) for peers, and the lane's real client.

- A connection counts from its accept (its TLS handshake included). Before it has proven who
  it is, it may be evicted: past the cap on such connections from one address, a new one from
  there takes the place of that address's oldest; at the connection cap, a new one takes the
  place of the oldest of all. Only where every connection has proven who it is is a new one
  closed as it comes.
- Proven, an identity holds at most its cap of connections, and clients together leave the
  node reserve to nodes: one past either is answered RESOURCE_EXHAUSTED at its AUTH, naming
  the limit, and closed. So a tenant that holds all it may does not keep another tenant out.
- An insecure master, where every caller is the same, caps no identity.
- The lane's client takes a connection ended before it was established (at a cap: closed in
  the TLS handshake, or refused at its AUTH) for an unreachable lane: its caller then makes
  the call over gRPC.
- The caps come from the constructor, else the master's environment, else the defaults.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import closed_within, wait_until
from prometheus_client import REGISTRY
from test_lane_hardening import (
    Credentials,
    RunningLane,
    authenticated,
    closed_for,
    connect,
    exists,
    has_node_stream,
    node_hello,
    read_frames,
)

from kvpool.client.lane_client import LaneClient
from kvpool.common import lane_protocol as lp
from kvpool.common.status import KeyStatus
from kvpool.master import lane_server
from kvpool.master.authenticator import Authenticator
from kvpool.master.lane_server import LaneServer, _address_of
from kvpool.proto import master_pb2 as pb
from kvpool.security.caller import CallerCredentials
from kvpool.security.dev_pki import DevPki, make_dev_pki
from kvpool.security.identity import Role
from kvpool.security.tls import TlsFiles
from kvpool.security.tokens import CredentialStore, new_token


@dataclasses.dataclass(frozen=True)
class Tenants(Credentials):
    """Beside the client of tenant "default" and node n1: a client of tenant "other"."""

    other: str


@pytest.fixture
def credentials(tmp_path) -> Tenants:
    store = CredentialStore.create(tmp_path / "credentials.json")
    tokens = {}
    for name, role, scope in (
        ("t", Role.CLIENT, {"tenant": "default"}),
        ("n1", Role.NODE, {"node_id": "n1"}),
        ("o", Role.CLIENT, {"tenant": "other"}),
    ):
        tokens[name], record = new_token(name, role, **scope)
        store.add(record)
    return Tenants(store, tokens["t"], tokens["n1"], tokens["o"])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def lanes(credentials: Tenants, pki: DevPki) -> Iterator[Callable[..., RunningLane]]:
    """Starts lanes with the given caps; ``tls=True`` serves TLS with the test CA's server
    certificate, as a secure master does."""
    started: list[RunningLane] = []

    def start(tls: bool = False, **options: Any) -> RunningLane:
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pki.server_cert, pki.server_key)
            options["tls"] = context
        started.append(RunningLane(credentials, **options))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def tls_credentials(token: str, pki: DevPki) -> CallerCredentials:
    return CallerCredentials(token, TlsFiles(ca=pki.ca))


def ask(client: LaneClient, timeout: float = 5.0) -> list[int]:
    request = pb.ExistsRequest(client_id="c", keys=["k"], no_lease=True)
    return list(client.call("Exists", request, pb.ExistsResponse, timeout).statuses)


def refused_at_auth(port: int, token: str) -> lp.Frame:
    """The master's answer to an AUTH frame it refuses; the connection is then closed."""
    sock = connect(port)
    sock.sendall(lp.encode(7, lp.AUTH, token.encode()))
    [answer] = read_frames(sock, 1)
    assert closed_within(sock, 5), "closed after its refusal"
    sock.close()
    return answer


def counted(lane: LaneServer) -> tuple[int, int, int]:
    """(connections open or handshaking, of them unproven, proven clients)."""
    return (
        len(lane._connections) + len(lane._handshaking),
        len(lane._unproven),
        lane._proven_clients,
    )


# ---- proven connections: per identity, and the node reserve


def test_an_identity_past_its_cap_is_refused_resource_exhausted_naming_the_limit(lanes):
    running = lanes(max_per_identity=2)
    before = closed_for("identity_cap")
    held = [running.client() for _ in range(2)]

    answer = refused_at_auth(running.port, running.credentials.client)
    assert answer.status == lp.RESOURCE_EXHAUSTED
    details, _ = answer.error()
    assert "client 't' of tenant 'default' holds 2 metadata lane connections" in details
    assert "the most one identity may (2)" in details
    assert closed_for("identity_cap") == before + 1

    assert exists(held[0]).status == lp.OK, "those it holds serve on"
    other = authenticated(running.port, running.credentials.other)
    assert exists(other).status == lp.OK, "another identity is let in"
    other.close()
    held.pop().close()
    assert wait_until(lambda: running.inspect(counted)[2] == 1, 5)
    assert exists(running.client()).status == lp.OK, "a place given back is taken again"


def test_a_tenant_holding_every_connection_it_may_cannot_keep_another_tenant_out(
    lanes, credentials
):
    """Tenant "default" tries for every connection of the lane: it gets its cap, and tenant
    "other" calls as ever (before, it took them all, and the other's calls failed)."""
    running = lanes(max_connections=6, max_per_identity=3, node_reserve=0)
    held, refused = [], 0
    for _ in range(6):
        sock = connect(running.port)
        sock.sendall(lp.encode(7, lp.AUTH, credentials.client.encode()))
        [answer] = read_frames(sock, 1)
        if answer.status == lp.OK:
            held.append(sock)
        else:
            assert answer.status == lp.RESOURCE_EXHAUSTED
            refused += 1
            sock.close()
    assert (len(held), refused) == (3, 3)

    other = LaneClient("127.0.0.1", running.port, CallerCredentials(token=credentials.other))
    started = time.monotonic()
    assert ask(other) == [KeyStatus.NOT_FOUND]
    assert time.monotonic() - started < 1.0
    other.close()
    for sock in held:
        sock.close()


def test_nothing_sent_after_an_auth_refused_at_a_cap_is_read(lanes):
    """(A node sends its AUTH and its hello together: refused at its AUTH, it is told why
    once, and its hello is not taken for a frame without credentials.)"""
    running = lanes(max_per_identity=1)
    held = running.node()
    missing = REGISTRY.get_sample_value("kvpool_master_auth_refused_total", {"reason": "missing"})
    sock = connect(running.port)
    sock.sendall(lp.encode(7, lp.AUTH, running.credentials.node.encode()) + node_hello())
    [answer] = read_frames(sock, 1)
    assert answer.status == lp.RESOURCE_EXHAUSTED
    assert closed_within(sock, 5), "nothing more, and closed"
    after = REGISTRY.get_sample_value("kvpool_master_auth_refused_total", {"reason": "missing"})
    assert after == missing
    sock.close()
    held.close()


def test_clients_together_leave_the_node_reserve_to_nodes(lanes, credentials):
    running = lanes(max_connections=4, max_per_identity=2, node_reserve=1)
    before = closed_for("client_cap")
    held = [running.client(), running.client(), authenticated(running.port, credentials.other)]

    answer = refused_at_auth(running.port, credentials.other)
    assert answer.status == lp.RESOURCE_EXHAUSTED
    assert "(4 less 1 kept for nodes)" in answer.error()[0]
    assert closed_for("client_cap") == before + 1

    node = running.node()  # (the place kept for it)
    node.sendall(node_hello())
    assert wait_until(lambda: running.inspect(has_node_stream), 5), "its command stream"
    assert running.inspect(counted) == (4, 0, 3)
    for sock in [*held, node]:
        sock.close()


# ---- unproven connections: per address, and at the cap


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_unproven_connections_past_an_address_cap_make_room_oldest_first(lanes, pki, tls):
    """Silent connections from one address (in their TLS handshake, or before their AUTH):
    past the cap the oldest go at once, not after the read timeout; a client from the same
    address still gets in, and is answered."""
    running = lanes(tls=tls, max_unauthenticated_per_address=3, read_timeout=30.0)
    before = closed_for("address_cap")
    silent = [connect(running.port) for _ in range(5)]
    assert all(closed_within(sock, 2) for sock in silent[:2]), "the oldest made room"
    assert not any(closed_within(sock, 0.2) for sock in silent[2:]), "the newest kept"
    assert closed_for("address_cap") == before + 2
    assert running.inspect(counted)[:2] == (3, 3)

    token = running.credentials.client
    credentials = tls_credentials(token, pki) if tls else CallerCredentials(token=token)
    client = LaneClient("127.0.0.1", running.port, credentials)
    assert ask(client) == [KeyStatus.NOT_FOUND], "a client from there gets in"
    assert closed_within(silent[2], 2), "in the place of the oldest left"
    assert running.inspect(counted) == (3, 2, 1)
    client.close()
    for sock in silent:
        sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_at_the_cap_a_new_connection_takes_the_place_of_the_oldest_unproven(
    lanes, pki, tls, monkeypatch
):
    """Connections that proved who they are are never evicted: once all have, a new one is
    closed as it comes (and the lane's client takes that for an unreachable lane)."""
    monkeypatch.setattr(lane_server, "EVICT_AFTER", 0.0)  # (see the test below)
    running = lanes(tls=tls, max_connections=4, node_reserve=0, read_timeout=30.0)
    before = closed_for("evicted"), closed_for("over_cap")
    token = running.credentials.client
    credentials = tls_credentials(token, pki) if tls else CallerCredentials(token=token)
    silent = [connect(running.port) for _ in range(4)]
    assert wait_until(lambda: running.inspect(counted)[:2] == (4, 4), 5)

    clients = [LaneClient("127.0.0.1", running.port, credentials) for _ in range(4)]
    for client in clients:
        assert ask(client) == [KeyStatus.NOT_FOUND]
    assert all(closed_within(sock, 2) for sock in silent), "each made room for a client"
    assert closed_for("evicted") == before[0] + 4
    assert running.inspect(counted) == (4, 0, 4)

    late = LaneClient("127.0.0.1", running.port, credentials)
    with pytest.raises(lp.LaneUnreachable, match="ended the connection before it was est"):
        ask(late)
    assert closed_for("over_cap") == before[1] + 1
    assert [ask(client) for client in clients] == [[KeyStatus.NOT_FOUND]] * 4, "none evicted"
    for client in [*clients, late]:
        client.close()
    for sock in silent:
        sock.close()


def test_at_the_cap_a_handshake_younger_than_evict_after_is_not_evicted(lanes, pki, monkeypatch):
    """Found by review: at the cap, a flood of new connections from other addresses evicted
    a node's or client's handshake under way. A connection that came less than EVICT_AFTER
    ago keeps its place; the new one is closed as it comes."""
    monkeypatch.setattr(lane_server, "EVICT_AFTER", 30.0)
    running = lanes(max_connections=2, node_reserve=0, read_timeout=30.0)
    before = closed_for("evicted"), closed_for("over_cap")
    young = [connect(running.port) for _ in range(2)]  # (unproven, just now)
    assert wait_until(lambda: running.inspect(counted)[:2] == (2, 2), 5)
    flood = connect(running.port)
    assert closed_within(flood, 2), "the new one is closed as it comes"
    assert not any(closed_within(sock, 0.2) for sock in young), "neither handshake evicted"
    assert closed_for("evicted") == before[0]
    assert closed_for("over_cap") == before[1] + 1
    for sock in [*young, flood]:
        sock.close()


def test_a_connection_refused_at_its_identity_s_cap_is_unreachable_for_the_lane_client(lanes):
    running = lanes(max_per_identity=1)
    token = running.credentials.client
    first = LaneClient("127.0.0.1", running.port, CallerCredentials(token=token))
    assert ask(first) == [KeyStatus.NOT_FOUND]  # (its connection stays open, idle)
    second = LaneClient("127.0.0.1", running.port, CallerCredentials(token=token))
    with pytest.raises(lp.LaneUnreachable, match=r"refused a connection: .*identity may \(1\)"):
        ask(second)
    first.close()
    second.close()


# ---- an insecure master


def test_an_insecure_master_caps_no_identity(credentials):
    """(Every caller of an insecure master is the same identity: a cap on it would be a cap
    on every client together.)"""

    class Insecure(RunningLane):
        async def _start(self, options: dict[str, Any]) -> LaneServer:
            lane = await super()._start(options)
            lane.auth = Authenticator(None, insecure=True)
            return lane

    running = Insecure(credentials, max_per_identity=1)
    try:
        held = [connect(running.port) for _ in range(3)]
        for sock in held:
            assert exists(sock).status == lp.OK
        assert running.inspect(counted) == (3, 0, 0)
        for sock in held:
            sock.close()
    finally:
        running.stop()


# ---- configuration


def test_the_caps_come_from_the_environment_where_not_given(monkeypatch):
    auth = Authenticator(None, insecure=True)

    def lane(**options: Any) -> LaneServer:
        return LaneServer(None, None, None, auth, **options)  # type: ignore[arg-type]

    defaults = lane()
    assert (defaults.max_connections, defaults.max_per_identity) == (4096, 1024)
    assert (defaults.max_unauthenticated_per_address, defaults.node_reserve) == (256, 256)

    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_CONNECTIONS", "32")
    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_PER_IDENTITY", "5")
    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_UNAUTHENTICATED_PER_ADDRESS", "6")
    configured = lane()
    assert (configured.max_connections, configured.max_per_identity) == (32, 5)
    assert (configured.max_unauthenticated_per_address, configured.node_reserve) == (6, 2)
    assert lane(max_per_identity=9).max_per_identity == 9, "an argument comes first"

    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_CONNECTIONS", "5000")
    with pytest.raises(ValueError, match="MAX_CONNECTIONS must be a whole number from 1 to 4096"):
        lane()
    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_CONNECTIONS", "8")
    monkeypatch.setenv("KVPOOL_MASTER_LANE_MAX_PER_IDENTITY", "lots")
    with pytest.raises(ValueError, match="MAX_PER_IDENTITY must be a whole number of at least"):
        lane()


def test_an_address_is_an_ipv4_address_or_an_ipv6_one_s_64():
    assert _address_of(("10.1.2.3", 5000)) == "10.1.2.3"
    assert _address_of(("2001:db8:1:2:aaaa::1", 5000, 0, 0)) == "2001:db8:1:2::/64"
    assert _address_of(("2001:db8:1:2:bbbb::9", 5000, 0, 0)) == "2001:db8:1:2::/64"
    assert _address_of(("::ffff:10.1.2.3", 5000, 0, 0)) == "10.1.2.3"
    assert _address_of(None) == "?"


def test_the_defaults_leave_room_for_a_busy_client_process():
    """A client process pools up to POOL_SIZE idle connections and makes at most
    MAX_CONNECTING at once: an identity's cap holds a fleet of such processes, and the cap
    on unproven ones per address the bursts of many processes on one host. (A tenant past
    its share is slowed to gRPC, not failed: test_lane_connection_limits.py.)"""
    from kvpool.client import lane_client

    assert lane_server.MAX_PER_IDENTITY >= 32 * lane_client.POOL_SIZE
    assert lane_server.MAX_UNAUTHENTICATED_PER_ADDRESS >= 16 * lane_client.MAX_CONNECTING
    clients = lane_server.MAX_CONNECTIONS - lane_server.NODE_RESERVE
    assert clients // lane_server.MAX_PER_IDENTITY >= 3, "several identities to fill the lane"
