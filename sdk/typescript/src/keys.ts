// The rules for idempotency keys and scopes, as the server enforces them, checked on this side
// so that a bad key shows up where it is made (or as a 400 from the middleware) rather than as
// a refused call; and a generator of keys that keep to the rule.

import { randomUUID } from "node:crypto";

/** Shortest key the server accepts, in bytes. */
export const KEY_MIN_LEN = 16;
/** Longest key the server accepts, in bytes. */
export const KEY_MAX_LEN = 255;
/** Longest scope the server accepts, in bytes. */
export const SCOPE_MAX_LEN = 128;

/** Why a key breaks the rule. */
export type KeyProblem =
  | { problem: "bad_character"; offset: number; found: string }
  | { problem: "length"; len: number };

function isKeyChar(c: number): boolean {
  return (
    (c >= 0x41 && c <= 0x5a) || // A-Z
    (c >= 0x61 && c <= 0x7a) || // a-z
    (c >= 0x30 && c <= 0x39) || // 0-9
    c === 0x5f || // _
    c === 0x2e || // .
    c === 0x3a || // :
    c === 0x2d // -
  );
}

/**
 * Checks a key against the server's rule, 16 to 255 bytes of `A-Z a-z 0-9 _ . : -`: the first
 * character outside the rule (with its byte offset), else a wrong length; null when it is valid.
 */
export function checkKey(key: string): KeyProblem | null {
  let offset = 0;
  for (const ch of key) {
    const c = ch.codePointAt(0) ?? 0;
    if (!isKeyChar(c)) return { problem: "bad_character", offset, found: ch };
    offset += Buffer.byteLength(ch, "utf8");
  }
  const len = Buffer.byteLength(key, "utf8");
  if (len < KEY_MIN_LEN || len > KEY_MAX_LEN) return { problem: "length", len };
  return null;
}

/** Whether a scope keeps to the server's rule: 1 to 128 bytes of `A-Z a-z 0-9 . _ : / -`. */
export function isValidScope(scope: string): boolean {
  return scope.length >= 1 && scope.length <= SCOPE_MAX_LEN && /^[A-Za-z0-9._:/-]+$/.test(scope);
}

/**
 * A fresh random key: `prefix` followed by a version 4 UUID (e.g. `pay_3f0c9a4e-...`). Make one
 * per logical operation and send the same key on every retry of it.
 */
export function randomKey(prefix = ""): string {
  const key = `${prefix}${randomUUID()}`;
  const problem = checkKey(key);
  if (problem !== null) {
    throw new RangeError(`the prefix ${JSON.stringify(prefix)} makes an invalid key: ${JSON.stringify(problem)}`);
  }
  return key;
}
