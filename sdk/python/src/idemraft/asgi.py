"""The HTTP idempotency layer as ASGI middleware, for FastAPI, Starlette and any ASGI app:
the handler it wraps runs at most once per ``Idempotency-Key``, with the cluster as the
single source of truth. It implements the contract of the Rust layer
(``client/src/http/``) answer for answer:

| case | answer |
|---|---|
| missing key (route requires one) | 400 problem+json |
| malformed key, or the header sent twice | 400 problem+json |
| body over the limit | 413 problem+json |
| key reused with a different request | 422 problem+json |
| first call still in flight | 409 problem+json with ``Retry-After: 1``, or a bounded wait and the first call's response |
| completed before | the stored status, body bytes and allowed headers, plus ``Idempotent-Replayed: true`` |
| cluster unavailable or the claim's outcome unknown | 503 problem+json with ``Retry-After: 1`` (fail-closed), or the handler runs unprotected (fail-open) |
| tenant's record quota used up | 429 problem+json (never fail-open: the cluster answered no) |
| handler raised | 500 problem+json; the key is released so a retry runs at once |

This module owns only the HTTP side: the header, the fingerprint, the size limit, mapping
outcomes to statuses and RFC 9457 bodies, which responses are stored, and the replay.
Claiming, keeping the lease alive and settling are the SDK's (``AsyncClient.claim``,
``wait`` and ``run_granted``), so the HTTP path and ``execute`` share one implementation.

The handler finds its claim in the ASGI scope's state, which Starlette and FastAPI expose as
``request.state``: ``idemraft_token`` (the fencing token: pass it to every downstream
write), ``idemraft_key`` and ``idemraft_claim`` (a ``ClaimInfo``). All three are None when
the handler runs unprotected (a safe method, no key on an optional route, fail-open).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from . import errors as E
from . import keys
from .aio import AsyncClient, RetryableWorkError, TerminalWorkError
from .fingerprint import fingerprint
from .types import Acquired, InProgressOutcome, MismatchOutcome, Replay, StoredResponse

log = logging.getLogger("idemraft.asgi")

IDEMPOTENCY_KEY = "idempotency-key"
IDEMPOTENT_REPLAYED = "idempotent-replayed"
PROBLEM_JSON = "application/problem+json"
PROBLEM_TYPE_PREFIX = "urn:idemraft:problem:"
DEFAULT_REPLAY_HEADERS = ("content-type", "location", "etag")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

# Bounds of contract §1.4 (the server's defaults), checked by validate().
LEASE_BOUNDS = (1.0, 600.0)
TTL_BOUNDS = (60.0, 30 * 24 * 3600.0)
MAX_SCOPE_LEN = 128
# The server's hint is the holder's lease time left, an upper bound (the lease is renewed
# while the handler runs): a client is told to come back soon instead.
MAX_IN_FLIGHT_RETRY_AFTER_SECS = 1
# Each round waits on the server; this only bounds a key that keeps changing hands.
MAX_WAIT_ROUNDS = 32
KEY_RULE = "a key is 16 to 255 characters of A-Z a-z 0-9 _ . : - (a UUID works)"


@dataclass(frozen=True)
class ClaimInfo:
    """More about the claim the handler runs under."""

    scope: str
    token: int
    #: 1 for a first run; more after a failed or abandoned attempt.
    attempt: int
    #: This run took the key over from a holder whose lease expired.
    takeover: bool
    #: Progress marker a previous holder left with Checkpoint.
    recovery_point: str


def default_store_policy(status: int) -> bool:
    """Semantics §7: 2xx and 4xx are final, except 408, 409 and 429, which say "try again";
    everything else (5xx above all) is released."""
    return (200 <= status < 300 or 400 <= status < 500) and status not in (408, 409, 429)


def store_everything(status: int) -> bool:
    """Stripe's policy: every response the handler produced is final, 5xx included."""
    return True


class KeyHeaderError(ValueError):
    """Why a key header is not usable; the message names the rule."""


