// The HTTP idempotency layer: an Express (Connect-style) middleware that makes the handlers
// after it run at most once per `Idempotency-Key`, with the cluster as the single source of
// truth. Its HTTP behaviour is exactly that of the Rust SDK's tower layer (client/src/http/):
//
// | case                                      | answer                                                  |
// |-------------------------------------------|---------------------------------------------------------|
// | missing key (route requires one)          | 400 problem+json                                        |
// | malformed key (or the header sent twice)  | 400 problem+json                                        |
// | body over the limit                       | 413 problem+json                                        |
// | key reused with a different request       | 422 problem+json                                        |
// | first call still in flight                | 409 problem+json, Retry-After: 1; or a bounded wait     |
// | completed before                          | stored status, body and allowed headers, plus           |
// |                                           | Idempotent-Replayed: true                               |
// | cluster unavailable, or the claim's       | 503 problem+json with Retry-After (fail-closed), or the |
// | outcome unknown                           | handler runs unprotected (fail-open)                    |
// | the tenant's record quota is used up      | 429 problem+json                                        |
// | handler raised                            | 500 problem+json; the key is released                   |
//
// This module owns only the HTTP side: the header, the body and its fingerprint, capturing
// the handler's response, the store policy, the problem bodies and the replay. Claiming,
// keeping the lease alive and settling are the client's (client.ts, execute.ts).
//
// The handler's response is buffered and sent only once it is stored, so a caller that sees
// it and retries gets a replay, never a second run.

import type { IncomingMessage, ServerResponse, OutgoingHttpHeaders } from "node:http";
import { randomUUID } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

import type { Client } from "./client";
import { ConfigError, IdemraftError, LostOwnershipError, QuotaExceededError, RpcError, WorkFailedError } from "./errors";
import { runGranted, WorkFailure } from "./execute";
import { fingerprint } from "./fingerprint";
import { checkKey, isValidScope, SCOPE_MAX_LEN, type KeyProblem } from "./keys";
import type { ResponseInit, StoredResponse } from "./types";

/** The request header carrying the key (IETF draft, Stripe). */
export const IDEMPOTENCY_KEY = "idempotency-key";
/** The response header marking a replay (Stripe's name). */
export const IDEMPOTENT_REPLAYED = "idempotent-replayed";
/** Media type of the error bodies (RFC 9457). */
export const PROBLEM_JSON = "application/problem+json";
/** Prefix of the `type` of every problem body the middleware writes. */
export const PROBLEM_TYPE_PREFIX = "urn:idemraft:problem:";

/** Which handler responses are stored and replayed. A response that is not stored releases the key. */
export type StorePolicy = "default" | "everything" | ((status: number) => boolean);

/** Whether a response with this status is stored under `policy`. */
export function stores(policy: StorePolicy, status: number): boolean {
  if (policy === "everything") return true;
  if (typeof policy === "function") return policy(status);
  // 2xx and 4xx are final, except 408, 409 and 429, which say "try again"; everything else
  // (5xx above all) is released.
  return ((status >= 200 && status < 300) || (status >= 400 && status < 500)) && ![408, 409, 429].includes(status);
}

