"""Who may call which of the master's methods: a table, asked before any handler runs.

Every method of the service is in ``ALLOWED`` (a test holds the table equal to the service's
methods, so a new method without a rule fails it). Beyond the role, the handlers bind what a
call names to its caller: a node's calls to its own node id, a client's keys to its tenant's
namespace (``scoped``), a client id to the identity that used it.
"""

from __future__ import annotations

import grpc

from kvpool.master import metrics
from kvpool.master.driver import CallRefused
from kvpool.security.identity import Identity, Role, internal_key

NODE = frozenset({Role.NODE})
CLIENT = frozenset({Role.CLIENT})
ADMIN = frozenset({Role.ADMIN})

#: The roles that may call each method (NodeSession: the nodes' command streams).
ALLOWED: dict[str, frozenset[Role]] = {
    "MountSegment": NODE,
    "UnmountSegment": NODE,
    "Heartbeat": NODE,
    "NodeSession": NODE,
    "PutStart": CLIENT,
    "PutEnd": CLIENT,
    "PutRevoke": CLIENT,
    "GetReplicas": CLIENT,
    "Exists": CLIENT,
    "ReleaseLeases": CLIENT,
    "Remove": CLIENT | ADMIN,
    "RemovePrefix": CLIENT | ADMIN,
    "Stat": CLIENT | ADMIN,
    "ClientHeartbeat": CLIENT,
    "ListKeys": CLIENT | ADMIN,
    "ClusterStatus": CLIENT | ADMIN,  # (a client's answer: totals, no topology)
    "Lane": CLIENT | NODE | ADMIN,
    "Story": CLIENT | ADMIN,
    "Drain": ADMIN,
}

_WHO = {
    NODE: "a storage node's",
    CLIENT: "a client's",
    ADMIN: "an admin's",
    CLIENT | ADMIN: "a client's or an admin's",
}


def authorize(identity: Identity, method: str) -> None:
    """Refuses (PERMISSION_DENIED) a call its caller's role may not make."""
    if identity.insecure:
        return
    allowed = ALLOWED.get(method)
    if allowed is None or identity.role not in allowed:
        who = _WHO.get(allowed, "another role's") if allowed is not None else "no one's"
        metrics.labelled(metrics.AUTH_REFUSED, "role").inc()
        raise CallRefused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} is {who} call; {identity.describe()} may not make it: "
            "use credentials of that role",
        )


def key_prefix(identity: Identity) -> str:
    """What the caller's keys start with in the master's key space: its tenant and the
    separator, or "" for an admin (who names keys as the master holds them)."""
    return internal_key(identity.tenant, "") if identity.tenant else ""


def own_node(identity: Identity, node_id: str, what: str) -> None:
    """Refuses (PERMISSION_DENIED) a node's call about another node's id."""
    if identity.insecure or identity.node_id == node_id:
        return
    metrics.labelled(metrics.AUTH_REFUSED, "other_node").inc()
    raise CallRefused(
        grpc.StatusCode.PERMISSION_DENIED,
        f"{identity.describe()} may not {what} for node {node_id!r}: a node's credentials "
        "name the one node id it may act as (start it with --node-id "
        f"{identity.node_id!r}, or give it that node's credentials)",
    )


def own_segment(identity: Identity, segment_id: str) -> None:
    """Refuses (PERMISSION_DENIED) a node's mount of a segment id that is not its own:
    ``<its node id>/<name>``, as nodes name their segments (``name`` without a "/", so that
    node "a" cannot take node "a/b"'s). Why: while a segment is away (its node declared
    dead) the master keeps, by segment id, what the segment's next mount must refuse
    (objects removed meanwhile, Forgets unanswered); a mount under the id by another node
    would end that, and the segment's own node would bring the removed objects back."""
    if identity.insecure:
        return
    owner, _, name = segment_id.rpartition("/")
    if owner == identity.node_id and name:
        return
    metrics.labelled(metrics.AUTH_REFUSED, "other_node").inc()
    raise CallRefused(
        grpc.StatusCode.PERMISSION_DENIED,
        f"{identity.describe()} may not mount segment {segment_id!r}: a node mounts only "
        f"segment ids of its node id, '/' and a name without '/' "
        f"({identity.node_id + '/NAME'!r}), as kvpool's nodes make them (a persistent "
        "segment made under another node id is mounted by a node started with that "
        "--node-id and its credentials)",
    )


#: The longest client id the master takes (``kvpool.Client`` makes 32 hex digits). The master
#: keeps a writer's id with each of its reservations, and in the story of each key it puts.
MAX_CLIENT_ID = 128


def client_scope(identity: Identity, client_id: str) -> str:
    """The client id as the master keeps it: qualified by the identity that used it, so no
    caller can heartbeat, or give back the leases of, another identity's clients."""
    if len(client_id) > MAX_CLIENT_ID:
        raise CallRefused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a client id holds at most {MAX_CLIENT_ID} characters, got {len(client_id)}: "
            "leave client_id to kvpool's Client, which makes one",
        )
    if identity.insecure or not client_id:
        return client_id
    # (the name's length first: a name may hold ":", and "svc" sending "prod:abc" must not
    # be "svc:prod" sending "abc")
    name = identity.name
    return f"{identity.tenant}/{len(name)}.{name}:{client_id}"
