"""The error taxonomy and the retry loop without a cluster: status mapping, broken
connections as unknown outcomes (retried on another node), quota refusals, leader hints,
dead endpoints, stopped nodes passed over, jittered backoff, secrets kept out of reprs, bearer
tokens on the wire."""

import asyncio
import random
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

import idemraft
from idemraft import errors as E
from idemraft.aio import AsyncClient, ClientConfig
from idemraft.v1 import idemraft_pb2 as pb
from idemraft.v1 import idemraft_pb2_grpc as pb_grpc

S = grpc.StatusCode


def st(code, details="", **md):
    return E.Status(code, details, {k.replace("_", "-"): v for k, v in md.items()})


def test_status_mapping():
    assert isinstance(E.from_status(st(S.INVALID_ARGUMENT, "key is 5 bytes long")), E.InvalidArgument)
    assert E.from_status(st(S.INVALID_ARGUMENT, "key is 5 bytes long")).message == "key is 5 bytes long"
    assert isinstance(E.from_status(st(S.UNAVAILABLE, "no leader is available (election); retry with backoff")), E.Unavailable)
    for code in (S.DEADLINE_EXCEEDED, S.CANCELLED):
        assert isinstance(E.from_status(st(code, "x")), E.DeadlineExceeded)
    assert isinstance(E.from_status(st(S.FAILED_PRECONDITION, "x")), E.Refused)
    q = E.from_status(st(S.FAILED_PRECONDITION, "record quota exceeded", idemraft_quota_tenant="acme",
                         idemraft_quota_limit="3", idemraft_quota_records="3"))
    assert isinstance(q, E.QuotaExceeded) and (q.tenant, q.limit, q.records) == ("acme", 3, 3) and not q.indeterminate
    internal = E.from_status(st(S.INTERNAL, "internal error: state machine: corrupt record"))
    assert isinstance(internal, E.RpcError) and not internal.indeterminate
    assert not E.retryable(st(S.INTERNAL, "internal error: state machine: corrupt record"))
    for code in (S.INVALID_ARGUMENT, S.FAILED_PRECONDITION, S.PERMISSION_DENIED, S.UNAUTHENTICATED):
        assert not E.retryable(st(code, "x"))
    for code in (S.UNAVAILABLE, S.DEADLINE_EXCEEDED, S.CANCELLED, S.RESOURCE_EXHAUSTED, S.UNKNOWN):
        assert E.retryable(st(code, "x"))


@pytest.mark.parametrize("s", [
    st(S.UNAVAILABLE, "Socket closed"), st(S.UNAVAILABLE, "recvmsg:Connection reset by peer"),
    st(S.UNAVAILABLE, "Broken pipe"), st(S.INTERNAL, "Received RST_STREAM with error code 2"),
    st(S.INTERNAL, "h2 protocol error: http2 error"), st(S.UNKNOWN, "transport error"),
    st(S.RESOURCE_EXHAUSTED, "Too many active requests for the connection"),
])
def test_a_broken_connection_is_an_unknown_outcome(s):
    assert E.retryable(s)
    e = E.from_status(s)
    assert isinstance(e, E.OutcomeUnknown) and e.indeterminate and "repeat it" in e.message


