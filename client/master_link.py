"""The client's line to the master: blocking calls with a deadline, retries and failover.

The hot calls go over the master's metadata lane when it has one (client/lane_client.py; its
port is asked for once per master over gRPC), the rest, and all of them where the lane is
missing or unreachable, over gRPC: both report the same status codes, handled alike below.

A call is retried with exponential backoff while the master is unreachable or shedding load
(UNAVAILABLE, RESOURCE_EXHAUSTED), and is redirected when a standby master answers that it is
not the leader (FAILED_PRECONDITION, naming the leader) or the leader stops answering, until
the caller's deadline; then MasterUnavailable says what was tried. Other gRPC failures become
typed errors at once, among them a RESOURCE_EXHAUSTED for the tenant's quota of calls in flight
("quota exceeded: ...", QuotaExceeded): its own calls fill it, and retrying adds to them.

One exception: a connection refused at a master address given directly, by a link that no
master has answered yet, fails at once. Nothing listens there, and waiting out the deadline
(seconds) would only delay the same error: the address is wrong or the master is not started.
Once a master has answered, a refusal means one restarting, and the call waits for it.

Likewise a client certificate the master refuses (expired, not yet valid, of another CA): the
master closes every TLS handshake, and no retry fixes that. A certificate out of its dates by
this host's clock is refused before connecting; one the master refused with a TLS alert (the
metadata lane) fails the call at once, saying that the master refused the certificate.
Handshakes closed with no alert (gRPC's "Socket closed") are retried to the deadline: a
master at its connection cap, or a proxy with no master behind it yet, closes them the same
way; the deadline's message then names the likely cause.
"""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from kvpool.client import batch_split
from kvpool.client.lane_client import CERTIFICATE_CUT, LaneBusy, LaneClient, LaneError
from kvpool.common import lane_protocol as lp
from kvpool.common.leader_resolver import LEADER_METADATA, LeaderResolver
from kvpool.common.limits import GRPC_MESSAGE_OPTIONS
from kvpool.common.logging import get_logger
from kvpool.common.master_address import MasterTarget, host_of, parse_master
from kvpool.errors import (
    ClientClosed,
    InvalidArgument,
    KVPoolError,
    MasterNotTrusted,
    MasterUnavailable,
    NotAuthenticated,
    PermissionDenied,
    QuotaExceeded,
)
from kvpool.proto import master_pb2 as pb
from kvpool.proto import master_pb2_grpc
from kvpool.security.caller import CallerCredentials
from kvpool.security.tls import TlsConfigError

log = get_logger("kvpool.client")

#: CANCELLED: a call on a channel another thread replaced (after a failover, or to skip
#: gRPC's reconnect backoff) ends so; it never reached an answer and is sent again.
RETRYABLE = (lp.UNAVAILABLE, lp.RESOURCE_EXHAUSTED, lp.DEADLINE_EXCEEDED, lp.CANCELLED)
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
#: The calls that take the metadata lane when the master has one, with their answers' types.
LANE_RESPONSES = {name: response for name, _, response in lp.LANE_METHODS.values()}
LANE_ASK_TIMEOUT = 1.0
#: How long a client uses gRPC where a master has no lane, or its lane could not be reached
#: or ended connections before they were established, as one at a connection cap does
#: (doubling after each failed attempt, up to LANE_RETRY_MAX, until the lane answers again:
#: a firewall that drops the lane's packets costs one call a connect timeout that rarely).
LANE_RETRY_AFTER = 60.0
LANE_RETRY_MAX = 3600.0
#: How a refusal for a tenant's quota of calls in flight begins (RESOURCE_EXHAUSTED, like
#: load shedding, which is retried; this is not).
QUOTA_REFUSAL = "quota exceeded"
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 0.5
#: Consecutive failures to reach a master before asking where the leader is now.
FAILURES_BEFORE_RESOLVING = 2
#: The TLS alerts a master sends about a client certificate it refuses (OpenSSL's names,
#: "_" as " "): of a CA it does not trust, expired or not yet valid, or otherwise bad.
CERTIFICATE_ALERTS = ("unknown ca", "certificate expired", "bad certificate", "certificate unknown")
#: How far out of its validity dates a client certificate must be, by this host's clock,
#: to be refused here before connecting: the master checks with its own clock, which may be
#: a little behind or ahead (a certificate just made, or just expired, is left to it).
CLOCK_LEEWAY = datetime.timedelta(minutes=5)


