// The client without a cluster: how gRPC statuses map onto the error taxonomy, which failures
// are retried and for how long, leader hints, dead and silent endpoints, the bearer token,
// 64-bit tokens, and configuration errors; against fake nodes that misbehave as real ones do
// under faults.

import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";

import { Client, errorFromStatus, lostReply, retryable } from "../../src/client";
import {
  ConfigError,
  DeadlineExceededError,
  InvalidArgumentError,
  OutcomeUnknownError,
  QuotaExceededError,
  RefusedError,
  RpcError,
  UnavailableError,
} from "../../src/errors";
import { acquired, breakingNode, deadAddr, fakeNode, silentNode } from "../support/fakes";
import { seeded } from "../support/random";

const md = (fields: Record<string, string> = {}) => {
  const m = new grpc.Metadata();
  for (const [k, v] of Object.entries(fields)) m.set(k, v);
  return m;
};
/** A status the node sent (its replies always carry metadata). */
const server = (code: number, details: string, fields: Record<string, string> = {}) => ({
  code,
  details,
  metadata: md({ "content-type": "application/grpc", ...fields }),
  sent: true,
});
/** A status grpc-js made itself, with no metadata. */
const local = (code: number, details: string, sent = true) => ({ code, details, metadata: md(), sent });

test("statuses map onto the error taxonomy with the server's message unchanged", () => {
  const invalid = errorFromStatus(server(grpc.status.INVALID_ARGUMENT, "key is 5 bytes long: a key must be 16 to 255 bytes"));
  assert.ok(invalid instanceof InvalidArgumentError);
  assert.equal(invalid.kind, "invalid_argument");
  assert.equal(invalid.message, "key is 5 bytes long: a key must be 16 to 255 bytes");
  assert.equal(invalid.indeterminate, false);

  const unavailable = errorFromStatus(server(grpc.status.UNAVAILABLE, "no leader"));
  assert.ok(unavailable instanceof UnavailableError);
  assert.equal(unavailable.indeterminate, true);
  assert.equal(unavailable.describe(), "cluster unavailable: no leader");

  for (const code of [grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]) {
    const e = errorFromStatus(server(code, "Timeout expired"));
    assert.ok(e instanceof DeadlineExceededError, String(code));
    assert.equal(e.indeterminate, true);
  }

  const refused = errorFromStatus(server(grpc.status.FAILED_PRECONDITION, "cannot remove the last voter"));
  assert.ok(refused instanceof RefusedError);
  assert.equal(refused.kind, "failed_precondition");

  const quota = errorFromStatus(
    server(grpc.status.FAILED_PRECONDITION, "record quota exceeded: tenant 'acme' holds 3 records", {
      "idemraft-quota-tenant": "acme",
      "idemraft-quota-limit": "3",
      "idemraft-quota-records": "3",
    }),
  );
  assert.ok(quota instanceof QuotaExceededError);
  assert.deepEqual([quota.kind, quota.tenant, quota.limit, quota.records, quota.indeterminate], ["quota_exceeded", "acme", 3, 3, false]);
  assert.match(quota.message, /record quota exceeded/);

  const denied = errorFromStatus(server(grpc.status.PERMISSION_DENIED, "the token's tenant is acme"));
  assert.ok(denied instanceof RpcError);
  assert.equal(denied.code, grpc.status.PERMISSION_DENIED);
  assert.equal(denied.describe(), "PermissionDenied: the token's tenant is acme");
});

