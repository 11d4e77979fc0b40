"""Typed results: the outcomes of writes, records, stored responses, execute's grant and
result. Dataclasses, not protobuf messages, so callers never depend on generated code; this
module owns the conversion from and to the wire types of ``idemraft.v1``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, List, Optional, Tuple, Union

from .errors import ProtocolError
from .v1 import idemraft_pb2 as pb


class RecordState(str, enum.Enum):
    """A record's lifecycle state, spelled as the API spells it."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def from_proto(cls, v: int) -> "RecordState":
        return {
            pb.RECORD_STATE_IN_PROGRESS: cls.IN_PROGRESS,
            pb.RECORD_STATE_COMPLETED: cls.COMPLETED,
            pb.RECORD_STATE_FAILED: cls.FAILED,
        }.get(v, cls.UNKNOWN)

    def to_proto(self) -> int:
        return {
            RecordState.IN_PROGRESS: pb.RECORD_STATE_IN_PROGRESS,
            RecordState.COMPLETED: pb.RECORD_STATE_COMPLETED,
            RecordState.FAILED: pb.RECORD_STATE_FAILED,
        }.get(self, pb.RECORD_STATE_UNSPECIFIED)


@dataclass(frozen=True)
class StoredResponse:
    """A response stored at completion and replayed byte for byte. ``headers`` keeps the
    order and spelling it was given in."""

    status: int
    headers: Tuple[Tuple[str, str], ...] = ()
    body: bytes = b""

    def __post_init__(self):
        object.__setattr__(self, "headers", tuple((str(n), str(v)) for n, v in self.headers))
        if isinstance(self.body, str):
            object.__setattr__(self, "body", self.body.encode("utf-8"))
        else:
            object.__setattr__(self, "body", bytes(self.body))

    def to_pb(self) -> "pb.StoredResponse":
        return pb.StoredResponse(
            status=self.status, headers=[pb.Header(name=n, value=v) for n, v in self.headers], body=self.body
        )

    @classmethod
    def from_pb(cls, r: "pb.StoredResponse") -> "StoredResponse":
        return cls(r.status, tuple((h.name, h.value) for h in r.headers), bytes(r.body))


# --- outcomes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Acquired:
    """Claim, Takeover: the caller owns the key."""

    name: ClassVar[str] = "ACQUIRED"
    #: Fencing token: carry it on every later call for this key and to downstream systems,
    #: which should refuse any token lower than the highest they have seen.
    token: int
    attempt: int
    takeover: bool
    lease_expires_ms: int
    expires_ms: int
    recovery_point: str = ""
    checkpoint: bytes = b""


#: The grant ``execute`` and the middleware hand to work; the same fields as ``Acquired``.
Grant = Acquired


@dataclass(frozen=True)
class Replay:
    """Claim: the key was completed before; this is its stored response."""

    name: ClassVar[str] = "REPLAY"
    token: int
    completed_ms: int
    response: StoredResponse


@dataclass(frozen=True)
class InProgressOutcome:
    """Claim, Takeover: someone else holds the key."""

    name: ClassVar[str] = "IN_PROGRESS"
    lease_expires_ms: int
    retry_after_ms: int


@dataclass(frozen=True)
class MismatchOutcome:
    """Claim: the key is bound to another request fingerprint."""

    name: ClassVar[str] = "MISMATCH"


@dataclass(frozen=True)
class StaleToken:
    """The token is not the record's current one."""

    name: ClassVar[str] = "STALE_TOKEN"
    current: int


@dataclass(frozen=True)
class NotFound:
    """No live record with that id."""

    name: ClassVar[str] = "NOT_FOUND"


@dataclass(frozen=True)
class WrongState:
    """The record's state does not allow the call."""

    name: ClassVar[str] = "WRONG_STATE"
    state: RecordState


@dataclass(frozen=True)
class Completed:
    """Complete accepted (also when retried after it was accepted)."""

    name: ClassVar[str] = "COMPLETED"
    token: int


@dataclass(frozen=True)
class Failed:
    """Fail accepted: FAILED (retryable) or COMPLETED with the error response."""

    name: ClassVar[str] = "FAILED"
    token: int
    retryable: bool


