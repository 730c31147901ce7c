"""The storage node's credentials flags: what it presents to the master, and the rule that a
node with none refuses to start unless told ``--insecure`` (its segments would be mounted by
whoever claims its node id, and it would obey any process that answers as the master)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvpool.common.loopback import is_loopback
from kvpool.common.master_address import MasterTarget

if TYPE_CHECKING:
    from kvpool.security.caller import CallerCredentials


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument(
        "--token",
        default=None,
        help="this node's token (`kvpool token create --role node --node-id ID`), or @FILE "
        "holding it (default: $KVPOOL_TOKEN, or the file $KVPOOL_TOKEN_FILE)",
    )
    group.add_argument(
        "--tls-ca", default=None, help="CA of the master's certificate (default: $KVPOOL_TLS_CA)"
    )
    group.add_argument("--tls-cert", default=None, help="client certificate ($KVPOOL_TLS_CERT)")
    group.add_argument("--tls-key", default=None, help="its private key ($KVPOOL_TLS_KEY)")
    group.add_argument(
        "--insecure",
        action="store_true",
        help="present no credentials (a master started --insecure): for a trusted network only",
    )


def credentials_from_args(args: argparse.Namespace, master: MasterTarget) -> CallerCredentials:
    """The node's credentials; ValueError with what to do when there are none, or when a
    token would cross the network in plaintext."""
    from kvpool.security.caller import ANONYMOUS, CallerCredentials  # (loads gRPC: not at parse)

    if args.insecure:
        return ANONYMOUS
    credentials = CallerCredentials.resolve(args.token, args.tls_ca, args.tls_cert, args.tls_key)
    if credentials.token is None and (credentials.tls is None or credentials.tls.cert is None):
        raise ValueError(
            "this node has no credentials for the master: create a node token with `kvpool "
            "token create --role node --node-id ID --name ID` and give it (--token, "
            "KVPOOL_TOKEN or KVPOOL_TOKEN_FILE) with --node-id ID, or pass --insecure for a "
            "master started --insecure"
        )
    remote = [m for m in (*master.masters, *master.etcd) if not is_loopback(m.rpartition(":")[0])]
    if remote and credentials.tls is None:
        raise ValueError(
            f"the master ({', '.join(remote)}) is beyond loopback and no CA is given: the "
            "token would cross the network readable. Give --tls-ca (KVPOOL_TLS_CA), or "
            "pass --insecure"
        )
    return credentials