test("a broken connection is an unknown outcome, whatever code grpc-js gives it", () => {
  const broken = [
    local(grpc.status.UNAVAILABLE, "Connection dropped"),
    local(grpc.status.UNAVAILABLE, "read ECONNRESET"),
    local(grpc.status.INTERNAL, "Received RST_STREAM with code 2 (Internal server error)"),
    local(grpc.status.INTERNAL, "Received RST_STREAM with code 0 (Call ended without gRPC status)"),
    local(grpc.status.RESOURCE_EXHAUSTED, "Bandwidth exhausted or memory limit exceeded"),
    local(grpc.status.UNKNOWN, "No status information received"),
    server(grpc.status.INTERNAL, "h2 protocol error: http2 error"),
  ];
  for (const s of broken) {
    assert.ok(retryable(s), s.details);
    const e = errorFromStatus(s);
    assert.ok(e instanceof OutcomeUnknownError, `${s.details}: ${e.name}`);
    assert.equal(e.kind, "indeterminate");
    assert.match(e.message, /repeat it with the same arguments/);
    assert.equal(e.indeterminate, true);
  }
  // A node's own INTERNAL error (a storage failure) is determinate, and not retried.
  const internal = server(grpc.status.INTERNAL, "internal error: state machine: corrupt record");
  assert.equal(lostReply(internal), undefined);
  assert.ok(!retryable(internal));
  assert.ok(errorFromStatus(internal) instanceof RpcError);
  // A call that never found a connection is unavailable, not an unknown outcome.
  const refused = local(grpc.status.UNAVAILABLE, "No connection established. Last error: connect ECONNREFUSED", false);
  assert.ok(retryable(refused));
  assert.ok(errorFromStatus(refused) instanceof UnavailableError);
  // A shed call carries the node's marker: never proposed, so not an unknown outcome.
  const shed = server(grpc.status.RESOURCE_EXHAUSTED, "overloaded", { "idemraft-not-proposed": "1" });
  assert.ok(retryable(shed));
  assert.ok(errorFromStatus(shed) instanceof RpcError);
  for (const code of [grpc.status.INVALID_ARGUMENT, grpc.status.FAILED_PRECONDITION, grpc.status.PERMISSION_DENIED]) {
    assert.ok(!retryable(server(code, "x")), String(code));
  }
});

test("backoff is full-jitter, bounded, and grows with the attempt", () => {
  const s = seeded();
  const c = new Client({ endpoints: ["127.0.0.1:1"], random: s.random });
  const backoff = (n: number) => (c as unknown as { backoff(n: number): number }).backoff(n);
  const seen = new Set<number>();
  for (let attempt = 0; attempt < 40; attempt++) {
    const b = backoff(attempt);
    const cap = Math.min(20 * 2 ** Math.min(attempt, 16), 250);
    assert.ok(b >= 0 && b <= cap, `attempt ${attempt}: ${b} above ${cap} (seed ${s.seed})`);
    seen.add(b);
  }
  assert.ok(seen.size > 5, `not jittered: ${[...seen]} (seed ${s.seed})`);
  c.close();
});

test("a call whose connection breaks is retried on the other node, then reported as an unknown outcome", async () => {
  const a = await breakingNode();
  const b = await breakingNode();
  const client = new Client({ endpoints: [a.addr, b.addr] });
  try {
    const started = Date.now();
    const err = await client.complete("s", "k".repeat(16), 7, { status: 200 }, { deadlineMs: 1500 }).catch((e) => e);
    assert.ok(err instanceof OutcomeUnknownError, String(err));
    assert.match(err.message, /broke/);
    assert.ok(Date.now() - started >= 1400, `gave up early: ${Date.now() - started} ms`);
    assert.ok(a.calls() >= 1 && b.calls() >= 1, `not retried on the other node: ${a.calls()} and ${b.calls()}`);
  } finally {
    client.close();
    await Promise.all([a.stop(), b.stop()]);
  }
});

test("a quota refusal is typed and answered at once, without retries", async () => {
  const node = await fakeNode(() => ({
    code: grpc.status.FAILED_PRECONDITION,
    details: "record quota exceeded: tenant 'acme' holds 3 records of its quota of 3",
    metadata: { "idemraft-quota-tenant": "acme", "idemraft-quota-limit": "3", "idemraft-quota-records": "3" },
  }));
  const client = new Client({ endpoints: [node.addr] });
  try {
    const started = Date.now();
    const err = await client.claim("s", "k".repeat(16), "o").catch((e) => e);
    assert.ok(err instanceof QuotaExceededError, String(err));
    assert.equal(err.tenant, "acme");
    assert.equal(node.seen.length, 1, "a quota refusal is not retried");
    assert.ok(Date.now() - started < 1000);
  } finally {
    client.close();
    await node.stop();
  }
});

