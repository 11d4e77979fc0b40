// The typed values of the client API: outcomes of writes, records, stored responses. These are
// plain TypeScript values, never protobuf objects, so a program can switch on `outcome` and
// the compiler checks every case.
//
// Fencing tokens are `bigint`: they are unsigned 64-bit on the wire, and a token rounded to
// the nearest double would fence the wrong writes. Timestamps (Unix ms), durations and counts
// are `number`, exact far beyond any date or count this service will see.

/** A response stored at completion and replayed byte for byte. */
export interface StoredResponse {
  /** Status code as the caller defines it (the HTTP status for HTTP work). */
  status: number;
  /** Headers to replay, in order, as `[name, value]` pairs. */
  headers: Array<[string, string]>;
  /** Body bytes. */
  body: Buffer;
}

/** A response to store: like {@link StoredResponse}, with the body as bytes or UTF-8 text. */
export interface ResponseInit {
  status: number;
  headers?: Array<[string, string]>;
  body?: Uint8Array | string;
}

/** A record's lifecycle state; `UNKNOWN` is one this SDK does not know (a newer server). */
export type RecordState = "IN_PROGRESS" | "COMPLETED" | "FAILED" | "UNKNOWN";

/** An ownership grant. */
export interface Grant {
  /** The fencing token: pass it to downstream systems, which refuse lower tokens. */
  token: bigint;
  /** 1 for a first grant, higher after failures and takeovers. */
  attempt: number;
  /** The previous owner's lease expired and this grant replaced it. */
  takeover: boolean;
  /** Lease deadline, Unix ms of the cluster's clock. */
  leaseExpiresMs: number;
  /** Record expiry, Unix ms. */
  expiresMs: number;
  /** Progress marker left by a previous owner (empty on a first grant). */
  recoveryPoint: string;
  /** Progress data left by a previous owner (empty on a first grant). */
  checkpoint: Buffer;
}

/** Claim, Takeover: the caller owns the key. */
export interface Acquired extends Grant {
  outcome: "ACQUIRED";
}
/** Claim: the key was completed before; here is its stored response. */
export interface Replay {
  outcome: "REPLAY";
  /** Token of the grant that completed the record. */
  token: bigint;
  /** When it completed, Unix ms. */
  completedMs: number;
  response: StoredResponse;
}
/** Claim, Takeover: someone else holds the key. */
export interface InProgress {
  outcome: "IN_PROGRESS";
  /** The holder's lease deadline, Unix ms. */
  leaseExpiresMs: number;
  /** Suggested wait before retrying, ms. */
  retryAfterMs: number;
}
/** Claim: the key is bound to another request fingerprint. */
export interface Mismatch {
  outcome: "MISMATCH";
}
/** A call with a token that is not the record's current one. */
export interface StaleToken {
  outcome: "STALE_TOKEN";
  /** The record's current token. */
  current: bigint;
}
/** No live record with that id. */
export interface NotFound {
  outcome: "NOT_FOUND";
}
/** The record's state does not allow the call. */
export interface WrongState {
  outcome: "WRONG_STATE";
  state: RecordState;
}
/** Complete accepted (also when retried after it was accepted). */
export interface Completed {
  outcome: "COMPLETED";
  token: bigint;
}
/** Fail accepted (also when retried after it was accepted). */
export interface Failed {
  outcome: "FAILED";
  token: bigint;
  /** FAILED (true: the next claim re-acquires) or COMPLETED with the error response (false). */
  retryable: boolean;
}
/** ExtendLease or Checkpoint accepted. */
export interface LeaseExtended {
  outcome: "LEASE_EXTENDED";
  token: bigint;
  /** New lease deadline, Unix ms. */
  leaseExpiresMs: number;
}

/** The decision on a write. Which variants a call can get is listed at each. */
export type Outcome =
  | Acquired
  | Replay
  | InProgress
  | Mismatch
  | StaleToken
  | NotFound
  | WrongState
  | Completed
  | Failed
  | LeaseExtended;

/** The answers a Claim can get. */
export type ClaimOutcome = Acquired | Replay | InProgress | Mismatch;
/** The answers a Takeover can get. */
export type TakeoverOutcome = Acquired | InProgress | NotFound | WrongState;
/** The answers a Complete can get. */
export type CompleteOutcome = Completed | StaleToken | NotFound | WrongState;
/** The answers a Fail can get. */
export type FailOutcome = Failed | StaleToken | NotFound | WrongState;
/** The answers an ExtendLease or a Checkpoint can get. */
export type ExtendOutcome = LeaseExtended | StaleToken | NotFound | WrongState;

/** Identity of a record. */
export interface RecordId {
  tenant: string;
  scope: string;
  key: string;
}

/** The public view of one record, as Get, Wait and List return it. */
export interface IdemRecord extends RecordId {
  state: RecordState;
  /** Token of the latest grant. */
  token: bigint;
  /** Owner id of the latest grant. */
  owner: string;
  /** 1 for the first grant, +1 for each re-acquire or takeover. */
  attempt: number;
  /** The latest grant replaced an owner whose lease expired. */
  takenOver: boolean;
  /** Lease deadline while IN_PROGRESS, Unix ms; 0 otherwise. */
  leaseExpiresMs: number;
  createdMs: number;
  updatedMs: number;
  /** When it became COMPLETED, Unix ms; 0 if it has not. */
  completedMs: number;
  expiresMs: number;
  /** How long the record is kept once settled, ms. */
  retentionMs: number;
  recoveryPoint: string;
  checkpoint: Buffer;
  /** The stored response once COMPLETED, else null. */
  response: StoredResponse | null;
  /** The bound fingerprint (32 bytes), or empty. */
  fingerprint: Buffer;
}

/** A record after Wait. */
export interface Waited {
  /** The record, or null when there is no live record with that id. */
  record: IdemRecord | null;
  /** The timeout passed while the record was still IN_PROGRESS. */
  timedOut: boolean;
}

/** One page of List. */
export interface ListPage {
  /** Records in key order. */
  records: IdemRecord[];
  /** Set when more records may follow: pass it as `startAfter` for the next page. */
  nextAfter: RecordId | null;
}

/** A node's view of itself and the cluster (Admin/Status). */
export interface NodeStatus {
  id: number;
  role: string;
  term: number;
  /** 0 when no leader is known. */
  leaderId: number;
  lastLogIndex: number;
  commitIndex: number;
  appliedIndex: number;
  members: Array<{ id: number; peerAddr: string; voter: boolean }>;
  clientAddr: string;
  /** The leader's client address, when known. */
  leaderClientAddr: string;
  clockMs: number;
  records: number;
  version: string;
}

/** Record quotas and their use (Admin/SetQuota, Admin/GetQuota). */
export interface QuotaReport {
  /** The default quota; null: none. */
  defaultMaxRecords: number | null;
  tenants: Array<{ tenant: string; records: number; maxRecords: number | null; own: boolean }>;
}
