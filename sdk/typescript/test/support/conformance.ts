// The interpreter of the shared conformance scenarios (sdk/conformance/scenarios.json, format
// in sdk/conformance/README.md): substitutes placeholders, performs each step with this SDK
// (client steps) or through the Express middleware with a real HTTP client (HTTP steps),
// renders each result as the README's JSON view and matches it against the expectation.
//
// It interprets the file; it never special-cases a scenario by name. Integers in views are
// compared exactly (tokens are bigint).

import * as assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";

import { Client } from "../../src/client";
import { IdemraftError } from "../../src/errors";
import { WorkFailure } from "../../src/execute";
import { fingerprint, type Fingerprint } from "../../src/fingerprint";
import { idempotency, type IdempotentRequest } from "../../src/http";
import type { IdemRecord, Outcome, ResponseInit, StoredResponse } from "../../src/types";
import { type Cluster, freePorts } from "./cluster";
import { send, serve, type Served } from "./http";
import type { Seeded } from "./random";

/* eslint-disable @typescript-eslint/no-explicit-any */
type Json = any;

export interface ScenarioFile {
  version: number;
  defaults: { client: { deadline_ms: number } };
  scenarios: Scenario[];
}

export interface Scenario {
  name: string;
  description?: string;
  kind: "client" | "http";
  tags?: string[];
  tenant?: string;
  app?: Json;
  steps: Json[];
}

/** An Express-compatible application factory (Express 5, Express 4). */
export type Framework = () => {
  use: (...h: unknown[]) => unknown;
  [method: string]: any;
};

class Gate {
  entered = false;
  opened = false;
  private openWaiters: Array<() => void> = [];
  private enterWaiters: Array<() => void> = [];

  /** Marks the gate entered and waits until it is opened, at most 60 s. */
  async pass(): Promise<void> {
    this.entered = true;
    for (const w of this.enterWaiters.splice(0)) w();
    if (this.opened) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, 60_000);
      this.openWaiters.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  open(): void {
    this.opened = true;
    for (const w of this.openWaiters.splice(0)) w();
  }

  /** Resolves true once something entered the gate, false after `ms`. */
  awaitEntered(ms: number): Promise<boolean> {
    if (this.entered) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(false), ms);
      this.enterWaiters.push(() => {
        clearTimeout(t);
        resolve(true);
      });
    });
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

// ---- bytes, placeholders, views --------------------------------------------------------

export function bytesIn(v: Json): Buffer {
  if (v === undefined || v === null) return Buffer.alloc(0);
  if (typeof v === "string") return Buffer.from(v, "utf8");
  if (typeof v === "object" && typeof v.base64 === "string") return Buffer.from(v.base64, "base64");
  throw new Error(`not a BYTES value: ${JSON.stringify(v)}`);
}

export function bytesView(b: Buffer): Json {
  if (b.length === 0) return "";
  try {
    return strictUtf8.decode(b);
  } catch {
    return { base64: b.toString("base64") };
  }
}

function responseIn(r: Json): ResponseInit {
  return { status: r.status, headers: (r.headers ?? []).map((h: [string, string]) => [h[0], h[1]]), body: bytesIn(r.body) };
}

function responseView(r: StoredResponse): Json {
  return { status: r.status, headers: r.headers.map(([n, v]) => [n, v]), body: bytesView(r.body) };
}

function recordView(r: IdemRecord | null): Json {
  if (r === null) return null;
  return {
    tenant: r.tenant,
    scope: r.scope,
    key: r.key,
    state: r.state,
    token: r.token,
    owner: r.owner,
    attempt: r.attempt,
    taken_over: r.takenOver,
    lease_expires_ms: r.leaseExpiresMs,
    created_ms: r.createdMs,
    updated_ms: r.updatedMs,
    completed_ms: r.completedMs,
    expires_ms: r.expiresMs,
    retention_ms: r.retentionMs,
    recovery_point: r.recoveryPoint,
    checkpoint: bytesView(r.checkpoint),
    response: r.response === null ? null : responseView(r.response),
    fingerprint: r.fingerprint.toString("hex"),
  };
}

