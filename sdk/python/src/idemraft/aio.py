"""The asyncio client: connections to the nodes, leader discovery, retries within a
deadline, typed outcomes, and ``execute`` with a background lease keep-alive.

It follows the Rust SDK (``client/src/sdk/``) rule for rule:

- every call is sent to the node believed to lead; a reply's ``idemraft-leader-addr``
  metadata (set by a follower that forwarded the call, and on UNAVAILABLE when the node knows
  the leader) points the next attempt and the next call at the leader;
- an attempt that got no decision (UNAVAILABLE, a timeout, a shed call, a broken connection)
  is repeated with the *same* request, so the same owner id, after a full-jitter exponential
  backoff, until the call's deadline; at the deadline the most telling answer is reported,
  and a write some attempt of which may have taken effect is never reported as a refusal;
- endpoints that refuse connections are skipped for a cooldown (never forgotten, so a
  restarted node comes back), and leader addresses learned from hints are dropped when
  nothing answers there;
- an endpoint that left an attempt unanswered (its whole attempt timeout passed, or the
  connection broke under the call) is passed over for ``SHUN``: a call starts at the first
  endpoint from the preferred one on that is neither shunned nor cooling down (the preferred
  one when all are), a leader hint naming a shunned endpoint is not adopted, and an answer
  from an endpoint takes it back at once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random as _random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Union

import grpc
import grpc.aio

from . import errors as E
from . import keys
from .errors import IdemraftError
from .fingerprint import Fingerprint
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
    Outcome,
    Quotas,
    Record,
    RecordId,
    RecordState,
    Replay,
    StaleToken,
    StoredResponse,
    TenantQuota,
    Waited,
    outcome_from_pb,
)
from .v1 import idemraft_pb2 as pb
from .v1 import idemraft_pb2_grpc as pb_grpc

log = logging.getLogger("idemraft")

#: Shortest attempt worth making; less is left only to learn that time ran out.
MIN_ATTEMPT = 0.010
MAX_MESSAGE = 8 * 1024 * 1024
#: How long a node that left an attempt unanswered (paused, partitioned, dead) is passed
#: over. Longer than a failover (about 1.6 s with the node's default election timeouts), so
#: that the hints of followers that have not yet noticed their leader's silence, which name
#: that leader, do not lead every new call back into it to wait out a whole attempt; short
#: enough that a node that was only slow for a moment soon takes calls again.
SHUN = 2.0


@dataclass
class ClientConfig:
    """Client settings. Durations are in seconds."""

    #: Client addresses of some or all nodes, ``host:port``, ``http://host:port`` or
    #: ``https://host:port``. Without a scheme, TLS is used exactly when ``tls_ca`` is set.
    endpoints: Sequence[str]
    #: Tenant of every record this client touches; empty lets the node decide (the bearer
    #: token's tenant when the node checks tokens, ``default`` otherwise).
    tenant: str = ""
    #: Deadline of a call when the caller gives none.
    deadline: float = 10.0
    #: Longest single attempt, so a hung node costs one attempt and not the whole deadline.
    attempt_timeout: float = 2.0
    #: First backoff after an attempt without a decision; doubles up to ``backoff_max``,
    #: with full jitter.
    backoff_base: float = 0.020
    backoff_max: float = 0.250
    #: Shortest time given to one TCP/TLS connection attempt.
    connect_timeout: float = 0.5
    #: How long an endpoint that refused a connection is skipped (doubling per failure, at
    #: most 8 times this), unless every endpoint is down.
    endpoint_cooldown: float = 0.5
    #: PEM of the CA that signed the nodes' certificates; the system's roots are never
    #: trusted for a cluster.
    tls_ca: Optional[bytes] = None
    #: PEM client certificate chain and key, for nodes started with ``--tls-client-ca``.
    tls_cert: Optional[bytes] = None
    tls_key: Optional[bytes] = None
    #: Sent as ``authorization: Bearer <token>`` on every call, for nodes started with
    #: ``--tokens-file``.
    bearer_token: Optional[str] = None
    #: Source of backoff jitter; seed one for reproducible tests.
    rng: Optional[_random.Random] = field(default=None, repr=False)

    def __repr__(self) -> str:
        # Never print secrets: a logged config leaks nothing.
        return (
            "ClientConfig(endpoints=%r, tenant=%r, deadline=%r, attempt_timeout=%r, tls=%s, "
            "client_cert=%s, bearer_token=%s)"
            % (
                list(self.endpoints),
                self.tenant,
                self.deadline,
                self.attempt_timeout,
                self.tls_ca is not None,
                self.tls_cert is not None,
                "<redacted>" if self.bearer_token else None,
            )
        )

    def with_tls_files(self, ca: Union[str, Path], cert: Union[str, Path, None] = None, key: Union[str, Path, None] = None) -> "ClientConfig":
        """Reads the CA (and optionally a client certificate and its key) from PEM files."""
        self.tls_ca = _read_pem("CA certificate", ca)
        if (cert is None) != (key is None):
            raise E.ConfigError("a client certificate needs both the certificate and its key")
        if cert is not None:
            self.tls_cert = _read_pem("client certificate", cert)
            self.tls_key = _read_pem("client key", key)
        return self


def _read_pem(what: str, path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise E.ConfigError("cannot read the %s %s: %s" % (what, path, e)) from None


def _normalise(addr: str, tls: bool) -> str:
    """``host:port`` gets ``https://`` when the client has a CA to verify nodes with."""
    a = addr.strip()
    if a.startswith("http://") or a.startswith("https://"):
        return a
    return ("https://" if tls else "http://") + a