test("retries keep the same request (the same owner), until the deadline, reporting the last refusal", async () => {
  const node = await fakeNode((_m, _r, n) =>
    n < 2 ? { code: grpc.status.UNAVAILABLE, details: "no leader yet" } : { ok: acquired(42) },
  );
  const client = new Client({ endpoints: [node.addr] });
  try {
    const o = await client.claim("s", "k".repeat(16), "owner-1", { leaseMs: 5000 });
    assert.equal(o.outcome, "ACQUIRED");
    assert.equal(node.seen.length, 3);
    assert.deepEqual(new Set(node.seen.map((s) => s.request.owner)), new Set(["owner-1"]));
    assert.deepEqual(new Set(node.seen.map((s) => s.request.lease_ms)), new Set(["5000"]));
  } finally {
    client.close();
    await node.stop();
  }
  const never = await fakeNode(() => ({ code: grpc.status.UNAVAILABLE, details: "no quorum" }));
  const c2 = new Client({ endpoints: [never.addr] });
  try {
    const started = Date.now();
    const err = await c2.get("s", "k".repeat(16), { deadlineMs: 600 }).catch((e) => e);
    assert.ok(err instanceof UnavailableError, String(err));
    assert.equal(err.message, "no quorum", "the last refusal, not 'deadline exceeded'");
    const took = Date.now() - started;
    assert.ok(took >= 550 && took < 2000, `${took} ms`);
    assert.ok(never.seen.length >= 3, `retried ${never.seen.length} times`);
  } finally {
    c2.close();
    await never.stop();
  }
});

test("a follower's leader hint is followed, on a refusal and on a forwarded success", async () => {
  const leader = await fakeNode(() => ({ ok: acquired(1) }));
  const follower = await fakeNode(() => ({
    code: grpc.status.UNAVAILABLE,
    details: "not the leader",
    metadata: { "idemraft-leader-addr": leader.addr },
  }));
  const client = new Client({ endpoints: [follower.addr] });
  try {
    assert.equal((await client.claim("s", "k".repeat(16), "o")).outcome, "ACQUIRED");
    assert.equal((await client.claim("s", "k".repeat(16), "o")).outcome, "ACQUIRED");
    assert.equal(follower.seen.length, 1, "the second call went to the leader directly");
    assert.equal(leader.seen.length, 2);
    assert.deepEqual(client.endpoints, [`http://${follower.addr}`, `http://${leader.addr}`]);
  } finally {
    client.close();
  }
  const forwarding = await fakeNode(() => ({ ok: acquired(2), metadata: { "idemraft-leader-addr": leader.addr } }));
  const c2 = new Client({ endpoints: [forwarding.addr] });
  try {
    await c2.claim("s", "k".repeat(16), "o");
    await c2.claim("s", "k".repeat(16), "o");
    assert.equal(forwarding.seen.length, 1, "after a forwarded reply the client goes to the leader");
  } finally {
    c2.close();
    await Promise.all([leader.stop(), follower.stop(), forwarding.stop()]);
  }
});

