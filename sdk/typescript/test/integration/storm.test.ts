// An Express payments app protected by the middleware survives a retry storm through a
// leader SIGKILL: parallel duplicates, double clicks and impatient clients that time out and
// retry, for a dozen keys, while the leader is killed halfway. Every key's charge runs
// exactly once, and every client of a key gets the same final answer. The Rust analogue is
// node/tests/http_layer.rs's a_retry_storm_through_a_leader_kill_charges_each_key_once.

import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import express = require("express");

import { Client } from "../../src/client";
import { idempotency, type IdempotentRequest } from "../../src/http";
import { Cluster } from "../support/cluster";
import { bodyText, send, serve, type Served } from "../support/http";
import { seeded, withSeed } from "../support/random";

const rnd = seeded();

/** The bank behind the charge endpoint: what was charged, per key, and with which tokens. */
class Bank {
  readonly charges = new Map<string, { count: number; tokens: bigint[] }>();
  charge(key: string, token: bigint): void {
    const c = this.charges.get(key) ?? { count: 0, tokens: [] };
    c.count++;
    c.tokens.push(token);
    this.charges.set(key, c);
  }
}

interface Seen {
  key: string;
  status: number;
  body: string;
  attempts: number;
}

/** Retries like a careful client: the same key and body until a final answer (not 409/503/timeout). */
async function carefulClient(base: string, key: string, body: string, timeoutMs: number): Promise<Seen> {
  const end = Date.now() + 60_000;
  for (let attempt = 1; attempt <= 60 && Date.now() < end; attempt++) {
    try {
      const r = await send(base, {
        method: "POST",
        path: "/v1/charges",
        headers: [["idempotency-key", key], ["content-type", "application/json"]],
        body,
        timeoutMs,
      });
      if (r.status !== 409 && r.status !== 503) return { key, status: r.status, body: bodyText(r), attempts: attempt };
    } catch {
      // Timed out or the connection broke: retry, as a real client would.
    }
    await new Promise((resolve) => setTimeout(resolve, 200 + rnd.int(0, 100)));
  }
  throw new Error(`no final answer for ${key}`);
}

let cluster: Cluster;
let client: Client;
let served: Served;
const bank = new Bank();

before(async () => {
  cluster = await Cluster.start();
  client = new Client({ endpoints: cluster.endpoints, random: rnd.random });
  const app = express();
  const idem = idempotency({ client, scope: "payments.create", leaseMs: 5_000, logger: { warn: () => undefined, error: () => undefined } });
  app.post("/v1/charges", idem, async (rq, res, next) => {
    try {
      const req = rq as IdempotentRequest;
      const { amount, delay_ms } = req.body as { amount: number; delay_ms: number };
      const info = req.idemraft;
      if (info === undefined) throw new Error("the charge ran without a claim");
      await new Promise((r) => setTimeout(r, delay_ms));
      bank.charge(info.key, info.token);
      res.status(201).json({ key: info.key, amount, token: String(info.token) });
    } catch (e) {
      next(e);
    }
  });
  app.use(idem.errorHandler);
  served = await serve(app);
});

after(async () => {
  await served?.close();
  client?.close();
  await cluster?.stop();
});

test("a retry storm through a leader SIGKILL charges each key exactly once", async () => {
  await withSeed(rnd, async () => {
    const KEYS = 12;
    const tasks: Array<Promise<Seen>> = [];
    const keys: string[] = [];
    for (let i = 0; i < KEYS; i++) {
      const key = `storm-${rnd.hex(12)}-${i}`;
      keys.push(key);
      const body = JSON.stringify({ amount: 100 + i, currency: "usd", delay_ms: 300 });
      // Parallel duplicates, a double click, and an impatient client that times out before
      // the charge is done and retries.
      for (let d = 0; d < 4; d++) tasks.push(carefulClient(served.base, key, body, 20_000));
      tasks.push(carefulClient(served.base, key, body, 100));
      if (i === KEYS / 2) await cluster.killLeader();
      await new Promise((r) => setTimeout(r, rnd.int(0, 40)));
    }
    const seen = await Promise.all(tasks);
    const byKey = new Map<string, Set<string>>();
    for (const s of seen) {
      assert.equal(s.status, 201, `${s.key}: ${s.status} ${s.body}`);
      const answers = byKey.get(s.key) ?? new Set<string>();
      answers.add(s.body);
      byKey.set(s.key, answers);
    }
    for (const key of keys) {
      const answers = byKey.get(key);
      assert.equal(answers?.size, 1, `${key}: every retry got the same answer: ${[...(answers ?? [])]}`);
      const charged = bank.charges.get(key);
      assert.equal(charged?.count, 1, `${key} charged exactly once (tokens ${charged?.tokens})`);
      assert.equal(JSON.parse([...(answers as Set<string>)][0]).token, String(charged?.tokens[0]), `${key}: the answer carries the charge's token`);
    }
    assert.equal(bank.charges.size, KEYS);
    assert.ok(seen.some((s) => s.attempts > 1), "the storm made clients retry");
  });
});