class _Target:
    __slots__ = ("url", "learned", "channel", "idem", "admin", "down_until", "failures", "shunned_until")

    def __init__(self, url: str, learned: bool):
        self.url = url
        self.learned = learned
        self.channel = None
        self.idem = None
        self.admin = None
        self.down_until = 0.0
        self.failures = 0
        #: Until when calls start elsewhere (loop time): this node left an attempt unanswered.
        self.shunned_until = 0.0

    @property
    def hostport(self) -> str:
        return self.url.split("://", 1)[1]


@dataclass
class WorkGrant:
    """What ``execute``'s work receives: the grant, and a way to learn that ownership was
    lost while it runs (another owner may then hold the key; stop: the fencing token will be
    refused downstream)."""

    grant: Grant
    lost_event: Any = field(default=None, repr=False)

    @property
    def token(self) -> int:
        """The fencing token: pass it to every downstream write."""
        return self.grant.token

    @property
    def attempt(self) -> int:
        return self.grant.attempt

    def is_lost(self) -> bool:
        return self.lost_event is not None and self.lost_event.is_set()


class RetryableWorkError(Exception):
    """Raised by work to say "try again later": the claim is released as FAILED and the
    next claim re-acquires it."""


class TerminalWorkError(Exception):
    """Raised by work to fail for good: ``response`` is stored and replayed to every retry."""

    def __init__(self, response: StoredResponse):
        super().__init__("terminal failure with status %d" % response.status)
        self.response = response


def _ms(seconds: Optional[float]) -> int:
    """Milliseconds on the wire, where 0 means "the server's default"."""
    return 0 if seconds is None else max(0, int(round(seconds * 1000)))


def _fp(fingerprint) -> bytes:
    if fingerprint is None:
        return b""
    b = bytes(fingerprint)
    if len(b) != 32:
        raise E.InvalidArgument("a fingerprint is 32 bytes (SHA-256), not %d" % len(b))
    return b


