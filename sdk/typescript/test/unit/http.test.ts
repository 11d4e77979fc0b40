// The Express middleware against an in-memory cluster (FakeClient), over real HTTP on
// loopback, under Express 5 and Express 4: every answer of the HTTP contract, what is stored,
// what is replayed, the fencing token, body parsers before and after it, and failures of the
// cluster at each step.

import { describe, test } from "node:test";
import * as assert from "node:assert/strict";
import express = require("express");

import { ConfigError, IdemraftError, InvalidArgumentError, OutcomeUnknownError, QuotaExceededError, RpcError, UnavailableError } from "../../src/errors";
import { captureRawBody, idempotency, type IdempotencyOptions, type IdempotentRequest, type Logger } from "../../src/http";
import { FakeClient } from "../support/fake-client";
import { bodyText, header, send, serve, type Received } from "../support/http";

// eslint-disable-next-line @typescript-eslint/no-require-imports
const express4: typeof express = require("express4");

const KEY = "8e03978e-40d5-43e8-bc93-6894a57f9324";
let keySeq = 0;
const freshKey = () => `test-key-${process.pid}-${++keySeq}-0000`;

interface Logged {
  level: string;
  message: string;
}

function quietLogger(into: Logged[]): Logger {
  return {
    warn: (message) => into.push({ level: "warn", message }),
    error: (message) => into.push({ level: "error", message }),
  };
}

function problem(r: Received): { type: string; title: string; status: number; detail: string } {
  assert.equal(header(r, "content-type"), "application/problem+json", bodyText(r));
  const p = JSON.parse(bodyText(r));
  assert.deepEqual(Object.keys(p), ["detail", "status", "title", "type"], "members in the Rust layer's order");
  assert.equal(p.status, r.status);
  assert.ok(typeof p.title === "string" && p.title.length > 0);
  return p;
}

type Framework = typeof express;

interface Harness {
  fake: FakeClient;
  logs: Logged[];
  runs: () => number;
  base: string;
  post: (key: string | null, body?: string, extra?: Array<[string, string]>, path?: string) => Promise<Received>;
  close: () => Promise<void>;
}

/** An app with one protected route, POST /charges, whose handler `handler` decides the answer. */
async function harness(
  framework: Framework,
  opts: Partial<IdempotencyOptions>,
  handler: (req: IdempotentRequest, res: express.Response, next: express.NextFunction, run: number) => void | Promise<void>,
  setup?: (app: express.Express) => void,
): Promise<Harness> {
  const fake = new FakeClient();
  const logs: Logged[] = [];
  let runs = 0;
  const idem = idempotency({ client: fake.asClient(), scope: "payments.create", logger: quietLogger(logs), ...opts });
  const app = framework();
  app.use((_req, res, next) => {
    res.setHeader("x-request-id", "req-1");
    next();
  });
  setup?.(app);
  app.all("/charges", idem, (req, res, next) => {
    runs++;
    Promise.resolve(handler(req as IdempotentRequest, res, next, runs)).catch(next);
  });
  app.get("/safe", idem, (req, res) => {
    runs++;
    res.json({ token: (req as IdempotentRequest).idemraft?.token?.toString() ?? null });
  });
  app.use(idem.errorHandler);
  const served = await serve(app);
  return {
    fake,
    logs,
    runs: () => runs,
    base: served.base,
    post: (key, body = "{}", extra = [], path = "/charges") =>
      send(served.base, {
        method: "POST",
        path,
        headers: [...(key === null ? [] : ([["idempotency-key", key]] as Array<[string, string]>)), ["content-type", "application/json"], ...extra],
        body,
      }),
    close: served.close,
  };
}

const created = (req: IdempotentRequest, res: express.Response) => {
  res.statusCode = 201;
  res.setHeader("content-type", "application/json");
  res.setHeader("location", "/charges/ch_1");
  res.setHeader("etag", '"e1"');
  res.setHeader("set-cookie", "sid=secret");
  res.setHeader("x-charge-id", "ch_1");
  res.end(JSON.stringify({ token: req.idemraft?.token.toString() ?? null, amount: (req.body as { amount?: number })?.amount ?? null }));
};

