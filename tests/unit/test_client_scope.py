"""The master keeps a client id qualified by the identity that used it (master/access.py):
no identity reaches another's clients (their reservations, leases, heartbeats), whatever
characters their names and the ids they send hold."""

from __future__ import annotations

import itertools

from kvpool.master.access import client_scope
from kvpool.security.identity import INSECURE, Identity, Role


def client(name: str, tenant: str = "t") -> Identity:
    return Identity(name=name, role=Role.CLIENT, tenant=tenant)


def test_no_two_identities_sending_any_ids_share_a_kept_id():
    """(With the name and the id joined by ":", "svc" sending "prod:abc" was "svc:prod"
    sending "abc", and a client's raw id is in the story of every key it put.)"""
    identities = [client("svc"), client("svc:prod"), client("svc", "u"), client("s")]
    ids = ["abc", "prod:abc", "vc:prod:abc", ":abc"]
    kept = {}
    for identity, client_id in itertools.product(identities, ids):
        scoped = client_scope(identity, client_id)
        assert kept.setdefault(scoped, (identity, client_id)) == (identity, client_id), scoped


def test_an_insecure_cluster_keeps_ids_as_sent():
    assert client_scope(INSECURE, "abc") == "abc"
