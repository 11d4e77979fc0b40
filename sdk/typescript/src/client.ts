// The client proper: connections to the nodes, leader discovery, retries within a deadline,
// the mapping of gRPC statuses onto the error taxonomy, and one typed method per call of the
// Idempotency service (plus the few Admin calls an application needs). `execute` and its
// lease keep-alive live in execute.ts.
//
// The retry rules are the Rust SDK's, so every SDK behaves alike under faults:
// - a call is retried, with full-jitter exponential backoff, on UNAVAILABLE, DEADLINE_EXCEEDED,
//   CANCELLED, RESOURCE_EXHAUSTED and a connection broken mid-call, until its deadline; every
//   Idemraft call is safe to repeat with the same arguments (same owner id, same token);
// - a follower that forwarded a call, or that refused it for want of a leader it knows, names
//   the leader in `idemraft-leader-addr`: the next attempt (and the next call) goes there;
// - a node that left an attempt unanswered (its whole attempt time passed, or the connection
//   broke mid-call) is passed over for SHUN_MS: calls start at the next node, and a hint
//   naming it does not make it the preferred node again until then, or until it answers;
// - a connection broken while the call was in flight is "outcome unknown", never a refusal;
// - once any attempt may have taken effect, a later refusal does not make the outcome known.

import * as fs from "node:fs";
import { randomUUID } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

import {
  ConfigError,
  DeadlineExceededError,
  IdemraftError,
  InvalidArgumentError,
  OutcomeUnknownError,
  QuotaExceededError,
  RefusedError,
  RpcError,
  UnavailableError,
} from "./errors";
import type { Fingerprint } from "./fingerprint";
import {
  bytesIn,
  millis,
  outcomeFromPb,
  quotaFromPb,
  recordFromPb,
  recordIdFromPb,
  responseToPb,
  services,
  stateToPb,
  statusFromPb,
  u64,
} from "./proto";
import type {
  ClaimOutcome,
  CompleteOutcome,
  ExtendOutcome,
  FailOutcome,
  IdemRecord,
  ListPage,
  NodeStatus,
  Outcome,
  QuotaReport,
  RecordId,
  RecordState,
  ResponseInit,
  TakeoverOutcome,
  Waited,
} from "./types";
import { execute, type ExecuteOptions, type Executed, type Work } from "./execute";

export const LEADER_ADDR_HEADER = "idemraft-leader-addr";
export const SERVED_BY_HEADER = "idemraft-served-by";
export const NOT_PROPOSED_HEADER = "idemraft-not-proposed";
export const QUOTA_TENANT_HEADER = "idemraft-quota-tenant";
export const QUOTA_LIMIT_HEADER = "idemraft-quota-limit";
export const QUOTA_RECORDS_HEADER = "idemraft-quota-records";

/** TLS settings: the CA that signed the nodes' certificates, and an optional client certificate. */
export interface TlsOptions {
  /** PEM of the CA. Only this CA is trusted for the cluster: never the system's roots. */
  ca: Buffer | string;
  /** Client certificate chain (PEM), for nodes started with `--tls-client-ca`. */
  cert?: Buffer | string;
  /** The client certificate's private key (PEM). */
  key?: Buffer | string;
}

/** Reads TLS settings from PEM files. */
export function tlsFromFiles(caPath: string, certPath?: string, keyPath?: string): TlsOptions {
  const read = (what: string, p: string) => {
    try {
      return fs.readFileSync(p);
    } catch (e) {
      throw new ConfigError(`cannot read the ${what} ${p}: ${(e as Error).message}`);
    }
  };
  if ((certPath === undefined) !== (keyPath === undefined)) {
    throw new ConfigError("a client certificate needs both its certificate file and its key file");
  }
  return {
    ca: read("CA certificate", caPath),
    cert: certPath === undefined ? undefined : read("client certificate", certPath),
    key: keyPath === undefined ? undefined : read("client key", keyPath),
  };
}

/** Client settings. Only `endpoints` is required. */
export interface ClientOptions {
  /** Client addresses of some or all nodes, `host:port`, `http://host:port` or `https://host:port`. */
  endpoints: string[];
  /**
   * Tenant of every record this client touches. Empty (the default) lets the node decide: the
   * bearer token's tenant when the node checks tokens, `default` when it does not.
   */
  tenant?: string;
  /** Deadline of a call when the caller gives none; 10 000 ms. */
  deadlineMs?: number;
  /** Longest single attempt, so a hung node costs one attempt and not the whole deadline; 2000 ms. */
  attemptTimeoutMs?: number;
  /** First backoff after a retryable failure; doubles up to `backoffMaxMs`, full jitter; 20 ms. */
  backoffBaseMs?: number;
  /** Backoff bound; 250 ms. */
  backoffMaxMs?: number;
  /** How long an attempt waits for a connection to a node before trying the next; 500 ms. */
  connectTimeoutMs?: number;
  /** Set: endpoints without a scheme (and leader addresses nodes hand back) are dialled with TLS. */
  tls?: TlsOptions;
  /** Sent as `authorization: Bearer <token>` on every call, for nodes started with `--tokens-file`. */
  bearerToken?: string;
  /** Source of randomness for backoff jitter, in [0, 1); `Math.random` by default. */
  random?: () => number;
}

