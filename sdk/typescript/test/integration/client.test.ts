// The client against real clusters of `idemraft` processes: leader discovery from a
// follower's hint, claims retried with the same owner through a leader SIGKILL, a connection
// broken mid-call reported as an unknown outcome (and retried on another node when one is
// there), and a cluster that requires TLS client certificates and bearer tokens.

import { after, before, describe, test } from "node:test";
import * as assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";

import { Client } from "../../src/client";
import { OutcomeUnknownError, RpcError, UnavailableError } from "../../src/errors";
import { fingerprint } from "../../src/fingerprint";
import { binDir, Cluster } from "../support/cluster";
import { seeded, withSeed } from "../support/random";

const rnd = seeded();
const key = (name: string) => `it-${rnd.hex(12)}-${name}`.padEnd(16, "0");

describe("a plaintext cluster", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start();
  });
  after(async () => {
    await cluster?.stop();
  });

  test("typed round trip: claim, replay, mismatch, list, wait", async () => {
    const client = new Client({ endpoints: cluster.endpoints });
    try {
      const k = key("roundtrip");
      const fp = fingerprint("POST", "/v1/charges", '{"amount":100}');
      const a = await client.claim("it.client", k, "o1", { fingerprint: fp, leaseMs: 10_000 });
      assert.equal(a.outcome, "ACQUIRED");
      if (a.outcome !== "ACQUIRED") return;
      assert.equal(typeof a.token, "bigint");
      const again = await client.claim("it.client", k, "o1", { fingerprint: fp, leaseMs: 10_000 });
      assert.deepEqual(again.outcome === "ACQUIRED" && again.token, a.token, "the owner's retried claim gets its grant back");
      const other = await client.claim("it.client", k, "o2", { fingerprint: fingerprint("POST", "/v1/charges", '{"amount":1}') });
      assert.equal(other.outcome, "MISMATCH");
      const waiting = client.wait("it.client", k, 5_000);
      const done = await client.complete("it.client", k, a.token, { status: 201, headers: [["location", "/c/1"]], body: Buffer.from([0, 1, 255]) });
      assert.deepEqual(done, { outcome: "COMPLETED", token: a.token });
      const waited = await waiting;
      assert.equal(waited.timedOut, false);
      assert.equal(waited.record?.state, "COMPLETED");
      const replay = await client.claim("it.client", k, "o3", { fingerprint: fingerprint("POST", "/v1/charges", '{ "amount" : 1e2 }') });
      assert.equal(replay.outcome, "REPLAY");
      if (replay.outcome === "REPLAY") {
        assert.deepEqual(replay.response.body, Buffer.from([0, 1, 255]));
        assert.deepEqual(replay.response.headers, [["location", "/c/1"]]);
      }
      const page = await client.list({ scope: "it.client", state: "COMPLETED" });
      assert.ok(page.records.some((r) => r.key === k && r.fingerprint.equals(fp.bytes)));
    } finally {
      client.close();
    }
  });

  test("a client given one follower finds the leader from its hint", async () => {
    const leaderId = await cluster.leader();
    const follower = cluster.nodes.find((n) => n.id !== leaderId);
    assert.ok(follower);
    const leaderAddr = `127.0.0.1:${cluster.nodes.find((n) => n.id === leaderId)?.clientPort}`;
    const client = new Client({ endpoints: [`127.0.0.1:${follower.clientPort}`] });
    try {
      await client.claim("it.client", key("hint"), "o1", { leaseMs: 5_000 });
      assert.deepEqual(client.endpoints, [`http://127.0.0.1:${follower.clientPort}`, `http://${leaderAddr}`]);
      assert.equal(await client.discover(), leaderId);
    } finally {
      client.close();
    }
  });

  test("a broken connection is an unknown outcome when no node answers, and retried on another when one does", async () => {
    const leaderId = await cluster.leader();
    const node = cluster.nodes.find((n) => n.id === leaderId);
    assert.ok(node);
    const lone = new Client({ endpoints: [`127.0.0.1:${node.clientPort}`] });
    const full = new Client({ endpoints: cluster.endpoints });
    try {
      const k = key("broken");
      const a = await full.claim("it.client", k, "holder", { leaseMs: 30_000 });
      assert.equal(a.outcome, "ACQUIRED");
      await full.discover();
      // Both clients hold a Wait open on the leader when it dies.
      const loneWait = lone.wait("it.client", k, 3_000).then(
        () => assert.fail("a wait on a dead node with no other to ask cannot succeed"),
        (e: unknown) => e,
      );
      const fullWait = full.wait("it.client", k, 3_000);
      await new Promise((r) => setTimeout(r, 500));
      cluster.kill(leaderId);
      const err = await loneWait;
      assert.ok(err instanceof OutcomeUnknownError, String(err));
      assert.match((err as Error).message, /broke before the answer arrived/);
      const waited = await fullWait;
      assert.equal(waited.timedOut, true, "the retried wait ran on another node");
      assert.equal(waited.record?.owner, "holder");
    } finally {
      lone.close();
      full.close();
      await cluster.restartKilled();
    }
  });

  test("claims in flight through a leader SIGKILL are retried with the same owner and keep their grant", async () => {
    await withSeed(rnd, async () => {
      const client = new Client({ endpoints: cluster.endpoints, random: rnd.random });
      try {
        await client.discover();
        const keys = Array.from({ length: 40 }, (_, i) => key(`kill${i}`));
        const claims = keys.map(async (k, i) => {
          await new Promise((r) => setTimeout(r, i * 25));
          return client.claim("it.kill", k, `owner-${k}`, { leaseMs: 30_000, deadlineMs: 20_000 });
        });
        await new Promise((r) => setTimeout(r, 300));
        const killed = await cluster.killLeader();
        const outcomes = await Promise.all(claims);
        const again = await Promise.all(keys.map((k) => client.claim("it.kill", k, `owner-${k}`, { leaseMs: 30_000 })));
        outcomes.forEach((o, i) => {
          assert.equal(o.outcome, "ACQUIRED", `${keys[i]}: ${JSON.stringify(o, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
          const b = again[i];
          assert.ok(o.outcome === "ACQUIRED" && b.outcome === "ACQUIRED" && b.token === o.token, `${keys[i]} kept its grant`);
        });
        assert.notEqual(await cluster.leader(), killed);
      } finally {
        client.close();
        await cluster.restartKilled();
      }
    });
  });
});

describe("a cluster with TLS client certificates and bearer tokens", () => {
  let cluster: Cluster;
  let certs = "";
  const tenantToken = randomBytes(24).toString("hex");
  const adminToken = randomBytes(24).toString("hex");
  const sha = (t: string) => createHash("sha256").update(t).digest("hex");

  before(async () => {
    cluster = await Cluster.start({
      prepare: (dir) => {
        certs = path.join(dir, "certs");
        execFileSync(path.join(binDir(), "idemctl"), ["dev-certs", certs], { stdio: "ignore" });
        execFileSync(path.join(binDir(), "idemctl"), ["dev-certs", path.join(dir, "other-ca")], { stdio: "ignore" });
        fs.writeFileSync(
          path.join(dir, "tokens.toml"),
          `[[token]]\nname = "acme"\ntenant = "acme"\nsha256 = "${sha(tenantToken)}"\n\n` +
            `[[token]]\nname = "operator"\nadmin = true\nsha256 = "${sha(adminToken)}"\n`,
        );
      },
      extraArgs: (id, dir) => [
        "--tls-cert", path.join(dir, "certs", `node-${id}.pem`),
        "--tls-key", path.join(dir, "certs", `node-${id}.key`),
        "--tls-client-ca", path.join(dir, "certs", "ca.pem"),
        "--tokens-file", path.join(dir, "tokens.toml"),
      ],
      ctlArgs: (dir) => [
        "--ca", path.join(dir, "certs", "ca.pem"),
        "--cert", path.join(dir, "certs", "client.pem"),
        "--key", path.join(dir, "certs", "client.key"),
      ],
      ctlEnv: { IDEMCTL_TOKEN: adminToken },
    });
  });
  after(async () => {
    await cluster?.stop();
  });

  const tls = () => ({
    ca: fs.readFileSync(path.join(certs, "ca.pem")),
    cert: fs.readFileSync(path.join(certs, "client.pem")),
    key: fs.readFileSync(path.join(certs, "client.key")),
  });

  test("a client with the CA, a client certificate and a token works in the token's tenant", async () => {
    const client = new Client({ endpoints: cluster.endpoints, tls: tls(), bearerToken: tenantToken });
    const admin = new Client({ endpoints: cluster.endpoints, tls: tls(), bearerToken: adminToken });
    try {
      assert.ok(client.endpoints.every((e) => e.startsWith("https://")));
      const k = key("tls");
      const a = await client.claim("it.tls", k, "o1", { leaseMs: 5_000 });
      assert.equal(a.outcome, "ACQUIRED");
      const rec = await client.get("it.tls", k);
      assert.equal(rec?.tenant, "acme");
      const q = await admin.getQuota("acme");
      assert.ok(q.tenants.some((t) => t.tenant === "acme" && t.records >= 1));
    } finally {
      client.close();
      admin.close();
    }
  });

  test("no token, no client certificate or another CA: refused", async () => {
    const noToken = new Client({ endpoints: cluster.endpoints, tls: tls(), deadlineMs: 2_000 });
    const noCert = new Client({ endpoints: cluster.endpoints, tls: { ca: tls().ca }, bearerToken: tenantToken, deadlineMs: 1_500 });
    const otherCa = new Client({
      endpoints: cluster.endpoints,
      tls: { ...tls(), ca: fs.readFileSync(path.join(path.dirname(certs), "other-ca", "ca.pem")) },
      bearerToken: tenantToken,
      deadlineMs: 1_500,
    });
    try {
      const e1 = await noToken.get("it.tls", key("x")).catch((e) => e);
      assert.ok(e1 instanceof RpcError && e1.codeName === "Unauthenticated", String(e1));
      for (const c of [noCert, otherCa]) {
        const e = await c.get("it.tls", key("y")).catch((x) => x);
        assert.ok(e instanceof UnavailableError || e instanceof OutcomeUnknownError, String(e));
      }
    } finally {
      noToken.close();
      noCert.close();
      otherCa.close();
    }
  });
});
