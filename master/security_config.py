"""The master's credentials and TLS flags, and the rule that makes them the default: a master
that listens beyond loopback without credentials and TLS refuses to start unless told
``--insecure`` (Redis's protected mode is the model)."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from kvpool.common.loopback import is_loopback
from kvpool.master.authenticator import Authenticator
from kvpool.security.identity import name_problem
from kvpool.security.mapping_grants import EVERY_CLIENT, SameHostPolicy
from kvpool.security.tls import ServerContexts, TlsFiles, grpc_server_credentials
from kvpool.security.tokens import CredentialError, CredentialStore


class InsecureRefused(ValueError):
    """The flags would serve an unauthenticated or plaintext master beyond loopback."""


@dataclass
class MasterSecurity:
    auth: Authenticator
    #: None: plaintext gRPC and lane (loopback, or --insecure).
    grpc_credentials: grpc.ServerCredentials | None
    lane_tls: ssl.SSLContext | None
    #: TLS material for etcd (https:// endpoints), else None.
    etcd_tls: TlsFiles | None

    @property
    def secure(self) -> bool:
        return not self.auth.insecure


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument(
        "--credentials",
        type=Path,
        default=None,
        help="file of token hashes (`kvpool token create --credentials FILE ...`); re-read "
        "when it changes. Every call must then carry a token or a client certificate",
    )
    group.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    group.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="CA that client certificates are checked against (mutual TLS)",
    )
    group.add_argument(
        "--require-client-cert",
        action="store_true",
        help="refuse connections that present no client certificate signed by --tls-client-ca",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="no credentials, no TLS: anyone who reaches the ports may do anything. Only for "
        "a network you trust entirely",
    )
    group.add_argument(
        "--same-host-clients",
        type=_same_host_policy,
        default=SameHostPolicy(),
        metavar="NAMES",
        help="client identities (token or certificate names, comma-separated; '*': every "
        "client) allowed to map storage nodes' memory on their host: only the DRAM of nodes "
        "given --tenant, and only of their own tenant, handed over by the node under a grant "
        "from this master. Default: none (those clients use the checked stream). An "
        "--insecure master lets every client map",
    )
    group.add_argument("--etcd-ca", type=Path, default=None, help="CA of etcd's certificate")
    group.add_argument("--etcd-cert", type=Path, default=None, help="client certificate for etcd")
    group.add_argument("--etcd-key", type=Path, default=None, help="its private key")


def _same_host_policy(value: str) -> SameHostPolicy:
    policy = SameHostPolicy.parse(value)
    for name in policy.names:
        if name != EVERY_CLIENT and (problem := name_problem(name)) is not None:
            raise argparse.ArgumentTypeError(problem)
    return policy


def security_from_args(args: argparse.Namespace) -> MasterSecurity:
    """What the flags configure; InsecureRefused (or TlsConfigError, CredentialError: all
    ValueErrors) with what to do when they do not fit together."""
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise InsecureRefused("--tls-cert and --tls-key go together: give both")
        tls = TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_client_ca)
        tls.check()
    elif args.tls_client_ca or args.require_client_cert:
        raise InsecureRefused("--tls-client-ca needs the server's --tls-cert and --tls-key")
    if args.require_client_cert and not args.tls_client_ca:
        raise InsecureRefused("--require-client-cert needs --tls-client-ca to check them with")
    etcd_tls = _etcd_tls(args)
    if args.insecure:
        if args.credentials or tls:
            raise InsecureRefused(
                "--insecure turns credentials and TLS off: drop it, or drop --credentials and "
                "--tls-cert/--tls-key"
            )
        return MasterSecurity(Authenticator(None, insecure=True), None, None, etcd_tls)
    exposed = not is_loopback(args.host)
    if args.credentials is None:
        raise InsecureRefused(
            f"this master would serve {args.host} with no credentials. Create some with "
            "`kvpool token create --credentials creds.json --name admin --role admin` and "
            "pass --credentials creds.json (with --tls-cert/--tls-key beyond loopback), or "
            "pass --insecure to serve anyone who reaches the port"
        )
    if exposed and tls is None:
        raise InsecureRefused(
            f"this master would serve {args.host} in plaintext: tokens would cross the network "
            "readable. Give --tls-cert and --tls-key (or --host 127.0.0.1), or pass --insecure"
        )
    try:
        store = CredentialStore(args.credentials)
    except CredentialError as error:
        raise InsecureRefused(f"--credentials {args.credentials}: {error}") from None
    if tls is None:
        return MasterSecurity(Authenticator(store), None, None, etcd_tls)
    contexts = ServerContexts(tls, require_client_cert=args.require_client_cert)
    return MasterSecurity(
        Authenticator(store),
        grpc_server_credentials(tls, require_client_cert=args.require_client_cert),
        contexts.listening_context(),
        etcd_tls,
    )


def _etcd_tls(args: argparse.Namespace) -> TlsFiles | None:
    named = (args.etcd_ca, args.etcd_cert, args.etcd_key)
    if not any(named):
        return None
    if bool(args.etcd_cert) != bool(args.etcd_key):
        raise InsecureRefused("--etcd-cert and --etcd-key go together: give both")
    files = TlsFiles(cert=args.etcd_cert, key=args.etcd_key, ca=args.etcd_ca)
    files.check()
    return files
