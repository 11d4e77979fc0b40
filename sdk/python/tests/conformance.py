"""The Python runner of the shared conformance scenarios (``sdk/conformance/README.md``
defines the format): placeholders, steps, views, matching. Client scenarios run through
``AsyncClient``; HTTP scenarios through ``IdempotencyMiddleware`` in a FastAPI or a
Starlette app served by uvicorn on a free loopback port, with httpx as the HTTP client.
"""

import asyncio
import base64
import json
import re
import secrets
from pathlib import Path
from typing import Any, Dict, List

import httpx

from idemraft import AsyncClient, ClientConfig, IdemraftError, RetryableWorkError, StoredResponse, TerminalWorkError
from idemraft.asgi import IdempotencyMiddleware
from idemraft.fingerprint import fingerprint
from idemraft.types import (
    Acquired, Completed, Executed, Failed, InProgressOutcome, LeaseExtended, MismatchOutcome, NotFound, Record,
    RecordState, Replay, StaleToken, Waited, WrongState,
)

from cluster import REPO, free_ports

SCENARIOS_FILE = REPO / "sdk" / "conformance" / "scenarios.json"
GATE_LIMIT = 60.0


def load() -> dict:
    return json.loads(SCENARIOS_FILE.read_text(encoding="utf-8"))


class Failure(AssertionError):
    pass


# --- placeholders ---------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


class Vars:
    def __init__(self):
        self.run = secrets.token_hex(8)
        self.captured: Dict[str, Any] = {}

    def value(self, name: str):
        if name == "run":
            return self.run
        if name.startswith("key:"):
            return "cf-%s-%s" % (self.run, name[4:])
        if name.startswith("owner:"):
            return "owner-%s-%s" % (self.run, name[6:])
        if name not in self.captured:
            raise Failure("placeholder ${%s} was never captured" % name)
        return self.captured[name]

    def sub(self, v):
        if isinstance(v, str):
            m = _PLACEHOLDER.fullmatch(v)
            if m:
                return self.value(m.group(1))
            return _PLACEHOLDER.sub(lambda m: str(self.value(m.group(1))), v)
        if isinstance(v, list):
            return [self.sub(x) for x in v]
        if isinstance(v, dict):
            return {k: self.sub(x) for k, x in v.items()}
        return v


# --- bytes and views --------------------------------------------------------------------

def to_bytes(v) -> bytes:
    if v is None:
        return b""
    if isinstance(v, dict):
        return base64.b64decode(v["base64"])
    return v.encode("utf-8")


def render_bytes(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode("ascii")}


def stored(spec) -> StoredResponse:
    return StoredResponse(int(spec["status"]), tuple((n, v) for n, v in spec.get("headers", [])), to_bytes(spec.get("body")))


def response_view(r: StoredResponse):
    return {"status": r.status, "headers": [[n, v] for n, v in r.headers], "body": render_bytes(r.body)}


def record_view(r: Record):
    if r is None:
        return None
    return {
        "tenant": r.tenant, "scope": r.scope, "key": r.key, "state": r.state.value, "token": r.token, "owner": r.owner,
        "attempt": r.attempt, "taken_over": r.taken_over, "lease_expires_ms": r.lease_expires_ms,
        "created_ms": r.created_ms, "updated_ms": r.updated_ms, "completed_ms": r.completed_ms,
        "expires_ms": r.expires_ms, "retention_ms": r.retention_ms, "recovery_point": r.recovery_point,
        "checkpoint": render_bytes(r.checkpoint), "response": response_view(r.response) if r.response else None,
        "fingerprint": r.fingerprint.hex(),
    }