/** Where diagnostics go. */
export interface Logger {
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** Settings of the middleware. Only `client` and `scope` are required. */
export interface IdempotencyOptions {
  /** The cluster. */
  client: Client;
  /** The route family's scope, e.g. `payments.create`. */
  scope: string;
  /** The header carrying the key; `idempotency-key`. */
  header?: string;
  /** Whether a request without the header is refused with 400 (true, the default) or runs unprotected. */
  keyRequired?: boolean;
  /** Lease held while the handler runs, extended every third of it in the background; 30 000 ms. */
  leaseMs?: number;
  /** How long a record (and its stored response) is kept; the scope's default on the server otherwise. */
  ttlMs?: number;
  /** `"conflict"` (409 at once, the default) or `{ waitMs }`: wait that long for the first request. */
  inFlight?: "conflict" | { waitMs: number };
  /** Which responses are stored; `"default"`: 2xx and 4xx except 408, 409, 429. */
  store?: StorePolicy;
  /** Replaces the replay allowlist (`content-type`, `location`, `etag` by default). */
  replayHeaders?: string[];
  /** Adds names to the replay allowlist. Headers off the list reach the first caller only. */
  addReplayHeaders?: string[];
  /** Run the handler unprotected (true) or answer 503 (false, the default) when the cluster is unreachable. */
  failOpen?: boolean;
  /** Largest request body, in bytes; a larger one is answered 413 before any claim. 1 MiB. */
  maxBodyBytes?: number;
  /**
   * Largest response body stored as is (the server's limit, 256 KiB by default). A larger one
   * reaches the first caller whole; retries get its status and allowed headers with a problem
   * body saying it was too large to keep.
   */
  maxStoredBodyBytes?: number;
  /** How long the claim may try to reach the cluster before 503 (or fail-open); 5000 ms. */
  clusterTimeoutMs?: number;
  /** How long to keep trying to store a response once the handler produced it; 30 000 ms. */
  settleTimeoutMs?: number;
  /** Whether a request may take over a key whose holder's lease expired (the holder crashed); true. */
  allowTakeover?: boolean;
  /**
   * Sets `req.body` from the bytes the middleware read (body parsers after it find the stream
   * consumed and skip). Default: parsed JSON for JSON media types, a flat object for
   * urlencoded forms, the raw Buffer otherwise; left alone when something already set it.
   */
  parseBody?: (raw: Buffer, req: IncomingMessage) => unknown;
  /** Diagnostics; `console` by default. */
  logger?: Logger;
}

/** What the handler learns about the claim it runs under: `req.idemraft`. */
export interface IdemraftRequestInfo {
  /** The fencing token: pass it to every downstream write, which should refuse lower tokens. */
  token: bigint;
  /** The key, as the client sent it (without the quotes of the structured-field form). */
  key: string;
  /** The route family's scope. */
  scope: string;
  /** 1 for a first run; more after a failed or abandoned attempt. */
  attempt: number;
  /** This run took the key over from a holder whose lease expired. */
  takeover: boolean;
  /** Progress marker a previous holder left with Checkpoint. */
  recoveryPoint: string;
  /** Aborted if the lease is lost while the handler runs (its token will be refused downstream). */
  signal: AbortSignal;
}

/** A request as the middleware leaves it for the handler. */
export type IdempotentRequest = IncomingMessage & {
  /** Set when the handler runs under a claim; absent when it runs unprotected. */
  idemraft?: IdemraftRequestInfo;
  /** The request body's bytes, as fingerprinted. */
  rawBody?: Buffer;
  body?: unknown;
  originalUrl?: string;
};

type Next = (err?: unknown) => void;
type Res = ServerResponse & { locals?: Record<string, unknown> };

/** The Express middleware, and the error handler that goes after the routes it protects. */
export interface IdempotencyMiddleware {
  (req: IncomingMessage, res: ServerResponse, next: Next): void;
  /**
   * An Express error handler (four arguments): install it after the protected routes
   * (`app.use(idem.errorHandler)`), so that a handler that throws (or calls `next(err)`) gets
   * a 500 problem+json and its key released for a retry. Errors of requests the middleware
   * does not guard are passed on untouched.
   */
  errorHandler: (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void;
}

// Bounds of the server's defaults, checked at construction so that a bad route configuration
// fails at startup instead of as a 500 on every request.
const LEASE_BOUNDS_MS: [number, number] = [1_000, 600_000];
const TTL_BOUNDS_MS: [number, number] = [60_000, 30 * 24 * 3600 * 1000];
/** Longest Retry-After on a 409: the holder's lease time left is an upper bound, not an estimate. */
const MAX_IN_FLIGHT_RETRY_AFTER_SECS = 1;
/** How many times a waiting request claims again before it gives up with 409. */
const MAX_WAIT_ROUNDS = 32;
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS", "TRACE"]);
const STATE = Symbol("idemraft.state");

/** An RFC 9457 problem: the body of every answer the middleware itself gives. */
export class Problem {
  constructor(
    readonly status: number,
    /** The slug after {@link PROBLEM_TYPE_PREFIX}. */
    readonly slug: string,
    readonly title: string,
    readonly detail: string,
    readonly retryAfter: number | null = null,
  ) {}

  get type(): string {
    return PROBLEM_TYPE_PREFIX + this.slug;
  }

  /** The JSON body, its members in the order the Rust SDK writes them (sorted). */
  body(): string {
    return JSON.stringify({ detail: this.detail, status: this.status, title: this.title, type: this.type });
  }

  static missingKey(header: string): Problem {
    return new Problem(
      400,
      "missing-idempotency-key",
      "Idempotency key required",
      `this endpoint requires an ${header} header: generate a unique key (16 to 255 characters of ` +
        "A-Z a-z 0-9 _ . : -, e.g. a UUID) for each new request and send the same key on its retries",
    );
  }

  static malformedKey(header: string, why: string): Problem {
    return new Problem(
      400,
      "malformed-idempotency-key",
      "Malformed idempotency key",
      `the ${header} header is not a valid key: ${why}`,
    );
  }

  static tooLarge(limit: number): Problem {
    return new Problem(
      413,
      "body-too-large",
      "Request body too large",
      `the body is over this endpoint's limit of ${limit} bytes; send a smaller body`,
    );
  }

  static unreadableBody(why: string): Problem {
    return new Problem(
      400,
      "unreadable-body",
      "Request body could not be read",
      `the body could not be read (${why}); send the request again with the same key`,
    );
  }

