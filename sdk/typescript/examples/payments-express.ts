// Example: a payments charge endpoint made exactly-once with the Idemraft middleware. A retry
// of a charge (a double click, a client that timed out) replays the first response instead
// of charging again, and the fencing token goes to the ledger, which refuses writes from an
// owner whose claim was taken over. Runs against the quick-start cluster (scripts/cluster.sh up).

import express from "express";
import { Client, idempotency, type IdempotentRequest } from "@idemraft/client";

const endpoints = (process.env.IDEMRAFT_ENDPOINTS ?? "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103").split(",");
const client = new Client({ endpoints });
const charges = idempotency({ client, scope: "payments.create", leaseMs: 10_000 });

/** The downstream ledger: it keeps the highest token per key and refuses lower ones. */
const fences = new Map<string, bigint>();
let nextCharge = 1;
function ledgerCharge(key: string, token: bigint, amount: number): string {
  if ((fences.get(key) ?? 0n) > token) throw new Error(`stale fencing token ${token} for ${key}`);
  fences.set(key, token);
  return `ch_${nextCharge++}`;
}

const app = express();
// The middleware reads and fingerprints the body itself, and sets req.body for JSON.
app.post("/v1/charges", charges, (rq, res, next) => {
  try {
    const req = rq as IdempotentRequest;
    const { token, key } = req.idemraft!;
    const { amount, currency } = (req.body ?? {}) as { amount?: unknown; currency?: unknown };
    if (!Number.isInteger(amount) || (amount as number) <= 0 || typeof currency !== "string") {
      // A 4xx is final: stored, and replayed to every retry of this key.
      res.status(400).json({ error: "amount (a positive integer) and currency are required" });
      return;
    }
    const id = ledgerCharge(key, token, amount as number);
    res.status(201).location(`/v1/charges/${id}`).json({ id, amount, currency, fencing_token: String(token) });
  } catch (e) {
    next(e);
  }
});
// After the routes: a handler that throws gets 500 problem+json and its key is released.
app.use(charges.errorHandler);

const port = Number(process.env.PORT ?? 8080);
app.listen(port, "127.0.0.1", () => {
  console.log(`charges on http://127.0.0.1:${port}/v1/charges; try twice:`);
  console.log(
    `  curl -i -X POST http://127.0.0.1:${port}/v1/charges -H 'Idempotency-Key: order-1234-0000000001' ` +
      `-H 'Content-Type: application/json' -d '{"amount":100,"currency":"usd"}'`,
  );
});