/** Per-call settings. */
export interface CallOptions {
  /** This call's deadline, ms from now; the client's `deadlineMs` by default. */
  deadlineMs?: number;
}

/** Options of a claim. */
export interface ClaimOptions extends CallOptions {
  /** Request fingerprint, binding the key to one payload. */
  fingerprint?: Fingerprint | null;
  /** Lease; absent takes the node's default. */
  leaseMs?: number;
  /** Record TTL and retention once settled; absent takes the scope's default. */
  ttlMs?: number;
  /** Take over an IN_PROGRESS record whose lease has expired. */
  allowTakeover?: boolean;
}

/** Options of a takeover. */
export interface TakeoverOptions extends CallOptions {
  /** Operator override: take over even while the holder's lease is alive. */
  force?: boolean;
  /** Lease for the new owner; absent takes the node's default. */
  leaseMs?: number;
}

/** A List request. */
export interface ListOptions extends CallOptions {
  /** Tenant to list; the client's tenant by default. */
  tenant?: string;
  /** Only this scope. */
  scope?: string;
  /** Only this state. */
  state?: Exclude<RecordState, "UNKNOWN">;
  /** Only IN_PROGRESS records whose lease has expired (abandoned work). */
  abandonedOnly?: boolean;
  /** Resume after this record (the `nextAfter` of the previous page). */
  startAfter?: RecordId | null;
  /** Page size; 0 or absent means 100, at most 1000. */
  limit?: number;
}

/** Shortest attempt worth making; less is left only to learn that time ran out. */
const MIN_ATTEMPT_MS = 10;
/** A node that refused connections is skipped for this long at first, doubling per failure. */
const DOWN_BASE_MS = 100;
const DOWN_MAX_MS = 2000;
/**
 * How long a node that left an attempt unanswered (paused, partitioned, dead) is passed over.
 * Longer than a failover (about 1.6 s with the node's default election timeouts), so that the
 * hints of followers that have not yet noticed their leader's silence, which name that leader,
 * do not lead every new call back into it to wait out a whole attempt; short enough that a node
 * that was only slow for a moment soon takes calls again.
 */
const SHUN_MS = 2000;
/** A discovered (not configured) endpoint is dropped after this many failures in a row. */
const DROP_AFTER_FAILURES = 3;

const MAX_MESSAGE_BYTES = 8 * 1024 * 1024;

/** What one attempt ended with when it got no answer. */
interface AttemptStatus {
  code: number;
  details: string;
  metadata: grpc.Metadata;
  /** The request may have reached the node (false: no connection was ever made). */
  sent: boolean;
}

type AttemptResult<T> = { ok: true; value: T; hint?: string } | { ok: false; status: AttemptStatus };

interface Target {
  /** Normalised address, with its scheme: how the client names it. */
  addr: string;
  idem: grpc.Client;
  admin: grpc.Client;
  /** Given by the caller (kept forever) rather than learned from a leader hint. */
  configured: boolean;
  failures: number;
  downUntil: number;
  /** Until when calls start elsewhere: this node left an attempt unanswered. */
  shunnedUntil: number;
}

const ADDRESS = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$/;

/** `host:port` gets `https://` when the client has a CA to verify nodes with, else `http://`. */
export function normaliseEndpoint(addr: string, tls: boolean): string {
  const a = addr.trim();
  if (a.startsWith("http://") || a.startsWith("https://")) return a.replace(/\/+$/, "");
  return `${tls ? "https" : "http"}://${a}`;
}

function clockMs(): number {
  return Date.now();
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}

function metaText(md: grpc.Metadata, key: string): string | undefined {
  const v = md.get(key)[0];
  return v === undefined ? undefined : typeof v === "string" ? v : v.toString("utf8");
}

function shunned(t: Target, now: number): boolean {
  return t.shunnedUntil > now;
}

function fromServer(s: AttemptStatus): boolean {
  return Object.keys(s.metadata.getMap()).length > 0;
}

function neverProposed(s: AttemptStatus): boolean {
  return s.code === grpc.status.RESOURCE_EXHAUSTED && s.metadata.get(NOT_PROPOSED_HEADER).length > 0;
}

