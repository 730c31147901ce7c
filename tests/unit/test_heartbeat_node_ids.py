"""A heartbeat or drain naming a node id no node could have mounted under is refused before
the master keeps anything of it (master/handlers.py): on an ``--insecure`` cluster any caller
may heartbeat for any node id, and the master remembers the ids it hears of, with their
processes; bounded in number, each must be bounded in size too."""

from __future__ import annotations

import grpc
import pytest
from state_helpers import new_state

from kvpool.common.keys import MAX_KEY_BYTES
from kvpool.master.core import MasterCore
from kvpool.master.driver import CallRefused, CoreDriver
from kvpool.master.handlers import MasterHandlers
from kvpool.proto import master_pb2 as pb
from kvpool.security.identity import INSECURE


@pytest.mark.parametrize("node_id", ["n" * (MAX_KEY_BYTES + 1), ""], ids=["too long", "empty"])
def test_a_heartbeat_for_a_node_id_no_node_has_is_refused_and_nothing_kept(node_id):
    state, _ = new_state()
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    request = pb.HeartbeatRequest(node_id=node_id, incarnation="i1")
    with pytest.raises(CallRefused) as refused:
        handlers.Heartbeat(request, INSECURE)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "node_id" in refused.value.details
    assert not handlers.driver.processes._heard


def test_a_drain_for_a_node_id_no_node_has_is_refused():
    state, _ = new_state()
    handlers = MasterHandlers(CoreDriver(MasterCore(state)))
    with pytest.raises(CallRefused) as refused:
        handlers.Drain(pb.DrainRequest(node_id="n" * (MAX_KEY_BYTES + 1)), INSECURE)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