def test_a_marked_shed_is_not_a_broken_connection_but_after_an_unknown_attempt_it_is_unknown():
    shed = st(S.RESOURCE_EXHAUSTED, "overloaded: 4096 writes are already queued", idemraft_not_proposed="1")
    assert E.retryable(shed) and E.never_proposed(shed)
    assert isinstance(E.from_status(shed), E.RpcError)
    assert not E.gave_up(shed, False).indeterminate
    assert isinstance(E.gave_up(shed, True), E.OutcomeUnknown)
    refused = st(S.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    assert E.connect_failed(refused) and isinstance(E.from_status(refused), E.Unavailable)


def test_backoff_is_jittered_and_bounded():
    c = AsyncClient(ClientConfig(["127.0.0.1:1"], rng=random.Random(7)))
    seen = set()
    for attempt in range(40):
        b = c._backoff(attempt)
        assert 0 <= b <= min(0.020 * 2 ** min(attempt, 16), 0.250)
        seen.add(round(b, 6))
    assert len(seen) > 5


def test_configuration_is_checked_and_secrets_stay_out_of_reprs():
    with pytest.raises(E.ConfigError):
        AsyncClient([])
    with pytest.raises(E.ConfigError, match="tls_ca"):
        AsyncClient(["https://127.0.0.1:1"])
    with pytest.raises(E.ConfigError, match="empty"):
        AsyncClient(["127.0.0.1:1"], bearer_token="  ")
    with pytest.raises(E.ConfigError):
        AsyncClient(["127.0.0.1:1"], bearer_token="bad\x7ftoken")
    with pytest.raises(E.ConfigError):
        AsyncClient(["127.0.0.1:1"], tls_ca=b"x", tls_cert=b"cert")
    cfg = ClientConfig(["127.0.0.1:1"], bearer_token="s3cret-token", tls_ca=b"ca", tls_cert=b"c", tls_key=b"PRIVATE KEY")
    assert "s3cret" not in repr(cfg) and "PRIVATE" not in repr(cfg)
    assert AsyncClient(cfg).endpoints() == ["https://127.0.0.1:1"]
    with pytest.raises(E.ConfigError, match="cannot read"):
        ClientConfig(["h:1"]).with_tls_files("/nonexistent/ca.pem")


class _RawNode:
    """A node that speaks only enough HTTP/2 to take calls: it answers the handshake and
    reads frames, counting those of type ``counted``; with ``close``, the first one ends the
    connection. ``calls`` is a one-element list."""

    def __init__(self, counted, close):
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(16)
        self._conns = []
        self.addr = "127.0.0.1:%d" % self._srv.getsockname()[1]
        self.calls = [0]
        self._counted, self._close = counted, close
        threading.Thread(target=self._serve, daemon=True).start()

    def _take(self, conn):
        try:
            conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            buf = b""
            at = 24  # after the client's connection preface
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= at + 9:
                    if buf[at + 3] == self._counted:
                        self.calls[0] += 1
                        if self._close:
                            conn.close()
                            return
                    at += 9 + int.from_bytes(buf[at:at + 3], "big")
        except OSError:
            pass

    def _serve(self):
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._take, args=(conn,), daemon=True).start()

    def close(self):
        self._srv.close()
        for c in self._conns:
            c.close()


def breaking_node():
    """A node whose connections break mid-call: it answers the HTTP/2 handshake, reads the
    call (a DATA frame) and closes the socket without an answer, as a node killed mid-call
    does."""
    n = _RawNode(0, True)
    return n, n.addr, n.calls


def test_a_call_whose_connection_breaks_is_retried_elsewhere_then_reported_unknown():
    a, addr_a, calls_a = breaking_node()
    b, addr_b, calls_b = breaking_node()
    try:
        async def go():
            c = AsyncClient([addr_a, addr_b], rng=random.Random(1))
            t = time.monotonic()
            with pytest.raises(E.OutcomeUnknown) as e:
                await c.complete("s", "k" * 16, 7, idemraft.StoredResponse(200), deadline=1.5)
            await c.close()
            return e.value, time.monotonic() - t
        err, took = asyncio.run(go())
        assert err.indeterminate and took >= 1.3, took
        assert calls_a[0] >= 1 and calls_b[0] >= 1, (calls_a, calls_b)
    finally:
        a.close()
        b.close()