class MasterLink:
    def __init__(
        self,
        target: MasterTarget | str,
        use_lane: bool = True,
        credentials: CallerCredentials | None = None,
    ) -> None:
        """``credentials``: None takes them from the environment (KVPOOL_TOKEN, ...)."""
        if credentials is None:
            credentials = CallerCredentials.resolve()
        if isinstance(target, str):
            target = parse_master(target)
        self.target = target
        self.credentials = credentials
        self._metadata = credentials.metadata
        self.use_lane = use_lane
        #: Per master address: its lane, or until when to use gRPC there (no lane, unreachable).
        self._lanes: dict[str, LaneClient | float] = {}
        #: Per master address: how long gRPC is used after its lane was last unreachable
        #: (absent until the first time, which is also the only one logged).
        self._lane_pauses: dict[str, float] = {}
        self.address = str(target)
        self.retries = 0  # calls retried because the master was away, busy or not leading
        self._resolver = LeaderResolver(target)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        #: Calls running on each channel: one replaced while calls run on it is closed when
        #: the last ends (closed at once, it would cancel them, and a call sent again after
        #: that might run twice: a PutStart would find its own reservation).
        self._channel_users: dict[grpc.Channel, int] = {}
        self._stub: master_pb2_grpc.MasterStub | None = None
        self._connected_to = ""
        #: Whether a master has ever answered this link (a refusal is then a restart).
        self._answered = False
        #: Directly given masters that refused a connection while none had answered yet.
        self._refused: set[str] = set()
        #: Leaders named by standbys that failed the TLS check (each logged once).
        self._hints_untrusted: set[str] = set()
        self._closed = False

    @property
    def answered(self) -> bool:
        """Whether a master has ever answered this link."""
        return self._answered

    def call(self, method: str, request: Any, deadline: float) -> Any:
        """Calls ``method`` on the leader until it answers or ``deadline`` (monotonic) passes.
        A per-key request larger than the master takes goes as several calls, answered as
        one (``batch_split``)."""
        if self._closed:
            raise ClientClosed("the client is closed: make a new one")
        if batch_split.too_many_keys(method, request):
            return batch_split.call_in_parts(
                method, request, lambda part: self.call(method, part, deadline)
            )
        backoff = FIRST_BACKOFF
        if deadline <= time.monotonic():  # (spent before: not the master's doing, say so)
            raise MasterUnavailable(_passed_before_sent(method, self.address))
        last_error = "no attempt made"
        not_proven = ""  # (a hinted leader's failed TLS check: said at the deadline)
        failures = 0
        #: The lane could not be connected to: this attempt goes over gRPC, which tells
        #: whether the master is down (then the lane is tried again) or only its lane is
        #: out of reach (a firewall, a Service without the port: gRPC for a while).
        lane_failure: lp.LaneUnreachable | None = None
        failed_lane: LaneClient | None = None  # (the lane client that raised it)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not_proven and not_proven != last_error:
                    last_error += f"; before that, {not_proven}"
                raise MasterUnavailable(self._deadline_passed(method, last_error))
            stub, leader, channel = self._stub_for_leader(deadline)
            if stub is None:
                last_error = "no leader elected yet"
                self._resolver.failed(deadline=deadline)
            else:
                try:
                    remaining = max(deadline - time.monotonic(), 0.001)  # (after a lookup)
                    lane = None if lane_failure else self._lane(method, stub, leader, remaining)
                    # (what asking for the lane took is not the call's to spend again)
                    remaining = max(deadline - time.monotonic(), 0.001)
                    if lane is not None:
                        response_type = LANE_RESPONSES[method]
                        answer = lane.call(method, request, response_type, remaining)
                        self._answered = True
                        if self._lane_pauses:  # (back on the lane: a later pause starts anew)
                            self._lane_reached(leader, lane)
                        return answer
                    _check_size(method, request)  # (the lane checks what it serializes)
                    response = getattr(stub, method)(
                        request, timeout=remaining, metadata=self._metadata
                    )
                    self._answered = True
                    if lane_failure is not None:
                        self._lane_unreachable(leader, lane_failure, failed_lane)
                    return response
                except lp.LaneUnreachable as error:
                    lane_failure, failed_lane = error, lane
                    continue  # the same call over gRPC, at once
                except LaneError as error:
                    code, details, hint = error.code, error.details, error.leader
                except ValueError as error:
                    # grpc's "Cannot invoke RPC on closed channel!" (or "...: Channel
                    # closed!"): another thread replaced the channel this call took (a new
                    # leader, or a fresh channel after failures) and closed it. The call goes
                    # again, on the new one.
                    if isinstance(error, KVPoolError) or not _channel_closed(error):
                        raise
                    if self._closed:
                        raise ClientClosed("the client is closed: make a new one") from None
                    continue  # (bounded by the deadline, as every attempt)
                except grpc.RpcError as error:
                    code, details = error.code().value[0], error.details() or ""
                    hint = _leader_hint(error)
                    if code == lp.CANCELLED and stub is not self._stub and not self._closed:
                        continue  # (cancelled by that same replacement, mid-call)
                finally:
                    self._release_channel(channel)
                if lane_failure is not None and code not in RETRYABLE:
                    self._lane_unreachable(leader, lane_failure, failed_lane)  # (gRPC got there)
                lane_failure = None  # (else the master itself is away: try its lane again)
                name = _CODE_NAMES.get(code, str(code))
                if code not in RETRYABLE:
                    self._answered = True
                problem = _tls_problem(details) if code == lp.UNAVAILABLE else ""
                if problem and not self._resolver.hinted(leader):
                    # No retry fixes that: raised at once. MasterNotTrusted, but for a
                    # certificate out of its dates, which a renewal (or a clock put right)
                    # fixes with no change on this side.
                    failed = MasterUnavailable if problem == CERTIFICATE_DATES else MasterNotTrusted
                    raise failed(self._not_proven(leader, problem, details))
                if code == lp.UNAVAILABLE and self._certificate_alert(details):
                    # (not NotAuthenticated: the lane checks a certificate it was given where
                    # gRPC, not asking for one, would have taken the call)
                    raise MasterUnavailable(
                        f"master {leader} did not answer {method}: "
                        f"{self._handshake_closed_hint()} ({name}: {details})"
                    )
                if code == lp.UNAVAILABLE and self._nothing_listens(leader, details):
                    refused = ", ".join(sorted(self._refused))
                    raise MasterUnavailable(
                        f"master {self.address} did not answer {method}: connection refused at "
                        f"{refused}, so nothing listens there ({name}: {details}). Check that "
                        "`kvpool master` runs there, and the address and port."
                    )
                if code == lp.RESOURCE_EXHAUSTED and details.startswith(QUOTA_REFUSAL):
                    # the tenant's own calls fill its quota: retrying would only add to them
                    raise QuotaExceeded(f"master {leader} refused {method}: {details}")
                if problem:
                    # The leader a standby named did not prove who it is at the address it
                    # advertises: back to the masters as given, which did (a hint never
                    # holds a link for good).
                    last_error = not_proven = self._not_proven(leader, problem, details)
                    if leader not in self._hints_untrusted:
                        self._hints_untrusted.add(leader)
                        log.warning(
                            "the leader a standby named did not prove who it is; going back "
                            "to the masters as given",
                            master=leader,
                            given=str(self.target),
                            error=last_error,
                        )
                    self._resolver.failed(deadline=deadline, tried=leader)
                    self._new_channel()
                elif code == lp.FAILED_PRECONDITION and "not the leader" in details:
                    last_error = f"{leader}: {details}"
                    self._resolver.failed(hint, deadline, tried=leader)
                elif code in RETRYABLE:
                    last_error = f"{leader}: {name}: {details}"
                    failures += 1
                    busy = code == lp.RESOURCE_EXHAUSTED
                    if failures >= FAILURES_BEFORE_RESOLVING and not busy:
                        failures = 0
                        self._resolver.failed(deadline=deadline, tried=leader)
                        self._new_channel()
                elif code == lp.INVALID_ARGUMENT:
                    raise InvalidArgument(f"master rejected {method}: {details}")
                elif code == lp.UNAUTHENTICATED:
                    raise NotAuthenticated(f"master {leader} refused {method}: {details}")
                elif code == lp.PERMISSION_DENIED:
                    raise PermissionDenied(f"master {leader} refused {method}: {details}")
                elif code == lp.UNIMPLEMENTED:
                    # (another gRPC server at that address, or a kvpool master without this
                    # method: no retry makes it answer; the address given has to change)
                    unusable = MasterUnavailable(_not_a_master(leader, method, name, details))
                    unusable.retryable = False
                    raise unusable
                else:
                    raise KVPoolError(f"master {method} failed: {name}: {details}")
            with self._lock:  # (threads share the link: no increment is lost)
                self.retries += 1
            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _not_proven(self, leader: str, problem: str, details: str = "") -> str:
        """What to tell a caller whose master at ``leader`` failed the TLS check ``problem``
        (``_tls_problem``; ``details``: the failure as told)."""
        how = (
            "a standby master named it as the leader"
            if self._resolver.hinted(leader)
            else "the address this client was given"
        )
        if problem == HOSTNAME_MISMATCH:
            return (
                f"master {leader} did not prove who it is: its certificate does not name "
                f"{host_of(leader)} ({how}). The master's certificate must name every address "
                "its callers dial: the one they are given and, with several masters, the one "
                "each master advertises (--advertise; the Helm chart's masters advertise "
                "<pod>.<release>-kvpool-master-headless.<namespace>.svc, which its "
                "certificate must name as *.<release>-kvpool-master-headless.<namespace>.svc: "
                "docs/kubernetes.md)"
            )
        if problem == CERTIFICATE_DATES:
            when = "is not valid yet" if "not yet valid" in details.lower() else "has expired"
            ca = self.credentials.tls.ca if self.credentials.tls else None
            return (
                f"master {leader} did not prove who it is: its certificate, or the CA "
                f"certificate that signed it ({ca or 'none given'}), {when} as this host's "
                f"clock reads it ({how}). Check both (`openssl x509 -noout -dates -in FILE`): "
                "renew the master's certificate (it is read again without a restart) or the "
                "CA's, or put right the clock of this host or the master's"
            )
        ca = self.credentials.tls.ca if self.credentials.tls else None
        return (
            f"master {leader} did not prove who it is: its certificate is not signed by the "
            f"CA this client trusts ({ca or 'none given'}; {how}). Give the CA of the "
            "master's certificate (tls_ca=, KVPOOL_TLS_CA or --tls-ca)"
        )

    def _deadline_passed(self, method: str, last_error: str) -> str:
        """What a call that ran out of time is told: where the last failure was a TLS
        handshake the master closed, the likely cause (a client certificate it refused, or
        none where it requires one), else that the master may not run or be reachable."""
        said = f"master {self.address} did not answer {method} before the deadline ({last_error})"
        if _handshake_closed(last_error):
            return f"{said}: {self._handshake_closed_hint()}."
        return (
            f"{said}. Check that `kvpool master` runs there and is reachable, or raise the "
            "client's timeout."
        )

    def _handshake_closed_hint(self) -> str:
        """Why a master closes the TLS handshake, for this client: without TLS, the master
        probably serves TLS; with a certificate, it probably refused it; without one, it
        probably requires one (--require-client-cert)."""
        if self.credentials.tls is None:
            return (
                "the master closed the connection in the TLS handshake: this client connected "
                "without TLS (no CA given), and the master probably serves TLS. Give the CA "
                "of the master's certificate (tls_ca=, KVPOOL_TLS_CA or --tls-ca; for a "
                "`kvpool up` cluster, `source` its client.env)"
            )
        cert = self.credentials.tls.cert
        if cert is None:
            return (
                "the master closed the connection in the TLS handshake: it probably requires "
                "a client certificate (--require-client-cert) and this client gave none. Give "
                "one signed by the master's --tls-client-ca (tls_cert= and tls_key=, "
                "KVPOOL_TLS_CERT and KVPOOL_TLS_KEY, or --tls-cert and --tls-key)"
            )
        return (
            "the master closed the connection in the TLS handshake: it probably refused this "
            f"client's certificate {cert}. Check its validity dates (`openssl x509 -noout "
            f"-dates -in {cert}`) and that the CA of the master's --tls-client-ca signed it"
        )

    def _certificate_alert(self, details: str) -> bool:
        """Whether the master refused this client's certificate in so many words: a TLS alert
        about it (the metadata lane checks a certificate it is given even where it does not
        require one; Python's ssl reports the alert, where gRPC only sees the socket close)."""
        tls = self.credentials.tls
        if tls is None or tls.cert is None:
            return False
        if CERTIFICATE_CUT in details:  # (the alert itself lost to the close: lane_client.py)
            return True
        lowered = details.lower().replace("_", " ")
        return "alert" in lowered and any(alert in lowered for alert in CERTIFICATE_ALERTS)

    def _nothing_listens(self, leader: str, details: str) -> bool:
        """Whether ``leader`` refusing a connection means that no master is to be waited for:
        no master has answered this link yet, and every master given directly has refused.
        (Where etcd names the leader, an election is under way: it is waited for.)"""
        if self._answered or self.target.etcd or "connection refused" not in details.lower():
            return False
        self._refused.add(leader)
        if self._refused.issuperset(self.target.masters):
            return True
        self._resolver.failed(tried=leader)  # the next master of the list, at once
        return False

    def _lane(
        self, method: str, stub: master_pb2_grpc.MasterStub, leader: str, remaining: float
    ) -> LaneClient | None:
        """The leader's metadata lane for ``method``, asked for once per leader; None: gRPC."""
        if not self.use_lane or method not in LANE_RESPONSES:
            return None
        with self._lock:
            known = self._lanes.get(leader)
        if isinstance(known, LaneClient):
            return known
        if isinstance(known, float) and time.monotonic() < known:
            return None  # none there, or unreachable from here: ask again later
        try:
            port = stub.Lane(
                pb.LaneRequest(),
                timeout=min(remaining, LANE_ASK_TIMEOUT),
                metadata=self._metadata,
            ).port
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # a master from before the lane
                with self._lock:
                    self._lanes[leader] = time.monotonic() + LANE_RETRY_AFTER
            return None  # this call goes over gRPC, which reports what is wrong
        stale: list[LaneClient] = []
        with self._lock:
            if self._closed:  # (closed while it asked: a lane made now would never close)
                raise ClientClosed("the client is closed: make a new one")
            if not port:
                self._lanes[leader] = time.monotonic() + LANE_RETRY_AFTER
                return None
            lane = self._lanes.get(leader)
            if isinstance(lane, float) and time.monotonic() < lane:
                return None  # (found out of reach meanwhile, by another thread: paused)
            if not isinstance(lane, LaneClient):
                # a new leader: the connections to the lanes of earlier ones are let go
                for address, other in list(self._lanes.items()):
                    if isinstance(other, LaneClient):
                        stale.append(other)
                        del self._lanes[address]
                try:
                    lane = LaneClient(host_of(leader), port, self.credentials)
                except TlsConfigError as error:
                    raise InvalidArgument(f"cannot connect to master {leader}: {error}") from None
                self._lanes[leader] = lane
        for other in stale:
            other.close()
        return lane

    def _lane_unreachable(
        self, leader: str, error: lp.LaneUnreachable, failed: LaneClient | None = None
    ) -> None:
        """The lane at ``leader`` could not be reached (or ended connections before they were
        established) through ``failed``, and gRPC was: gRPC is used for a pause, doubling
        from one pause to the next while the lane stays out of reach. Once per lane client:
        the other threads of a burst that failed on the same one do not double it again (a
        busy client would otherwise pause for the longest at once)."""
        if isinstance(error, LaneBusy):
            return  # (this client's own connections were all busy: nothing of the lane)
        with self._lock:
            lane = self._lanes.get(leader)
            if failed is not None and lane is not failed:
                return  # (reported already, by another thread that failed on it)
            first = leader not in self._lane_pauses
            pause = self._lane_pauses.get(leader, LANE_RETRY_AFTER / 2) * 2
            self._lane_pauses[leader] = pause = min(pause, LANE_RETRY_MAX)
            self._lanes[leader] = time.monotonic() + pause
        if isinstance(lane, LaneClient):
            lane.close()
        if first:
            log.warning("metadata lane unreachable; using gRPC", master=leader, error=str(error))

    def _lane_reached(self, leader: str, lane: LaneClient) -> None:
        """The lane at ``leader`` answered through ``lane``: the next time it cannot be
        reached, gRPC is used for LANE_RETRY_AFTER again, not for twice the pause before
        (which grows only while the lane stays out of reach). A call that finished on a lane
        client given up meanwhile says nothing of the lane now."""
        with self._lock:
            if self._lanes.get(leader) is lane:
                self._lane_pauses.pop(leader, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            lanes, self._lanes = self._lanes, {}
        for lane in lanes.values():
            if isinstance(lane, LaneClient):
                lane.close()

    def _new_channel(self) -> None:
        """Makes the next call open a fresh channel: one that kept failing to connect waits
        out gRPC's reconnect backoff, seconds after a restarted master is back."""
        with self._lock:
            self._connected_to = ""

    def _stub_for_leader(
        self, deadline: float
    ) -> tuple[master_pb2_grpc.MasterStub | None, str, grpc.Channel | None]:
        """The leader's stub, its address and its channel, counted as used until
        ``_release_channel``; (None, "", None) while no leader is known."""
        leader = self._resolver.leader(deadline)
        with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed: make a new one")
            if not leader:
                return None, "", None
            if leader != self._connected_to or self._stub is None:
                replaced = self._channel
                try:  # (the TLS files are read again for each channel: they may be rotated)
                    _check_certificate_dates(self.credentials)
                    self._channel = self.credentials.channel(
                        leader,
                        options=[
                            *GRPC_MESSAGE_OPTIONS,
                            ("grpc.enable_retries", 0),
                            ("grpc.initial_reconnect_backoff_ms", 50),
                            ("grpc.max_reconnect_backoff_ms", 1000),
                        ],
                    )
                except TlsConfigError as error:
                    raise InvalidArgument(f"cannot connect to master {leader}: {error}") from None
                self._stub = master_pb2_grpc.MasterStub(self._channel)
                self._connected_to = leader
                if replaced is not None and not self._channel_users.get(replaced):
                    replaced.close()  # (else its last call closes it: _release_channel)
            channel = self._channel
            assert channel is not None
            self._channel_users[channel] = self._channel_users.get(channel, 0) + 1
            return self._stub, leader, channel

    def _release_channel(self, channel: grpc.Channel | None) -> None:
        """A call on ``channel`` ended: a channel replaced meanwhile closes with its last."""
        if channel is None:
            return
        with self._lock:
            left = self._channel_users[channel] - 1
            if left:
                self._channel_users[channel] = left
                return
            del self._channel_users[channel]
            replaced = channel is not self._channel
        if replaced:
            channel.close()


def _passed_before_sent(method: str, address: str) -> str:
    """What a call is told whose deadline had passed before its first attempt: the time went
    on the call's earlier steps (the parts of a large batch before, its transfers), so the
    master is not to blame and checking that it runs would not help."""
    return (
        f"{method} was not sent to master {address}: the call's deadline had passed before "
        "it was sent (its earlier steps took the whole timeout). Raise the client's timeout, "
        "or do less in one call"
    )


def _not_a_master(address: str, method: str, name: str, details: str) -> str:
    """What a call answered UNIMPLEMENTED is told: gRPC's own "Method not found!" does not
    say that the address, not the call, is what is wrong."""
    return (
        f"{address} answered but is not a kvpool master (or one of an incompatible version): "
        f"check --master / the address ({method}: {name}: {details})"
    )


def _handshake_closed(details: str) -> bool:
    """Whether gRPC's ``details`` say the master closed the connection as it was being made
    (in the TLS handshake): "failed to connect to all addresses; ... Socket closed", or
    "Secure read failed (Socket closed)". Under TLS 1.3 a master that refuses the client's
    certificate (or requires one and got none) does so after the client's side of the
    handshake is done, and the alert that says why is not what gRPC reports."""
    lowered = details.lower()
    return "socket closed" in lowered and any(
        sign in lowered for sign in ("secure read failed", "handshake", "failed to connect")
    )


def _check_certificate_dates(credentials: CallerCredentials) -> None:
    """TlsConfigError when the client certificate is expired or not yet valid by this host's
    clock (beyond CLOCK_LEEWAY): the master would close every handshake, and the caller
    would learn only that it did not answer."""
    cert = credentials.tls.cert if credentials.tls else None
    if cert is None:
        return
    problem = certificate_dates_problem(cert, datetime.datetime.now(datetime.UTC))
    if problem:
        raise TlsConfigError(problem)


def certificate_dates_problem(path: Path, now: datetime.datetime) -> str:
    """What is wrong with the validity dates of the certificate in ``path`` at ``now``
    (beyond CLOCK_LEEWAY), or "". A file that does not parse is left to the TLS checks,
    which say so."""
    from cryptography import x509

    try:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return ""
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    dates = f"valid from {start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} UTC"
    now_said = f"it is {now:%Y-%m-%d %H:%M:%S} UTC here"
    if now > end + CLOCK_LEEWAY:
        return (
            f"the client certificate {path} has expired ({dates}; {now_said}), so the master "
            "would refuse it: give a current one (or check this host's clock)"
        )
    if now < start - CLOCK_LEEWAY:
        return (
            f"the client certificate {path} is not valid yet ({dates}; {now_said}), so the "
            "master would refuse it: wait until then, or check this host's clock"
        )
    return ""


def _channel_closed(error: ValueError) -> bool:
    """Whether grpc raised ``error`` for a call on a channel closed under it."""
    text = str(error).lower()
    return "channel" in text and "closed" in text


def _check_size(method: str, request: Any) -> None:
    """InvalidArgument for a request larger than the master reads: it would refuse it, or
    drop the connection, however often it was sent."""
    size = request.ByteSize()
    if size > lp.REQUEST_LIMIT:
        raise InvalidArgument(lp.too_large(method, size))


#: ``_tls_problem``'s answers: the master's certificate is not signed by a CA trusted here, or
#: it is, but does not name the address dialled.
UNTRUSTED_CA = "untrusted"
HOSTNAME_MISMATCH = "hostname"
#: The master's certificate is outside its validity dates (as this host's clock reads them):
#: a renewal, or a clock put right, fixes it without a change here.
CERTIFICATE_DATES = "dates"


def _tls_problem(details: str) -> str:
    """Why a connection failed the TLS check of the master's certificate ("" where it did
    not): UNTRUSTED_CA or HOSTNAME_MISMATCH. gRPC reports a name the certificate lacks as a
    "Hostname Verification Check failed" (C-core's own check, after OpenSSL's chain check),
    Python's ssl as "Hostname mismatch" within "certificate verify failed"."""
    lowered = details.lower()
    if "hostname verification" in lowered or "hostname mismatch" in lowered:
        return HOSTNAME_MISMATCH
    if "certificate has expired" in lowered or "certificate is not yet valid" in lowered:
        return CERTIFICATE_DATES
    if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        return UNTRUSTED_CA
    return ""


def _leader_hint(error: grpc.RpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA:
            return value
    return ""
