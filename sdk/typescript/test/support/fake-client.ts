// An in-memory stand-in for the cluster, for the middleware's unit tests: it keeps records
// with the server's rules for the calls the middleware makes (claim, wait, complete, fail,
// extend), records every call, and can be told to fail calls the way a real cluster does.

import type { Client } from "../../src/client";
import type { Fingerprint } from "../../src/fingerprint";
import type { ClaimOutcome, CompleteOutcome, ExtendOutcome, FailOutcome, ResponseInit, StoredResponse, Waited } from "../../src/types";

interface Rec {
  state: "IN_PROGRESS" | "COMPLETED" | "FAILED";
  token: bigint;
  owner: string;
  attempt: number;
  fingerprint: string;
  response: StoredResponse | null;
}

export interface Call {
  op: string;
  key: string;
  args: unknown[];
}

function stored(r: ResponseInit): StoredResponse {
  return { status: r.status, headers: [...(r.headers ?? [])], body: Buffer.from(r.body ?? "") };
}

export class FakeClient {
  readonly records = new Map<string, Rec>();
  readonly calls: Call[] = [];
  private nextToken = 100n;
  private waiters: Array<() => void> = [];
  /** Thrown by the next claims (a cluster that cannot be reached, a quota refusal, ...). */
  claimError: (() => Error) | null = null;
  /** Thrown by complete and fail. */
  settleError: (() => Error) | null = null;
  /** Makes the next extend answer STALE_TOKEN (another owner took the key). */
  stealOnExtend = false;

  asClient(): Client {
    return this as unknown as Client;
  }

  private changed(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  count(op: string): number {
    return this.calls.filter((c) => c.op === op).length;
  }

  async claim(
    _scope: string,
    key: string,
    owner: string,
    opts: { fingerprint?: Fingerprint | null; leaseMs?: number } = {},
  ): Promise<ClaimOutcome> {
    this.calls.push({ op: "claim", key, args: [owner, opts] });
    if (this.claimError) throw this.claimError();
    const fp = opts.fingerprint ? opts.fingerprint.toHex() : "";
    const r = this.records.get(key);
    const grant = (rec: Rec): ClaimOutcome => ({
      outcome: "ACQUIRED",
      token: rec.token,
      attempt: rec.attempt,
      takeover: false,
      leaseExpiresMs: Date.now() + (opts.leaseMs ?? 30_000),
      expiresMs: Date.now() + 86_400_000,
      recoveryPoint: "",
      checkpoint: Buffer.alloc(0),
    });
    if (r !== undefined && r.fingerprint !== "" && fp !== "" && r.fingerprint !== fp) return { outcome: "MISMATCH" };
    if (r === undefined || r.state === "FAILED") {
      const rec: Rec = {
        state: "IN_PROGRESS",
        token: this.nextToken++,
        owner,
        attempt: (r?.attempt ?? 0) + 1,
        fingerprint: fp,
        response: null,
      };
      this.records.set(key, rec);
      return grant(rec);
    }
    if (r.state === "COMPLETED") {
      return { outcome: "REPLAY", token: r.token, completedMs: Date.now(), response: r.response as StoredResponse };
    }
    if (r.owner === owner) return grant(r);
    return { outcome: "IN_PROGRESS", leaseExpiresMs: Date.now() + 30_000, retryAfterMs: 29_000 };
  }

  async wait(_scope: string, key: string, timeoutMs: number): Promise<Waited> {
    this.calls.push({ op: "wait", key, args: [timeoutMs] });
    const end = Date.now() + timeoutMs;
    while (this.records.get(key)?.state === "IN_PROGRESS" && Date.now() < end) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.max(0, end - Date.now()));
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    return { record: null, timedOut: this.records.get(key)?.state === "IN_PROGRESS" };
  }

  async complete(_scope: string, key: string, token: bigint, response: ResponseInit): Promise<CompleteOutcome> {
    this.calls.push({ op: "complete", key, args: [token, response] });
    if (this.settleError) throw this.settleError();
    const r = this.records.get(key);
    if (r === undefined) return { outcome: "NOT_FOUND" };
    if (r.token !== token) return { outcome: "STALE_TOKEN", current: r.token };
    r.state = "COMPLETED";
    r.response = stored(response);
    this.changed();
    return { outcome: "COMPLETED", token };
  }

  async fail(_scope: string, key: string, token: bigint, retryable: boolean, response?: ResponseInit | null): Promise<FailOutcome> {
    this.calls.push({ op: "fail", key, args: [token, retryable, response] });
    if (this.settleError) throw this.settleError();
    const r = this.records.get(key);
    if (r === undefined) return { outcome: "NOT_FOUND" };
    if (r.token !== token) return { outcome: "STALE_TOKEN", current: r.token };
    if (retryable) r.state = "FAILED";
    else {
      r.state = "COMPLETED";
      r.response = stored(response as ResponseInit);
    }
    this.changed();
    return { outcome: "FAILED", token, retryable };
  }

  async extendLease(_scope: string, key: string, token: bigint): Promise<ExtendOutcome> {
    this.calls.push({ op: "extend", key, args: [token] });
    const r = this.records.get(key);
    if (r === undefined) return { outcome: "NOT_FOUND" };
    if (this.stealOnExtend) {
      this.stealOnExtend = false;
      r.token = this.nextToken++;
      r.owner = "thief";
    }
    if (r.token !== token) return { outcome: "STALE_TOKEN", current: r.token };
    return { outcome: "LEASE_EXTENDED", token, leaseExpiresMs: Date.now() + 30_000 };
  }
}