/**
 * Why the reply to a call was lost, when the status says it was: the connection under the
 * call broke, or HTTP/2 closed it, before an answer arrived. The call may have been carried
 * out, so this is "outcome unknown", never a refusal.
 *
 * grpc-js makes these statuses itself, with no metadata, and words them in a few known ways;
 * a status the node sent always carries metadata, so a node's own INTERNAL (a storage
 * failure) stays a determinate error.
 */
export function lostReply(s: AttemptStatus): string | undefined {
  if (!s.sent) return undefined;
  const local = !fromServer(s);
  switch (s.code) {
    case grpc.status.UNAVAILABLE:
      if (local && /^Connection dropped|ECONNRESET|ETIMEDOUT|EPIPE|socket hang up|^Write (error|failed)|GOAWAY/i.test(s.details)) {
        return "the connection to the node broke before the answer arrived";
      }
      return undefined;
    case grpc.status.INTERNAL:
      if ((local && /RST_STREAM|http2|protocol error/i.test(s.details)) || s.details.startsWith("h2 protocol error:")) {
        return "the HTTP/2 connection to the node broke before the answer arrived";
      }
      return undefined;
    case grpc.status.UNKNOWN:
      // No gRPC status at all: something below gRPC ended the call.
      return "the call ended without a gRPC status";
    case grpc.status.RESOURCE_EXHAUSTED:
      // The node marks every call it sheds; an unmarked one was ended by HTTP/2 (a GOAWAY
      // with ENHANCE_YOUR_CALM), possibly after the node had taken it.
      return neverProposed(s)
        ? undefined
        : "HTTP/2 closed the connection to the node as overloaded before the answer arrived";
    default:
      return undefined;
  }
}

/** Whether an attempt that ended this way is worth repeating. */
export function retryable(s: AttemptStatus): boolean {
  switch (s.code) {
    case grpc.status.UNAVAILABLE:
    case grpc.status.DEADLINE_EXCEEDED:
    case grpc.status.CANCELLED:
    case grpc.status.RESOURCE_EXHAUSTED:
      return true;
    default:
      return lostReply(s) !== undefined;
  }
}

/** Statuses that say only that an attempt's time ran out. */
function ranOut(code: number): boolean {
  return code === grpc.status.DEADLINE_EXCEEDED || code === grpc.status.CANCELLED;
}

const CODE_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(grpc.status)
    .filter(([, v]) => typeof v === "number")
    .map(([k, v]) => [v as number, k.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase())]),
);

/** The error a status maps to. */
export function errorFromStatus(s: AttemptStatus): IdemraftError {
  const why = lostReply(s);
  if (why !== undefined) {
    return new OutcomeUnknownError(
      `${why} (${CODE_NAMES[s.code] ?? s.code}: ${s.details}); the call may or may not have taken effect: ` +
        "repeat it with the same arguments",
    );
  }
  switch (s.code) {
    case grpc.status.INVALID_ARGUMENT:
      return new InvalidArgumentError(s.details);
    case grpc.status.UNAVAILABLE:
      return new UnavailableError(s.details);
    case grpc.status.DEADLINE_EXCEEDED:
    case grpc.status.CANCELLED:
      // A cancelled call is one whose time ran out (the node's answer when a call's
      // grpc-timeout passes): its outcome is just as unknown.
      return new DeadlineExceededError(s.details);
    case grpc.status.FAILED_PRECONDITION: {
      // The metadata, not the message, is what tells a quota refusal apart.
      const limit = metaText(s.metadata, QUOTA_LIMIT_HEADER);
      if (limit !== undefined && /^\d+$/.test(limit)) {
        const records = metaText(s.metadata, QUOTA_RECORDS_HEADER);
        return new QuotaExceededError(
          s.details,
          metaText(s.metadata, QUOTA_TENANT_HEADER) ?? "",
          Number(limit),
          records !== undefined && /^\d+$/.test(records) ? Number(records) : Number(limit),
        );
      }
      return new RefusedError(s.details);
    }
    default:
      return new RpcError(s.details, s.code);
  }
}

/**
 * The error of a call whose deadline ran out, `last` being the most telling answer of its
 * attempts. When an earlier attempt may have taken effect, a determinate refusal after it
 * (an overloaded leader shedding the retry) does not make the outcome known.
 */
function gaveUp(last: AttemptStatus, maybeApplied: boolean): IdemraftError {
  const e = errorFromStatus(last);
  if (e.indeterminate || !maybeApplied) return e;
  return new OutcomeUnknownError(
    `an earlier attempt got no answer and may have taken effect, and the last was refused (${e.describe()}); ` +
      "repeat the call with the same arguments",
  );
}

interface CallSpec {
  service: "idem" | "admin";
  method: string;
  /** The request; a function builds it anew for each attempt (Wait asks for what is left). */
  request: unknown | (() => unknown);
  /** Absolute deadline, ms since the epoch. */
  deadline: number;
  /** Longest attempt, given what is left of the call. */
  attemptBudget?: (remainingMs: number) => number;
  /** Set when an attempt ended without proof that it had no effect. */
  unsure?: { value: boolean };
}