function outcomeView(o: Outcome): Json {
  switch (o.outcome) {
    case "ACQUIRED":
      return {
        outcome: o.outcome,
        token: o.token,
        attempt: o.attempt,
        takeover: o.takeover,
        lease_expires_ms: o.leaseExpiresMs,
        expires_ms: o.expiresMs,
        recovery_point: o.recoveryPoint,
        checkpoint: bytesView(o.checkpoint),
      };
    case "REPLAY":
      return { outcome: o.outcome, token: o.token, completed_ms: o.completedMs, response: responseView(o.response) };
    case "IN_PROGRESS":
      return { outcome: o.outcome, lease_expires_ms: o.leaseExpiresMs, retry_after_ms: o.retryAfterMs };
    case "MISMATCH":
    case "NOT_FOUND":
      return { outcome: o.outcome };
    case "STALE_TOKEN":
      return { outcome: o.outcome, current: o.current };
    case "WRONG_STATE":
      return { outcome: o.outcome, state: o.state };
    case "COMPLETED":
      return { outcome: o.outcome, token: o.token };
    case "FAILED":
      return { outcome: o.outcome, token: o.token, retryable: o.retryable };
    case "LEASE_EXTENDED":
      return { outcome: o.outcome, token: o.token, lease_expires_ms: o.leaseExpiresMs };
  }
}

function errorView(e: unknown): Json {
  if (!(e instanceof IdemraftError)) {
    return { error: "runner", message: e instanceof Error ? e.stack ?? e.message : String(e), indeterminate: false };
  }
  const v: Json = { error: e.kind, message: e.message, indeterminate: e.indeterminate };
  const x = e as any;
  if (e.kind === "quota_exceeded") Object.assign(v, { tenant: x.tenant, limit: x.limit, records: x.records });
  if (e.kind === "in_progress") v.lease_expires_ms = x.leaseExpiresMs;
  if (e.kind === "lost_ownership") Object.assign(v, { token: x.token, current: x.current });
  return v;
}

/** JSON with every integer literal read as a bigint, so a u64 token parses exactly. */
export function parseJsonExact(text: string): Json {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const fail = (): never => {
    throw new SyntaxError(`bad JSON at ${i}`);
  };
  const value = (): Json => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const o: Json = {};
      ws();
      if (text[i] === "}") {
        i++;
        return o;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail();
        const k = str();
        ws();
        if (text[i++] !== ":") fail();
        o[k] = value();
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i++] !== "}") fail();
        return o;
      }
    }
    if (c === "[") {
      i++;
      const a: Json[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return a;
      }
      for (;;) {
        a.push(value());
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i++] !== "]") fail();
        return a;
      }
    }
    if (c === '"') return str();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]] as const) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
    if (m === null) fail();
    const lit = (m as RegExpExecArray)[0];
    i += lit.length;
    return (m as RegExpExecArray)[2] === undefined && (m as RegExpExecArray)[3] === undefined ? BigInt(lit) : Number(lit);
  };
  const str = (): string => {
    const start = i;
    i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    if (text[i] !== '"') fail();
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const v = value();
  ws();
  if (i !== text.length) fail();
  return v;
}

// ---- matching ---------------------------------------------------------------------------

const isInt = (v: unknown): v is number | bigint => typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));

function scalarEq(e: unknown, a: unknown): boolean {
  if (isInt(e) && isInt(a)) return BigInt(e) === BigInt(a);
  return typeof e === typeof a && e === a;
}

function deepEq(e: unknown, a: unknown): boolean {
  if (e === null || a === null || typeof e !== "object" || typeof a !== "object") {
    return e === null || a === null ? e === a : scalarEq(e, a);
  }
  if (Array.isArray(e) !== Array.isArray(a)) return false;
  if (Array.isArray(e)) return e.length === (a as unknown[]).length && e.every((x, k) => deepEq(x, (a as unknown[])[k]));
  const ek = Object.keys(e as object);
  const ak = Object.keys(a as object);
  return ek.length === ak.length && ek.every((k) => deepEq((e as Json)[k], (a as Json)[k]));
}

const show = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x));

function isMatcher(e: Json): boolean {
  return e !== null && typeof e === "object" && !Array.isArray(e) && Object.keys(e).length === 1 && Object.keys(e)[0].startsWith("$");
}

