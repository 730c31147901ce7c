"""Which UCX transports a storage node offers (storage_node/main.py ``_ucx_config``): shared
memory only while the checked stream carries what comes from other hosts; UCX's own choice
where an operator asked for UCX over TCP, where there is no stream, or where UCX_TLS says."""

from __future__ import annotations

import pytest

from kvpool.cli.main import build_parser
from kvpool.storage_node.main import LOCAL_UCX_TRANSPORTS, _ucx_config


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


def test_an_operators_ucx_tls_is_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("UCX_TLS", "tcp,sm,self")
    assert _ucx_config(node_args()) is None