/** A connection to an Idemraft cluster. Create one per process and share it; `close()` it at exit. */
export class Client {
  readonly tenant: string;
  private readonly deadlineMs: number;
  private readonly attemptTimeoutMs: number;
  private readonly backoffBaseMs: number;
  private readonly backoffMaxMs: number;
  private readonly connectTimeoutMs: number;
  private readonly random: () => number;
  private readonly credentials: grpc.ChannelCredentials;
  private readonly tls: boolean;
  private readonly authorization: string | undefined;
  private readonly targets: Target[] = [];
  /** Index into `targets` of the node believed to lead. */
  private preferred = 0;
  private closed = false;

  constructor(options: ClientOptions) {
    if (!options || !Array.isArray(options.endpoints) || options.endpoints.length === 0) {
      throw new ConfigError("no endpoints: give at least one node's client address");
    }
    const positive = (v: number | undefined, dflt: number, what: string) => {
      if (v === undefined) return dflt;
      if (!Number.isFinite(v) || v < 0) throw new ConfigError(`${what} must be a number of ms >= 0, not ${v}`);
      return v;
    };
    this.tenant = options.tenant ?? "";
    this.deadlineMs = positive(options.deadlineMs, 10_000, "deadlineMs");
    this.attemptTimeoutMs = positive(options.attemptTimeoutMs, 2_000, "attemptTimeoutMs");
    this.backoffBaseMs = positive(options.backoffBaseMs, 20, "backoffBaseMs");
    this.backoffMaxMs = positive(options.backoffMaxMs, 250, "backoffMaxMs");
    this.connectTimeoutMs = positive(options.connectTimeoutMs, 500, "connectTimeoutMs");
    this.random = options.random ?? Math.random;
    this.tls = options.tls !== undefined;
    if (options.tls !== undefined) {
      const pem = (v: Buffer | string | undefined) => (v === undefined ? null : Buffer.from(v));
      if ((options.tls.cert === undefined) !== (options.tls.key === undefined)) {
        throw new ConfigError("a client certificate needs both `cert` and `key`");
      }
      try {
        this.credentials = grpc.credentials.createSsl(pem(options.tls.ca), pem(options.tls.key), pem(options.tls.cert));
      } catch (e) {
        throw new ConfigError(`the TLS settings are unusable: ${(e as Error).message}; check the PEM data`);
      }
    } else {
      this.credentials = grpc.credentials.createInsecure();
    }
    if (options.bearerToken !== undefined) {
      const token = options.bearerToken.trim();
      if (token.length === 0) {
        throw new ConfigError("the bearer token is empty: give the token from the tokens file's owner");
      }
      if (!/^[\x21-\x7e]+$/.test(token)) {
        throw new ConfigError("the bearer token has characters that cannot go in a header: use printable ASCII");
      }
      this.authorization = `Bearer ${token}`;
    }
    for (const e of options.endpoints) this.targets.push(this.target(e, true));
  }

  /** Endpoint addresses, normalised, in the order `nodeStatus` indexes them. */
  get endpoints(): string[] {
    return this.targets.map((t) => t.addr);
  }

  /** Closes every connection. Calls made afterwards fail with a ConfigError. */
  close(): void {
    this.closed = true;
    for (const t of this.targets) t.idem.close();
  }

  private target(addr: string, configured: boolean): Target {
    const url = normaliseEndpoint(addr, this.tls);
    const https = url.startsWith("https://");
    const hostPort = url.slice(https ? 8 : 7);
    if (!ADDRESS.test(hostPort)) {
      throw new ConfigError(`endpoint '${addr}' is not a usable address; write host:port`);
    }
    if (https && !this.tls) {
      throw new ConfigError(`endpoint '${addr}' uses https but no CA is configured: set tls.ca`);
    }
    const creds = https ? this.credentials : grpc.credentials.createInsecure();
    const { Idempotency, Admin } = services();
    const idem = new Idempotency(hostPort, creds, {
      "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
      "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
      // A killed node comes back within seconds: reconnect soon instead of after grpc-js's
      // default backoff of up to two minutes.
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 1000,
      // One channel per node, not one shared by every client of the process, so close()
      // closes only this client's connections.
      "grpc.use_local_subchannel_pool": 1,
    });
    const admin = new Admin(hostPort, creds, { channelOverride: idem.getChannel() });
    return { addr: url, idem, admin, configured, failures: 0, downUntil: 0, shunnedUntil: 0 };
  }