  static mismatch(header: string): Problem {
    return new Problem(
      422,
      "idempotency-key-reused",
      "Idempotency key reused with a different request",
      `this ${header} was first used with a different method, path or body; resend the original request ` +
        "unchanged to get its response, or use a new key for a new request",
    );
  }

  static inFlight(secs: number): Problem {
    return new Problem(
      409,
      "request-in-progress",
      "A request with this idempotency key is in progress",
      "the first request with this key has not finished; retry the same request with the same key after " +
        `${secs} s to get its response`,
      secs,
    );
  }

  static unavailable(e: IdemraftError): Problem {
    return new Problem(
      503,
      "idempotency-store-unavailable",
      "Idempotency store unavailable",
      `the request was not processed because the idempotency store could not be reached (${e.describe()}); retry the ` +
        "same request with the same key after 1 s",
      1,
    );
  }

  static quotaExceeded(): Problem {
    return new Problem(
      429,
      "idempotency-quota-exceeded",
      "Too many idempotency keys in use",
      "the request was not processed: this service holds as many idempotency records as it is allowed; " +
        "retry later, when older keys have expired (requests that reuse an existing key still work)",
    );
  }

  static handlerFailed(): Problem {
    return new Problem(
      500,
      "handler-failed",
      "The request failed and was not stored",
      "the request failed before it produced a response; the key was released, so retry the same request " +
        "with the same key",
    );
  }

  static lostOwnership(): Problem {
    return new Problem(
      409,
      "idempotency-lease-lost",
      "The request lost its claim on the key",
      "the request ran past its lease and another request took the key over; retry the same request with " +
        "the same key after 1 s to get the response that was stored",
      1,
    );
  }

