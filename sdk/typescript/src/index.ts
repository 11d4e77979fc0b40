// The public surface of @idemraft/client: the client, its typed values and errors,
// `execute`, request fingerprints, key rules and the Express middleware.

export {
  Client,
  newOwner,
  normaliseEndpoint,
  tlsFromFiles,
  LEADER_ADDR_HEADER,
  SERVED_BY_HEADER,
  type CallOptions,
  type ClaimOptions,
  type ClientOptions,
  type ListOptions,
  type TakeoverOptions,
  type TlsOptions,
} from "./client";
export * from "./errors";
export { runGranted, WorkFailure, type ExecuteOptions, type Executed, type GrantedOptions, type Work, type WorkGrant } from "./execute";
export { canonicalJson, CanonicalJsonError, Fingerprint, fingerprint, fingerprintParts, type BytesLike, type CanonicalJsonProblem } from "./fingerprint";
export {
  captureRawBody,
  idempotency,
  parseKey,
  Problem,
  retryAfterSecs,
  stores,
  IDEMPOTENCY_KEY,
  IDEMPOTENT_REPLAYED,
  PROBLEM_JSON,
  PROBLEM_TYPE_PREFIX,
  type IdemraftRequestInfo,
  type IdempotencyMiddleware,
  type IdempotencyOptions,
  type IdempotentRequest,
  type Logger,
  type StorePolicy,
} from "./http";
export { checkKey, isValidScope, randomKey, KEY_MAX_LEN, KEY_MIN_LEN, type KeyProblem } from "./keys";
export * from "./types";
