"""The SDK's error taxonomy, the same as the Rust SDK's ``Error`` and ``ExecuteError``.

Conflicts a caller handles in the normal course (IN_PROGRESS, MISMATCH, STALE_TOKEN, ...) are
outcomes (``idemraft.types``), not errors. An error means the call reached no decision, or
(for ``execute``) that the flow could not produce a response.

This module also owns the mapping from a gRPC status to an error, including the one rule that
matters most for payments: a call whose connection broke before its answer arrived is
``OutcomeUnknown``, never a refusal, because the node may have carried it out.
"""

from __future__ import annotations

from typing import Mapping, Optional

import grpc

LEADER_ID_HEADER = "idemraft-leader-id"
LEADER_ADDR_HEADER = "idemraft-leader-addr"
NOT_PROPOSED_HEADER = "idemraft-not-proposed"
SERVED_BY_HEADER = "idemraft-served-by"
QUOTA_TENANT_HEADER = "idemraft-quota-tenant"
QUOTA_LIMIT_HEADER = "idemraft-quota-limit"
QUOTA_RECORDS_HEADER = "idemraft-quota-records"


class IdemraftError(Exception):
    """Base of every error the SDK raises. ``message`` is the underlying text, unchanged
    (for a server refusal, the node's own words naming the rule and the fix)."""

    #: The conformance name of the error kind.
    kind = "error"
    prefix = ""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def indeterminate(self) -> bool:
        """Whether the call may or may not have taken effect (repeating it is safe)."""
        return False

    def __str__(self) -> str:
        return self.prefix + self.message


class InvalidArgument(IdemraftError):
    """The request broke a rule; the message names it. Retrying will not help."""

    kind = "invalid_argument"
    prefix = "invalid request: "


class Unavailable(IdemraftError):
    """No node could serve the call before the deadline (no leader, no quorum, nodes down).
    For a write the outcome is unknown; repeating the same call is safe."""

    kind = "unavailable"
    prefix = "cluster unavailable: "

    @property
    def indeterminate(self) -> bool:
        return True


class DeadlineExceeded(IdemraftError):
    """The deadline passed; for a write the outcome is unknown, repeating it is safe."""

    kind = "deadline_exceeded"
    prefix = "deadline exceeded: "

    @property
    def indeterminate(self) -> bool:
        return True


class OutcomeUnknown(IdemraftError):
    """The outcome of the call is unknown; repeating the same call is safe. Either the
    connection broke before the answer arrived and no other attempt got one before the
    deadline, or a retried write got an answer that an earlier attempt, whose outcome is
    unknown, may itself have caused. The Rust SDK's ``Error::Indeterminate``."""

    kind = "indeterminate"
    prefix = "outcome unknown: "

    @property
    def indeterminate(self) -> bool:
        return True


class Refused(IdemraftError):
    """The cluster refused the call in its current shape (gRPC FAILED_PRECONDITION, e.g. an
    admin change it cannot make now). The Rust SDK's ``Error::FailedPrecondition``."""

    kind = "failed_precondition"
    prefix = "refused: "


class QuotaExceeded(IdemraftError):
    """The claim would have created a record past the tenant's record quota; nothing was
    stored. Not retried: the same claim gets the same answer until an operator raises the
    quota or records expire. Claims on keys that already have a record are never refused."""

    kind = "quota_exceeded"

    def __init__(self, message: str, tenant: str, limit: int, records: int):
        super().__init__(message)
        self.tenant = tenant
        self.limit = limit
        self.records = records


class ConfigError(IdemraftError):
    """The client was configured wrongly (no endpoints, unreadable TLS files, a bad token)."""

    kind = "config"
    prefix = "client configuration: "


class RpcError(IdemraftError):
    """Any other gRPC failure (e.g. a real INTERNAL error of the node, PERMISSION_DENIED)."""

    kind = "rpc"

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return "%s: %s" % (self.code.name, self.message)


class ProtocolError(IdemraftError):
    """The server answered with something this SDK does not understand (a newer server?)."""

    kind = "protocol"
    prefix = "unexpected reply: "


# --- execute ---------------------------------------------------------------------------


class ExecuteError(IdemraftError):
    """Why ``execute`` produced no response (besides the client errors above)."""


class Mismatch(ExecuteError):
    """The key is bound to a different request fingerprint."""

    kind = "mismatch"

    def __init__(self):
        super().__init__("the idempotency key was used with a different request (fingerprint mismatch)")


class InProgress(ExecuteError):
    """Another worker still holds the key at the deadline."""

    kind = "in_progress"

    def __init__(self, lease_expires_ms: int):
        super().__init__("another worker holds the key (its lease runs until %d)" % lease_expires_ms)
        self.lease_expires_ms = lease_expires_ms


class WorkFailed(ExecuteError):
    """The work failed retryably; the key was released for a retry. ``message`` is the
    work's reason."""

    kind = "work_failed"

    def __str__(self) -> str:
        return "the work failed and may be retried: " + self.message


class LostOwnership(ExecuteError):
    """The lease was lost and another owner took the key over; this worker's settle was
    refused. Downstream writes fenced with the old token are refused too."""

    kind = "lost_ownership"

    def __init__(self, token: int, current: int):
        super().__init__("ownership lost: token %d was superseded by %d" % (token, current))
        self.token = token
        self.current = current


class UnexpectedOutcome(ExecuteError):
    """An outcome that should not happen in this flow; ``message`` is its name."""

    kind = "unexpected"

    def __str__(self) -> str:
        return "unexpected outcome " + self.message


# --- from gRPC --------------------------------------------------------------------------

