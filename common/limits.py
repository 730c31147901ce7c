"""Limits that every kvpool process must agree on."""

from __future__ import annotations

#: The longest duration a call may carry: the wire's millisecond fields are 32-bit.
MAX_SECONDS = (2**32 - 1) / 1000.0

#: The most copies of an object a master keeps (``MasterConfig.max_replicas``): a put asking
#: for more is refused, so an engine's adapter refuses a setting above it at start.
MAX_REPLICAS = 8

#: Largest message kvpool sends or accepts, over gRPC (the master's server and the clients'
#: channels) and over the metadata lane (a frame's body): a batch that needs more is refused
#: and must be split, and a peer that sends more is broken or foreign.
MESSAGE_LIMIT = 256 * 1024 * 1024

#: The gRPC channel and server options that apply MESSAGE_LIMIT both ways.
GRPC_MESSAGE_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
)

#: The largest request the master's gRPC server reads: the largest legal call is a mount
#: report's part (``lp.MAX_BATCH_KEYS`` objects of the longest stored keys, every field at
#: its largest: tests/unit/test_lane_hardening.py builds it and holds it under this). gRPC
#: reads a request whole before the master sees it, so this bounds what each call in flight
#: may make the master hold.
GRPC_REQUEST_LIMIT = 6 * 1024 * 1024

#: The master's gRPC server options: requests up to GRPC_REQUEST_LIMIT, answers up to
#: MESSAGE_LIMIT (a client's channel reads answers that large).
GRPC_SERVER_MESSAGE_OPTIONS = (
    ("grpc.max_receive_message_length", GRPC_REQUEST_LIMIT),
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
)