  /** Index of the first endpoint at or after `index` neither down nor shunned (else `index`'s). */
  private pick(index: number): number {
    const n = this.targets.length;
    const start = ((index % n) + n) % n;
    const now = clockMs();
    for (let k = 0; k < n; k++) {
      const j = (start + k) % n;
      if (this.targets[j].downUntil <= now && !shunned(this.targets[j], now)) return j;
    }
    return start;
  }

  private markUp(t: Target): void {
    t.failures = 0;
    t.downUntil = 0;
    t.shunnedUntil = 0;
  }

  /** A node that refused connections or broke them: skip it for a while, drop it if learned. */
  private markDown(t: Target): void {
    t.failures++;
    t.downUntil = clockMs() + Math.min(DOWN_BASE_MS * 2 ** (t.failures - 1), DOWN_MAX_MS);
    if (!t.configured && t.failures >= DROP_AFTER_FAILURES) {
      const i = this.targets.indexOf(t);
      if (i >= 0) {
        const preferredAddr = this.targets[this.preferred]?.addr;
        this.targets.splice(i, 1);
        const p = this.targets.findIndex((x) => x.addr === preferredAddr);
        this.preferred = p >= 0 ? p : 0;
        // Calls still in flight on it finish first.
        setTimeout(() => t.idem.close(), this.deadlineMs).unref();
      }
    }
  }

  /** Points the client at `addr` (a leader hint), adding it if it is not an endpoint yet. */
  private preferAddr(addr: string): number | undefined {
    let wanted: string;
    try {
      wanted = normaliseEndpoint(addr, this.tls);
    } catch {
      return undefined;
    }
    let i = this.targets.findIndex((t) => t.addr === wanted);
    if (i < 0) {
      try {
        this.targets.push(this.target(addr, false));
      } catch {
        return undefined;
      }
      i = this.targets.length - 1;
    }
    // A hint naming a node that just left us unanswered is most likely a follower's stale view
    // of a leader that has stopped: keep the current preference until it has had its time out.
    if (!shunned(this.targets[i], clockMs())) this.preferred = i;
    return i;
  }

  /** Full-jitter exponential backoff. */
  private backoff(attempt: number): number {
    const cap = Math.min(this.backoffBaseMs * 2 ** Math.min(attempt, 16), this.backoffMaxMs);
    return Math.floor(this.random() * (cap + 1));
  }

  private metadata(): grpc.Metadata {
    const md = new grpc.Metadata();
    if (this.authorization !== undefined) md.set("authorization", this.authorization);
    return md;
  }

  /**
   * Waits for a connection to `t`, at most `ms`; false if none came up. A refused or failed
   * connection ends the wait at once: the attempt goes to the next node instead of spending its
   * time on one that is most likely down (grpc-js reconnects in the background meanwhile).
   */
  private connected(t: Target, ms: number): Promise<boolean> {
    const channel = t.idem.getChannel();
    const deadline = clockMs() + ms;
    return new Promise((resolve) => {
      const check = () => {
        const state = channel.getConnectivityState(true);
        if (state === grpc.connectivityState.READY) return resolve(true);
        if (state === grpc.connectivityState.TRANSIENT_FAILURE || state === grpc.connectivityState.SHUTDOWN) {
          return resolve(false);
        }
        if (clockMs() >= deadline) return resolve(false);
        channel.watchConnectivityState(state, deadline, (err) => (err ? resolve(false) : check()));
      };
      check();
    });
  }

  private async attempt<T>(t: Target, spec: CallSpec, budget: number): Promise<AttemptResult<T>> {
    const connectWithin = Math.min(this.connectTimeoutMs, budget);
    if (!(await this.connected(t, connectWithin))) {
      return {
        ok: false,
        status: {
          code: grpc.status.UNAVAILABLE,
          details: `no connection to ${t.addr} (refused, or none within ${Math.round(connectWithin)} ms)`,
          metadata: new grpc.Metadata(),
          sent: false,
        },
      };
    }
    const client = spec.service === "idem" ? t.idem : t.admin;
    const fn = (client as unknown as Record<string, Function>)[spec.method];
    const request = typeof spec.request === "function" ? (spec.request as () => unknown)() : spec.request;
    return new Promise((resolve) => {
      let hint: string | undefined;
      let headers = false;
      const call = fn.call(
        client,
        request,
        this.metadata(),
        { deadline: clockMs() + Math.max(1, budget) },
        (err: grpc.ServiceError | null, value: T) => {
          if (err === null) {
            resolve({ ok: true, value, hint });
            return;
          }
          const metadata = err.metadata ?? new grpc.Metadata();
          // A connection refused before the call went out cannot have had an effect.
          const sent = headers || !/^No connection established|^Stream refused|^Channel closed before call started|^Name resolution failed/.test(err.details ?? "");
          resolve({ ok: false, status: { code: err.code, details: err.details ?? err.message, metadata, sent } });
        },
      ) as grpc.ClientUnaryCall;
      call.on("metadata", (md: grpc.Metadata) => {
        headers = true;
        hint = metaText(md, LEADER_ADDR_HEADER);
      });
    });
  }