def outcome_view(o):
    v = {"outcome": o.name}
    if isinstance(o, Acquired):
        v.update(token=o.token, attempt=o.attempt, takeover=o.takeover, lease_expires_ms=o.lease_expires_ms,
                 expires_ms=o.expires_ms, recovery_point=o.recovery_point, checkpoint=render_bytes(o.checkpoint))
    elif isinstance(o, Replay):
        v.update(token=o.token, completed_ms=o.completed_ms, response=response_view(o.response))
    elif isinstance(o, InProgressOutcome):
        v.update(lease_expires_ms=o.lease_expires_ms, retry_after_ms=o.retry_after_ms)
    elif isinstance(o, StaleToken):
        v.update(current=o.current)
    elif isinstance(o, WrongState):
        v.update(state=o.state.value)
    elif isinstance(o, (Completed,)):
        v.update(token=o.token)
    elif isinstance(o, Failed):
        v.update(token=o.token, retryable=o.retryable)
    elif isinstance(o, LeaseExtended):
        v.update(token=o.token, lease_expires_ms=o.lease_expires_ms)
    elif not isinstance(o, (MismatchOutcome, NotFound)):
        raise Failure("unknown outcome %r" % (o,))
    return v


def error_view(e: IdemraftError):
    v = {"error": e.kind, "message": e.message, "indeterminate": e.indeterminate}
    for attr in ("tenant", "limit", "records", "lease_expires_ms", "token", "current"):
        if hasattr(e, attr):
            v[attr] = getattr(e, attr)
    return v


def http_view(r: httpx.Response):
    headers: Dict[str, Any] = {}
    for n, val in r.headers.multi_items():
        n = n.lower()
        if n in headers:
            headers[n] = (headers[n] if isinstance(headers[n], list) else [headers[n]]) + [val]
        else:
            headers[n] = val
    body = r.content
    try:
        parsed = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        parsed = None
    return {"status": r.status_code, "headers": headers, "body": render_bytes(body), "json": parsed}


# --- matching ---------------------------------------------------------------------------

def _same(a, b) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def match(exp, act, path="$") -> List[str]:
    if isinstance(exp, dict) and len(exp) == 1 and next(iter(exp)).startswith("$"):
        op, arg = next(iter(exp.items()))
        num = isinstance(act, int) and not isinstance(act, bool)
        ok = {
            "$gt": lambda: num and act > arg, "$gte": lambda: num and act >= arg,
            "$lt": lambda: num and act < arg, "$lte": lambda: num and act <= arg,
            "$between": lambda: num and arg[0] <= act <= arg[1],
            "$ne": lambda: not _same(arg, act),
            "$in": lambda: any(_same(a, act) for a in arg),
            "$contains": lambda: isinstance(act, str) and arg in act,
            "$any_of": lambda: any(not match(a, act, path) for a in arg),
        }
        if op not in ok:
            raise Failure("unknown matcher %s at %s" % (op, path))
        return [] if ok[op]() else ["%s: %r does not match %s %r" % (path, act, op, arg)]
    if isinstance(exp, dict):
        if not isinstance(act, dict):
            return ["%s: expected an object, got %r" % (path, act)]
        out = []
        for k, v in exp.items():
            if v is None:
                if act.get(k) is not None:
                    out.append("%s.%s: expected null/absent, got %r" % (path, k, act.get(k)))
                continue
            if k not in act:
                out.append("%s.%s: missing (have %s)" % (path, k, sorted(act)))
                continue
            out += match(v, act[k], "%s.%s" % (path, k))
        return out
    if isinstance(exp, list):
        if not isinstance(act, list) or len(act) != len(exp):
            return ["%s: expected %d items %r, got %r" % (path, len(exp), exp, act)]
        out = []
        for i, (e, a) in enumerate(zip(exp, act)):
            out += match(e, a, "%s[%d]" % (path, i))
        return out
    return [] if _same(exp, act) else ["%s: expected %r, got %r" % (path, exp, act)]


def match_http(exp, view) -> List[str]:
    exp = dict(exp)
    problem = exp.pop("problem", None)
    out = match(exp, view)
    if problem is not None:
        ct = view["headers"].get("content-type")
        if ct != "application/problem+json":
            out.append("problem: content-type is %r" % ct)
        j = view["json"]
        if not isinstance(j, dict):
            out.append("problem: body is not a JSON object: %r" % view["body"])
        else:
            if j.get("type") != problem["type"]:
                out.append("problem: type %r != %r" % (j.get("type"), problem["type"]))
            if j.get("status") != view["status"]:
                out.append("problem: status %r != %r" % (j.get("status"), view["status"]))
            if not (isinstance(j.get("title"), str) and j["title"]):
                out.append("problem: title %r" % j.get("title"))
            d = j.get("detail")
            if not isinstance(d, str) or problem.get("detail_contains", "") not in d:
                out.append("problem: detail %r lacks %r" % (d, problem.get("detail_contains")))
    return out