/** Why `actual` does not match `expect` (at `path`), or null when it does. */
export function mismatch(expect: Json, actual: Json, path = "$"): string | null {
  if (expect === null) return actual === null || actual === undefined ? null : `${path}: expected null, got ${show(actual)}`;
  if (isMatcher(expect)) {
    const [op] = Object.keys(expect);
    const arg = expect[op];
    const cmp = (test: (a: bigint, b: bigint) => boolean) =>
      isInt(actual) && isInt(arg) && test(BigInt(actual), BigInt(arg)) ? null : `${path}: ${show(actual)} is not ${op} ${show(arg)}`;
    switch (op) {
      case "$gt":
        return cmp((a, b) => a > b);
      case "$gte":
        return cmp((a, b) => a >= b);
      case "$lt":
        return cmp((a, b) => a < b);
      case "$lte":
        return cmp((a, b) => a <= b);
      case "$between":
        return isInt(actual) && BigInt(actual) >= BigInt(arg[0]) && BigInt(actual) <= BigInt(arg[1])
          ? null
          : `${path}: ${show(actual)} is not between ${show(arg)}`;
      case "$ne":
        return deepEq(arg, actual) ? `${path}: ${show(actual)} should differ from ${show(arg)}` : null;
      case "$in":
        return (arg as Json[]).some((x) => deepEq(x, actual)) ? null : `${path}: ${show(actual)} is not in ${show(arg)}`;
      case "$contains":
        return typeof actual === "string" && actual.includes(arg) ? null : `${path}: ${show(actual)} does not contain ${show(arg)}`;
      case "$any_of": {
        const why = (arg as Json[]).map((x) => mismatch(x, actual, path));
        return why.some((w) => w === null) ? null : `${path}: matches none of $any_of: ${why.join(" | ")}`;
      }
      default:
        return `${path}: unknown matcher ${op}`;
    }
  }
  if (Array.isArray(expect)) {
    if (!Array.isArray(actual)) return `${path}: expected an array, got ${show(actual)}`;
    if (actual.length !== expect.length) return `${path}: expected ${expect.length} elements, got ${actual.length}: ${show(actual)}`;
    for (let k = 0; k < expect.length; k++) {
      const w = mismatch(expect[k], actual[k], `${path}[${k}]`);
      if (w !== null) return w;
    }
    return null;
  }
  if (typeof expect === "object") {
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) return `${path}: expected an object, got ${show(actual)}`;
    for (const k of Object.keys(expect)) {
      const w = mismatch(expect[k], actual[k], `${path}.${k}`);
      if (w !== null) return w;
    }
    return null;
  }
  return scalarEq(expect, actual) ? null : `${path}: expected ${show(expect)}, got ${show(actual)}`;
}

/** The README's `problem` expectation of a request view. */
function problemMismatch(p: Json, view: Json): string | null {
  if (view.headers?.["content-type"] !== "application/problem+json") {
    return `problem: content-type is ${show(view.headers?.["content-type"])}`;
  }
  const body = view.json;
  if (body === null || typeof body !== "object" || Array.isArray(body)) return `problem: the body is not a JSON object: ${show(view.body)}`;
  if (body.type !== p.type) return `problem: type ${show(body.type)}, expected ${show(p.type)}`;
  if (!scalarEq(body.status, view.status)) return `problem: status ${show(body.status)} is not the response's ${view.status}`;
  if (typeof body.title !== "string" || body.title === "") return "problem: no title";
  if (typeof body.detail !== "string") return "problem: no detail";
  if (p.detail_contains !== undefined && !body.detail.includes(p.detail_contains)) {
    return `problem: detail ${show(body.detail)} does not contain ${show(p.detail_contains)}`;
  }
  return null;
}

// ---- the runner -------------------------------------------------------------------------

export interface RunnerEnv {
  file: ScenarioFile;
  cluster: Cluster;
  rnd: Seeded;
}

