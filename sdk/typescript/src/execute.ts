// `execute`: run a piece of work at most once per key, with the lease kept alive in the
// background while it runs, and the key settled with the work's result. Like the Rust SDK's
// `Client::execute` and `Client::run_granted` (which the HTTP middleware uses too, having made
// the claim itself).
//
// The settle is worth a long fight: the work is done by then, and a key left unsettled makes
// a retry wait out the lease and run the work again. So Complete/Fail is repeated (it is
// idempotent) while its outcome is unknown, for up to the execution's deadline, with the
// lease still kept alive.

import {
  InProgressError,
  isIndeterminate,
  LostOwnershipError,
  MismatchError,
  UnexpectedOutcomeError,
  WorkFailedError,
} from "./errors";
import type { Client } from "./client";
import type { Fingerprint } from "./fingerprint";
import { bytesIn } from "./proto";
import type { Grant, Outcome, ResponseInit, StoredResponse } from "./types";
import { randomUUID } from "node:crypto";

/** Options of {@link Client.execute}. */
export interface ExecuteOptions {
  /** Lease to hold while the work runs, extended every third of it; 30 000 ms. */
  leaseMs?: number;
  /** Record TTL and retention; absent takes the scope's default. */
  ttlMs?: number;
  /**
   * How long to keep trying (claims, waiting for another holder) before giving up, and then
   * again how long to keep trying to settle the key once the work is done; 30 000 ms.
   */
  deadlineMs?: number;
  /** Owner id; a fresh random one by default. Give your own to let a restarted process resume its claims. */
  owner?: string;
  /** Take the key over when its holder's lease has expired (the holder crashed); true. */
  allowTakeover?: boolean;
}

/** What the work receives: the grant, and ways to learn that ownership was lost. */
export interface WorkGrant {
  /** The grant (token, attempt, the recovery point and checkpoint of a previous owner). */
  grant: Grant;
  /** The fencing token: pass it to every downstream write. */
  token: bigint;
  /**
   * Aborted if the lease was lost while the work runs (another owner may now hold the key):
   * stop, the fencing token will be refused downstream.
   */
  signal: AbortSignal;
  /** Resolves when the lease is lost (never, if it is not). */
  lost: Promise<void>;
  /** Whether the lease was lost. */
  isLost(): boolean;
}

/** How a piece of work failed, as the work's return value. */
export class WorkFailure {
  private constructor(
    /** true: release the key (FAILED) so the next claim runs the work again. */
    readonly retryable: boolean,
    /** Why, for a retryable failure. */
    readonly reason: string,
    /** The error response to store and replay, for a terminal failure. */
    readonly response: ResponseInit | null,
  ) {}

  /** Try again later: the key is released and the next claim re-acquires it. */
  static retryable(reason: string): WorkFailure {
    return new WorkFailure(true, reason, null);
  }

  /** Final: this error response is stored and replayed to every retry. */
  static terminal(response: ResponseInit): WorkFailure {
    return new WorkFailure(false, "", response);
  }
}

/**
 * The work `execute` runs once it owns the key: return the response to store, or a
 * {@link WorkFailure}. A thrown exception releases the key like a retryable failure and is
 * then thrown on to the caller of `execute`.
 */
export type Work = (grant: WorkGrant) => Promise<ResponseInit | WorkFailure> | ResponseInit | WorkFailure;

/** The result of {@link Client.execute}. */
export interface Executed {
  /** The token of the grant that produced the response. */
  token: bigint;
  /** The response (a terminal failure's stored error response included). */
  response: StoredResponse;
  /** The response was stored by an earlier execution, not produced now. */
  replayed: boolean;
}

/** Settings of {@link runGranted}. */
export interface GrantedOptions {
  /** Lease to keep renewing while the work runs. */
  leaseMs: number;
  /** How long to keep trying to settle the key once the work is done. */
  settleDeadlineMs: number;
}

const MIN_WAIT_MS = 10;

function stored(r: ResponseInit): StoredResponse {
  return { status: r.status, headers: [...(r.headers ?? [])], body: bytesIn(r.body) };
}

/** Renews a lease every third of its length until stopped; reports a lease it lost. */
class LeaseKeeper {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly client: Client,
    private readonly scope: string,
    private readonly key: string,
    private readonly token: bigint,
    private readonly leaseMs: number,
    private readonly onLost: (outcome: Outcome["outcome"]) => void,
  ) {}

  start(): void {
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
  }

  private schedule(): void {
    if (this.stopped) return;
    // Unreferenced: a keep-alive alone must not hold a process open; the work it guards does.
    this.timer = setTimeout(() => void this.tick(), Math.max(1, Math.floor(this.leaseMs / 3)));
    this.timer.unref();
  }

  private async tick(): Promise<void> {
    if (this.stopped) return;
    try {
      const o = await this.client.extendLease(this.scope, this.key, this.token, this.leaseMs);
      if (this.stopped) return;
      if (o.outcome !== "LEASE_EXTENDED") {
        this.stopped = true;
        this.onLost(o.outcome);
        return;
      }
    } catch {
      // Unreachable cluster or unknown outcome: the next renewal tries again, and the lease
      // is still ours until someone else is granted the key.
    }
    this.schedule();
  }
}