test("dead endpoints are skipped, and a learned one that stays dead is dropped", async () => {
  const dead = await deadAddr();
  const node = await fakeNode(() => ({ ok: acquired(3) }));
  const client = new Client({ endpoints: [dead, node.addr] });
  try {
    for (let i = 0; i < 5; i++) assert.equal((await client.claim("s", "k".repeat(16), "o")).outcome, "ACQUIRED");
    assert.equal(node.seen.length, 5);
    assert.deepEqual(client.endpoints, [`http://${dead}`, `http://${node.addr}`], "configured endpoints are kept");
  } finally {
    client.close();
  }
  // A node hints at a leader address that is dead: it is tried, then dropped.
  const deadLeader = await deadAddr();
  const hinting = await fakeNode((_m, _r, n) =>
    n % 2 === 0
      ? { code: grpc.status.UNAVAILABLE, details: "not the leader", metadata: { "idemraft-leader-addr": deadLeader } }
      : { ok: acquired(4) },
  );
  const c2 = new Client({ endpoints: [hinting.addr] });
  try {
    const end = Date.now() + 10_000;
    let learned = false;
    for (let i = 0; i < 100 && Date.now() < end; i++) {
      await c2.claim("s", "k".repeat(16), "o", { deadlineMs: 5000 });
      learned ||= c2.endpoints.length === 2;
      if (learned && c2.endpoints.length === 1) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(learned, "the hinted address was never added");
    assert.deepEqual(c2.endpoints, [`http://${hinting.addr}`], "the dead learned endpoint was dropped");
  } finally {
    c2.close();
    await Promise.all([node.stop(), hinting.stop()]);
  }
});

test("a node that left an attempt unanswered is passed over, even when a follower names it", async () => {
  // A leader that stopped, and a follower that still names it: every new call used to follow
  // that hint into the stopped node and wait out a whole attempt there.
  const stopped = await silentNode();
  let serving = false;
  const follower = await fakeNode(() =>
    serving
      ? { ok: {} }
      : {
          code: grpc.status.UNAVAILABLE,
          details: "no leader: leader 2 at the hinted address did not take the call",
          metadata: { "idemraft-leader-addr": stopped.addr },
        },
  );
  const client = new Client({ endpoints: [stopped.addr, follower.addr], attemptTimeoutMs: 300, deadlineMs: 900 });
  try {
    // While nobody leads: the stopped node takes one attempt, the follower refuses the rest.
    const err = await client.get("s", "k".repeat(16)).catch((e) => e);
    assert.ok(err instanceof Error, `answered: ${JSON.stringify(err)}`);
    assert.equal(stopped.calls(), 1, "the stopped node was tried again within one call");

    // A leader is back behind the follower: the next call goes there first and is answered
    // within one attempt, without another visit to the stopped node.
    serving = true;
    const started = Date.now();
    assert.equal(await client.get("s", "k".repeat(16)), null);
    const took = Date.now() - started;
    assert.ok(took < 300, `took ${took} ms`);
    assert.equal(stopped.calls(), 1, "the stopped node was tried again");
  } finally {
    client.close();
    await Promise.all([stopped.stop(), follower.stop()]);
  }
});

test("the bearer token goes on every call; 64-bit tokens cross the wire exactly", async () => {
  const big = (1n << 60n) + 1n;
  const node = await fakeNode((method, request) =>
    method === "Complete" ? { ok: { completed: { token: request.token } } } : { ok: acquired(big.toString()) },
  );
  const client = new Client({ endpoints: [node.addr], bearerToken: "  s3cret-token\n", tenant: "acme" });
  try {
    const a = await client.claim("s", "k".repeat(16), "o");
    assert.equal(a.outcome === "ACQUIRED" && a.token, big);
    const c = await client.complete("s", "k".repeat(16), big, { status: 201, body: "x" });
    assert.deepEqual(c, { outcome: "COMPLETED", token: big });
    assert.equal(node.seen[1].request.token, big.toString());
    assert.equal(node.seen[1].request.id.tenant, "acme");
    for (const s of node.seen) assert.deepEqual(s.metadata.get("authorization"), ["Bearer s3cret-token"]);
  } finally {
    client.close();
    await node.stop();
  }
});

test("an earlier Fail attempt that may have gone through makes a later STALE_TOKEN an unknown outcome", async () => {
  const node = await fakeNode((_m, _r, n) =>
    n === 0 ? { ok: { failed: { token: "5", retryable: true } }, delayMs: 600 } : { ok: { stale_token: { current: "9" } } },
  );
  const client = new Client({ endpoints: [node.addr], attemptTimeoutMs: 200 });
  try {
    const err = await client.fail("s", "k".repeat(16), 5, true).catch((e) => e);
    assert.ok(err instanceof OutcomeUnknownError, String(err));
    assert.match(err.message, /token 9/);
  } finally {
    client.close();
    await node.stop();
  }
});

test("configuration and argument mistakes are refused before any call", async () => {
  assert.throws(() => new Client({ endpoints: [] }), ConfigError);
  assert.throws(() => new Client({ endpoints: ["https://127.0.0.1:1"] }), /no CA is configured/);
  assert.throws(() => new Client({ endpoints: ["not an address"] }), /not a usable address/);
  assert.throws(() => new Client({ endpoints: ["127.0.0.1:1"], bearerToken: "   " }), /empty/);
  assert.throws(() => new Client({ endpoints: ["127.0.0.1:1"], bearerToken: "bad\u007ftoken" }), /printable ASCII/);
  assert.throws(() => new Client({ endpoints: ["127.0.0.1:1"], tls: { ca: "x", cert: "only a cert" } }), ConfigError);
  const c = new Client({ endpoints: ["127.0.0.1:1", " http://127.0.0.1:2 "] });
  assert.deepEqual(c.endpoints, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
  await assert.rejects(c.complete("s", "k".repeat(16), -1, { status: 200 }), InvalidArgumentError);
  await assert.rejects(c.claim("s", "k".repeat(16), "o", { leaseMs: 1.5 }), InvalidArgumentError);
  c.close();
  await assert.rejects(c.get("s", "k".repeat(16)), /closed/);
});
