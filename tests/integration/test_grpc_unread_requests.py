"""A gRPC call's request must arrive whole soon after the call (master/grpc_request_guard.py).

gRPC buffers a request as it arrives; a caller with a token could open calls and never finish
sending their requests, each holding what was buffered and a slot of the master's in-flight
limit for as long as its connection lived: an audit held 1,024 such calls and every other
tenant's calls were refused as the master's being saturated. Now a call's request is read
within REQUEST_READ_TIMEOUT (else DEADLINE_EXCEEDED), and one tenant has at most
UNREAD_PER_TENANT calls whose request is still coming (RESOURCE_EXHAUSTED past it); another
tenant's calls go on being served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from helpers import bearer

from kvpool.local_cluster import LocalCluster
from kvpool.master.grpc_request_guard import REQUEST_READ_TIMEOUT, UNREAD_PER_TENANT
from kvpool.proto import master_pb2 as pb

EXISTS = "/kvpool.v1.Master/Exists"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        1, "64MiB", tenants=("a", "b"), run_dir=tmp_path_factory.mktemp("unread")
    ) as cluster:
        yield cluster


def channel(cluster: LocalCluster) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=cluster.pki.ca.read_bytes())
    return grpc.aio.secure_channel(cluster.master_address, credentials)


def token_of(cluster: LocalCluster, tenant: str) -> tuple[tuple[str, str], ...]:
    return bearer(cluster.tenant_tokens[tenant])


def exists(ch: grpc.aio.Channel, streaming: bool = False) -> Any:
    """Exists on ``ch``, called as gRPC's unary call, or as a client stream (``streaming``:
    its request sent as the caller's iterator yields it)."""
    make = ch.stream_unary if streaming else ch.unary_unary
    return make(
        EXISTS,
        request_serializer=pb.ExistsRequest.SerializeToString,
        response_deserializer=pb.ExistsResponse.FromString,
    )


async def never_sent() -> AsyncIterator[pb.ExistsRequest]:
    """A request that never comes (the call stays open, sending nothing)."""
    await asyncio.sleep(3600)
    yield pb.ExistsRequest()


def test_a_call_whose_request_never_arrives_ends_within_the_read_timeout(cluster):
    async def run() -> tuple[grpc.StatusCode, float]:
        async with channel(cluster) as ch:
            call = exists(ch, streaming=True)
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await call(
                    never_sent(), metadata=token_of(cluster, "a"), timeout=REQUEST_READ_TIMEOUT * 3
                )
            return ended.value.code(), time.monotonic() - started

    code, took = asyncio.run(run())
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert took < REQUEST_READ_TIMEOUT * 2, "ended by the master, not by the caller's deadline"


def test_one_tenant_s_unsent_requests_leave_other_tenants_served(cluster):
    async def run() -> tuple[grpc.StatusCode, pb.ExistsResponse]:
        async with channel(cluster) as ch:
            call = exists(ch, streaming=True)
            held = [
                asyncio.ensure_future(call(never_sent(), metadata=token_of(cluster, "a")))
                for _ in range(UNREAD_PER_TENANT)
            ]
            await asyncio.sleep(1.0)  # (every one dispatched, its request awaited)
            try:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await exists(ch)(
                        pb.ExistsRequest(keys=["k"]), metadata=token_of(cluster, "a"), timeout=5
                    )
                other = await exists(ch)(
                    pb.ExistsRequest(keys=["k"]), metadata=token_of(cluster, "b"), timeout=5
                )
            finally:
                for call_held in held:
                    call_held.cancel()
                await asyncio.gather(*held, return_exceptions=True)
            return refused.value.code(), other

    code, other = asyncio.run(run())
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(other.statuses) == 1, "tenant b's call was served"
