"""A payments API whose charge endpoint runs at most once per Idempotency-Key.

Start the quick-start cluster (``scripts/cluster.sh up``), then::

    pip install ./sdk/python fastapi uvicorn
    uvicorn payments_fastapi:app --app-dir sdk/python/examples --port 8000
    curl -s -X POST localhost:8000/v1/charges -H 'Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324' \\
         -H 'content-type: application/json' -d '{"amount": 1000, "currency": "usd"}' -i

Repeat the curl: the second answer is the stored one, with ``Idempotent-Replayed: true``.
"""

import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from idemraft import AsyncClient
from idemraft.asgi import IdempotencyMiddleware

ENDPOINTS = os.environ.get("IDEMRAFT_ENDPOINTS", "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103").split(",")


class Ledger:
    """Stands in for the card processor: it keeps the highest fencing token per key and
    refuses lower ones, so a request whose lease ran out cannot charge after its successor."""

    def __init__(self):
        self.highest = {}
        self.charges = {}

    def charge(self, key: str, token: int, amount: int) -> str:
        if token < self.highest.get(key, 0):
            raise PermissionError("stale fencing token %d for %s" % (token, key))
        self.highest[key] = token
        self.charges[key] = self.charges.get(key, 0) + 1
        return "ch_%s" % key[:8]


ledger = Ledger()
app = FastAPI()
app.add_middleware(
    IdempotencyMiddleware,
    client=AsyncClient(ENDPOINTS),
    scope="payments.create",
    paths=["/v1/charges"],
    lease=10.0,
    replay_headers=("content-type", "location"),
)


@app.post("/v1/charges", status_code=201)
async def create_charge(request: Request):
    body = await request.json()
    key = request.state.idemraft_key
    charge_id = ledger.charge(key, request.state.idemraft_token, int(body["amount"]))
    return JSONResponse(
        {"id": charge_id, "amount": body["amount"], "currency": body.get("currency", "usd")},
        status_code=201,
        headers={"location": "/v1/charges/" + charge_id},
    )