def path_get(view, path: str):
    cur = view
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise Failure("capture path %r not in %r" % (path, view))
    return cur


# --- gates and counters -----------------------------------------------------------------

class Gates:
    def __init__(self):
        self.entered: Dict[str, asyncio.Event] = {}
        self.opened: Dict[str, asyncio.Event] = {}

    def _get(self, name):
        return self.entered.setdefault(name, asyncio.Event()), self.opened.setdefault(name, asyncio.Event())

    async def block(self, name):
        entered, opened = self._get(name)
        entered.set()
        try:
            await asyncio.wait_for(opened.wait(), GATE_LIMIT)
        except asyncio.TimeoutError:
            pass

    async def await_entered(self, name, timeout):
        entered, _ = self._get(name)
        try:
            await asyncio.wait_for(entered.wait(), timeout)
        except asyncio.TimeoutError:
            raise Failure("nothing entered gate %s within %ss" % (name, timeout)) from None

    def release(self, name):
        self._get(name)[1].set()

    def release_all(self):
        for e in self.opened.values():
            e.set()


# --- apps -----------------------------------------------------------------------------------

def make_handler(spec, counters, gates):
    from starlette.responses import Response

    async def handler(request):
        n = 0
        if spec.get("count"):
            counters[spec["count"]] = n = counters.get(spec["count"], 0) + 1
        if spec.get("block"):
            await gates.block(spec["block"])
        if spec.get("sleep_ms"):
            await asyncio.sleep(spec["sleep_ms"] / 1000)
        if n in spec.get("raise_on_runs", []):
            raise RuntimeError("planned handler failure on run %d" % n)
        token = getattr(request.state, "idemraft_token", None)
        claim = getattr(request.state, "idemraft_claim", None)
        body = to_bytes(spec.get("body"))
        body = body.replace(b"{{token}}", b"null" if token is None else str(token).encode())
        body = body.replace(b"{{attempt}}", b"null" if claim is None else str(claim.attempt).encode())
        return Response(content=body, status_code=spec["status"], headers={n: v for n, v in spec.get("headers", [])})

    return handler


def middleware_kwargs(mw, client):
    in_flight = mw.get("in_flight", "conflict")
    return dict(
        client=client,
        scope=mw["scope"],
        lease=mw.get("lease_ms", 30000) / 1000,
        wait_for_in_flight=None if in_flight == "conflict" else in_flight["wait_ms"] / 1000,
        fail_open=mw.get("fail_open", False),
        key_required=mw.get("key_required", True),
        max_body_bytes=mw.get("max_body_bytes", 1048576),
        replay_headers=("content-type", "location", "etag") + tuple(mw.get("replay_headers_add", [])),
        cluster_timeout=mw.get("cluster_timeout_ms", 5000) / 1000,
    )


def build_app(framework, app_spec, client, counters, gates):
    kwargs = middleware_kwargs(app_spec["middleware"], client)
    if framework == "starlette":
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.routing import Route

        routes = [Route(r["path"], make_handler(r["handler"], counters, gates), methods=[r["method"]]) for r in app_spec["routes"]]
        return Starlette(routes=routes, middleware=[Middleware(IdempotencyMiddleware, **kwargs)])
    from fastapi import FastAPI

    app = FastAPI()
    for r in app_spec["routes"]:
        app.add_api_route(r["path"], _fastapi_endpoint(make_handler(r["handler"], counters, gates)), methods=[r["method"]])
    app.add_middleware(IdempotencyMiddleware, **kwargs)
    return app


def _fastapi_endpoint(handler):
    from fastapi import Request

    async def endpoint(request: Request):
        return await handler(request)

    return endpoint


