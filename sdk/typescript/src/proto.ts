// The wire side: loading idemraft.proto at run time with @grpc/proto-loader (no generated code
// is kept in the repository) and converting between its messages and the typed values of
// types.ts. Nothing outside this module sees a protobuf object.
//
// 64-bit integers travel as decimal strings (`longs: String`), never as doubles, so a token
// above 2^53 arrives exact; they become `bigint` (tokens) or `number` (timestamps, counts).

import * as fs from "node:fs";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { InvalidArgumentError, ProtocolError } from "./errors";
import type {
  IdemRecord,
  NodeStatus,
  Outcome,
  QuotaReport,
  RecordId,
  RecordState,
  ResponseInit,
  StoredResponse,
} from "./types";

/** Where the build puts the proto, beside the compiled modules. */
const PROTO_RELATIVE = path.join("proto", "idemraft", "v1", "idemraft.proto");

function protoPath(): string {
  const p = path.join(__dirname, PROTO_RELATIVE);
  if (!fs.existsSync(p)) {
    throw new Error(
      `idemraft.proto is missing at ${p}: the package was not built (run \`npm run build\`, which copies it ` +
        `from proto/proto/idemraft/v1 of the Idemraft repository)`,
    );
  }
  return p;
}

/** Loaded service constructors. */
export interface Services {
  Idempotency: grpc.ServiceClientConstructor;
  Admin: grpc.ServiceClientConstructor;
}

let loaded: Services | undefined;

/** The Idempotency and Admin services, loaded once per process. */
export function services(): Services {
  if (loaded === undefined) {
    const def = protoLoader.loadSync(protoPath(), {
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
      bytes: Buffer,
    });
    const pkg = grpc.loadPackageDefinition(def) as unknown as {
      idemraft: { v1: { Idempotency: grpc.ServiceClientConstructor; Admin: grpc.ServiceClientConstructor } };
    };
    loaded = { Idempotency: pkg.idemraft.v1.Idempotency, Admin: pkg.idemraft.v1.Admin };
  }
  return loaded;
}

// Protobuf shapes as proto-loader produces them with the options above.
/* eslint-disable @typescript-eslint/no-explicit-any */
type Pb = any;

const U64_MAX = (1n << 64n) - 1n;

/** A caller's unsigned 64-bit integer, checked, as the wire's decimal string. */
export function u64(value: bigint | number | string, what: string): string {
  let v: bigint;
  try {
    v = BigInt(value);
  } catch {
    throw new InvalidArgumentError(`${what} must be an unsigned 64-bit integer, not ${String(value)}`);
  }
  if (v < 0n || v > U64_MAX) {
    throw new InvalidArgumentError(`${what} must be an unsigned 64-bit integer, not ${String(value)}`);
  }
  return v.toString();
}

/** Milliseconds on the wire, where 0 (and absent) means "the server's default". */
export function millis(ms: number | undefined, what: string): string {
  if (ms === undefined) return "0";
  if (!Number.isSafeInteger(ms) || ms < 0) {
    throw new InvalidArgumentError(`${what} must be a whole number of milliseconds >= 0, not ${ms}`);
  }
  return String(ms);
}

function big(v: unknown): bigint {
  return v === undefined || v === null || v === "" ? 0n : BigInt(v as string);
}

function num(v: unknown): number {
  return v === undefined || v === null || v === "" ? 0 : Number(v);
}

function buf(v: unknown): Buffer {
  return Buffer.isBuffer(v) ? v : v instanceof Uint8Array ? Buffer.from(v) : Buffer.alloc(0);
}

/** Bytes from a caller: a string means its UTF-8 encoding. */
export function bytesIn(v: Uint8Array | string | undefined): Buffer {
  if (v === undefined) return Buffer.alloc(0);
  return typeof v === "string" ? Buffer.from(v, "utf8") : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
}

export function responseToPb(r: ResponseInit): Pb {
  if (!Number.isInteger(r.status) || r.status < 0 || r.status > 0xffffffff) {
    throw new InvalidArgumentError(`a response status must be an unsigned 32-bit integer, not ${r.status}`);
  }
  return {
    status: r.status,
    headers: (r.headers ?? []).map(([name, value]) => ({ name, value })),
    body: bytesIn(r.body),
  };
}

export function responseFromPb(r: Pb | null | undefined): StoredResponse {
  return {
    status: num(r?.status),
    headers: ((r?.headers ?? []) as Pb[]).map((h) => [String(h.name), String(h.value)] as [string, string]),
    body: buf(r?.body),
  };
}

export function stateFromPb(s: unknown): RecordState {
  switch (s) {
    case "RECORD_STATE_IN_PROGRESS":
    case 1:
      return "IN_PROGRESS";
    case "RECORD_STATE_COMPLETED":
    case 2:
      return "COMPLETED";
    case "RECORD_STATE_FAILED":
    case 3:
      return "FAILED";
    default:
      return "UNKNOWN";
  }
}

