"""The ASGI middleware's HTTP logic against a scripted fake client (no cluster): every
answer of the contract, what is stored, what is released, and the token handed over."""

import asyncio
import json

import grpc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.routing import Route

from idemraft import errors as E
from idemraft.aio import RetryableWorkError, TerminalWorkError
from idemraft.asgi import IdempotencyMiddleware, default_store_policy, parse_key, KeyHeaderError, retry_after_secs
from idemraft.types import Acquired, Completed, Executed, InProgressOutcome, MismatchOutcome, Replay, StoredResponse, Waited

KEY = "8e03978e-40d5-43e8-bc93-6894a57f9324"


class FakeClient:
    """Answers claims from a script and records how keys were settled."""

    def __init__(self, *claims):
        self.claims = list(claims)
        self.claimed = []
        self.settled = []

    async def claim(self, scope, key, owner, **kw):
        self.claimed.append((scope, key, owner, kw))
        c = self.claims.pop(0)
        if isinstance(c, Exception):
            raise c
        return c

    async def wait(self, scope, key, timeout):
        return Waited(None, False)

    async def run_granted(self, scope, key, grant, fn, **kw):
        try:
            r = await fn(None)
        except RetryableWorkError as e:
            self.settled.append(("retry", str(e)))
            raise E.WorkFailed(str(e))
        except TerminalWorkError as e:
            self.settled.append(("terminal", e.response))
            return Executed(grant.token, e.response, False)
        self.settled.append(("complete", r))
        return Executed(grant.token, r, False)


GRANT = Acquired(token=4242, attempt=1, takeover=False, lease_expires_ms=1, expires_ms=2)
runs = []


async def charge(request):
    runs.append(getattr(request.state, "idemraft_token", None))
    status = int(request.query_params.get("status", "201"))
    if request.query_params.get("raise"):
        raise RuntimeError("boom")
    body = request.query_params.get("body", "{\"token\":%s}" % json.dumps(request.state.idemraft_token))
    return Response(body, status, headers={"content-type": "application/json", "location": "/c/1", "set-cookie": "s=1"})


def app(client, **kw):
    return Starlette(routes=[Route("/c", charge, methods=["GET", "POST"])],
                     middleware=[Middleware(IdempotencyMiddleware, client=client, scope="t.scope", **kw)])


def send(application, method="POST", headers=(), body=b"{}", path="/c"):
    async def go():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as h:
            return await h.request(method, path, headers=list(headers), content=body)
    return asyncio.run(go())


def problem(r, status, slug):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["type"] == "urn:idemraft:problem:" + slug and p["status"] == status and p["title"]
    return p


@pytest.fixture(autouse=True)
def clear_runs():
    runs.clear()


def test_refusals_before_any_claim():
    c = FakeClient()
    a = app(c, max_body_bytes=8)
    assert "idempotency-key header" in problem(send(a), 400, "missing-idempotency-key")["detail"]
    assert "16 to 255" in problem(send(a, headers=[("idempotency-key", "short")]), 400, "malformed-idempotency-key")["detail"]
    p = problem(send(a, headers=[("idempotency-key", KEY), ("idempotency-key", KEY)]), 400, "malformed-idempotency-key")
    assert "more than once" in p["detail"]
    assert "8 bytes" in problem(send(a, headers=[("idempotency-key", KEY)], body=b'{"amount": 100}'), 413, "body-too-large")["detail"]
    assert c.claimed == [] and runs == []


def test_safe_methods_and_optional_keys_run_unprotected():
    c = FakeClient()
    r = send(app(c), method="GET", headers=[("idempotency-key", KEY)])
    assert r.status_code == 201 and runs == [None] and c.claimed == []
    r = send(app(c, key_required=False))
    assert r.status_code == 201 and r.json() == {"token": None} and c.claimed == []


def test_acquired_runs_with_the_token_and_stores_only_allowed_headers():
    c = FakeClient(GRANT)
    r = send(app(c), headers=[("idempotency-key", '"%s"' % KEY)], body=b'{"b":1, "a":2}')
    assert r.status_code == 201 and r.json() == {"token": 4242} and r.headers["set-cookie"] == "s=1"
    assert runs == [4242]
    scope, key, owner, kw = c.claimed[0]
    assert (scope, key) == ("t.scope", KEY) and owner.startswith("http-")
    from idemraft import fingerprint
    assert kw["fingerprint"] == fingerprint("POST", "/c", b'{"a":2,"b":1}')
    kind, stored = c.settled[0]
    assert kind == "complete" and stored.status == 201
    assert stored.headers == (("content-type", "application/json"), ("location", "/c/1"))
    assert stored.body == b'{"token":4242}'