  static internal(why: string): Problem {
    return new Problem(
      500,
      "idempotency-internal",
      "Idempotency check failed",
      `the idempotency check failed (${why}); the request was not processed; report this to the operator`,
    );
  }
}

const KEY_RULE = "a key is 16 to 255 characters of A-Z a-z 0-9 _ . : - (a UUID works)";

/** A character as Rust's `{:?}` prints it, so that messages match the Rust layer's word for word. */
function rustCharDebug(ch: string): string {
  const escapes: Record<string, string> = { "\t": "\\t", "\r": "\\r", "\n": "\\n", "'": "\\'", "\\": "\\\\", "\0": "\\0" };
  if (ch in escapes) return `'${escapes[ch]}'`;
  const c = ch.codePointAt(0) ?? 0;
  if (c < 0x20 || c === 0x7f) return `'\\u{${c.toString(16)}}'`;
  return `'${ch}'`;
}

function keyProblemText(p: KeyProblem): string {
  return p.problem === "length"
    ? `the key is ${p.len} characters long; ${KEY_RULE}`
    : `the key has ${rustCharDebug(p.found)} at position ${p.offset}; ${KEY_RULE}`;
}

/**
 * Reads the key from the header's values (one per header line): the IETF draft's
 * structured-field string (`"8e03978e-..."`) or Stripe's bare token, checked against the key
 * rule. `{ key: null }` when there is no header; `{ error }` names what is wrong.
 */
export function parseKey(values: readonly string[]): { key: string | null; error?: undefined } | { key?: undefined; error: string } {
  if (values.length === 0) return { key: null };
  if (values.length > 1) return { error: "the header was sent more than once; send exactly one key" };
  const value = values[0];
  if (!/^[\t\x20-\x7e]*$/.test(value)) return { error: `the header is not visible ASCII; ${KEY_RULE}` };
  const text = value.replace(/^[ \t]+|[ \t]+$/g, "");
  let key = text;
  if (text.startsWith('"')) {
    const rest = text.slice(1);
    // The key rule has neither quotes nor backslashes, so an escape is never needed.
    if (!rest.endsWith('"') || /["\\]/.test(rest.slice(0, -1))) {
      return {
        error: `the header starts a quoted string but is not one; send "<key>" or the bare key; ${KEY_RULE}`,
      };
    }
    key = rest.slice(0, -1);
  }
  const problem = checkKey(key);
  if (problem !== null) return { error: keyProblemText(problem) };
  return { key };
}

/** An `express.json({ verify: captureRawBody })` hook, for apps whose body parser runs before the middleware. */
export function captureRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  (req as IdempotentRequest).rawBody = Buffer.from(buf);
}

function headerValues(req: IncomingMessage, name: string): string[] {
  const out: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if (raw[i].toLowerCase() === name) out.push(raw[i + 1]);
  }
  return out;
}

function defaultParseBody(raw: Buffer, req: IncomingMessage): unknown {
  const type = String(req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
  if (raw.length === 0) return type === "" ? undefined : raw;
  if (type === "application/json" || type.endsWith("+json")) {
    try {
      return JSON.parse(raw.toString("utf8"));
    } catch {
      return undefined;
    }
  }
  if (type === "application/x-www-form-urlencoded") {
    return Object.fromEntries(new URLSearchParams(raw.toString("utf8")));
  }
  return raw;
}

type BodyRead = { ok: true; body: Buffer } | { ok: false; problem: Problem; close: boolean };

/** Buffers a request body of at most `limit` bytes; 413 above it (told by Content-Length first). */
function readBody(req: IdempotentRequest, limit: number): Promise<BodyRead> {
  if (req.readableEnded) {
    // A body parser already read the stream: only the bytes it kept aside can be fingerprinted.
    if (Buffer.isBuffer(req.rawBody)) return Promise.resolve({ ok: true, body: req.rawBody });
    return Promise.resolve({
      ok: false,
      close: false,
      problem: Problem.internal(
        "the request body was read before the idempotency middleware ran; put the middleware before the body " +
          "parsers, or give the parser verify: captureRawBody",
      ),
    });
  }
  const declared = req.headers["content-length"];
  if (declared !== undefined && /^\d+$/.test(declared) && Number(declared) > limit) {
    return Promise.resolve({ ok: false, close: true, problem: Problem.tooLarge(limit) });
  }
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let total = 0;
    let settled = false;
    const finish = (r: BodyRead) => {
      if (settled) return;
      settled = true;
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
      resolve(r);
    };
    const onData = (chunk: Buffer | string) => {
      const b = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      total += b.length;
      if (total > limit) {
        req.pause();
        finish({ ok: false, close: true, problem: Problem.tooLarge(limit) });
        return;
      }
      chunks.push(b);
    };
    const onEnd = () => finish({ ok: true, body: Buffer.concat(chunks, total) });
    const onError = (e: Error) => finish({ ok: false, close: true, problem: Problem.unreadableBody(e.message) });
    const onClose = () => {
      if (!req.readableEnded) {
        finish({ ok: false, close: true, problem: Problem.unreadableBody("the connection closed before the body ended") });
      }
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

/** A header value that is visible ASCII (tab allowed): what can be stored and replayed. */
function visible(v: string): boolean {
  return /^[\t\x20-\x7e]*$/.test(v);
}

function headerList(value: number | string | readonly string[] | undefined): string[] {
  if (value === undefined) return [];
  return Array.isArray(value) ? value.map(String) : [String(value)];
}

/** The handler's response as it left the handler. */
interface Captured {
  status: number;
  statusMessage: string;
  /** Names (as set) and their values, in the order the handler set them. */
  headers: Array<[string, string[]]>;
  body: Buffer;
}

type HandlerEnd = { kind: "response"; response: Captured } | { kind: "raised"; error: unknown };

const INTERCEPTED = ["writeHead", "write", "end", "flushHeaders"] as const;

/**
 * Holds back everything the handler writes, so that the response can be stored before any of
 * it reaches the caller. Replaces the response's writing methods with buffering ones and puts
 * the originals back before the real answer is written.
 */
class ResponseCapture {
  private readonly chunks: Buffer[] = [];
  private readonly callbacks: Array<() => void> = [];
  private readonly saved: Array<[string, boolean, unknown]> = [];
  private ended = false;
  /** The headers set before the handler ran (by earlier middleware: CORS, tracing, ...). */
  private before: Array<[string, string[]]> = [];
  private resolveEnd: (e: HandlerEnd) => void = () => undefined;
  readonly done: Promise<HandlerEnd>;

  constructor(private readonly res: Res) {
    this.done = new Promise((resolve) => (this.resolveEnd = resolve));
  }

  get finished(): boolean {
    return this.ended;
  }

  install(): void {
    this.before = headersOf(this.res);
    const res = this.res as unknown as Record<string, unknown>;
    for (const name of INTERCEPTED) {
      this.saved.push([name, Object.prototype.hasOwnProperty.call(res, name), res[name]]);
    }
    const self = this;
    res.writeHead = function writeHead(status: number, reason?: unknown, headers?: unknown) {
      if (self.ended) return self.res;
      self.res.statusCode = status;
      if (typeof reason === "string") self.res.statusMessage = reason;
      else headers = reason;
      if (Array.isArray(headers)) {
        // Either [[name, value], ...] or the flat [name, value, name, value, ...] form.
        const pairs: Array<[string, string]> = Array.isArray(headers[0])
          ? (headers as Array<[string, string]>)
          : Array.from({ length: Math.floor(headers.length / 2) }, (_, i) => [headers[2 * i], headers[2 * i + 1]]);
        for (const [n, v] of pairs) self.res.setHeader(n, v);
      } else if (headers !== null && typeof headers === "object") {
        for (const [n, v] of Object.entries(headers as OutgoingHttpHeaders)) {
          if (v !== undefined) self.res.setHeader(n, v);
        }
      }
      return self.res;
    };
    res.write = function write(chunk: unknown, encoding?: unknown, cb?: unknown) {
      if (typeof encoding === "function") [cb, encoding] = [encoding, undefined];
      if (!self.ended) self.push(chunk, encoding as BufferEncoding | undefined);
      if (typeof cb === "function") self.callbacks.push(cb as () => void);
      return true;
    };
    res.end = function end(chunk?: unknown, encoding?: unknown, cb?: unknown) {
      if (typeof chunk === "function") [cb, chunk] = [chunk, undefined];
      if (typeof encoding === "function") [cb, encoding] = [encoding, undefined];
      if (typeof cb === "function") self.callbacks.push(cb as () => void);
      if (self.ended) return self.res;
      self.push(chunk, encoding as BufferEncoding | undefined);
      self.ended = true;
      self.resolveEnd({ kind: "response", response: self.snapshot() });
      return self.res;
    };
    res.flushHeaders = function flushHeaders() {
      // Nothing may go out before the response is stored.
    };
  }

  /** The handler raised: whatever it wrote is dropped. */
  raise(error: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.chunks.length = 0;
    this.resolveEnd({ kind: "raised", error });
  }

  private push(chunk: unknown, encoding: BufferEncoding | undefined): void {
    if (chunk === undefined || chunk === null) return;
    if (typeof chunk === "string") this.chunks.push(Buffer.from(chunk, encoding ?? "utf8"));
    else if (chunk instanceof Uint8Array) this.chunks.push(Buffer.from(chunk));
  }

  private snapshot(): Captured {
    return {
      status: this.res.statusCode,
      statusMessage: this.res.statusMessage,
      headers: headersOf(this.res),
      body: Buffer.concat(this.chunks),
    };
  }

  /**
   * Sets the response's headers to `headers`, or back to those set before the handler ran:
   * the middleware's own answers keep what earlier middleware added, as the answers of an
   * inner layer do.
   */
  resetHeaders(headers: Array<[string, string[]]> = this.before): void {
    for (const n of this.res.getHeaderNames()) this.res.removeHeader(n);
    for (const [n, values] of headers) this.res.setHeader(n, values.length === 1 ? values[0] : values);
  }

  /** Puts the response's own methods back. */
  restore(): void {
    const res = this.res as unknown as Record<string, unknown>;
    for (const [name, own, value] of this.saved) {
      if (own) res[name] = value;
      else delete res[name];
    }
    this.saved.length = 0;
  }

  /** Runs the callbacks the handler gave write() and end(), once the real answer is out. */
  callbacksAfter(): void {
    for (const cb of this.callbacks.splice(0)) {
      try {
        cb();
      } catch {
        // A handler's callback failing after its response went out changes nothing here.
      }
    }
  }
}

/** A response's headers: names as they were set and their values, in the order they were set. */
function headersOf(res: ServerResponse): Array<[string, string[]]> {
  // getRawHeaderNames keeps the case the names were set in (Node >= 15.13; not in the typings).
  const raw = (res as unknown as { getRawHeaderNames?: () => string[] }).getRawHeaderNames?.() ?? res.getHeaderNames();
  return raw.map((n): [string, string[]] => [n, headerList(res.getHeader(n))]);
}

function sendBody(res: ServerResponse, status: number, body: Buffer, after?: () => void): void {
  if (res.headersSent) {
    res.end(after);
    return;
  }
  res.statusCode = status;
  res.removeHeader("transfer-encoding");
  if (status === 204 || status === 304 || (status >= 100 && status < 200)) {
    res.removeHeader("content-length");
    res.end(after);
    return;
  }
  res.setHeader("content-length", body.length);
  res.end(body, after);
}

function sendProblem(res: ServerResponse, p: Problem, close = false): void {
  if (!res.headersSent) {
    res.setHeader("content-type", PROBLEM_JSON);
    if (p.retryAfter !== null) res.setHeader("retry-after", String(p.retryAfter));
    else res.removeHeader("retry-after");
    // The unread rest of a refused body would otherwise be parsed as the next request.
    if (close) res.setHeader("connection", "close");
  }
  sendBody(res, p.status, Buffer.from(p.body(), "utf8"));
}

/** A stored response as a replay. */
function sendReplay(res: ServerResponse, stored: StoredResponse, logger: Logger): void {
  const status = Number.isInteger(stored.status) && stored.status >= 100 && stored.status <= 999 ? stored.status : 500;
  const byName = new Map<string, string[]>();
  for (const [name, value] of stored.headers) {
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name) || !visible(value)) {
      logger.warn("a stored header is not a valid HTTP header; skipped", { header: name });
      continue;
    }
    const n = name.toLowerCase();
    byName.set(n, [...(byName.get(n) ?? []), value]);
  }
  if (!res.headersSent) {
    for (const [n, values] of byName) res.setHeader(n, values.length === 1 ? values[0] : values);
    res.setHeader(IDEMPOTENT_REPLAYED, "true");
  }
  sendBody(res, status, stored.body);
}

/** Whether the cluster gave the claim no answer: 503 or fail-open, never the operator's 500. */
function storeUnavailable(e: unknown): e is IdemraftError {
  return (
    e instanceof IdemraftError &&
    (e.indeterminate || (e instanceof RpcError && e.code === grpc.status.RESOURCE_EXHAUSTED))
  );
}

/** Seconds for Retry-After: the server's hint rounded up, at least 1. */
export function retryAfterSecs(retryAfterMs: number): number {
  return Math.max(1, Math.ceil(retryAfterMs / 1000));
}

interface Settings {
  client: Client;
  scope: string;
  header: string;
  keyRequired: boolean;
  leaseMs: number;
  ttlMs: number | undefined;
  waitMs: number | null;
  store: StorePolicy;
  replayHeaders: Set<string>;
  failOpen: boolean;
  maxBodyBytes: number;
  maxStoredBodyBytes: number;
  clusterTimeoutMs: number;
  settleTimeoutMs: number;
  allowTakeover: boolean;
  parseBody: (raw: Buffer, req: IncomingMessage) => unknown;
  logger: Logger;
}

function settingsOf(o: IdempotencyOptions): Settings {
  const scope = o.scope;
  const fail = (problem: string): never => {
    throw new ConfigError(`idempotency middleware for scope ${JSON.stringify(scope)}: ${problem}`);
  };
  if (!o.client) fail("a client is required");
  if (typeof scope !== "string" || !isValidScope(scope)) {
    fail(`a scope is 1 to ${SCOPE_MAX_LEN} bytes of A-Z a-z 0-9 . _ : / -`);
  }
  const leaseMs = o.leaseMs ?? 30_000;
  if (!(leaseMs >= LEASE_BOUNDS_MS[0] && leaseMs <= LEASE_BOUNDS_MS[1]) || !Number.isInteger(leaseMs)) {
    fail(`lease ${leaseMs} ms is outside ${LEASE_BOUNDS_MS[0]}..=${LEASE_BOUNDS_MS[1]} ms`);
  }
  if (o.ttlMs !== undefined && (!(o.ttlMs >= TTL_BOUNDS_MS[0] && o.ttlMs <= TTL_BOUNDS_MS[1]) || !Number.isInteger(o.ttlMs))) {
    fail(`ttl ${o.ttlMs} ms is outside ${TTL_BOUNDS_MS[0]}..=${TTL_BOUNDS_MS[1]} ms`);
  }
  const maxBodyBytes = o.maxBodyBytes ?? 1024 * 1024;
  if (!(maxBodyBytes > 0)) fail("maxBodyBytes must be above 0");
  const clusterTimeoutMs = o.clusterTimeoutMs ?? 5_000;
  const settleTimeoutMs = o.settleTimeoutMs ?? 30_000;
  if (!(clusterTimeoutMs > 0) || !(settleTimeoutMs > 0)) fail("clusterTimeoutMs and settleTimeoutMs must be above 0");
  let waitMs: number | null = null;
  if (o.inFlight !== undefined && o.inFlight !== "conflict") {
    waitMs = o.inFlight.waitMs;
    if (!(waitMs >= 0)) fail("inFlight.waitMs must be >= 0");
  }
  const header = (o.header ?? IDEMPOTENCY_KEY).toLowerCase();
  if (!/^[!#$%&'*+.^_`|~0-9a-z-]+$/.test(header)) fail(`${JSON.stringify(header)} is not a header name`);
  const replayHeaders = new Set((o.replayHeaders ?? ["content-type", "location", "etag"]).map((h) => h.toLowerCase()));
  for (const h of o.addReplayHeaders ?? []) replayHeaders.add(h.toLowerCase());
  return {
    client: o.client,
    scope,
    header,
    keyRequired: o.keyRequired ?? true,
    leaseMs,
    ttlMs: o.ttlMs,
    waitMs,
    store: o.store ?? "default",
    replayHeaders,
    failOpen: o.failOpen ?? false,
    maxBodyBytes,
    maxStoredBodyBytes: o.maxStoredBodyBytes ?? 256 * 1024,
    clusterTimeoutMs,
    settleTimeoutMs,
    allowTakeover: o.allowTakeover ?? true,
    parseBody: o.parseBody ?? defaultParseBody,
    logger: o.logger ?? {
      warn: (m, f) => console.warn(`idemraft: ${m}`, f ?? ""),
      error: (m, f) => console.error(`idemraft: ${m}`, f ?? ""),
    },
  };
}

/** The stored form of a response: status, the allowed headers in order, body bytes. */
function toStored(r: Captured, s: Settings): ResponseInit {
  const tooLarge = r.body.length > s.maxStoredBodyBytes;
  const headers: Array<[string, string]> = [];
  for (const [raw, values] of r.headers) {
    // Stored lower-case, as HTTP/2 and the Rust layer spell header names.
    const name = raw.toLowerCase();
    if (!s.replayHeaders.has(name) || (tooLarge && name === "content-type")) continue;
    for (const v of values) {
      if (visible(v)) headers.push([name, v]);
      else s.logger.warn("a header that is not visible ASCII is not replayed", { header: name });
    }
  }
  let body: Buffer = r.body;
  if (tooLarge) {
    body = Buffer.from(
      new Problem(
        r.status,
        "response-not-stored",
        "Response too large to replay",
        `the request was processed once, but its ${r.body.length}-byte response is over the ${s.maxStoredBodyBytes}-byte limit of what is ` +
          "kept; fetch the result another way (e.g. from the Location header)",
      ).body(),
      "utf8",
    );
    headers.push(["content-type", PROBLEM_JSON]);
  }
  return { status: r.status, headers, body };
}

/** Per-request state the error handler finds on the request. */
interface RequestState {
  capture: ResponseCapture;
}

/**
 * The idempotency middleware for one route family:
 *
 * ```ts
 * const idem = idempotency({ client, scope: "payments.create" });
 * app.post("/v1/charges", idem, (req, res) => { ... req.idemraft.token ... });
 * app.use(idem.errorHandler);
 * ```
 *
 * Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched. Put it before body parsers:
 * it reads the body itself (it must fingerprint the exact bytes before the handler runs) and
 * sets `req.rawBody` and `req.body`. Put compression before it, so what is stored is the
 * uncompressed response.
 */
export function idempotency(options: IdempotencyOptions): IdempotencyMiddleware {
  const s = settingsOf(options);

  const middleware = function idemraftMiddleware(rq: IncomingMessage, rs: ServerResponse, next: Next): void {
    const req = rq as IdempotentRequest;
    const res = rs as Res;
    handle(s, req, res, next).catch((e: unknown) => {
      // A bug here must not leave the request hanging: answer it, and say so.
      s.logger.error("the idempotency middleware failed", { error: String(e) });
      if (!res.writableEnded) sendProblem(res, Problem.internal(e instanceof Error ? e.message : String(e)));
    });
  } as IdempotencyMiddleware;

  // Express tells error handlers by their four parameters.
  middleware.errorHandler = function idemraftErrorHandler(err: unknown, req: IncomingMessage, _res: ServerResponse, next: Next) {
    const state = (req as unknown as Record<symbol, RequestState | undefined>)[STATE];
    if (state === undefined) {
      next(err);
      return;
    }
    if (state.capture.finished) {
      // The handler's response is already decided (and about to be stored): a later error
      // cannot change it.
      s.logger.error("an error after the handler's response was complete", { error: String(err) });
      return;
    }
    s.logger.error("the handler raised; the key is released", { error: String(err), scope: s.scope });
    state.capture.raise(err);
  };
  return middleware;
}

async function handle(s: Settings, req: IdempotentRequest, res: Res, next: Next): Promise<void> {
  if (SAFE_METHODS.has((req.method ?? "").toUpperCase())) {
    next();
    return;
  }
  const parsed = parseKey(headerValues(req, s.header));
  if (parsed.error !== undefined) {
    sendProblem(res, Problem.malformedKey(s.header, parsed.error));
    return;
  }
  const key = parsed.key;
  if (key === null) {
    if (s.keyRequired) sendProblem(res, Problem.missingKey(s.header));
    else next();
    return;
  }
  const read = await readBody(req, s.maxBodyBytes);
  if (!read.ok) {
    sendProblem(res, read.problem, read.close);
    return;
  }
  const body = read.body;
  req.rawBody = body;
  if (req.body === undefined) req.body = s.parseBody(body, req);
  // body-parser 1.x skips a request marked this way (2.x sees the stream has ended).
  (req as unknown as { _body: boolean })._body = true;

  // The target as the client sent it (path and query), whatever router the app mounts this on.
  const target = req.originalUrl ?? req.url ?? "/";
  const fp = fingerprint(req.method ?? "", Buffer.from(target === "" ? "/" : target, "latin1"), body);

  const client = s.client;
  const owner = `http-${randomUUID()}`;
  const waitUntil = s.waitMs === null ? null : Date.now() + s.waitMs;
  let rounds = 0;
  let grant;
  for (;;) {
    let outcome;
    try {
      outcome = await client.claim(s.scope, key, owner, {
        fingerprint: fp,
        leaseMs: s.leaseMs,
        ttlMs: s.ttlMs,
        allowTakeover: s.allowTakeover,
        deadlineMs: s.clusterTimeoutMs,
      });
    } catch (e) {
      if (e instanceof QuotaExceededError) {
        // The operator's problem, not the caller's: the full message goes to the log; the
        // caller learns only that it may retry later. Never fail-open: the cluster said no.
        s.logger.error("the tenant's record quota refused a new key", { error: e.message, scope: s.scope });
        sendProblem(res, Problem.quotaExceeded());
        return;
      }
      if (storeUnavailable(e)) {
        if (!s.failOpen) {
          sendProblem(res, Problem.unavailable(e));
          return;
        }
        s.logger.warn("cluster unavailable; running the handler unprotected (fail-open)", {
          error: e.describe(),
          scope: s.scope,
        });
        next();
        return;
      }
      // The key was checked here with the server's rule, so a refusal is a configuration
      // mismatch between this route and the cluster.
      const why = e instanceof IdemraftError ? e.describe() : String(e);
      s.logger.error("the cluster refused the claim", { error: why, scope: s.scope });
      sendProblem(res, Problem.internal(why));
      return;
    }
    if (outcome.outcome === "ACQUIRED") {
      grant = outcome;
      break;
    }
    if (outcome.outcome === "REPLAY") {
      sendReplay(res, outcome.response, s.logger);
      return;
    }
    if (outcome.outcome === "MISMATCH") {
      sendProblem(res, Problem.mismatch(s.header));
      return;
    }
    if (outcome.outcome === "IN_PROGRESS") {
      const left = waitUntil === null ? 0 : waitUntil - Date.now();
      rounds++;
      if (left < 10 || rounds > MAX_WAIT_ROUNDS) {
        sendProblem(res, Problem.inFlight(Math.min(retryAfterSecs(outcome.retryAfterMs), MAX_IN_FLIGHT_RETRY_AFTER_SECS)));
        return;
      }
      try {
        await client.wait(s.scope, key, left);
      } catch (e) {
        // Waiting is a courtesy; the cluster going away during it is a 503 (never fail-open:
        // another request is known to be running this key).
        sendProblem(res, Problem.unavailable(e instanceof IdemraftError ? e : new ConfigError(String(e))));
        return;
      }
      continue;
    }
    const name = (outcome as { outcome: string }).outcome;
    s.logger.error("unexpected claim outcome", { outcome: name });
    sendProblem(res, Problem.internal(`unexpected claim outcome ${name}`));
    return;
  }

  const capture = new ResponseCapture(res);
  (req as unknown as Record<symbol, RequestState>)[STATE] = { capture };
  const token = grant.token;
  let answer: HandlerEnd | undefined;
  let executed: unknown;
  try {
    await runGranted(
      client,
      s.scope,
      key,
      grant,
      { leaseMs: s.leaseMs, settleDeadlineMs: s.settleTimeoutMs },
      async (work) => {
        req.idemraft = {
          token,
          key,
          scope: s.scope,
          attempt: grant.attempt,
          takeover: grant.takeover,
          recoveryPoint: grant.recoveryPoint,
          signal: work.signal,
        };
        if (res.locals === undefined) res.locals = {};
        res.locals.idemraftToken = token;
        capture.install();
        next();
        answer = await capture.done;
        if (answer.kind === "raised") {
          const e = answer.error;
          return WorkFailure.retryable(`the handler raised: ${e instanceof Error ? e.message : String(e)}`);
        }
        const r = answer.response;
        if (!stores(s.store, r.status)) return WorkFailure.retryable(`status ${r.status} is not stored`);
        const stored = toStored(r, s);
        return r.status < 400 ? stored : WorkFailure.terminal(stored);
      },
    );
  } catch (e) {
    executed = e;
  } finally {
    capture.restore();
  }

  if (executed instanceof LostOwnershipError) {
    s.logger.warn("lease lost while the handler ran; its response was not stored", {
      token: String(token),
      current: String(executed.current),
    });
    capture.resetHeaders();
    sendProblem(res, Problem.lostOwnership());
    capture.callbacksAfter();
    return;
  }
  if (executed !== undefined && !(executed instanceof WorkFailedError)) {
    // The handler ran, but its outcome could not be stored: the caller still gets what the
    // handler did. A retry after the lease expires may run it again, which the fencing token
    // makes safe downstream.
    s.logger.error("the response could not be stored", {
      error: executed instanceof IdemraftError ? executed.describe() : String(executed),
      token: String(token),
    });
  }
  if (answer === undefined) {
    sendProblem(res, Problem.internal("the handler produced no answer"));
    return;
  }
  if (answer.kind === "raised") {
    capture.resetHeaders();
    sendProblem(res, Problem.handlerFailed());
    capture.callbacksAfter();
    return;
  }
  const r = answer.response;
  // Whatever touched the headers after the handler ended (a late error's handler) is undone.
  capture.resetHeaders(r.headers);
  res.statusMessage = r.statusMessage;
  sendBody(res, r.status, r.body, () => capture.callbacksAfter());
}
