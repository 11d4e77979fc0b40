"""Integration beyond the shared scenarios, on the real cluster: the blocking client
(including execute with a plain function and the keep-alive), and a FastAPI app protected by
the middleware that survives a retry storm through a leader SIGKILL with each key's handler
run exactly once (the Rust analogue is node/tests/http_layer.rs)."""

import asyncio
import time

import httpx
import pytest

import idemraft
from idemraft import Client, StoredResponse
from idemraft.asgi import IdempotencyMiddleware

from conformance import Served


def test_the_blocking_client_claims_completes_and_replays(cluster, rng):
    key = "sync-%016x-a" % rng.getrandbits(64)
    with Client(cluster.endpoints, deadline=10) as c:
        o = c.claim("py.sync", key, "owner-1", lease=10)
        assert isinstance(o, idemraft.Acquired) and o.attempt == 1
        assert isinstance(c.complete("py.sync", key, o.token, StoredResponse(201, (("etag", '"1"'),), b"done")), idemraft.Completed)
        r = c.claim("py.sync", key, "owner-2")
        assert isinstance(r, idemraft.Replay) and r.token == o.token and r.response.body == b"done"
        rec = c.get("py.sync", key)
        assert rec.state == idemraft.RecordState.COMPLETED and rec.response.headers == (("etag", '"1"'),)
        with pytest.raises(idemraft.InvalidArgument, match="16 to 255"):
            c.claim("py.sync", "short", "owner-1")


def test_blocking_execute_keeps_the_lease_and_releases_on_an_exception(cluster, rng):
    key = "sync-%016x-b" % rng.getrandbits(64)
    runs = []
    with Client(cluster.endpoints) as c:
        def slow(work):
            runs.append(work.token)
            time.sleep(2.5)  # over twice the lease: only the keep-alive holds it
            intruder = c.claim("py.sync", key, "intruder", lease=10, allow_takeover=True)
            assert isinstance(intruder, idemraft.InProgressOutcome), intruder
            assert not work.is_lost()
            return StoredResponse(200, (), b"slow")

        e = c.execute("py.sync", key, None, slow, lease=1.0, deadline=20)
        assert (e.replayed, e.response.body, runs) == (False, b"slow", [e.token])
        again = c.execute("py.sync", key, None, slow, lease=1.0)
        assert again.replayed and again.token == e.token and len(runs) == 1

        key2 = key + "-x"

        def broken(work):
            raise ValueError("card network down")

        with pytest.raises(ValueError, match="card network down"):
            c.execute("py.sync", key2, None, broken, lease=5.0)
        assert c.get("py.sync", key2).state == idemraft.RecordState.FAILED


KEYS = 12


def test_a_retry_storm_through_a_leader_kill_runs_each_key_once(cluster, rng):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    async def go():
        client = idemraft.AsyncClient(cluster.endpoints)
        books = {}  # key -> {"charges": n, "highest": token}

        async def charge(request: Request):
            key = request.headers["idempotency-key"]
            token = request.state.idemraft_token
            entry = books.setdefault(key, {"charges": 0, "highest": 0})
            # The bank refuses a token lower than the highest it has seen for the key.
            if token < entry["highest"]:
                return JSONResponse({"error": "stale token"}, status_code=409)
            entry["highest"] = token
            await asyncio.sleep(0.3)
            entry["charges"] += 1
            amount = (await request.json())["amount"]
            return JSONResponse({"charged": amount, "key": key}, status_code=201)

        app = FastAPI()
        app.add_api_route("/v1/charges", charge, methods=["POST"])
        app.add_middleware(IdempotencyMiddleware, client=client, scope="py.storm", lease=5.0)
        run = "%012x" % rng.getrandbits(48)

        async with Served(app) as served, httpx.AsyncClient(timeout=30) as http:
            url = served.url + "/v1/charges"

            async def careful(key, body, timeout, seed):
                jitter = __import__("random").Random(seed)
                end = time.monotonic() + 60
                for _ in range(400):
                    try:
                        r = await http.post(url, headers={"idempotency-key": key}, content=body, timeout=timeout)
                        if r.status_code not in (409, 503):
                            return key, r.status_code, r.content
                    except httpx.TimeoutException:
                        pass
                    if time.monotonic() > end:
                        break
                    await asyncio.sleep(0.15 + jitter.random() * 0.2)
                raise AssertionError("no final answer for %s" % key)

            tasks = []
            for i in range(KEYS):
                key = "storm-%s-%02d" % (run, i)
                body = ('{"amount": %d, "currency": "usd"}' % (100 + i)).encode()
                # Parallel duplicates, and an impatient client that gives up before the charge
                # is done and retries.
                for j in range(4):
                    tasks.append(asyncio.ensure_future(careful(key, body, 20.0, rng.getrandbits(32))))
                tasks.append(asyncio.ensure_future(careful(key, body, 0.1, rng.getrandbits(32))))
                if i == KEYS // 2:
                    await asyncio.get_running_loop().run_in_executor(None, cluster.kill_leader)
                await asyncio.sleep(0.05)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        await client.close()
        return results, books, run

    try:
        results, books, run = asyncio.run(go())
    finally:
        cluster.restart_killed()
    by_key = {}
    for key, status, body in results:
        by_key.setdefault(key, set()).add((status, body))
    assert len(by_key) == KEYS
    for key, answers in by_key.items():
        assert len(answers) == 1, "%s: every retry got the same answer: %s" % (key, answers)
        status, body = next(iter(answers))
        assert status == 201, (key, answers)
        assert books[key]["charges"] == 1, "%s charged %d times" % (key, books[key]["charges"])


def test_the_payments_example_charges_once(cluster, monkeypatch, rng):
    import importlib.util

    from conftest import REPO

    monkeypatch.setenv("IDEMRAFT_ENDPOINTS", ",".join(cluster.endpoints))
    spec = importlib.util.spec_from_file_location("payments_fastapi", REPO / "sdk" / "python" / "examples" / "payments_fastapi.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    key = "example-%016x" % rng.getrandbits(64)

    async def go():
        transport = httpx.ASGITransport(app=mod.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://example") as h:
            send = lambda: h.post("/v1/charges", headers={"idempotency-key": key}, json={"amount": 1000})  # noqa: E731
            first, second = await send(), await send()
            missing = await h.post("/v1/charges", json={"amount": 1000})
        return first, second, missing

    first, second, missing = asyncio.run(go())
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    assert second.status_code == 201 and second.headers["idempotent-replayed"] == "true"
    assert second.content == first.content and second.headers["location"] == first.headers["location"]
    assert missing.status_code == 400
    assert mod.ledger.charges == {key: 1}