  /** Runs one RPC with retries until `spec.deadline`. */
  private async call<T>(spec: CallSpec): Promise<T> {
    if (this.closed) throw new ConfigError("the client was closed");
    let index = this.preferred;
    let attempt = 0;
    // The last refusal: when the deadline runs out it says why better than "deadline".
    let last: AttemptStatus | undefined;
    // Some attempt may have taken effect: then no refusal after it makes the outcome known.
    let maybeApplied = false;
    for (;;) {
      const remaining = spec.deadline - clockMs();
      // An attempt of a few ms can only time out, and would hide why earlier ones failed.
      if (remaining < MIN_ATTEMPT_MS) {
        if (last !== undefined) throw gaveUp(last, maybeApplied);
        throw new DeadlineExceededError("the call's deadline passed before any node answered");
      }
      const i = this.pick(index);
      const t = this.targets[i];
      const budget = spec.attemptBudget ? spec.attemptBudget(remaining) : Math.min(remaining, this.attemptTimeoutMs);
      // What the attempt would have had were the call's deadline further off.
      const uncut = spec.attemptBudget ? spec.attemptBudget(Infinity) : this.attemptTimeoutMs;
      const r = await this.attempt<T>(t, spec, budget);
      if (r.ok) {
        this.markUp(t);
        // A follower that forwarded the call names the leader: go there next time.
        if (r.hint !== undefined) this.preferAddr(r.hint);
        else {
          const now = this.targets.indexOf(t);
          if (now >= 0) this.preferred = now;
        }
        return r.value;
      }
      const status = r.status;
      if (!retryable(status)) throw errorFromStatus(status);
      // A shed call was never proposed, and a call that found no connection never left.
      if (status.sent && !neverProposed(status)) {
        maybeApplied = true;
        if (spec.unsure) spec.unsure.value = true;
      }
      if (!fromServer(status) && status.code === grpc.status.UNAVAILABLE) this.markDown(t);
      // Only an attempt that used its whole time says the node is not answering; one cut short
      // by the call's deadline says nothing of it. A lost reply says the same as a silence.
      const timedOut =
        status.sent && !fromServer(status) && status.code === grpc.status.DEADLINE_EXCEEDED && uncut <= remaining;
      if (timedOut || lostReply(status) !== undefined) t.shunnedUntil = clockMs() + SHUN_MS;
      // "Time ran out" says less than a refusal before it (e.g. no quorum): keep that. And a
      // reply lost mid-call says more than a later attempt that found no connection at all:
      // the call's outcome is unknown, not merely "the cluster is unreachable".
      const weaker =
        last !== undefined && (ranOut(status.code) || (!status.sent && lostReply(last) !== undefined));
      if (!weaker) last = status;
      const left = spec.deadline - clockMs();
      if (left <= 0) throw gaveUp(last ?? status, maybeApplied);
      const hint = metaText(status.metadata, LEADER_ADDR_HEADER);
      const hinted = hint === undefined ? undefined : this.preferAddr(hint);
      const at = this.targets.indexOf(t);
      // Follow the hint unless it points where we just failed.
      index = hinted !== undefined && hinted !== at ? hinted : (at >= 0 ? at : i) + 1;
      await sleep(Math.min(this.backoff(attempt), left));
      attempt++;
    }
  }

  private id(scope: string, key: string) {
    return { tenant: this.tenant, scope, key };
  }

  private deadline(opts?: CallOptions): number {
    const ms = opts?.deadlineMs ?? this.deadlineMs;
    if (!Number.isFinite(ms) || ms < 0) throw new ConfigError(`deadlineMs must be a number of ms >= 0, not ${ms}`);
    return clockMs() + ms;
  }

  private async write(method: string, request: unknown, opts?: CallOptions): Promise<Outcome> {
    return outcomeFromPb(await this.call({ service: "idem", method, request, deadline: this.deadline(opts) }));
  }

  /**
   * Claims a key for `owner`. Retries keep the same owner, so a claim whose reply was lost comes
   * back ACQUIRED with the same token. Send the same owner on your own retries too.
   */
  async claim(scope: string, key: string, owner: string, opts: ClaimOptions = {}): Promise<ClaimOutcome> {
    const request = {
      id: this.id(scope, key),
      fingerprint: opts.fingerprint ? opts.fingerprint.bytes : Buffer.alloc(0),
      owner,
      lease_ms: millis(opts.leaseMs, "leaseMs"),
      ttl_ms: millis(opts.ttlMs, "ttlMs"),
      allow_takeover: Boolean(opts.allowTakeover),
    };
    return (await this.write("Claim", request, opts)) as ClaimOutcome;
  }