def test_replay_mismatch_in_flight():
    stored = StoredResponse(201, (("content-type", "application/json"), ("location", "/c/9")), b"stored!")
    c = FakeClient(Replay(1, 2, stored), MismatchOutcome(), InProgressOutcome(5, 29500))
    a = app(c)
    r = send(a, headers=[("idempotency-key", KEY)])
    assert (r.status_code, r.content, r.headers["location"], r.headers["idempotent-replayed"]) == (201, b"stored!", "/c/9", "true")
    assert r.headers["content-length"] == "7"
    problem(send(a, headers=[("idempotency-key", KEY)]), 422, "idempotency-key-reused")
    r = send(a, headers=[("idempotency-key", KEY)])
    problem(r, 409, "request-in-progress")
    assert r.headers["retry-after"] == "1"
    assert runs == []


def test_unavailable_is_503_or_fail_open_and_quota_is_429():
    down = E.Unavailable("no leader")
    r = send(app(FakeClient(down)), headers=[("idempotency-key", KEY)])
    problem(r, 503, "idempotency-store-unavailable")
    assert r.headers["retry-after"] == "1" and runs == []
    unknown = E.OutcomeUnknown("the connection broke")
    r = send(app(FakeClient(unknown), fail_open=True), headers=[("idempotency-key", KEY)])
    assert r.status_code == 201 and r.json() == {"token": None} and runs == [None]
    p = problem(send(app(FakeClient(E.QuotaExceeded("quota", "acme", 3, 3)), fail_open=True),
                     headers=[("idempotency-key", KEY)]), 429, "idempotency-quota-exceeded")
    assert "acme" not in p["detail"]
    problem(send(app(FakeClient(E.InvalidArgument("scope has a forbidden character"))), headers=[("idempotency-key", KEY)]),
            500, "idempotency-internal")
    assert runs == [None]


@pytest.mark.parametrize("status,kind", [(200, "complete"), (402, "terminal"), (422, "terminal"), (409, "retry"),
                                         (429, "retry"), (408, "retry"), (500, "retry"), (503, "retry")])
def test_store_policy(status, kind):
    c = FakeClient(GRANT)
    r = send(app(c), headers=[("idempotency-key", KEY)], path="/c?status=%d" % status)
    assert r.status_code == status
    assert c.settled[0][0] == kind
    assert default_store_policy(status) == (kind != "retry")


def test_a_raising_handler_is_500_and_released():
    c = FakeClient(GRANT)
    problem(send(app(c), headers=[("idempotency-key", KEY)], path="/c?raise=1"), 500, "handler-failed")
    assert c.settled[0][0] == "retry" and "boom" in c.settled[0][1]


def test_a_too_large_response_reaches_the_caller_whole_and_is_stored_as_a_marker():
    c = FakeClient(GRANT)
    r = send(app(c, max_stored_body_bytes=4), headers=[("idempotency-key", KEY)], path="/c?body=0123456789")
    assert r.content == b"0123456789"
    kind, stored = c.settled[0]
    assert stored.status == 201 and ("location", "/c/1") in stored.headers
    assert stored.headers[-1] == ("content-type", "application/problem+json")
    assert b"response-not-stored" in stored.body


def test_key_parsing_and_validation():
    assert parse_key([]) is None
    assert parse_key([KEY.encode()]) == KEY
    assert parse_key([('  "%s"\t' % KEY).encode()]) == KEY
    for bad in [[b"short"], [b"k" * 256], [b"has space in the key 123"], [b"slash/not/allowed/in/keys"],
                [('"' + KEY).encode()], [b'"abc\\"defghijklmnopqrs"'], ["clé-0000000000000000".encode()], [KEY.encode()] * 2]:
        with pytest.raises(KeyHeaderError):
            parse_key(bad)
    assert [retry_after_secs(x) for x in (0, 1, 1000, 1001, 29500)] == [1, 1, 1, 2, 30]
    with pytest.raises(ValueError):
        IdempotencyMiddleware(None, client=None, scope="has space")
    with pytest.raises(ValueError):
        IdempotencyMiddleware(None, client=None, scope="ok", lease=0.01)