class FakeIdempotency(pb_grpc.IdempotencyServicer):
    """A fake node: records the metadata of every call; a follower that answers UNAVAILABLE
    naming the leader, or the leader itself."""

    def __init__(self, leader_addr=None):
        self.leader_addr = leader_addr
        self.seen = []

    def Get(self, request, context):
        self.seen.append(dict(context.invocation_metadata()))
        if self.leader_addr:
            context.set_trailing_metadata((("idemraft-leader-addr", self.leader_addr),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        return pb.GetResponse()


def serve_fake(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_IdempotencyServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, "127.0.0.1:%d" % port


def test_leader_hints_dead_endpoints_and_the_bearer_token():
    leader = FakeIdempotency()
    ls, laddr = serve_fake(leader)
    follower = FakeIdempotency(leader_addr=laddr)
    fs, faddr = serve_fake(follower)
    dead = "127.0.0.1:%d" % _unused_port()
    try:
        async def go():
            c = AsyncClient([dead, faddr], bearer_token="tok-123\n", rng=random.Random(3))
            assert await c.get("s", "k" * 16) is None
            # The follower's hint was followed and is preferred from now on.
            assert c._preferred.url == "http://" + laddr
            assert c.endpoints()[:2] == ["http://" + dead, "http://" + faddr]
            n = len(follower.seen)
            assert await c.get("s", "k" * 16) is None
            assert len(follower.seen) == n, "the second call went to the leader directly"
            await c.close()
        asyncio.run(go())
        assert leader.seen and all(m.get("authorization") == "Bearer tok-123" for m in leader.seen + follower.seen)
    finally:
        ls.stop(0)
        fs.stop(0)


def stopped_node():
    """A node that stopped (SIGSTOP, a partition that drops packets): it takes the connection
    and the call, then never answers. Counts the calls it takes (HEADERS frames opening a
    stream)."""
    n = _RawNode(1, False)
    return n.close, n.addr, n.calls


def test_a_node_that_left_an_attempt_unanswered_is_passed_over_even_when_hinted():
    # A leader that stopped, and a follower that still names it: every new call used to
    # follow that hint into the stopped node and wait out a whole attempt there.
    close_stopped, stopped, calls = stopped_node()
    follower = FakeIdempotency(leader_addr=stopped)
    fs, faddr = serve_fake(follower)
    try:
        async def go():
            c = AsyncClient([stopped, faddr], attempt_timeout=0.3, deadline=0.9, rng=random.Random(5))
            # While nobody leads: the stopped node takes one attempt, the follower refuses the rest.
            with pytest.raises(E.IdemraftError) as e:
                await c.get("s", "k" * 16)
            assert e.value.indeterminate, e.value
            assert calls[0] == 1, "the stopped node was tried %d times within one call" % calls[0]
            assert len(follower.seen) >= 1

            # A leader is back behind the follower: the next call goes there first and is
            # answered within one attempt, without another visit to the stopped node.
            follower.leader_addr = None
            t = time.monotonic()
            assert await c.get("s", "k" * 16) is None
            took = time.monotonic() - t
            assert took < 0.3, took
            assert calls[0] == 1, "the stopped node was tried again"
            await c.close()
        asyncio.run(go())
    finally:
        fs.stop(0)
        close_stopped()


def _unused_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_an_unreachable_cluster_is_unavailable_within_the_deadline():
    async def go():
        c = AsyncClient(["127.0.0.1:%d" % _unused_port()], deadline=0.6)
        t = time.monotonic()
        with pytest.raises(E.Unavailable) as e:
            await c.claim("s", "k" * 16, "owner")
        await c.close()
        return e.value, time.monotonic() - t
    err, took = asyncio.run(go())
    assert err.indeterminate and 0.5 <= took < 2.0, took


def test_generated_keys_keep_the_key_rule():
    from idemraft import keys

    for prefix in ("", "owner-", "http-"):
        keys.validate(keys.random(prefix))
    for bad in ("short", "k" * 256, "has space in the key 123", "slash/not/allowed/in/keys"):
        with pytest.raises(keys.KeyRuleError, match="16 to 255"):
            keys.validate(bad)