export function stateToPb(s: RecordState | undefined): string {
  switch (s) {
    case undefined:
      return "RECORD_STATE_UNSPECIFIED";
    case "IN_PROGRESS":
      return "RECORD_STATE_IN_PROGRESS";
    case "COMPLETED":
      return "RECORD_STATE_COMPLETED";
    case "FAILED":
      return "RECORD_STATE_FAILED";
    default:
      throw new InvalidArgumentError(`state must be IN_PROGRESS, COMPLETED or FAILED, not ${String(s)}`);
  }
}

export function outcomeFromPb(o: Pb): Outcome {
  const which: string | undefined = o?.result;
  const v = which === undefined ? undefined : o[which];
  switch (which) {
    case "acquired":
      return {
        outcome: "ACQUIRED",
        token: big(v.token),
        attempt: num(v.attempt),
        takeover: Boolean(v.takeover),
        leaseExpiresMs: num(v.lease_expires_ms),
        expiresMs: num(v.expires_ms),
        recoveryPoint: String(v.recovery_point ?? ""),
        checkpoint: buf(v.checkpoint),
      };
    case "replay":
      return {
        outcome: "REPLAY",
        token: big(v.token),
        completedMs: num(v.completed_ms),
        response: responseFromPb(v.response),
      };
    case "in_progress":
      return { outcome: "IN_PROGRESS", leaseExpiresMs: num(v.lease_expires_ms), retryAfterMs: num(v.retry_after_ms) };
    case "mismatch":
      return { outcome: "MISMATCH" };
    case "stale_token":
      return { outcome: "STALE_TOKEN", current: big(v.current) };
    case "not_found":
      return { outcome: "NOT_FOUND" };
    case "wrong_state":
      return { outcome: "WRONG_STATE", state: stateFromPb(v.state) };
    case "completed":
      return { outcome: "COMPLETED", token: big(v.token) };
    case "failed":
      return { outcome: "FAILED", token: big(v.token), retryable: Boolean(v.retryable) };
    case "lease_extended":
      return { outcome: "LEASE_EXTENDED", token: big(v.token), leaseExpiresMs: num(v.lease_expires_ms) };
    default:
      throw new ProtocolError(
        which === undefined ? "an outcome with no result" : `an outcome this SDK does not know: ${which}`,
      );
  }
}

export function recordIdFromPb(id: Pb): RecordId {
  return { tenant: String(id?.tenant ?? ""), scope: String(id?.scope ?? ""), key: String(id?.key ?? "") };
}

export function recordFromPb(r: Pb | null | undefined): IdemRecord | null {
  if (r === null || r === undefined) return null;
  return {
    ...recordIdFromPb(r.id),
    state: stateFromPb(r.state),
    token: big(r.token),
    owner: String(r.owner ?? ""),
    attempt: num(r.attempt),
    takenOver: Boolean(r.taken_over),
    leaseExpiresMs: num(r.lease_expires_ms),
    createdMs: num(r.created_ms),
    updatedMs: num(r.updated_ms),
    completedMs: num(r.completed_ms),
    expiresMs: num(r.expires_ms),
    retentionMs: num(r.retention_ms),
    recoveryPoint: String(r.recovery_point ?? ""),
    checkpoint: buf(r.checkpoint),
    response: r.response === null || r.response === undefined ? null : responseFromPb(r.response),
    fingerprint: buf(r.fingerprint),
  };
}

export function statusFromPb(s: Pb): NodeStatus {
  return {
    id: num(s.id),
    role: String(s.role ?? "ROLE_UNSPECIFIED").replace(/^ROLE_/, ""),
    term: num(s.term),
    leaderId: num(s.leader_id),
    lastLogIndex: num(s.last_log_index),
    commitIndex: num(s.commit_index),
    appliedIndex: num(s.applied_index),
    members: ((s.members ?? []) as Pb[]).map((m) => ({
      id: num(m.id),
      peerAddr: String(m.peer_addr ?? ""),
      voter: Boolean(m.voter),
    })),
    clientAddr: String(s.client_addr ?? ""),
    leaderClientAddr: String(s.leader_client_addr ?? ""),
    clockMs: num(s.clock_ms),
    records: num(s.records),
    version: String(s.version ?? ""),
  };
}

export function quotaFromPb(q: Pb): QuotaReport {
  const opt = (v: unknown) => (v === undefined || v === null ? null : num(v));
  return {
    defaultMaxRecords: opt(q.default_max_records),
    tenants: ((q.tenants ?? []) as Pb[]).map((t) => ({
      tenant: String(t.tenant ?? ""),
      records: num(t.records),
      maxRecords: opt(t.max_records),
      own: Boolean(t.own),
    })),
  };
}