class Execution {
  readonly run: string;
  readonly vars = new Map<string, unknown>();
  readonly counters = new Map<string, number>();
  readonly gates = new Map<string, Gate>();
  readonly handles = new Map<string, Promise<Json>>();
  readonly cleanups: Array<() => Promise<void> | void> = [];
  client!: Client;
  app: Served | null = null;
  appClient: Client | null = null;
  tenant: string | undefined;

  constructor(
    readonly env: RunnerEnv,
    readonly scenario: Scenario,
    readonly framework: Framework | null,
  ) {
    this.run = env.rnd.hex(16);
  }

  gate(name: string): Gate {
    let g = this.gates.get(name);
    if (g === undefined) {
      g = new Gate();
      this.gates.set(name, g);
    }
    return g;
  }

  count(name: string): number {
    const n = (this.counters.get(name) ?? 0) + 1;
    this.counters.set(name, n);
    return n;
  }

  private resolve(name: string): unknown {
    if (name === "run") return this.run;
    if (name.startsWith("key:")) return `cf-${this.run}-${name.slice(4)}`;
    if (name.startsWith("owner:")) return `owner-${this.run}-${name.slice(6)}`;
    if (!this.vars.has(name)) throw new Error(`the scenario uses \${${name}}, which was never captured`);
    return this.vars.get(name);
  }