class AsyncClient:
    """A connection to an Idemraft cluster for asyncio code. Share one per process (and per
    event loop); connections are made on first use, so it may be created while nodes are
    still starting. ``await client.close()`` when done, or use ``async with``."""

    def __init__(self, config: Union[ClientConfig, Sequence[str]], **overrides):
        if not isinstance(config, ClientConfig):
            config = ClientConfig(endpoints=list(config), **overrides)
        elif overrides:
            raise TypeError("give overrides only with a list of endpoints")
        endpoints = [e for e in config.endpoints if e and e.strip()]
        if not endpoints:
            raise E.ConfigError("no endpoints: give at least one node's client address")
        self._cfg = config
        tls = config.tls_ca is not None
        if (config.tls_cert is None) != (config.tls_key is None):
            raise E.ConfigError("a client certificate needs both tls_cert and tls_key")
        self._metadata = ()
        if config.bearer_token is not None:
            token = config.bearer_token.strip()
            if not token:
                raise E.ConfigError("the bearer token is empty: give the token from the tokens file's owner")
            if any(not (0x21 <= ord(c) <= 0x7E) for c in token):
                raise E.ConfigError("the bearer token has characters that cannot go in a header: use printable ASCII")
            self._metadata = (("authorization", "Bearer " + token),)
        self._targets: List[_Target] = []
        for e in endpoints:
            url = _normalise(e, tls)
            if url.startswith("https://") and not tls:
                raise E.ConfigError("endpoint %r uses https but no CA is configured: set tls_ca" % e)
            if not any(t.url == url for t in self._targets):
                self._targets.append(_Target(url, learned=False))
        self._preferred = self._targets[0]
        self._rng = config.rng or _random.Random()
        self._closed = False

    @property
    def config(self) -> ClientConfig:
        return self._cfg

    def endpoints(self) -> List[str]:
        """Endpoint URLs, configured ones first, in the order ``node_status`` indexes them."""
        return [t.url for t in self._targets]

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        for t in self._targets:
            if t.channel is not None:
                await t.channel.close()
                t.channel = None

    # --- connections --------------------------------------------------------------------

    def _connect(self, t: _Target) -> _Target:
        if t.channel is None:
            cfg = self._cfg
            opts = [
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                # This client retries with the same arguments itself; grpc's own retries
                # would add attempts it cannot count.
                ("grpc.enable_retries", 0),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", max(100, int(cfg.connect_timeout * 1000))),
                # A killed node comes back within seconds; grpc's default (120 s) would keep
                # its channel failing long after.
                ("grpc.max_reconnect_backoff_ms", 1000),
            ]
            if t.url.startswith("https://"):
                creds = grpc.ssl_channel_credentials(
                    root_certificates=cfg.tls_ca, private_key=cfg.tls_key, certificate_chain=cfg.tls_cert
                )
                t.channel = grpc.aio.secure_channel(t.hostport, creds, options=opts)
            else:
                t.channel = grpc.aio.insecure_channel(t.hostport, options=opts)
            t.idem = pb_grpc.IdempotencyStub(t.channel)
            t.admin = pb_grpc.AdminStub(t.channel)
        return t

    def _usable(self, t: _Target, now: float) -> _Target:
        """``t`` unless it is cooling down after refusing a connection or shunned after
        leaving an attempt unanswered: then the next endpoint that is neither (or ``t``
        itself when none is)."""
        if t not in self._targets:
            t = self._preferred if self._preferred in self._targets else self._targets[0]
        n = len(self._targets)
        start = self._targets.index(t)
        for i in range(n):
            cand = self._targets[(start + i) % n]
            if cand.down_until <= now and cand.shunned_until <= now:
                return cand
        return t

    def _next(self, t: _Target) -> _Target:
        if t not in self._targets:
            return self._targets[0]
        return self._targets[(self._targets.index(t) + 1) % len(self._targets)]

    def _prefer_addr(self, addr: str) -> Optional[_Target]:
        """Points the client at ``addr`` (a leader hint), adding it if it is not an endpoint."""
        url = _normalise(addr, self._cfg.tls_ca is not None)
        if url.startswith("https://") and self._cfg.tls_ca is None:
            return None
        for t in self._targets:
            if t.url == url:
                # A hint naming a node that just left us unanswered is most likely a
                # follower's stale view of a leader that has stopped: keep the current
                # preference until it has had its time out.
                if t.shunned_until <= asyncio.get_running_loop().time():
                    self._preferred = t
                return t
        t = _Target(url, learned=True)
        self._targets.append(t)
        self._preferred = t
        return t

    def _mark_down(self, t: _Target, now: float) -> None:
        if t.learned and len(self._targets) > 1:
            # A leader address nobody configured, where nothing answers: forget it.
            self._targets.remove(t)
            if t.channel is not None:
                asyncio.ensure_future(t.channel.close())
                t.channel = None
            if self._preferred is t:
                self._preferred = self._targets[0]
            return
        t.failures += 1
        t.down_until = now + min(self._cfg.endpoint_cooldown * (2 ** (t.failures - 1)), self._cfg.endpoint_cooldown * 8)

    def _backoff(self, attempt: int) -> float:
        cap = min(self._cfg.backoff_base * (2 ** min(attempt, 16)), self._cfg.backoff_max)
        return self._rng.uniform(0, cap) if cap > 0 else 0.0

    # --- the retry loop -----------------------------------------------------------------

    async def _call(
        self,
        stub: str,
        rpc: str,
        build: Callable[[float], Any],
        deadline: float,
        attempt_timeout: Optional[float] = None,
        unsure: Optional[list] = None,
    ):
        """Runs one RPC with retries until ``deadline`` (loop time). ``build(budget)``
        returns ``(request, grpc_timeout)`` and must build the same request each time.
        ``unsure`` (a one-element list) is set when an attempt ended without an answer that
        proves it had no effect."""
        if self._closed:
            raise E.ConfigError("the client is closed")
        loop = asyncio.get_running_loop()
        per_attempt = attempt_timeout if attempt_timeout is not None else self._cfg.attempt_timeout
        target = self._preferred
        attempt = 0
        last: Optional[E.Status] = None
        maybe_applied = False
        while True:
            now = loop.time()
            remaining = deadline - now
            # An attempt of a few ms can only time out, and would hide why earlier ones failed.
            if remaining < MIN_ATTEMPT:
                if last is not None:
                    raise E.gave_up(last, maybe_applied)
                raise E.DeadlineExceeded("the call's deadline passed before any node answered")
            target = self._connect(self._usable(target, now))
            budget = min(remaining, per_attempt)
            request, timeout = build(budget)
            try:
                call = getattr(getattr(target, stub), rpc)(request, timeout=timeout, metadata=self._metadata)
                response = await call
                hint = None
                try:
                    for k, v in (await call.initial_metadata()) or ():
                        if k.lower() == E.LEADER_ADDR_HEADER:
                            hint = v
                except Exception:  # the answer is in hand; a missing hint costs nothing
                    hint = None
                target.failures = 0
                target.down_until = 0.0
                target.shunned_until = 0.0
                # A follower that forwarded the call names the leader: go there next time.
                if hint:
                    self._prefer_addr(hint)
                else:
                    self._preferred = target
                return response
            except grpc.RpcError as e:
                status = E.Status.from_rpc_error(e)
                # Only an attempt that used its whole budget says the node is not answering;
                # one cut short by the call's deadline says nothing of it. A timeout the node
                # itself reported (a forward it gave up on) is an answer.
                timed_out = status.code == grpc.StatusCode.DEADLINE_EXCEEDED and not E._from_node(status)
                if (timed_out and budget >= per_attempt) or E.lost_reply(status) is not None:
                    target.shunned_until = loop.time() + SHUN
            left = deadline - loop.time()
            if not E.retryable(status):
                raise E.from_status(status)
            # A shed call or a connection never made had no effect; anything else may have.
            if not E.never_proposed(status) and not E.connect_failed(status):
                maybe_applied = True
                if unsure is not None:
                    unsure[0] = True
            # "Time ran out" says less than a refusal before it (e.g. no quorum): keep that.
            if not (E.ran_out(status) and last is not None):
                last = status
            if left <= 0:
                raise E.gave_up(last, maybe_applied)
            if E.connect_failed(status):
                self._mark_down(target, loop.time())
            hint = status.metadata.get(E.LEADER_ADDR_HEADER)
            hinted = self._prefer_addr(hint) if hint else None
            # Follow the hint unless it points where we just failed.
            target = hinted if hinted is not None and hinted is not target else self._next(target)
            log.debug("retrying %s after %s: %s (attempt %d)", rpc, status.code.name, status.details, attempt)
            await asyncio.sleep(min(self._backoff(attempt), max(left, 0)))
            attempt += 1

    def _deadline(self, deadline: Optional[float]) -> float:
        return asyncio.get_running_loop().time() + (self._cfg.deadline if deadline is None else deadline)

    def _id(self, scope: str, key: str) -> "pb.RecordId":
        return pb.RecordId(tenant=self._cfg.tenant, scope=scope, key=key)

    async def _write(self, rpc: str, request, deadline: Optional[float] = None, unsure=None) -> Outcome:
        o = await self._call("idem", rpc, lambda budget: (request, budget), self._deadline(deadline), unsure=unsure)
        return outcome_from_pb(o)

    # --- the Idempotency API --------------------------------------------------------------

    async def claim(
        self,
        scope: str,
        key: str,
        owner: str,
        *,
        fingerprint: Optional[Union[Fingerprint, bytes]] = None,
        lease: Optional[float] = None,
        ttl: Optional[float] = None,
        allow_takeover: bool = False,
        deadline: Optional[float] = None,
    ) -> Outcome:
        """Claims a key for ``owner``. Retries keep the same owner, so a claim whose reply
        was lost comes back ACQUIRED with the same token. ``lease``/``ttl`` None: the
        server's defaults."""
        req = pb.ClaimRequest(
            id=self._id(scope, key),
            fingerprint=_fp(fingerprint),
            owner=owner,
            lease_ms=_ms(lease),
            ttl_ms=_ms(ttl),
            allow_takeover=allow_takeover,
        )
        return await self._write("Claim", req, deadline)

    async def complete(self, scope: str, key: str, token: int, response: StoredResponse, *, deadline: Optional[float] = None) -> Outcome:
        """Completes an owned key with the response to replay."""
        req = pb.CompleteRequest(id=self._id(scope, key), token=token, response=response.to_pb())
        return await self._write("Complete", req, deadline)

    async def fail(
        self,
        scope: str,
        key: str,
        token: int,
        retryable: bool,
        response: Optional[StoredResponse] = None,
        *,
        deadline: Optional[float] = None,
    ) -> Outcome:
        """Fails an owned key: retryable (the next claim re-acquires) or terminal with an
        error response that is stored and replayed."""
        req = pb.FailRequest(id=self._id(scope, key), token=token, retryable=retryable)
        if response is not None:
            req.response.CopyFrom(response.to_pb())
        unsure = [False]
        outcome = await self._write("Fail", req, deadline, unsure=unsure)
        # A retryable Fail leaves the key FAILED and the next claim grants it again with a new
        # token: if an earlier attempt of this call may have gone through, a STALE_TOKEN now
        # may mean just that. Saying "stale" would be a guess.
        if retryable and unsure[0] and isinstance(outcome, StaleToken):
            raise E.OutcomeUnknown(
                "an earlier attempt of this Fail got no answer, and the key now has token %d: "
                "the Fail may have gone through before the key was granted again" % outcome.current
            )
        return outcome

    async def extend_lease(self, scope: str, key: str, token: int, lease: Optional[float] = None, *, deadline: Optional[float] = None) -> Outcome:
        """Extends an owned key's lease (None: the server's default length)."""
        req = pb.ExtendLeaseRequest(id=self._id(scope, key), token=token, lease_ms=_ms(lease))
        return await self._write("ExtendLease", req, deadline)

    async def checkpoint(
        self,
        scope: str,
        key: str,
        token: int,
        recovery_point: str,
        data: bytes = b"",
        lease: Optional[float] = None,
        *,
        deadline: Optional[float] = None,
    ) -> Outcome:
        """Records progress (handed to whoever takes over) and extends the lease."""
        req = pb.CheckpointRequest(
            id=self._id(scope, key), token=token, recovery_point=recovery_point, data=bytes(data), lease_ms=_ms(lease)
        )
        return await self._write("Checkpoint", req, deadline)

    async def takeover(
        self, scope: str, key: str, owner: str, *, force: bool = False, lease: Optional[float] = None, deadline: Optional[float] = None
    ) -> Outcome:
        """Takes over an IN_PROGRESS key whose lease expired (any, with ``force``)."""
        req = pb.TakeoverRequest(id=self._id(scope, key), owner=owner, force=force, lease_ms=_ms(lease))
        return await self._write("Takeover", req, deadline)

    async def get(self, scope: str, key: str, *, deadline: Optional[float] = None) -> Optional[Record]:
        """Reads one record linearizably; None when there is no live record."""
        req = pb.GetRequest(id=self._id(scope, key))
        r = await self._call("idem", "Get", lambda budget: (req, budget), self._deadline(deadline))
        return Record.from_pb(r.record) if r.HasField("record") else None

    async def wait(self, scope: str, key: str, timeout: float) -> Waited:
        """Waits until the record leaves IN_PROGRESS, at most ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        rid = self._id(scope, key)

        def build(budget: float):
            # A retried wait asks only for what is left of the caller's timeout.
            left = max(0.0, end - loop.time())
            req = pb.WaitRequest(id=rid, timeout_ms=max(1, int(left * 1000)))
            return req, max(budget, left + 0.5)

        r = await self._call("idem", "Wait", build, end + 2.0)
        return Waited(Record.from_pb(r.record) if r.HasField("record") else None, r.timed_out)

    async def list(
        self,
        *,
        scope: str = "",
        state: Optional[RecordState] = None,
        abandoned_only: bool = False,
        start_after: Optional[RecordId] = None,
        limit: int = 0,
        tenant: Optional[str] = None,
        deadline: Optional[float] = None,
    ) -> ListPage:
        """One page of a tenant's records in key order (at most ``limit``, 0 = 100, and
        4 MiB); while ``next_after`` is set, pass it as ``start_after``."""
        tenant = self._cfg.tenant if tenant is None else tenant
        req = pb.ListRequest(
            tenant=tenant,
            scope=scope,
            state=RecordState(state).to_proto() if state is not None else pb.RECORD_STATE_UNSPECIFIED,
            abandoned_only=abandoned_only,
            limit=limit,
        )
        if start_after is not None:
            # A record id's empty tenant means `default`, not the listed tenant.
            req.start_after.CopyFrom(pb.RecordId(tenant=start_after.tenant or tenant, scope=start_after.scope, key=start_after.key))
        r = await self._call("idem", "List", lambda budget: (req, budget), self._deadline(deadline))
        nxt = RecordId(r.next_after.tenant, r.next_after.scope, r.next_after.key) if r.HasField("next_after") else None
        return ListPage([Record.from_pb(x) for x in r.records], nxt)

    # --- admin ----------------------------------------------------------------------------

    async def node_status(self, index: int, *, with_digest: bool = False) -> "pb.StatusResponse":
        """The status of the node at endpoint ``index``, asked of that node only."""
        t = self._connect(self._targets[index])
        budget = self._cfg.attempt_timeout
        try:
            return await t.admin.Status(pb.StatusRequest(with_digest=with_digest), timeout=budget, metadata=self._metadata)
        except grpc.RpcError as e:
            raise E.from_status(E.Status.from_rpc_error(e)) from None

    async def discover(self) -> Optional[int]:
        """Asks every endpoint for its status and prefers the leader from now on; returns
        the leader's id if any node knows it."""
        leader = None
        for i in range(len(self._targets)):
            try:
                s = await self.node_status(i)
            except IdemraftError:
                continue
            if s.leader_id and s.leader_id == s.id:
                self._preferred = self._targets[i]
                return s.id
            if s.leader_id:
                leader = s.leader_id
                if s.leader_client_addr:
                    self._prefer_addr(s.leader_client_addr)
        return leader

    async def _admin(self, rpc: str, req):
        # Membership changes wait for joint consensus: each attempt gets the whole deadline.
        return await self._call("admin", rpc, lambda budget: (req, budget), self._deadline(None), attempt_timeout=self._cfg.deadline)

    async def set_quota(self, tenant: Optional[str], max_records: Optional[int]) -> Quotas:
        """Sets (an int) or clears (None) the record quota of ``tenant``, or with
        ``tenant=None`` the default quota. Needs an admin token when tokens are checked."""
        req = pb.SetQuotaRequest(tenant=tenant or "", default_quota=tenant is None)
        if max_records is not None:
            req.max_records = max_records
        return _quotas(await self._admin("SetQuota", req))

    async def get_quota(self, tenant: Optional[str] = None) -> Quotas:
        return _quotas(await self._admin("GetQuota", pb.GetQuotaRequest(tenant=tenant or "")))

    # --- execute --------------------------------------------------------------------------

    async def execute(
        self,
        scope: str,
        key: str,
        fingerprint: Optional[Union[Fingerprint, bytes]],
        fn: Callable[[WorkGrant], Union[StoredResponse, Awaitable[StoredResponse]]],
        *,
        lease: float = 30.0,
        ttl: Optional[float] = None,
        deadline: float = 30.0,
        owner: Optional[str] = None,
        allow_takeover: bool = True,
    ) -> Executed:
        """Runs ``fn`` at most once for this key (contract §4):

        - claims, with one owner id for every retry of this execution (give ``owner`` to
          make a restarted process resume its own claim);
        - on ACQUIRED runs ``fn(work_grant)`` (a coroutine function or a plain one) while a
          background task extends the lease every third of ``lease``; then completes the key
          with the returned ``StoredResponse``, or fails it: ``RetryableWorkError`` releases
          it, ``TerminalWorkError(response)`` stores that error response, and any other
          exception releases it and is re-raised;
        - on REPLAY returns the stored response with ``replayed=True``;
        - on IN_PROGRESS waits for the holder and claims again, until ``deadline``;
        - MISMATCH and a lost lease raise ``Mismatch`` and ``LostOwnership``.
        """
        grant = await self._claim_for_execute(scope, key, fingerprint, lease, ttl, deadline, owner, allow_takeover)
        if isinstance(grant, Executed):
            return grant
        return await self.run_granted(scope, key, grant, fn, lease=lease, settle_timeout=deadline)

    async def _claim_for_execute(self, scope, key, fingerprint, lease, ttl, deadline, owner, allow_takeover):
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        owner = owner or keys.random("owner-")
        reserve = min(0.5, deadline / 4)
        while True:
            o = await self.claim(
                scope, key, owner, fingerprint=fingerprint, lease=lease, ttl=ttl, allow_takeover=allow_takeover,
                deadline=max(0.0, end - loop.time()),
            )
            if isinstance(o, Acquired):
                return o
            if isinstance(o, Replay):
                return Executed(o.token, o.response, True)
            if isinstance(o, MismatchOutcome):
                raise E.Mismatch()
            if isinstance(o, InProgressOutcome):
                left = end - loop.time()
                # Time is kept back for the claim after the wait: a wait that used up the
                # deadline would leave that claim none, and the caller would get a deadline
                # (an unknown outcome) instead of the answer it was waiting to give, "still
                # held by another worker".
                if left - reserve < 0.010:
                    raise E.InProgress(o.lease_expires_ms)
                # Wait for the holder to settle, at most until its lease could expire (so a
                # takeover is attempted promptly) and never past our deadline.
                await self.wait(scope, key, min(left - reserve, max(o.retry_after_ms, 100) / 1000.0 * 4))
                continue
            raise E.UnexpectedOutcome(o.name)

    async def run_granted(
        self,
        scope: str,
        key: str,
        grant: Grant,
        fn: Callable[[WorkGrant], Any],
        *,
        lease: float,
        settle_timeout: float = 30.0,
    ) -> Executed:
        """The second half of ``execute``, for a caller that made the claim itself (the HTTP
        middleware): runs ``fn`` under ``grant`` with the lease kept alive, then settles the
        key. Settling is retried for up to ``settle_timeout`` while the cluster is
        unreachable: the work is done, and an unsettled key would make a retry wait out the
        lease and run it again."""
        work = WorkGrant(grant, asyncio.Event())
        keeper = asyncio.ensure_future(self._keep_alive(scope, key, grant.token, lease, work.lost_event))
        try:
            raised: Optional[BaseException] = None
            try:
                result = fn(work)
                if inspect.isawaitable(result):
                    result = await result
                if not isinstance(result, StoredResponse):
                    raise TypeError("execute's work must return a StoredResponse, not %r" % type(result).__name__)
                kind, payload = "ok", result
            except RetryableWorkError as e:
                kind, payload = "retry", str(e) or "the work failed"
            except TerminalWorkError as e:
                kind, payload = "terminal", e.response
            except asyncio.CancelledError:
                # The caller gave up on this execution: as when the Rust future is dropped, the
                # lease is left to run out, and nothing is settled on a result nobody has.
                raise
            except Exception as e:
                kind, payload, raised = "retry", "the work raised %s: %s" % (type(e).__name__, e), e
            outcome = await self._settle(scope, key, grant.token, kind, payload, settle_timeout)
        finally:
            keeper.cancel()
        token = grant.token
        if isinstance(outcome, StaleToken):
            raise E.LostOwnership(token, outcome.current)
        if raised is not None:
            if isinstance(outcome, Failed) and outcome.retryable:
                raise raised
            raise E.UnexpectedOutcome(outcome.name) from raised
        if kind == "ok" and isinstance(outcome, Completed):
            return Executed(token, payload, False)
        if kind == "terminal" and isinstance(outcome, Failed) and not outcome.retryable:
            return Executed(token, payload, False)
        if kind == "retry" and isinstance(outcome, Failed) and outcome.retryable:
            raise E.WorkFailed(payload)
        raise E.UnexpectedOutcome(outcome.name)

    async def _settle(self, scope, key, token, kind, payload, settle_timeout: float) -> Outcome:
        loop = asyncio.get_running_loop()
        until = loop.time() + settle_timeout
        while True:
            try:
                if kind == "ok":
                    return await self.complete(scope, key, token, payload)
                if kind == "terminal":
                    return await self.fail(scope, key, token, False, payload)
                return await self.fail(scope, key, token, True)
            except IdemraftError as e:
                if e.indeterminate and loop.time() < until:
                    log.warning("settling %s/%s (token %d) failed; retrying: %s", scope, key, token, e)
                    continue
                raise

    async def _keep_alive(self, scope: str, key: str, token: int, lease: float, lost: asyncio.Event) -> None:
        period = lease / 3.0
        while True:
            await asyncio.sleep(period)
            try:
                o = await self.extend_lease(scope, key, token, lease)
            except IdemraftError as e:
                log.debug("lease extension of %s/%s failed; retrying: %s", scope, key, e)
                continue
            if not isinstance(o, LeaseExtended):
                log.warning("lease of %s/%s (token %d) lost while the work ran: %s", scope, key, token, o.name)
                lost.set()
                return


def _quotas(r: "pb.QuotaResponse") -> Quotas:
    return Quotas(
        r.default_max_records if r.HasField("default_max_records") else None,
        [TenantQuota(t.tenant, t.records, t.max_records if t.HasField("max_records") else None, t.own) for t in r.tenants],
    )
