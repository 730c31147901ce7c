"""Limits that every kvpool process must agree on."""

from __future__ import annotations

#: Largest message kvpool sends or accepts, over gRPC (the master's server and the clients'
#: channels) and over the metadata lane (a frame's body): a batch that needs more is refused
#: and must be split, and a peer that sends more is broken or foreign.
MESSAGE_LIMIT = 256 * 1024 * 1024

#: The gRPC channel and server options that apply MESSAGE_LIMIT both ways.
GRPC_MESSAGE_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
)