# Words grpcio uses for a connection that could not be made: the call never left this side.
_CONNECT_FAILED = ("failed to connect", "connection refused", "dns resolution failed", "no route to host")
# Words grpcio uses for a connection that broke under a call: the call may have been taken.
_BROKEN = (
    "socket closed",
    "connection reset",
    "broken pipe",
    "recvmsg",
    "sendmsg",
    "rst_stream",
    "stream removed",
    "goaway",
    "h2 protocol error",
    "connection aborted",
    "end of tcp stream",
    "keepalive watchdog",
    "http2",
)


class Status:
    """One failed attempt: the gRPC code, its message, and the reply metadata (initial and
    trailing, merged) that tells a node's answer from the transport's."""

    __slots__ = ("code", "details", "metadata", "debug")

    def __init__(self, code: grpc.StatusCode, details: str, metadata: Optional[Mapping[str, str]] = None, debug: str = ""):
        self.code = code
        self.details = details or ""
        self.metadata = dict(metadata or {})
        self.debug = debug or ""

    @classmethod
    def from_rpc_error(cls, e: grpc.RpcError) -> "Status":
        md = {}
        for getter in ("initial_metadata", "trailing_metadata"):
            fn = getattr(e, getter, None)
            try:
                pairs = fn() if fn else None
            except Exception:  # a metadata accessor on a broken call may itself fail
                pairs = None
            for k, v in pairs or ():
                md[k.lower()] = v.decode("latin-1") if isinstance(v, bytes) else v
        debug = ""
        dbg = getattr(e, "debug_error_string", None)
        if dbg:
            try:
                debug = dbg() or ""
            except Exception:
                debug = ""
        return cls(e.code(), e.details() or "", md, debug)

    def __repr__(self) -> str:
        return "Status(%s, %r)" % (self.code.name, self.details)


def connect_failed(s: Status) -> bool:
    """The attempt never reached a node (refused, unresolvable): this endpoint is down."""
    text = s.details.lower()
    return s.code == grpc.StatusCode.UNAVAILABLE and any(w in text for w in _CONNECT_FAILED)


def never_proposed(s: Status) -> bool:
    """Whether the node says the call was refused before it was proposed. The code alone
    does not prove it: HTTP/2 closing a connection as overloaded also surfaces as
    RESOURCE_EXHAUSTED, after the node may have taken the call."""
    return s.code == grpc.StatusCode.RESOURCE_EXHAUSTED and NOT_PROPOSED_HEADER in s.metadata


def _from_node(s: Status) -> bool:
    """Whether the status was written by a node rather than made up by the transport on
    this side. A node's refusals carry its metadata or come back as "received from peer"."""
    if LEADER_ID_HEADER in s.metadata or LEADER_ADDR_HEADER in s.metadata or NOT_PROPOSED_HEADER in s.metadata:
        return True
    if QUOTA_LIMIT_HEADER in s.metadata:
        return True
    return "error received from peer" in s.debug.lower()


def lost_reply(s: Status) -> Optional[str]:
    """Why the reply to a call was lost, when the status says it was: the connection under
    the call broke before an answer arrived. The call may have been carried out, so this is
    a timeout's "outcome unknown", never a refusal (a real INTERNAL error of the node stays
    a determinate error)."""
    code = s.code
    text = s.details.lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        if connect_failed(s) or _from_node(s):
            return None
        if any(w in text for w in _BROKEN) or not text:
            return "the connection to the node broke before the answer arrived"
        return None
    if code == grpc.StatusCode.INTERNAL:
        if any(w in text for w in _BROKEN) and (text.startswith("h2 protocol error") or not _from_node(s)):
            return "the HTTP/2 connection to the node broke before the answer arrived"
        return None
    if code == grpc.StatusCode.UNKNOWN:
        return "the call ended without a gRPC status"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not never_proposed(s):
        return "HTTP/2 closed the connection to the node as overloaded before the answer arrived"
    return None


def retryable(s: Status) -> bool:
    """Every Idempotency call is safe to repeat with the same arguments; these statuses say
    only that this attempt got no decision."""
    return (
        s.code
        in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )
        or lost_reply(s) is not None
    )


def ran_out(s: Status) -> bool:
    return s.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def _int(v: Optional[str]) -> Optional[int]:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def from_status(s: Status) -> IdemraftError:
    """The error for one status, as the Rust SDK's ``Error::from_status``."""
    why = lost_reply(s)
    if why is not None:
        return OutcomeUnknown(
            "%s (%s: %s); the call may or may not have taken effect: repeat it with the same arguments"
            % (why, s.code.name, s.details)
        )
    code = s.code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(s.details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(s.details)
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        # A cancelled call is one whose time ran out: its outcome is just as unknown.
        return DeadlineExceeded(s.details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        limit = _int(s.metadata.get(QUOTA_LIMIT_HEADER))
        if limit is not None:
            records = _int(s.metadata.get(QUOTA_RECORDS_HEADER))
            return QuotaExceeded(
                s.details, s.metadata.get(QUOTA_TENANT_HEADER, ""), limit, records if records is not None else limit
            )
        return Refused(s.details)
    return RpcError(code, s.details)


def gave_up(last: Status, maybe_applied: bool) -> IdemraftError:
    """The error of a call whose deadline ran out, ``last`` being the most telling answer of
    its attempts. When an earlier attempt may have taken effect, a determinate refusal after
    it (an overloaded leader shedding the retry) does not make the outcome known."""
    e = from_status(last)
    if e.indeterminate or not maybe_applied:
        return e
    return OutcomeUnknown(
        "an earlier attempt got no answer and may have taken effect, and the last was refused (%s); "
        "repeat the call with the same arguments" % e
    )
