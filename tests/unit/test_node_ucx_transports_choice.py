"""Which UCX transports a storage node offers (storage_node/main.py ``_ucx_config``): shared
memory only while the checked stream carries what comes from other hosts; UCX's own choice
where an operator asked for UCX over TCP or where there is no stream. An operator's UCX_TLS
naming local transports only is kept; one that would open UCX to other hosts without
``--ucx-tcp`` stops the node (a tuning variable, in a chart's example say, once opened the
unchecked path quietly)."""

from __future__ import annotations

import pytest

from kvpool.cli.main import build_parser
from kvpool.storage_node.main import LOCAL_UCX_TRANSPORTS, CannotStart, _ucx_config


def node_args(*flags: str):
    return build_parser().parse_args(["node", "--master", "127.0.0.1:50051", *flags])


@pytest.fixture(autouse=True)
def no_ucx_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UCX_TLS", raising=False)


def test_a_node_serving_the_checked_stream_offers_shared_memory_only():
    assert _ucx_config(node_args()) == {"TLS": LOCAL_UCX_TRANSPORTS}
    assert _ucx_config(node_args("--data-port", "9092")) == {"TLS": LOCAL_UCX_TRANSPORTS}


@pytest.mark.parametrize("flags", [("--ucx-tcp",), ("--data-port", "-1"), ("--insecure",)], ids=str)
def test_ucx_picks_its_transports_where_the_stream_does_not_carry_everything(flags):
    assert _ucx_config(node_args(*flags)) is None


@pytest.mark.parametrize(
    "named", ["sm,self", "cma,posix,self", "shm , self,cuda_copy", "sm,self,cuda", "sm,rocm"]
)
def test_an_operators_local_ucx_tls_is_kept(monkeypatch: pytest.MonkeyPatch, named: str):
    monkeypatch.setenv("UCX_TLS", named)
    assert _ucx_config(node_args()) == {"TLS": named}


@pytest.mark.parametrize(
    ("named", "said"),
    [("tcp,sm,self", "(tcp)"), ("sm,ud:aux", "(ud:aux)"), ("^cma", "(^cma)"), ("all", "(all)"),
     ("", "(UCX's defaults)")],
)  # fmt: skip
def test_an_ucx_tls_that_reaches_other_hosts_stops_a_node_without_ucx_tcp(
    monkeypatch: pytest.MonkeyPatch, named: str, said: str
):
    monkeypatch.setenv("UCX_TLS", named)
    with pytest.raises(CannotStart) as refused:
        _ucx_config(node_args())
    message = str(refused.value)
    assert said in message and "--ucx-tcp" in message and "unset UCX_TLS" in message, message


def test_an_ucx_tls_with_ucx_tcp_is_ucxs_to_follow(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("UCX_TLS", "tcp,sm,self")
    assert _ucx_config(node_args("--ucx-tcp")) is None
    assert _ucx_config(node_args("--data-port", "-1")) is None