@dataclass(frozen=True)
class LeaseExtended:
    """ExtendLease, Checkpoint accepted."""

    name: ClassVar[str] = "LEASE_EXTENDED"
    token: int
    lease_expires_ms: int


Outcome = Union[
    Acquired, Replay, InProgressOutcome, MismatchOutcome, StaleToken, NotFound, WrongState, Completed, Failed, LeaseExtended
]


def outcome_from_pb(o: "pb.Outcome") -> Outcome:
    which = o.WhichOneof("result")
    if which is None:
        raise ProtocolError("an outcome with no result")
    v = getattr(o, which)
    if which == "acquired":
        return Acquired(v.token, v.attempt, v.takeover, v.lease_expires_ms, v.expires_ms, v.recovery_point, bytes(v.checkpoint))
    if which == "replay":
        return Replay(v.token, v.completed_ms, StoredResponse.from_pb(v.response))
    if which == "in_progress":
        return InProgressOutcome(v.lease_expires_ms, v.retry_after_ms)
    if which == "mismatch":
        return MismatchOutcome()
    if which == "stale_token":
        return StaleToken(v.current)
    if which == "not_found":
        return NotFound()
    if which == "wrong_state":
        return WrongState(RecordState.from_proto(v.state))
    if which == "completed":
        return Completed(v.token)
    if which == "failed":
        return Failed(v.token, v.retryable)
    if which == "lease_extended":
        return LeaseExtended(v.token, v.lease_expires_ms)
    raise ProtocolError("an outcome this SDK does not know: %s" % which)


# --- records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordId:
    tenant: str
    scope: str
    key: str


@dataclass(frozen=True)
class Record:
    """The public view of one record, as Get, Wait and List return it."""

    tenant: str
    scope: str
    key: str
    state: RecordState
    token: int
    owner: str
    attempt: int
    taken_over: bool
    lease_expires_ms: int
    created_ms: int
    updated_ms: int
    completed_ms: int
    expires_ms: int
    retention_ms: int
    recovery_point: str
    checkpoint: bytes
    #: The stored response once COMPLETED, else None.
    response: Optional[StoredResponse]
    #: The bound fingerprint (32 bytes), or b"".
    fingerprint: bytes

    @classmethod
    def from_pb(cls, r: "pb.Record") -> "Record":
        return cls(
            tenant=r.id.tenant,
            scope=r.id.scope,
            key=r.id.key,
            state=RecordState.from_proto(r.state),
            token=r.token,
            owner=r.owner,
            attempt=r.attempt,
            taken_over=r.taken_over,
            lease_expires_ms=r.lease_expires_ms,
            created_ms=r.created_ms,
            updated_ms=r.updated_ms,
            completed_ms=r.completed_ms,
            expires_ms=r.expires_ms,
            retention_ms=r.retention_ms,
            recovery_point=r.recovery_point,
            checkpoint=bytes(r.checkpoint),
            response=StoredResponse.from_pb(r.response) if r.HasField("response") else None,
            fingerprint=bytes(r.fingerprint),
        )


@dataclass(frozen=True)
class Waited:
    """A record after Wait: ``record`` is None when there is no live record;
    ``timed_out`` when it was still IN_PROGRESS as the wait ended."""

    record: Optional[Record]
    timed_out: bool


@dataclass(frozen=True)
class ListPage:
    """One page of List. While ``next_after`` is set, pass it as ``start_after``."""

    records: List[Record]
    next_after: Optional[RecordId]


@dataclass(frozen=True)
class Executed:
    """The result of ``execute``."""

    #: The token of the grant that produced the response.
    token: int
    #: The response (a terminal failure's stored error response included).
    response: StoredResponse
    #: The response was stored by an earlier execution, not produced now.
    replayed: bool


@dataclass(frozen=True)
class TenantQuota:
    tenant: str
    records: int
    max_records: Optional[int]
    own: bool


@dataclass(frozen=True)
class Quotas:
    default_max_records: Optional[int]
    tenants: List[TenantQuota] = field(default_factory=list)
