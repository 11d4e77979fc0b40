// The error taxonomy of the client, the same as the Rust SDK's: why a call reached no
// decision. Conflicts a caller handles in the normal course (IN_PROGRESS, MISMATCH, ...) are
// outcomes, not errors. Every error has a `kind` a program can switch on and an
// `indeterminate` flag: true when the call may or may not have taken effect, so repeating it
// with the same arguments (same owner id, same token) is the way to learn its outcome.
//
// `message` is the server's text unchanged where the server gave one, so a rule named by the
// node reaches the caller word for word.

/** Every kind of error, as `IdemraftError.kind` spells it. */
export type ErrorKind =
  | "invalid_argument"
  | "unavailable"
  | "deadline_exceeded"
  | "indeterminate"
  | "failed_precondition"
  | "quota_exceeded"
  | "config"
  | "protocol"
  | "rpc"
  | "mismatch"
  | "in_progress"
  | "work_failed"
  | "lost_ownership"
  | "unexpected";

/** The base of every error this package throws. */
export abstract class IdemraftError extends Error {
  abstract readonly kind: ErrorKind;

  /** Whether the call may or may not have taken effect; repeating it is safe. */
  get indeterminate(): boolean {
    return false;
  }

  /** The message with the kind in front, as the Rust SDK displays it (for logs). */
  describe(): string {
    return this.message;
  }
}

/** The request broke a rule; the message (the server's) names it. Retrying will not help. */
export class InvalidArgumentError extends IdemraftError {
  readonly kind = "invalid_argument" as const;
  override name = "InvalidArgumentError";
  override describe(): string {
    return `invalid request: ${this.message}`;
  }
}

/**
 * No node could serve the call before the deadline (no leader, no quorum, nodes down). For a
 * write the outcome is unknown; repeating the same call is safe.
 */
export class UnavailableError extends IdemraftError {
  readonly kind = "unavailable" as const;
  override name = "UnavailableError";
  override get indeterminate(): boolean {
    return true;
  }
  override describe(): string {
    return `cluster unavailable: ${this.message}`;
  }
}

/** The deadline passed; for a write the outcome is unknown, repeating it is safe. */
export class DeadlineExceededError extends IdemraftError {
  readonly kind = "deadline_exceeded" as const;
  override name = "DeadlineExceededError";
  override get indeterminate(): boolean {
    return true;
  }
  override describe(): string {
    return `deadline exceeded: ${this.message}`;
  }
}

/**
 * The outcome of the call is unknown: the connection broke before the answer arrived and no
 * other attempt got an answer before the deadline, or a retried write got an answer that an
 * earlier attempt, whose outcome is unknown, may itself have caused. Repeating the same call
 * is safe. The message says which.
 */
export class OutcomeUnknownError extends IdemraftError {
  readonly kind = "indeterminate" as const;
  override name = "OutcomeUnknownError";
  override get indeterminate(): boolean {
    return true;
  }
  override describe(): string {
    return `outcome unknown: ${this.message}`;
  }
}

/** The cluster refused the call in its current shape (an admin change it cannot make). */
export class RefusedError extends IdemraftError {
  readonly kind = "failed_precondition" as const;
  override name = "RefusedError";
  override describe(): string {
    return `refused: ${this.message}`;
  }
}

/**
 * The claim would have created a record past the tenant's record quota, and the cluster
 * refused it; nothing was stored. Not retried: the same claim gets the same answer until an
 * operator raises the quota or records expire. Claims on keys that already have a record are
 * never refused this way.
 */
export class QuotaExceededError extends IdemraftError {
  readonly kind = "quota_exceeded" as const;
  override name = "QuotaExceededError";
  constructor(
    message: string,
    /** The tenant whose quota is used up. */
    readonly tenant: string,
    /** Its quota, in records. */
    readonly limit: number,
    /** The records it holds. */
    readonly records: number,
  ) {
    super(message);
  }
}

/** The client was configured wrongly (no endpoints, a malformed address, unusable TLS files). */
export class ConfigError extends IdemraftError {
  readonly kind = "config" as const;
  override name = "ConfigError";
  override describe(): string {
    return `client configuration: ${this.message}`;
  }
}

/** The server answered with something this SDK does not understand (a newer server?). */
export class ProtocolError extends IdemraftError {
  readonly kind = "protocol" as const;
  override name = "ProtocolError";
  override describe(): string {
    return `unexpected reply: ${this.message}`;
  }
}

/** gRPC status code names, as the Rust SDK prints them. */
const CODE_NAMES = [
  "Ok",
  "Cancelled",
  "Unknown",
  "InvalidArgument",
  "DeadlineExceeded",
  "NotFound",
  "AlreadyExists",
  "PermissionDenied",
  "ResourceExhausted",
  "FailedPrecondition",
  "Aborted",
  "OutOfRange",
  "Unimplemented",
  "Internal",
  "Unavailable",
  "DataLoss",
  "Unauthenticated",
];

/** Any other gRPC failure (PERMISSION_DENIED, UNAUTHENTICATED, a node's INTERNAL error, ...). */
export class RpcError extends IdemraftError {
  readonly kind = "rpc" as const;
  override name = "RpcError";
  constructor(
    message: string,
    /** The gRPC status code. */
    readonly code: number,
  ) {
    super(message);
  }
  /** The code's name, e.g. `PermissionDenied`. */
  get codeName(): string {
    return CODE_NAMES[this.code] ?? `Code(${this.code})`;
  }
  override describe(): string {
    return `${this.codeName}: ${this.message}`;
  }
}

// Errors of `execute` only: why it produced no response.

/** The key is bound to a different request fingerprint. */
export class MismatchError extends IdemraftError {
  readonly kind = "mismatch" as const;
  override name = "MismatchError";
  constructor() {
    super("the idempotency key was used with a different request (fingerprint mismatch)");
  }
}

/** Another worker still holds the key at the deadline. */
export class InProgressError extends IdemraftError {
  readonly kind = "in_progress" as const;
  override name = "InProgressError";
  constructor(
    /** The holder's lease deadline, Unix ms. */
    readonly leaseExpiresMs: number,
  ) {
    super(`another worker holds the key (its lease runs until ${leaseExpiresMs})`);
  }
}

/** The work failed retryably; the key was released for a retry. `message` is the work's reason. */
export class WorkFailedError extends IdemraftError {
  readonly kind = "work_failed" as const;
  override name = "WorkFailedError";
  constructor(readonly reason: string) {
    super(reason);
  }
  override describe(): string {
    return `the work failed and may be retried: ${this.reason}`;
  }
}

/**
 * The lease was lost and another owner took the key over; this worker's completion was
 * refused. Downstream writes fenced with the old token are refused too.
 */
export class LostOwnershipError extends IdemraftError {
  readonly kind = "lost_ownership" as const;
  override name = "LostOwnershipError";
  constructor(
    /** Our token. */
    readonly token: bigint,
    /** The record's current token. */
    readonly current: bigint,
  ) {
    super(`ownership lost: token ${token} was superseded by ${current}`);
  }
}

/** An outcome that should not happen in this flow; `message` is the outcome's name. */
export class UnexpectedOutcomeError extends IdemraftError {
  readonly kind = "unexpected" as const;
  override name = "UnexpectedOutcomeError";
  constructor(readonly outcome: string) {
    super(outcome);
  }
  override describe(): string {
    return `unexpected outcome ${this.outcome}`;
  }
}

/** Whether `e` is an error of this package whose call may or may not have taken effect. */
export function isIndeterminate(e: unknown): boolean {
  return e instanceof IdemraftError && e.indeterminate;
}