def parse_key(values: Sequence[bytes]) -> Optional[str]:
    """The key from the header's values: the IETF draft's structured-field string
    (``"8e03978e-..."``) or Stripe's bare token, checked against the key rule. None when
    there is no header."""
    if not values:
        return None
    if len(values) > 1:
        raise KeyHeaderError("the header was sent more than once; send exactly one key")
    raw = values[0]
    if any(not (b == 0x09 or 0x20 <= b <= 0x7E) for b in raw):
        raise KeyHeaderError("the header is not visible ASCII; " + KEY_RULE)
    text = raw.decode("ascii").strip(" \t")
    if text.startswith('"'):
        inner = text[1:]
        if not inner.endswith('"'):
            raise KeyHeaderError('the header starts a quoted string but is not one; send "<key>" or the bare key; ' + KEY_RULE)
        inner = inner[:-1]
        # The key rule has neither quotes nor backslashes, so an escape is never needed.
        if '"' in inner or "\\" in inner:
            raise KeyHeaderError('the header starts a quoted string but is not one; send "<key>" or the bare key; ' + KEY_RULE)
        text = inner
    n = len(text)
    if n < keys.MIN_LEN or n > keys.MAX_LEN:
        raise KeyHeaderError("the key is %d characters long; %s" % (n, KEY_RULE))
    for i, c in enumerate(text):
        if not (c.isascii() and (c.isalnum() or c in "_.:-")):
            raise KeyHeaderError("the key has %r at position %d; %s" % (c, i, KEY_RULE))
    return text