  /** Completes an owned key with the response to replay to every later claim. */
  async complete(
    scope: string,
    key: string,
    token: bigint | number,
    response: ResponseInit,
    opts?: CallOptions,
  ): Promise<CompleteOutcome> {
    const request = { id: this.id(scope, key), token: u64(token, "token"), response: responseToPb(response) };
    return (await this.write("Complete", request, opts)) as CompleteOutcome;
  }

  /**
   * Gives an owned key up: retryable (the record becomes FAILED and the next claim re-acquires
   * it) or terminal, with an error response that is stored and replayed like any other.
   */
  async fail(
    scope: string,
    key: string,
    token: bigint | number,
    retryable: boolean,
    response?: ResponseInit | null,
    opts?: CallOptions,
  ): Promise<FailOutcome> {
    const request = {
      id: this.id(scope, key),
      token: u64(token, "token"),
      retryable,
      response: response ? responseToPb(response) : null,
    };
    const unsure = { value: false };
    const outcome = outcomeFromPb(
      await this.call({ service: "idem", method: "Fail", request, deadline: this.deadline(opts), unsure }),
    ) as FailOutcome;
    // A retryable Fail leaves the key FAILED, and the next claim grants it again with a new
    // token. If an earlier attempt of this call may have gone through, a STALE_TOKEN now may
    // only mean that: the key failed as asked and moved on. Saying "stale" would be a guess.
    if (retryable && unsure.value && outcome.outcome === "STALE_TOKEN") {
      throw new OutcomeUnknownError(
        `an earlier attempt of this Fail got no answer, and the key now has token ${outcome.current}: ` +
          "the Fail may have gone through before the key was granted again",
      );
    }
    return outcome;
  }

  /** Pushes an owned key's lease deadline out (absent `leaseMs`: the node's default length). */
  async extendLease(
    scope: string,
    key: string,
    token: bigint | number,
    leaseMs?: number,
    opts?: CallOptions,
  ): Promise<ExtendOutcome> {
    const request = { id: this.id(scope, key), token: u64(token, "token"), lease_ms: millis(leaseMs, "leaseMs") };
    return (await this.write("ExtendLease", request, opts)) as ExtendOutcome;
  }

  /** Records progress of a multi-step flow (handed to whoever takes over) and extends the lease. */
  async checkpoint(
    scope: string,
    key: string,
    token: bigint | number,
    recoveryPoint: string,
    data: Uint8Array | string,
    leaseMs?: number,
    opts?: CallOptions,
  ): Promise<ExtendOutcome> {
    const request = {
      id: this.id(scope, key),
      token: u64(token, "token"),
      recovery_point: recoveryPoint,
      data: bytesIn(data),
      lease_ms: millis(leaseMs, "leaseMs"),
    };
    return (await this.write("Checkpoint", request, opts)) as ExtendOutcome;
  }

  /** Takes over an IN_PROGRESS key whose lease expired (any, with `force`). */
  async takeover(scope: string, key: string, owner: string, opts: TakeoverOptions = {}): Promise<TakeoverOutcome> {
    const request = {
      id: this.id(scope, key),
      owner,
      force: Boolean(opts.force),
      lease_ms: millis(opts.leaseMs, "leaseMs"),
    };
    return (await this.write("Takeover", request, opts)) as TakeoverOutcome;
  }

  /** Reads one record, linearizably; null when there is no live record with that id. */
  async get(scope: string, key: string, opts?: CallOptions): Promise<IdemRecord | null> {
    const r = await this.call<{ record?: unknown }>({
      service: "idem",
      method: "Get",
      request: { id: this.id(scope, key) },
      deadline: this.deadline(opts),
    });
    return recordFromPb(r.record);
  }

  /** Waits until the record leaves IN_PROGRESS, at most `timeoutMs`, then reads it. */
  async wait(scope: string, key: string, timeoutMs: number): Promise<Waited> {
    if (!Number.isFinite(timeoutMs) || timeoutMs < 0) {
      throw new InvalidArgumentError(`timeoutMs must be a number of ms >= 0, not ${timeoutMs}`);
    }
    const end = clockMs() + timeoutMs;
    const id = this.id(scope, key);
    const r = await this.call<{ record?: unknown; timed_out?: boolean }>({
      service: "idem",
      method: "Wait",
      // A retried wait asks only for what is left of the caller's timeout.
      request: () => ({ id, timeout_ms: String(Math.max(1, Math.ceil(end - clockMs()))) }),
      deadline: end + 2_000,
      // The node holds the call for the whole wait: an attempt gets that plus the usual
      // attempt time, so a hung node still costs a bounded time.
      attemptBudget: (remaining) => Math.min(remaining, Math.max(0, end - clockMs()) + this.attemptTimeoutMs),
    });
    return { record: recordFromPb(r.record), timedOut: Boolean(r.timed_out) };
  }