class Served:
    """An ASGI app served by uvicorn on a free loopback port, in this event loop."""

    def __init__(self, app):
        import uvicorn

        self.port = free_ports(1)[0]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"))
        self.task = None

    async def __aenter__(self):
        self.task = asyncio.ensure_future(self.server.serve())
        for _ in range(200):
            if self.server.started:
                return self
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.025)
        raise Failure("uvicorn did not start")

    async def __aexit__(self, *exc):
        self.server.should_exit = True
        try:
            await asyncio.wait_for(self.task, 10)
        except asyncio.TimeoutError:
            self.task.cancel()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port


# --- the runner ---------------------------------------------------------------------------

class Runner:
    def __init__(self, scenario, cluster, defaults, framework=None):
        self.s = scenario
        self.cluster = cluster
        self.defaults = defaults
        self.framework = framework
        self.vars = Vars()
        self.counters: Dict[str, int] = {}
        self.gates = Gates()
        self.handles: Dict[str, asyncio.Task] = {}
        self.http = None
        self.base = None

    def client(self, **kw):
        return AsyncClient(ClientConfig(endpoints=self.cluster.endpoints, deadline=self.defaults["client"]["deadline_ms"] / 1000, **kw))

    async def run(self):
        tenant = self.vars.sub(self.s.get("tenant", ""))
        self.c = self.client(tenant=tenant)
        clients = [self.c]
        try:
            if self.s["kind"] == "http":
                app_spec = self.vars.sub(self.s["app"])
                mw = app_spec["middleware"]
                if mw.get("endpoints", "cluster") == "unreachable":
                    mwc = AsyncClient(ClientConfig(endpoints=["127.0.0.1:%d" % p for p in free_ports(2)]))
                else:
                    mwc = self.client()
                clients.append(mwc)
                app = build_app(self.framework, app_spec, mwc, self.counters, self.gates)
                async with Served(app) as served, httpx.AsyncClient(timeout=60.0) as http:
                    self.http, self.base = http, served.url
                    await self.steps()
            else:
                await self.steps()
        finally:
            self.gates.release_all()
            for t in self.handles.values():
                if not t.done():
                    try:
                        await asyncio.wait_for(t, 30)
                    except BaseException:
                        t.cancel()
            for c in clients:
                await c.close()

    async def steps(self):
        for i, raw in enumerate(self.s["steps"]):
            step_where = "step %d (%s)" % (i, raw["op"])
            try:
                await self.step(raw)
            except Failure as e:
                raise Failure("%s: %s" % (step_where, e)) from None

    async def step(self, raw):
        op = raw["op"]
        if op == "sleep":
            await asyncio.sleep(raw["ms"] / 1000)
            return
        if op == "kill_leader":
            await asyncio.get_running_loop().run_in_executor(None, self.cluster.kill_leader)
            return
        if op == "await_blocked":
            await self.gates.await_entered(raw["gate"], raw.get("timeout_ms", 10000) / 1000)
            return
        if op == "release":
            self.gates.release(raw["gate"])
            return
        if op == "counter":
            got = self.counters.get(raw["name"], 0)
            bad = match(raw["expect"], got, "counter " + raw["name"])
            if bad:
                raise Failure("; ".join(bad))
            return
        if op == "join":
            task = self.handles.pop(raw["handle"])
            try:
                view = await asyncio.wait_for(task, raw.get("timeout_ms", 60000) / 1000)
            except asyncio.TimeoutError:
                raise Failure("background %s did not finish" % raw["handle"]) from None
            self.check(raw, view, http=isinstance(view, dict) and "status" in view and "json" in view)
            return
        step = self.vars.sub({k: v for k, v in raw.items() if k not in ("expect", "capture")})
        if "background" in step:
            self.handles[step["background"]] = asyncio.ensure_future(self.perform(step))
            return
        view = await self.perform(step)
        self.check(raw, view, http=op == "request")

    def check(self, raw, view, http):
        if "expect" in raw:
            exp = self.vars.sub(raw["expect"])
            bad = match_http(exp, view) if http else match(exp, view)
            if bad:
                raise Failure("; ".join(bad) + "\n  view: " + json.dumps(view, default=str)[:2000])
        elif isinstance(view, dict) and "error" in view:
            raise Failure("unexpected error %r" % view)
        for var, path in raw.get("capture", {}).items():
            self.vars.captured[var] = path_get(view, path)

    async def perform(self, s):
        op = s["op"]
        if op == "request":
            r = await self.http.request(s["method"], self.base + s["path"], headers=[(n, v) for n, v in s.get("headers", [])],
                                        content=to_bytes(s.get("body")))
            return http_view(r)
        c = self.c
        fp = s.get("fingerprint")
        fpv = fingerprint(fp["method"], fp["path"], to_bytes(fp.get("body"))) if fp else None
        ms = lambda k: None if not s.get(k) else s[k] / 1000  # noqa: E731  (0/absent: server default)
        try:
            if op == "claim":
                return outcome_view(await c.claim(s["scope"], s["key"], s["owner"], fingerprint=fpv, lease=ms("lease_ms"),
                                                  ttl=ms("ttl_ms"), allow_takeover=s.get("allow_takeover", False)))
            if op == "complete":
                return outcome_view(await c.complete(s["scope"], s["key"], s["token"], stored(s["response"])))
            if op == "fail":
                resp = stored(s["response"]) if s.get("response") else None
                return outcome_view(await c.fail(s["scope"], s["key"], s["token"], s["retryable"], resp))
            if op == "extend_lease":
                return outcome_view(await c.extend_lease(s["scope"], s["key"], s["token"], ms("lease_ms")))
            if op == "checkpoint":
                return outcome_view(await c.checkpoint(s["scope"], s["key"], s["token"], s["recovery_point"],
                                                       to_bytes(s.get("data")), ms("lease_ms")))
            if op == "takeover":
                return outcome_view(await c.takeover(s["scope"], s["key"], s["owner"], force=s.get("force", False),
                                                     lease=ms("lease_ms")))
            if op == "get":
                return {"record": record_view(await c.get(s["scope"], s["key"]))}
            if op == "wait":
                w: Waited = await c.wait(s["scope"], s["key"], s["timeout_ms"] / 1000)
                return {"record": record_view(w.record), "timed_out": w.timed_out}
            if op == "list":
                page = await c.list(scope=s.get("scope", ""), state=RecordState(s["state"]) if s.get("state") else None,
                                    abandoned_only=s.get("abandoned_only", False), limit=s.get("limit", 0))
                nxt = page.next_after
                return {"records": [record_view(r) for r in page.records],
                        "next_after": None if nxt is None else {"tenant": nxt.tenant, "scope": nxt.scope, "key": nxt.key}}
            if op == "set_quota":
                await c.set_quota(s["tenant"], s["max_records"])
                return {}
            if op == "execute":
                return await self.execute(s, fpv)
        except IdemraftError as e:
            return error_view(e)
        raise Failure("unknown op %s" % op)

    async def execute(self, s, fpv):
        spec = s["work"]

        async def work(wg):
            if spec.get("count"):
                self.counters[spec["count"]] = self.counters.get(spec["count"], 0) + 1
            if spec.get("block"):
                await self.gates.block(spec["block"])
            if spec.get("sleep_ms"):
                await asyncio.sleep(spec["sleep_ms"] / 1000)
            result = spec["result"]
            if "respond" in result:
                return stored(result["respond"])
            if "fail_retryable" in result:
                raise RetryableWorkError(result["fail_retryable"])
            raise TerminalWorkError(stored(result["fail_terminal"]))

        e: Executed = await self.c.execute(s["scope"], s["key"], fpv, work, lease=s["lease_ms"] / 1000,
                                           deadline=s["deadline_ms"] / 1000, owner=s.get("owner"),
                                           allow_takeover=s.get("allow_takeover", True))
        return {"outcome": "EXECUTED", "token": e.token, "replayed": e.replayed, "response": response_view(e.response)}