/**
 * Runs `work` under `grant`, renewing the lease every third of `opts.leaseMs` in the
 * background while it runs, then completes the key with its response or fails it (retryable
 * or terminal, by the work's choice). For a caller that made the claim itself.
 */
export async function runGranted(
  client: Client,
  scope: string,
  key: string,
  grant: Grant,
  opts: GrantedOptions,
  work: Work,
): Promise<Executed> {
  const token = grant.token;
  const controller = new AbortController();
  let lostResolve: () => void = () => undefined;
  const lost = new Promise<void>((resolve) => (lostResolve = resolve));
  const keeper = new LeaseKeeper(client, scope, key, token, opts.leaseMs, (outcome) => {
    controller.abort(new Error(`the lease on the key was lost (${outcome}): another owner may hold it`));
    lostResolve();
  });
  keeper.start();
  const workGrant: WorkGrant = {
    grant,
    token,
    signal: controller.signal,
    lost,
    isLost: () => controller.signal.aborted,
  };

  type Result =
    | { kind: "ok"; response: ResponseInit }
    | { kind: "failure"; failure: WorkFailure }
    | { kind: "threw"; error: unknown };
  let result: Result;
  try {
    const r = await work(workGrant);
    result = r instanceof WorkFailure ? { kind: "failure", failure: r } : { kind: "ok", response: r };
  } catch (error) {
    result = { kind: "threw", error };
  }

  const settleUntil = Date.now() + opts.settleDeadlineMs;
  let outcome: Outcome;
  try {
    for (;;) {
      try {
        if (result.kind === "ok") {
          outcome = await client.complete(scope, key, token, result.response);
        } else if (result.kind === "failure" && !result.failure.retryable) {
          outcome = await client.fail(scope, key, token, false, result.failure.response);
        } else {
          outcome = await client.fail(scope, key, token, true, null);
        }
        break;
      } catch (e) {
        if (isIndeterminate(e) && Date.now() < settleUntil) continue;
        // The work's own exception says more than the failure to release the key after it.
        throw result.kind === "threw" ? result.error : e;
      }
    }
  } finally {
    keeper.stop();
  }

  // The work threw: the key is released (or was taken over meanwhile); its exception is the answer.
  if (result.kind === "threw") throw result.error;
  if (outcome.outcome === "STALE_TOKEN") throw new LostOwnershipError(token, outcome.current);
  if (result.kind === "ok" && outcome.outcome === "COMPLETED") {
    return { token, response: stored(result.response), replayed: false };
  }
  if (result.kind === "failure" && outcome.outcome === "FAILED" && outcome.retryable === result.failure.retryable) {
    if (result.failure.retryable) throw new WorkFailedError(result.failure.reason);
    return { token, response: stored(result.failure.response as ResponseInit), replayed: false };
  }
  throw new UnexpectedOutcomeError(outcome.outcome);
}

/** See {@link Client.execute}. */
export async function execute(
  client: Client,
  scope: string,
  key: string,
  fingerprint: Fingerprint | null,
  work: Work,
  opts: ExecuteOptions,
): Promise<Executed> {
  const leaseMs = opts.leaseMs ?? 30_000;
  const deadlineMs = opts.deadlineMs ?? 30_000;
  const deadline = Date.now() + deadlineMs;
  const owner = opts.owner ?? `owner-${randomUUID()}`;
  const claimOpts = {
    fingerprint,
    leaseMs,
    ttlMs: opts.ttlMs,
    allowTakeover: opts.allowTakeover ?? true,
  };
  let grant: Grant;
  for (;;) {
    const o = await client.claim(scope, key, owner, { ...claimOpts, deadlineMs: Math.max(0, deadline - Date.now()) });
    if (o.outcome === "ACQUIRED") {
      grant = o;
      break;
    }
    if (o.outcome === "REPLAY") return { token: o.token, response: o.response, replayed: true };
    if (o.outcome === "MISMATCH") throw new MismatchError();
    if (o.outcome === "IN_PROGRESS") {
      const left = deadline - Date.now();
      if (left < MIN_WAIT_MS) throw new InProgressError(o.leaseExpiresMs);
      // Wait for the holder to settle, at most until its lease could expire (so a takeover
      // is attempted promptly) and never past our deadline.
      const waited = await client.wait(scope, key, Math.min(left, Math.max(o.retryAfterMs, 100) * 4));
      // Still held when our time is up: that is the answer. Claiming again now could only
      // report that the deadline passed, which says less.
      if (waited.timedOut && deadline - Date.now() < MIN_WAIT_MS) {
        throw new InProgressError(waited.record?.leaseExpiresMs || o.leaseExpiresMs);
      }
      continue;
    }
    throw new UnexpectedOutcomeError((o as Outcome).outcome);
  }
  const { outcome: _acquired, ...plain } = grant as Grant & { outcome?: string };
  return runGranted(client, scope, key, plain, { leaseMs, settleDeadlineMs: deadlineMs }, work);
}