def retry_after_secs(retry_after_ms: int) -> int:
    """Seconds for ``Retry-After``: the server's hint rounded up, at least 1."""
    return max(1, -(-retry_after_ms // 1000))


@dataclass
class Problem:
    """An RFC 9457 problem: the body of every answer the layer itself gives."""

    status: int
    kind: str
    title: str
    detail: str
    retry_after: Optional[int] = None

    @classmethod
    def new(cls, status: int, slug: str, title: str, detail: str, retry_after: Optional[int] = None) -> "Problem":
        return cls(status, PROBLEM_TYPE_PREFIX + slug, title, detail, retry_after)

    def body(self) -> bytes:
        return json.dumps(
            {"type": self.kind, "title": self.title, "status": self.status, "detail": self.detail},
            sort_keys=True, separators=(",", ":"), ensure_ascii=False,
        ).encode("utf-8")

    def response(self) -> "Answer":
        headers = [(b"content-type", PROBLEM_JSON.encode())]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        return Answer(self.status, headers, self.body())

    @classmethod
    def missing_key(cls, header: str) -> "Problem":
        return cls.new(400, "missing-idempotency-key", "Idempotency key required",
                       "this endpoint requires an %s header: generate a unique key (16 to 255 characters of "
                       "A-Z a-z 0-9 _ . : -, e.g. a UUID) for each new request and send the same key on its retries" % header)

    @classmethod
    def malformed_key(cls, header: str, e: Exception) -> "Problem":
        return cls.new(400, "malformed-idempotency-key", "Malformed idempotency key",
                       "the %s header is not a valid key: %s" % (header, e))

    @classmethod
    def too_large(cls, limit: int) -> "Problem":
        return cls.new(413, "body-too-large", "Request body too large",
                       "the body is over this endpoint's limit of %d bytes; send a smaller body" % limit)

    @classmethod
    def unreadable_body(cls, why: str) -> "Problem":
        return cls.new(400, "unreadable-body", "Request body could not be read",
                       "the body could not be read (%s); send the request again with the same key" % why)

    @classmethod
    def mismatch(cls, header: str) -> "Problem":
        return cls.new(422, "idempotency-key-reused", "Idempotency key reused with a different request",
                       "this %s was first used with a different method, path or body; resend the original request "
                       "unchanged to get its response, or use a new key for a new request" % header)

    @classmethod
    def in_flight(cls, secs: int) -> "Problem":
        return cls.new(409, "request-in-progress", "A request with this idempotency key is in progress",
                       "the first request with this key has not finished; retry the same request with the same key after "
                       "%d s to get its response" % secs, retry_after=secs)

    @classmethod
    def unavailable(cls, e: Exception) -> "Problem":
        return cls.new(503, "idempotency-store-unavailable", "Idempotency store unavailable",
                       "the request was not processed because the idempotency store could not be reached (%s); retry the "
                       "same request with the same key after 1 s" % e, retry_after=1)

    @classmethod
    def quota_exceeded(cls) -> "Problem":
        return cls.new(429, "idempotency-quota-exceeded", "Too many idempotency keys in use",
                       "the request was not processed: this service holds as many idempotency records as it is allowed; "
                       "retry later, when older keys have expired (requests that reuse an existing key still work)")

    @classmethod
    def handler_failed(cls) -> "Problem":
        return cls.new(500, "handler-failed", "The request failed and was not stored",
                       "the request failed before it produced a response; the key was released, so retry the same request "
                       "with the same key")

    @classmethod
    def lost_ownership(cls) -> "Problem":
        return cls.new(409, "idempotency-lease-lost", "The request lost its claim on the key",
                       "the request ran past its lease and another request took the key over; retry the same request with "
                       "the same key after 1 s to get the response that was stored", retry_after=1)

    @classmethod
    def internal(cls, why: str) -> "Problem":
        return cls.new(500, "idempotency-internal", "Idempotency check failed",
                       "the idempotency check failed (%s); the request was not processed; report this to the operator" % why)


@dataclass
class Answer:
    """A buffered HTTP response: status, ASGI header pairs, body."""

    status: int
    headers: List[Tuple[bytes, bytes]]
    body: bytes

    async def send(self, send) -> None:
        headers = [(n, v) for n, v in self.headers if n.lower() not in (b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


class IdempotencyMiddleware:
    """ASGI middleware that makes the wrapped app's handlers run at most once per
    ``Idempotency-Key``. One instance protects one route family (its ``scope`` names it)::

        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, client=client, scope="payments.create",
                           paths=["/v1/charges"])

    Safe methods (GET, HEAD, OPTIONS, TRACE) and paths the middleware does not protect pass
    through untouched. Durations are in seconds.

    - ``paths``: exact paths to protect, or prefixes ending in ``*``; ``match`` (a function of
      the ASGI scope) instead; neither: every path.
    - ``key_required``: a request without the header is refused 400 (True) or runs unprotected.
    - ``lease``: held while the handler runs, extended every third in the background.
    - ``ttl``: how long the record (and its stored response) is kept; the scope's default if None.
    - ``wait_for_in_flight``: wait up to this long for an in-flight first request and answer
      with its response, instead of 409 at once (None).
    - ``store``: which statuses are stored (``default_store_policy``, ``store_everything``, or
      your own function of the status); a response not stored releases the key.
    - ``replay_headers``: the allowlist of headers stored and replayed (lowercase names).
    - ``fail_open``: run the handler unprotected when the cluster cannot be reached (True) or
      answer 503 (False, the default).
    - ``max_body_bytes`` / ``max_stored_body_bytes``: request limit (413 above it) and the
      largest response body kept as is (a larger one reaches the first caller whole; retries
      get its status and allowed headers with a problem body saying it was too large).
    - ``cluster_timeout``: how long the claim may try to reach the cluster.
    - ``settle_timeout``: how long storing a produced response is retried.
    """

    def __init__(
        self,
        app,
        client: AsyncClient,
        scope: str,
        *,
        paths: Optional[Iterable[str]] = None,
        match: Optional[Callable[[dict], bool]] = None,
        header: str = IDEMPOTENCY_KEY,
        key_required: bool = True,
        lease: float = 30.0,
        ttl: Optional[float] = None,
        wait_for_in_flight: Optional[float] = None,
        store: Callable[[int], bool] = default_store_policy,
        replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
        fail_open: bool = False,
        max_body_bytes: int = 1024 * 1024,
        max_stored_body_bytes: int = 256 * 1024,
        cluster_timeout: float = 5.0,
        settle_timeout: float = 30.0,
        allow_takeover: bool = True,
    ):
        self.app = app
        self.client = client
        self.scope = scope
        self.paths = None if paths is None else tuple(paths)
        self.match = match
        self.header = header.lower()
        self.key_required = key_required
        self.lease = lease
        self.ttl = ttl
        self.wait_for_in_flight = wait_for_in_flight
        self.store = store
        self.replay_headers = tuple(dict.fromkeys(h.lower() for h in replay_headers))
        self.fail_open = fail_open
        self.max_body_bytes = max_body_bytes
        self.max_stored_body_bytes = max_stored_body_bytes
        self.cluster_timeout = cluster_timeout
        self.settle_timeout = settle_timeout
        self.allow_takeover = allow_takeover
        self.validate()

    def validate(self) -> None:
        """Checks the settings against the server's default bounds, so a bad route
        configuration fails at startup instead of as a 500 on every request."""
        s = self.scope
        problem = None
        if not (0 < len(s) <= MAX_SCOPE_LEN and all(c.isascii() and (c.isalnum() or c in "._:/-") for c in s)):
            problem = "a scope is 1 to %d bytes of A-Z a-z 0-9 . _ : / -" % MAX_SCOPE_LEN
        elif not LEASE_BOUNDS[0] <= self.lease <= LEASE_BOUNDS[1]:
            problem = "lease %ss is outside %s..=%ss" % (self.lease, LEASE_BOUNDS[0], LEASE_BOUNDS[1])
        elif self.ttl is not None and not TTL_BOUNDS[0] <= self.ttl <= TTL_BOUNDS[1]:
            problem = "ttl %ss is outside %s..=%ss" % (self.ttl, TTL_BOUNDS[0], TTL_BOUNDS[1])
        elif self.max_body_bytes <= 0:
            problem = "max_body_bytes must be above 0"
        elif self.cluster_timeout <= 0 or self.settle_timeout <= 0:
            problem = "cluster_timeout and settle_timeout must be above 0"
        if problem:
            raise ValueError("idempotency middleware for scope %r: %s" % (s, problem))

    def _protects(self, scope) -> bool:
        if self.match is not None:
            return bool(self.match(scope))
        if self.paths is None:
            return True
        path = scope.get("path", "")
        return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in self.paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._protects(scope):
            return await self.app(scope, receive, send)
        if scope["method"].upper() in SAFE_METHODS:
            return await self.app(_unprotected(scope), receive, send)
        values = [v for n, v in scope.get("headers", ()) if n.lower() == self.header.encode("latin-1")]
        try:
            key = parse_key(values)
        except KeyHeaderError as e:
            return await Problem.malformed_key(self.header, e).response().send(send)
        if key is None:
            if not self.key_required:
                return await self.app(_unprotected(scope), receive, send)
            return await Problem.missing_key(self.header).response().send(send)
        try:
            body = await self._read_body(scope, receive)
        except _TooLarge:
            return await Problem.too_large(self.max_body_bytes).response().send(send)
        except _Disconnected:
            return  # nobody to answer, nothing claimed
        fp = fingerprint(scope["method"], _path_and_query(scope), body)
        # The rest runs in a task of its own: if the caller hangs up, the handler still
        # finishes and its response is stored, so the caller's retry gets a replay instead
        # of a second run after the lease expires.
        task = asyncio.ensure_future(self._protected(scope, key, fp, body))
        try:
            answer = await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("idempotent request task failed")
            answer = Problem.handler_failed().response()
        if isinstance(answer, Answer):
            await answer.send(send)
        else:  # fail-open: the unprotected app's messages, in order
            for message in answer:
                await send(message)

    async def _read_body(self, scope, receive) -> bytes:
        declared = None
        for n, v in scope.get("headers", ()):
            if n.lower() == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = None
        if declared is not None and declared > self.max_body_bytes:
            raise _TooLarge()
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _protected(self, scope, key: str, fp, body: bytes):
        client = self.client
        loop = asyncio.get_running_loop()
        owner = keys.random("http-")
        wait_until = None if self.wait_for_in_flight is None else loop.time() + self.wait_for_in_flight
        rounds = 0
        while True:
            try:
                outcome = await client.claim(
                    self.scope, key, owner, fingerprint=fp, lease=self.lease, ttl=self.ttl,
                    allow_takeover=self.allow_takeover, deadline=self.cluster_timeout,
                )
            except E.QuotaExceeded as e:
                # The operator's problem, not the caller's: the full message goes to the log;
                # the caller learns only that it may retry later. Never fail-open.
                log.error("the tenant's record quota refused a new key in scope %s: %s", self.scope, e)
                return Problem.quota_exceeded().response()
            except E.IdemraftError as e:
                if _store_unavailable(e):
                    if not self.fail_open:
                        return Problem.unavailable(e).response()
                    log.warning("cluster unavailable; running the handler unprotected (fail-open): %s", e)
                    return await _call_buffered_stream(self.app, _unprotected(scope), body)
                # The key was checked here with the server's rule, so a refusal is a
                # configuration mismatch between this route and the cluster.
                log.error("the cluster refused the claim in scope %s: %s", self.scope, e)
                return Problem.internal(str(e)).response()
            if isinstance(outcome, Acquired):
                break
            if isinstance(outcome, Replay):
                return replay(outcome.response)
            if isinstance(outcome, MismatchOutcome):
                return Problem.mismatch(self.header).response()
            if isinstance(outcome, InProgressOutcome):
                left = 0.0 if wait_until is None else max(0.0, wait_until - loop.time())
                rounds += 1
                if left < 0.010 or rounds > MAX_WAIT_ROUNDS:
                    secs = min(retry_after_secs(outcome.retry_after_ms), MAX_IN_FLIGHT_RETRY_AFTER_SECS)
                    return Problem.in_flight(secs).response()
                try:
                    await client.wait(self.scope, key, left)
                except E.IdemraftError as e:
                    # Waiting is a courtesy; the cluster going away during it is a 503 (never
                    # fail-open: another request is known to be running this key).
                    return Problem.unavailable(e).response()
                continue
            log.error("unexpected claim outcome %s", outcome.name)
            return Problem.internal("unexpected claim outcome %s" % outcome.name).response()

        grant = outcome
        info = ClaimInfo(self.scope, grant.token, grant.attempt, grant.takeover, grant.recovery_point)
        state = dict(scope.get("state") or {})
        state.update(idemraft_token=grant.token, idemraft_key=key, idemraft_claim=info)
        inner_scope = dict(scope, state=state)
        answer_box = []

        async def work(_grant):
            answer, stored = await self._run_handler(inner_scope, body)
            answer_box.append(answer)
            return stored if isinstance(stored, StoredResponse) else _raise(stored)

        try:
            await client.run_granted(self.scope, key, grant, work, lease=self.lease, settle_timeout=self.settle_timeout)
        except E.WorkFailed:
            pass
        except E.LostOwnership as e:
            log.warning("lease lost while the handler ran (token %d, now %d); its response was not stored", e.token, e.current)
            return Problem.lost_ownership().response()
        except E.IdemraftError as e:
            # The handler ran, but its outcome could not be stored: the caller still gets what
            # the handler did. A retry after the lease expires may run it again, which the
            # fencing token makes safe downstream.
            log.error("the response of token %d could not be stored: %s", grant.token, e)
        if not answer_box:
            return Problem.internal("the handler produced no answer").response()
        return answer_box[0]

    async def _run_handler(self, scope, body: bytes):
        """Runs the app once with the buffered body; returns what the caller gets and what
        the key is settled with (a StoredResponse, or the work error to raise)."""
        start = None
        chunks: List[bytes] = []

        async def capture(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        try:
            await self.app(scope, _replay_receive(body), capture)
        except Exception as e:
            log.exception("the handler raised; the key in scope %s is released", self.scope)
            return Problem.handler_failed().response(), RetryableWorkError("the handler raised %s: %s" % (type(e).__name__, e))
        if start is None:
            log.error("the handler returned without a response; the key in scope %s is released", self.scope)
            return Problem.handler_failed().response(), RetryableWorkError("the handler produced no response")
        status = int(start["status"])
        headers = [(bytes(n), bytes(v)) for n, v in start.get("headers", ())]
        body_out = b"".join(chunks)
        answer = Answer(status, headers, body_out)
        if not self.store(status):
            return answer, RetryableWorkError("status %d is not stored" % status)
        stored = self._to_stored(status, headers, body_out)
        if status < 400:
            return answer, stored
        return answer, TerminalWorkError(stored)

    def _to_stored(self, status: int, headers, body: bytes) -> StoredResponse:
        """The stored form: status, the allowed headers in order, body bytes."""
        too_large = len(body) > self.max_stored_body_bytes
        kept = []
        for n, v in headers:
            name = n.decode("latin-1").lower()
            if name not in self.replay_headers or (too_large and name == "content-type"):
                continue
            if any(not (b == 0x09 or 0x20 <= b <= 0x7E) for b in v):
                log.warning("header %s is not visible ASCII and is not replayed", name)
                continue
            kept.append((name, v.decode("ascii")))
        if too_large:
            p = Problem.new(status, "response-not-stored", "Response too large to replay",
                            "the request was processed once, but its %d-byte response is over the %d-byte limit of what is "
                            "kept; fetch the result another way (e.g. from the Location header)"
                            % (len(body), self.max_stored_body_bytes))
            kept.append(("content-type", PROBLEM_JSON))
            return StoredResponse(status, tuple(kept), p.body())
        return StoredResponse(status, tuple(kept), body)


def replay(stored: StoredResponse) -> Answer:
    """A stored response as a replay: its status, headers in order, body, and
    ``Idempotent-Replayed: true``."""
    status = stored.status if 100 <= stored.status <= 999 else 500
    headers = []
    for n, v in stored.headers:
        try:
            name, value = n.encode("ascii"), v.encode("ascii")
        except UnicodeEncodeError:
            log.warning("stored header %r is not a valid HTTP header; skipped", n)
            continue
        if not name or name.lower() == IDEMPOTENT_REPLAYED.encode():
            continue
        headers.append((name.lower(), value))
    headers.append((IDEMPOTENT_REPLAYED.encode(), b"true"))
    return Answer(status, headers, stored.body)


def _raise(e):
    raise e


def _store_unavailable(e: E.IdemraftError) -> bool:
    """Whether the cluster gave the claim no answer: unreachable, the outcome unknown, or
    every attempt shed by an overloaded leader. The handler has not run, so these are 503
    or fail-open; only a refusal the cluster stands by is the operator's problem (500)."""
    import grpc

    return e.indeterminate or (isinstance(e, E.RpcError) and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED)


def _unprotected(scope):
    state = dict(scope.get("state") or {})
    state.update(idemraft_token=None, idemraft_key=None, idemraft_claim=None)
    return dict(scope, state=state)


def _path_and_query(scope) -> str:
    raw = scope.get("raw_path")
    if raw:
        path = raw.decode("latin-1")
    else:
        from urllib.parse import quote

        path = quote(scope.get("root_path", "") + scope.get("path", "")) or "/"
    qs = scope.get("query_string", b"")
    return path + ("?" + qs.decode("latin-1") if qs else "")


def _replay_receive(body: bytes):
    sent = False
    never = asyncio.Event()

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The client's own disconnect is not passed on: the handler finishes either way.
        await never.wait()
        return {"type": "http.disconnect"}

    return receive


async def _call_buffered_stream(app, scope, body: bytes):
    messages = []

    async def collect(message):
        messages.append(message)

    await app(scope, _replay_receive(body), collect)
    return messages
