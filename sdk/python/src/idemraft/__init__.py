"""Idemraft's Python SDK.

- ``AsyncClient`` (asyncio) and ``Client`` (blocking): every Idempotency call, typed
  outcomes, leader discovery, retries with the same owner id within a deadline, TLS and
  bearer tokens; ``execute`` runs work at most once per key with the lease kept alive.
- ``fingerprint``: the request digest every SDK computes alike (RFC 8785 JSON).
- ``IdempotencyMiddleware`` (in ``idemraft.asgi``): the HTTP contract for FastAPI and
  Starlette.
- ``idemraft.errors``: the error taxonomy.
"""

from .aio import AsyncClient, ClientConfig, RetryableWorkError, TerminalWorkError, WorkGrant
from .errors import (
    ConfigError,
    DeadlineExceeded,
    ExecuteError,
    IdemraftError,
    InProgress,
    InvalidArgument,
    LostOwnership,
    Mismatch,
    OutcomeUnknown,
    ProtocolError,
    QuotaExceeded,
    Refused,
    RpcError,
    Unavailable,
    UnexpectedOutcome,
    WorkFailed,
)
from .fingerprint import Fingerprint, canonical_json, fingerprint, fingerprint_parts
from .sync import Client
from .types import (
    Acquired,
    Completed,
    Executed,
    Failed,
    Grant,
    InProgressOutcome,
    LeaseExtended,
    ListPage,
    MismatchOutcome,
    NotFound,
    Outcome,
    Record,
    RecordId,
    RecordState,
    Replay,
    StaleToken,
    StoredResponse,
    Waited,
    WrongState,
)

__version__ = "0.1.0"