  subst(v: Json): Json {
    if (typeof v === "string") {
      const whole = /^\$\{([^}]*)\}$/.exec(v);
      if (whole !== null) return this.resolve(whole[1]);
      return v.replace(/\$\{([^}]*)\}/g, (_m, name: string) => String(this.resolve(name)));
    }
    if (Array.isArray(v)) return v.map((x) => this.subst(x));
    if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, this.subst(x)]));
    return v;
  }

  fingerprintOf(f: Json): Fingerprint | null {
    if (f === null || f === undefined) return null;
    return fingerprint(f.method, f.path, bytesIn(f.body));
  }

  async setup(): Promise<void> {
    const d = this.env.file.defaults.client.deadline_ms;
    this.tenant = this.scenario.tenant === undefined ? undefined : this.subst(this.scenario.tenant);
    this.client = new Client({ endpoints: this.env.cluster.endpoints, tenant: this.tenant, deadlineMs: d });
    this.cleanups.push(() => this.client.close());
    if (this.scenario.kind === "http") await this.serveApp();
  }

  /** Serves the scenario's app: every route behind one middleware instance with its settings. */
  private async serveApp(): Promise<void> {
    const spec = this.subst(this.scenario.app);
    const mw = spec.middleware ?? {};
    const endpoints =
      (mw.endpoints ?? "cluster") === "unreachable"
        ? (await freePorts(2)).map((p) => `127.0.0.1:${p}`)
        : this.env.cluster.endpoints;
    this.appClient = new Client({ endpoints, tenant: this.tenant, deadlineMs: this.env.file.defaults.client.deadline_ms });
    this.cleanups.push(() => this.appClient?.close());
    const idem = idempotency({
      client: this.appClient,
      scope: mw.scope,
      leaseMs: mw.lease_ms,
      inFlight: mw.in_flight === undefined || mw.in_flight === "conflict" ? "conflict" : { waitMs: mw.in_flight.wait_ms },
      failOpen: mw.fail_open,
      keyRequired: mw.key_required,
      maxBodyBytes: mw.max_body_bytes,
      addReplayHeaders: mw.replay_headers_add,
      clusterTimeoutMs: mw.cluster_timeout_ms,
      logger: { warn: () => undefined, error: () => undefined },
    });
    const app = (this.framework as Framework)();
    app.use(idem);
    for (const route of spec.routes) {
      const h = route.handler;
      const method = String(route.method).toLowerCase();
      app[method](route.path, (rq: IncomingMessage, res: ServerResponse, next: (e?: unknown) => void) => {
        const req = rq as IdempotentRequest;
        (async () => {
          const n = h.count !== undefined ? this.count(h.count) : 0;
          if (h.block !== undefined) await this.gate(h.block).pass();
          if (h.sleep_ms !== undefined) await sleep(h.sleep_ms);
          if (Array.isArray(h.raise_on_runs) && h.raise_on_runs.includes(n)) throw new Error(`the handler raises on run ${n}`);
          res.statusCode = h.status ?? 200;
          for (const [name, value] of h.headers ?? []) res.appendHeader(name, value);
          const token = req.idemraft ? String(req.idemraft.token) : "null";
          const attempt = req.idemraft ? String(req.idemraft.attempt) : "null";
          const body =
            typeof h.body === "string"
              ? Buffer.from(h.body.replaceAll("{{token}}", token).replaceAll("{{attempt}}", attempt), "utf8")
              : bytesIn(h.body);
          res.end(body);
        })().catch(next);
      });
    }
    app.use(idem.errorHandler);
    this.app = await serve(app as unknown as Parameters<typeof serve>[0]);
    this.cleanups.push(() => this.app?.close());
  }

  private async request(step: Json): Promise<Json> {
    if (this.app === null) throw new Error("a request step in a scenario without an app");
    const r = await send(this.app.base, {
      method: step.method,
      path: step.path,
      headers: (step.headers ?? []).map((h: [string, string]) => [h[0], h[1]]),
      body: step.body === undefined ? undefined : bytesIn(step.body),
      timeoutMs: 60_000,
    });
    const headers: Json = {};
    for (const [n, v] of r.headers) {
      if (headers[n] === undefined) headers[n] = v;
      else headers[n] = Array.isArray(headers[n]) ? [...headers[n], v] : [headers[n], v];
    }
    let json: Json = null;
    try {
      json = parseJsonExact(r.body.toString("utf8"));
    } catch {
      json = null;
    }
    return { status: r.status, headers, body: bytesView(r.body), json };
  }

  /** Performs a step that produces a view; errors of the SDK become error views. */
  private async perform(step: Json): Promise<Json> {
    const c = this.client;
    const call = { deadlineMs: step.deadline_ms };
    try {
      switch (step.op) {
        case "claim":
          return outcomeView(
            await c.claim(step.scope, step.key, step.owner, {
              fingerprint: this.fingerprintOf(step.fingerprint),
              leaseMs: step.lease_ms,
              ttlMs: step.ttl_ms,
              allowTakeover: step.allow_takeover ?? false,
              ...call,
            }),
          );
        case "complete":
          return outcomeView(await c.complete(step.scope, step.key, step.token, responseIn(step.response), call));
        case "fail":
          return outcomeView(
            await c.fail(step.scope, step.key, step.token, step.retryable, step.response ? responseIn(step.response) : null, call),
          );
        case "extend_lease":
          return outcomeView(await c.extendLease(step.scope, step.key, step.token, step.lease_ms, call));
        case "checkpoint":
          return outcomeView(
            await c.checkpoint(step.scope, step.key, step.token, step.recovery_point, bytesIn(step.data), step.lease_ms, call),
          );
        case "takeover":
          return outcomeView(await c.takeover(step.scope, step.key, step.owner, { force: step.force ?? false, leaseMs: step.lease_ms, ...call }));
        case "get":
          return { record: recordView(await c.get(step.scope, step.key, call)) };
        case "wait": {
          const w = await c.wait(step.scope, step.key, step.timeout_ms);
          return { record: recordView(w.record), timed_out: w.timedOut };
        }
        case "list": {
          const page = await c.list({ scope: step.scope, state: step.state, abandonedOnly: step.abandoned_only, limit: step.limit, ...call });
          return { records: page.records.map(recordView), next_after: page.nextAfter };
        }
        case "set_quota":
          await c.setQuota(step.tenant, step.max_records, call);
          return {};
        case "execute": {
          const work = step.work;
          const executed = await c.execute(
            step.scope,
            step.key,
            this.fingerprintOf(step.fingerprint),
            async () => {
              if (work.count !== undefined) this.count(work.count);
              if (work.block !== undefined) await this.gate(work.block).pass();
              if (work.sleep_ms !== undefined) await sleep(work.sleep_ms);
              const r = work.result;
              if (r.respond !== undefined) return responseIn(r.respond);
              if (r.fail_retryable !== undefined) return WorkFailure.retryable(r.fail_retryable);
              if (r.fail_terminal !== undefined) return WorkFailure.terminal(responseIn(r.fail_terminal));
              throw new Error(`a work result this runner does not know: ${show(r)}`);
            },
            { leaseMs: step.lease_ms, deadlineMs: step.deadline_ms, owner: step.owner, allowTakeover: step.allow_takeover ?? true },
          );
          return { outcome: "EXECUTED", token: executed.token, replayed: executed.replayed, response: responseView(executed.response) };
        }
        case "request":
          return await this.request(step);
        default:
          throw new Error(`op ${step.op} produces no view here`);
      }
    } catch (e) {
      return errorView(e);
    }
  }

  private check(step: Json, view: Json, where: string): void {
    if (step.expect === undefined) {
      assert.ok(view === null || typeof view !== "object" || view.error === undefined, `${where}: unexpected error ${show(view)}`);
    } else {
      let expect = step.expect;
      if (step.op === "request" || (step.op === "join" && expect !== null && typeof expect === "object" && "problem" in expect)) {
        if (expect.problem !== undefined) {
          const p = problemMismatch(expect.problem, view);
          assert.equal(p, null, `${where}: ${p}\n  view: ${show(view)}`);
          expect = { ...expect };
          delete expect.problem;
        }
      }
      const why = mismatch(expect, view);
      assert.equal(why, null, `${where}: ${why}\n  view: ${show(view)}`);
    }
    for (const [name, p] of Object.entries((step.capture ?? {}) as Record<string, string>)) {
      let v: Json = view;
      for (const part of p.split(".")) {
        if (v === null || v === undefined || typeof v !== "object") {
          v = undefined;
          break;
        }
        v = Array.isArray(v) ? v[Number(part)] : v[part];
      }
      assert.ok(v !== undefined, `${where}: capture ${name} from ${p}: no such path in ${show(view)}`);
      this.vars.set(name, v);
    }
  }

  async step(raw: Json, index: number): Promise<void> {
    const where = `step ${index} (${raw.op})`;
    if (raw.op === "join") {
      const handle = this.handles.get(raw.handle);
      assert.ok(handle !== undefined, `${where}: no background call named ${raw.handle}`);
      const ms = raw.timeout_ms ?? 60_000;
      const view = await Promise.race([handle, sleep(ms).then(() => ({ error: "runner", message: `join timed out after ${ms} ms` }))]);
      // The expectation may use captures made after the call started.
      this.check(this.subst({ ...raw, op: "join" }), view, where);
      return;
    }
    const step = this.subst(raw);
    switch (step.op) {
      case "sleep":
        await sleep(step.ms);
        return;
      case "kill_leader":
        await this.env.cluster.killLeader(10_000);
        return;
      case "await_blocked": {
        const ok = await this.gate(step.gate).awaitEntered(step.timeout_ms ?? 10_000);
        assert.ok(ok, `${where}: nothing entered gate ${step.gate}`);
        return;
      }
      case "release":
        this.gate(step.gate).open();
        return;
      case "counter": {
        const why = mismatch(step.expect, this.counters.get(step.name) ?? 0);
        assert.equal(why, null, `${where}: counter ${step.name}: ${why}`);
        return;
      }
    }
    if (step.background !== undefined) {
      assert.ok(step.expect === undefined && step.capture === undefined, `${where}: a background step's expect belongs to its join`);
      this.handles.set(step.background, this.perform(step));
      return;
    }
    this.check(step, await this.perform(step), where);
  }

  async teardown(): Promise<void> {
    // Unblock whatever still waits at a gate, and let background calls finish (bounded).
    for (const g of this.gates.values()) g.open();
    await Promise.race([Promise.allSettled([...this.handles.values()]), sleep(30_000)]);
    for (const f of this.cleanups.reverse()) await f();
    if (this.env.cluster.degraded) await this.env.cluster.restartKilled();
  }
}

/** Runs one execution of a scenario (an HTTP one under `framework`). */
export async function runScenario(env: RunnerEnv, scenario: Scenario, framework: Framework | null): Promise<void> {
  const ex = new Execution(env, scenario, framework);
  try {
    await ex.setup();
    for (const [i, step] of scenario.steps.entries()) await ex.step(step, i);
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e));
    err.message = `${scenario.name} (run ${ex.run}): ${err.message}`;
    throw err;
  } finally {
    await ex.teardown();
  }
}