  /**
   * One page of a tenant's records. A page ends at `limit` records or before 4 MiB of them;
   * while `nextAfter` is set, pass it as `startAfter` for the next page.
   */
  async list(opts: ListOptions = {}): Promise<ListPage> {
    const tenant = opts.tenant !== undefined && opts.tenant !== "" ? opts.tenant : this.tenant;
    let startAfter = opts.startAfter ?? null;
    // A record id's empty tenant means `default`, not the listed tenant: a start point given
    // without one would otherwise lie outside the listing.
    if (startAfter !== null && startAfter.tenant === "") startAfter = { ...startAfter, tenant };
    const limit = opts.limit ?? 0;
    if (!Number.isInteger(limit) || limit < 0 || limit > 0xffffffff) {
      throw new InvalidArgumentError(`limit must be a whole number >= 0, not ${limit}`);
    }
    const request = {
      tenant,
      scope: opts.scope ?? "",
      state: stateToPb(opts.state),
      abandoned_only: Boolean(opts.abandonedOnly),
      start_after: startAfter,
      limit,
    };
    const r = await this.call<{ records?: unknown[]; next_after?: unknown }>({
      service: "idem",
      method: "List",
      request,
      deadline: this.deadline(opts),
    });
    return {
      records: (r.records ?? []).map((x) => recordFromPb(x) as IdemRecord),
      nextAfter: r.next_after === null || r.next_after === undefined ? null : recordIdFromPb(r.next_after),
    };
  }

  /**
   * Runs `work` at most once for this key: claims it (one owner id for every retry), runs the
   * work under the grant while a background task keeps the lease alive, then completes the
   * key with the work's response or fails it. A stored response is returned with
   * `replayed: true` without running the work; a key held by another worker is waited for.
   * See execute.ts.
   */
  execute(
    scope: string,
    key: string,
    fingerprint: Fingerprint | null | undefined,
    work: Work,
    opts: ExecuteOptions = {},
  ): Promise<Executed> {
    return execute(this, scope, key, fingerprint ?? null, work, opts);
  }

  /** The status of the node at endpoint `index`, asked of that node only (no retries elsewhere). */
  async nodeStatus(index: number): Promise<NodeStatus> {
    if (index < 0 || index >= this.targets.length) throw new ConfigError(`no endpoint ${index}`);
    const t = this.targets[index];
    const r = await this.attempt<unknown>(
      t,
      { service: "admin", method: "Status", request: { with_digest: false }, deadline: 0 },
      this.attemptTimeoutMs,
    );
    if (!r.ok) throw errorFromStatus(r.status);
    return statusFromPb(r.value);
  }

  /**
   * Asks every endpoint for its status and prefers the leader from now on. Returns the
   * leader's id, if any node knows it.
   */
  async discover(): Promise<number | undefined> {
    let leader: number | undefined;
    const n = this.targets.length;
    for (let i = 0; i < n && i < this.targets.length; i++) {
      let s: NodeStatus;
      try {
        s = await this.nodeStatus(i);
      } catch {
        continue;
      }
      if (s.leaderId !== 0 && s.leaderId === s.id) {
        this.preferred = i;
        return s.id;
      }
      if (s.leaderId !== 0) {
        leader = s.leaderId;
        if (s.leaderClientAddr !== "") this.preferAddr(s.leaderClientAddr);
      }
    }
    return leader;
  }

  /**
   * Sets (a number) or clears (null) the record quota of `tenant`, or with `tenant` null the
   * default quota of tenants without their own. Needs an admin token on a node that checks tokens.
   */
  async setQuota(tenant: string | null, maxRecords: number | bigint | null, opts?: CallOptions): Promise<QuotaReport> {
    const request: Record<string, unknown> = { tenant: tenant ?? "", default_quota: tenant === null };
    if (maxRecords !== null) request.max_records = u64(maxRecords, "maxRecords");
    return quotaFromPb(await this.admin("SetQuota", request, opts));
  }

  /** The quotas and the records each tenant holds: one tenant, or every tenant with records or a quota. */
  async getQuota(tenant?: string, opts?: CallOptions): Promise<QuotaReport> {
    return quotaFromPb(await this.admin("GetQuota", { tenant: tenant ?? "" }, opts));
  }

  private admin(method: string, request: unknown, opts?: CallOptions): Promise<unknown> {
    // Admin changes may wait for the cluster (joint consensus): each attempt gets the whole deadline.
    return this.call({ service: "admin", method, request, deadline: this.deadline(opts), attemptBudget: (r) => r });
  }
}

/** A fresh owner id: `prefix` and a random UUID. Reuse it on every retry of one operation. */
export function newOwner(prefix = "owner-"): string {
  return `${prefix}${randomUUID()}`;
}