for (const [name, framework] of [
  ["express 5", express],
  ["express 4", express4],
] as Array<[string, Framework]>) {
  describe(`middleware under ${name}`, () => {
    test("a missing or malformed key is 400 problem+json naming the rule; the handler never runs", async () => {
      const h = await harness(framework, {}, created);
      try {
        const missing = await h.post(null);
        assert.equal(missing.status, 400);
        const p = problem(missing);
        assert.equal(p.type, "urn:idemraft:problem:missing-idempotency-key");
        assert.match(p.detail, /requires an idempotency-key header/);
        assert.equal(header(missing, "x-request-id"), "req-1", "earlier middleware's headers stay");

        const cases: Array<[Array<[string, string]>, string]> = [
          [[["idempotency-key", "short"]], "the key is 5 characters long; a key is 16 to 255 characters of A-Z a-z 0-9 _ . : - (a UUID works)"],
          [[["idempotency-key", "not/a/valid/key/at/all"]], "the key has '/' at position 3; a key is 16 to 255"],
          [[["idempotency-key", "has space in the key 123"]], "the key has ' ' at position 3"],
          [[["idempotency-key", `"${KEY}`]], `the header starts a quoted string but is not one; send "<key>" or the bare key`],
          [[["idempotency-key", `"abc\\"defghijklmnopqrs"`]], "starts a quoted string but is not one"],
          [[["idempotency-key", KEY], ["Idempotency-Key", KEY]], "the header was sent more than once; send exactly one key"],
          [[["idempotency-key", "clé-0000000000000000"]], "the header is not visible ASCII"],
          [[["idempotency-key", ""]], "the key is 0 characters long"],
        ];
        for (const [headers, detail] of cases) {
          const r = await send(h.base, { method: "POST", path: "/charges", headers, body: "{}" });
          assert.equal(r.status, 400, JSON.stringify(headers));
          const q = problem(r);
          assert.equal(q.type, "urn:idemraft:problem:malformed-idempotency-key");
          assert.ok(q.detail.startsWith("the idempotency-key header is not a valid key: "), q.detail);
          assert.ok(q.detail.includes(detail), `${q.detail}\n  should include ${detail}`);
        }
        assert.equal(h.runs(), 0);
        assert.equal(h.fake.count("claim"), 0);
      } finally {
        await h.close();
      }
    });

    test("the first request runs the handler; retries replay status, body and allowlisted headers only", async () => {
      const h = await harness(framework, {}, created);
      try {
        const first = await h.post(KEY, '{"amount":100,"currency":"usd"}');
        assert.equal(first.status, 201);
        const token = JSON.parse(bodyText(first)).token;
        assert.match(token, /^\d+$/, "the handler got the fencing token");
        assert.equal(JSON.parse(bodyText(first)).amount, 100, "req.body is the parsed JSON");
        assert.equal(header(first, "set-cookie"), "sid=secret");
        assert.equal(header(first, "x-charge-id"), "ch_1");
        assert.equal(header(first, "idempotent-replayed"), undefined);
        for (const [key, body] of [
          [KEY, '{"amount":100,"currency":"usd"}'],
          [`"${KEY}"`, '{ "currency": "usd", "amount": 1.0e2 }'],
        ]) {
          const again = await h.post(key, body);
          assert.equal(again.status, 201);
          assert.equal(bodyText(again), bodyText(first));
          assert.equal(header(again, "idempotent-replayed"), "true");
          assert.equal(header(again, "content-type"), "application/json");
          assert.equal(header(again, "location"), "/charges/ch_1");
          assert.equal(header(again, "etag"), '"e1"');
          assert.equal(header(again, "set-cookie"), undefined);
          assert.equal(header(again, "x-charge-id"), undefined);
          assert.equal(header(again, "x-request-id"), "req-1");
        }
        assert.equal(h.runs(), 1);
        const rec = h.fake.records.get(KEY);
        assert.equal(rec?.state, "COMPLETED");
        assert.equal(String(rec?.token), token);
        assert.deepEqual(rec?.response?.headers, [
          ["content-type", "application/json"],
          ["location", "/charges/ch_1"],
          ["etag", '"e1"'],
        ]);
      } finally {
        await h.close();
      }
    });

    test("binary and streamed bodies, writeHead headers and added allowlist names are stored byte for byte", async () => {
      const bytes = Buffer.from([0, 255, 1, 2, 3, 0x80]);
      const h = await harness(framework, { addReplayHeaders: ["X-Charge-Id"] }, (_req, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream", "x-charge-id": "ch_9", "x-debug": "1" });
        res.write(bytes.subarray(0, 2));
        res.write(bytes.subarray(2));
        res.end();
      });
      try {
        const key = freshKey();
        const first = await h.post(key);
        assert.deepEqual(first.body, bytes);
        assert.equal(header(first, "x-debug"), "1");
        const again = await h.post(key);
        assert.deepEqual(again.body, bytes);
        assert.equal(header(again, "x-charge-id"), "ch_9");
        assert.equal(header(again, "x-debug"), undefined);
        assert.equal(header(again, "content-length"), String(bytes.length));
        assert.equal(h.runs(), 1);
      } finally {
        await h.close();
      }
    });

    test("a key reused with another body, path or query is 422; the original still replays", async () => {
      const h = await harness(framework, {}, created);
      try {
        const key = freshKey();
        assert.equal((await h.post(key, '{"amount":100}')).status, 201);
        for (const [body, path] of [
          ['{"amount":999}', "/charges"],
          ['{"amount":100}', "/charges?capture=false"],
        ]) {
          const r = await h.post(key, body, [], path);
          assert.equal(r.status, 422, path);
          const p = problem(r);
          assert.equal(p.type, "urn:idemraft:problem:idempotency-key-reused");
          assert.match(p.detail, /different method, path or body/);
        }
        assert.equal(header(await h.post(key, '{"amount":100}'), "idempotent-replayed"), "true");
        assert.equal(h.runs(), 1);
      } finally {
        await h.close();
      }
    });

    test("while the first request runs: 409 with Retry-After 1, or a bounded wait that answers with its response", async () => {
      let release: () => void = () => undefined;
      const gate = new Promise<void>((r) => (release = r));
      let entered: () => void = () => undefined;
      const started = new Promise<void>((r) => (entered = r));
      const slow = async (_req: IdempotentRequest, res: express.Response) => {
        entered();
        await gate;
        res.statusCode = 201;
        res.setHeader("content-type", "text/plain");
        res.end("slow charge");
      };
      const conflict = await harness(framework, {}, slow);
      const waiting = await harness(framework, { inFlight: { waitMs: 5_000 } }, slow);
      try {
        const key = freshKey();
        const first = conflict.post(key);
        await started;
        const second = await conflict.post(key);
        assert.equal(second.status, 409);
        assert.equal(header(second, "retry-after"), "1");
        const p = problem(second);
        assert.equal(p.type, "urn:idemraft:problem:request-in-progress");
        assert.match(p.detail, /retry the same request with the same key after 1 s/);

        const wkey = freshKey();
        const wfirst = waiting.post(wkey);
        await new Promise((r) => setTimeout(r, 100));
        const wsecond = waiting.post(wkey);
        await new Promise((r) => setTimeout(r, 200));
        release();
        assert.equal((await first).status, 201);
        const [a, b] = await Promise.all([wfirst, wsecond]);
        assert.deepEqual([a.status, bodyText(a), header(a, "idempotent-replayed")], [201, "slow charge", undefined]);
        assert.deepEqual([b.status, bodyText(b), header(b, "idempotent-replayed")], [201, "slow charge", "true"]);
        assert.equal(waiting.runs(), 1);
        assert.ok(waiting.fake.count("wait") >= 1, "the second request waited on the cluster");
      } finally {
        release();
        await conflict.close();
        await waiting.close();
      }
    });

    test("which statuses are stored: 2xx and 4xx but 408/409/429; 5xx released; 'everything' stores all", async () => {
      let status = 0;
      const respond = (_req: IdempotentRequest, res: express.Response) => {
        res.statusCode = status;
        res.setHeader("content-type", "text/plain");
        res.end(`status ${status}`);
      };
      const h = await harness(framework, {}, respond);
      const all = await harness(framework, { store: "everything" }, respond);
      try {
        for (const [s, storedAs] of [
          [402, "terminal"],
          [404, "terminal"],
          [200, "completed"],
          [500, "released"],
          [503, "released"],
          [408, "released"],
          [409, "released"],
          [429, "released"],
        ] as Array<[number, string]>) {
          status = s;
          const key = freshKey();
          const r1 = await h.post(key);
          const r2 = await h.post(key);
          assert.deepEqual([r1.status, bodyText(r1)], [s, `status ${s}`]);
          assert.equal(r2.status, s);
          assert.equal(header(r2, "idempotent-replayed"), storedAs === "released" ? undefined : "true", `${s}`);
          const rec = h.fake.records.get(key);
          assert.equal(rec?.state, storedAs === "released" ? "FAILED" : "COMPLETED", `${s}`);
          if (storedAs === "terminal") {
            assert.ok(h.fake.calls.some((c) => c.op === "fail" && c.key === key && c.args[1] === false), `${s} fails terminally`);
          }
        }
        status = 500;
        const key = freshKey();
        await all.post(key);
        assert.equal(header(await all.post(key), "idempotent-replayed"), "true", "'everything' stores a 500");
      } finally {
        await h.close();
        await all.close();
      }
    });

    test("a handler that throws gets 500 problem+json and releases the key; the retry runs again", async () => {
      const h = await harness(framework, {}, (req, res, _next, run) => {
        if (run === 1) throw new Error("card network exploded");
        res.statusCode = 201;
        res.end(`attempt ${req.idemraft?.attempt}`);
      });
      try {
        const key = freshKey();
        const r1 = await h.post(key);
        assert.equal(r1.status, 500);
        const p = problem(r1);
        assert.equal(p.type, "urn:idemraft:problem:handler-failed");
        assert.match(p.detail, /the key was released/);
        assert.equal(header(r1, "x-request-id"), "req-1");
        assert.equal(h.fake.records.get(key)?.state, "FAILED");
        const r2 = await h.post(key);
        assert.deepEqual([r2.status, bodyText(r2)], [201, "attempt 2"]);
        const r3 = await h.post(key);
        assert.deepEqual([r3.status, bodyText(r3), header(r3, "idempotent-replayed")], [201, "attempt 2", "true"]);
        assert.equal(h.runs(), 2);
        assert.ok(h.logs.some((l) => l.message.includes("the handler raised")));
      } finally {
        await h.close();
      }
    });

    test("an unreachable cluster is 503 fail-closed or runs the handler unprotected fail-open", async () => {
      const failures: Array<() => IdemraftError> = [
        () => new UnavailableError("no leader"),
        () => new OutcomeUnknownError("the connection to the node broke before the answer arrived"),
        () => new RpcError("overloaded", 8),
      ];
      for (const failure of failures) {
        const closed = await harness(framework, {}, created);
        const open = await harness(framework, { failOpen: true }, created);
        try {
          closed.fake.claimError = failure;
          open.fake.claimError = failure;
          const r = await closed.post(freshKey());
          assert.equal(r.status, 503);
          assert.equal(header(r, "retry-after"), "1");
          const p = problem(r);
          assert.equal(p.type, "urn:idemraft:problem:idempotency-store-unavailable");
          assert.ok(p.detail.includes("was not processed") && p.detail.includes(failure().describe()), p.detail);
          assert.equal(closed.runs(), 0);
          const o = await open.post(freshKey(), '{"amount":5}');
          assert.equal(o.status, 201);
          assert.deepEqual(JSON.parse(bodyText(o)), { token: null, amount: 5 }, "no token when unprotected");
          assert.ok(open.logs.some((l) => l.message.includes("fail-open")));
        } finally {
          await closed.close();
          await open.close();
        }
      }
    });

    test("a used-up quota is 429 (never fail-open); any other refusal is the operator's 500", async () => {
      const h = await harness(framework, { failOpen: true }, created);
      try {
        h.fake.claimError = () => new QuotaExceededError("record quota exceeded: tenant 'acme' holds 3", "acme", 3, 3);
        const q = await h.post(freshKey());
        assert.equal(q.status, 429);
        assert.equal(header(q, "retry-after"), undefined);
        const p = problem(q);
        assert.equal(p.type, "urn:idemraft:problem:idempotency-quota-exceeded");
        assert.ok(!p.detail.includes("acme"), "nothing names the tenant");
        h.fake.claimError = () => new InvalidArgumentError("scope has a forbidden character");
        const i = await h.post(freshKey());
        assert.equal(i.status, 500);
        assert.equal(problem(i).type, "urn:idemraft:problem:idempotency-internal");
        assert.match(problem(i).detail, /invalid request: scope has a forbidden character/);
        assert.equal(h.runs(), 0);
      } finally {
        await h.close();
      }
    });

    test("a lease lost while the handler runs aborts its signal and answers 409 lease-lost", async () => {
      let aborted = false;
      const h = await harness(framework, { leaseMs: 1_000 }, async (req, res) => {
        await new Promise((r) => setTimeout(r, 700));
        aborted = req.idemraft?.signal.aborted ?? false;
        res.statusCode = 201;
        res.end("too late");
      });
      try {
        h.fake.stealOnExtend = true;
        const r = await h.post(freshKey());
        assert.equal(r.status, 409);
        assert.equal(header(r, "retry-after"), "1");
        assert.equal(problem(r).type, "urn:idemraft:problem:idempotency-lease-lost");
        assert.ok(aborted, "the handler's signal said the lease was lost");
      } finally {
        await h.close();
      }
    });

    test("a response too large to keep reaches the first caller whole; retries get a problem body", async () => {
      const h = await harness(framework, { maxStoredBodyBytes: 4 }, (_req, res) => {
        res.statusCode = 201;
        res.setHeader("content-type", "text/plain");
        res.setHeader("location", "/charges/big");
        res.end("0123456789");
      });
      try {
        const key = freshKey();
        assert.equal(bodyText(await h.post(key)), "0123456789");
        const again = await h.post(key);
        assert.equal(again.status, 201);
        assert.equal(header(again, "location"), "/charges/big");
        const p = problem(again);
        assert.equal(p.type, "urn:idemraft:problem:response-not-stored");
        assert.match(p.detail, /10-byte response is over the 4-byte limit/);
      } finally {
        await h.close();
      }
    });

    test("bodies over the limit are 413 before any claim, with or without a Content-Length", async () => {
      const h = await harness(framework, { maxBodyBytes: 8 }, created);
      try {
        const r = await h.post(freshKey(), '{"amount": 100}');
        assert.equal(r.status, 413);
        const p = problem(r);
        assert.equal(p.type, "urn:idemraft:problem:body-too-large");
        assert.match(p.detail, /limit of 8 bytes/);
        const chunked = await send(h.base, {
          method: "POST",
          path: "/charges",
          headers: [["idempotency-key", freshKey()], ["transfer-encoding", "chunked"]],
          body: "0123456789abcdef",
          chunked: true,
        });
        assert.equal(chunked.status, 413);
        assert.equal(h.fake.count("claim"), 0);
        assert.equal(h.runs(), 0);
      } finally {
        await h.close();
      }
    });

    test("safe methods and key-less requests on an optional route pass through unprotected", async () => {
      // A parser before the middleware (with captureRawBody) serves both kinds of request.
      const h = await harness(framework, { keyRequired: false }, created, (app) =>
        app.use(framework.json({ verify: captureRawBody })),
      );
      try {
        const g = await send(h.base, { method: "GET", path: "/safe", headers: [["idempotency-key", KEY]] });
        assert.deepEqual(JSON.parse(bodyText(g)), { token: null });
        const p = await h.post(null, '{"amount":7}');
        assert.deepEqual([p.status, JSON.parse(bodyText(p))], [201, { token: null, amount: 7 }]);
        assert.equal(h.fake.count("claim"), 0);
        const k = await h.post(freshKey(), '{"amount":8}');
        assert.match(JSON.parse(bodyText(k)).token, /^\d+$/);
        assert.equal(JSON.parse(bodyText(k)).amount, 8);
        assert.equal(h.runs(), 3);
      } finally {
        await h.close();
      }
    });

    test("body parsers: after the middleware they skip; before it they need captureRawBody", async () => {
      const after = await harness(framework, {}, created, undefined);
      const before = await harness(framework, {}, created, (app) => app.use(framework.json({ verify: captureRawBody })));
      const blind = await harness(framework, {}, created, (app) => app.use(framework.json()));
      try {
        const k1 = freshKey();
        assert.equal(JSON.parse(bodyText(await after.post(k1, '{"amount":3}'))).amount, 3);
        const k2 = freshKey();
        assert.equal(JSON.parse(bodyText(await before.post(k2, '{"amount":4}'))).amount, 4);
        assert.equal(header(await before.post(k2, '{ "amount" : 4 }'), "idempotent-replayed"), "true");
        assert.equal((await before.post(k2, '{"amount":5}')).status, 422, "the raw body was fingerprinted");
        const r = await blind.post(freshKey(), '{"amount":6}');
        assert.equal(r.status, 500);
        assert.match(problem(r).detail, /captureRawBody/);
        assert.equal(blind.runs(), 0);
      } finally {
        await after.close();
        await before.close();
        await blind.close();
      }
    });

    test("when the response cannot be stored the caller still gets what the handler did", async () => {
      const h = await harness(framework, { settleTimeoutMs: 300 }, created);
      try {
        h.fake.settleError = () => new OutcomeUnknownError("the connection broke");
        const r = await h.post(freshKey(), '{"amount":1}');
        assert.equal(r.status, 201);
        assert.equal(JSON.parse(bodyText(r)).amount, 1);
        assert.ok(h.logs.some((l) => l.level === "error" && l.message.includes("could not be stored")));
        assert.ok(h.fake.count("complete") >= 2, "the settle was retried");
      } finally {
        await h.close();
      }
    });
  });
}

test("settings the cluster would refuse fail at construction", () => {
  const client = new FakeClient().asClient();
  for (const bad of [
    { scope: "" },
    { scope: "has space" },
    { scope: "x".repeat(129) },
    { scope: "ok", leaseMs: 10 },
    { scope: "ok", leaseMs: 3_600_000 },
    { scope: "ok", ttlMs: 1_000 },
    { scope: "ok", maxBodyBytes: 0 },
    { scope: "ok", clusterTimeoutMs: 0 },
    { scope: "ok", header: "bad header" },
  ]) {
    assert.throws(() => idempotency({ client, ...bad }), ConfigError, JSON.stringify(bad));
  }
  assert.throws(() => idempotency({ client, scope: "payments.create", leaseMs: 10 }), /payments\.create.*lease/);
  assert.equal(idempotency({ client, scope: "payments.create" }).errorHandler.length, 4, "Express needs four parameters");
});
