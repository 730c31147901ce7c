"""``Story``: a key's story (``MasterState.story``) as the wire carries it to operators.

Times on the master's clock mean nothing elsewhere (it is monotonic), so each event also says
how long before the answer it happened; details become text, replicas as ``segment@offset``.
"""

from __future__ import annotations

from kvpool.master.state import MasterState
from kvpool.master.story import format_value
from kvpool.proto import master_pb2 as pb


def story_response(state: MasterState, key: str) -> pb.StoryResponse:
    """The story of ``key`` (as the master holds it: behind its tenant's prefix)."""
    response = pb.StoryResponse()
    now = state.clock()
    for event in state.story(key):
        response.events.add(
            time=event.time,
            age_s=max(0.0, now - event.time),
            event=event.event,
            details={name: format_value(value) for name, value in event.details.items()},
        )
    return response
