// Request fingerprints: the digest that binds an idempotency key to one request, so that a
// retry carrying a different payload is refused as MISMATCH instead of being answered with
// the response of another request.
//
// Every Idemraft SDK must compute the same 32 bytes for the same request, so this module
// reproduces the Rust SDK's definition exactly:
//   SHA-256(UPPER_ASCII(method) "\n" path "\n" canonical(body))
// with `canonical` the JSON Canonicalization Scheme of RFC 8785 when the body is JSON, and the
// raw bytes otherwise. "Not JSON" means: not valid UTF-8, not a single RFC 8259 value, or JSON
// that RFC 8785 excludes (a duplicate key, a number beyond the range of a double, a lone
// surrogate). `JSON.parse` is not used because it silently keeps the last of duplicate keys,
// accepts lone surrogates and turns 1e400 into Infinity: each of those would make this SDK
// hash a canonical form where the others hash the raw bytes.
//
// The reader keeps explicit stacks rather than recursing, so a deeply nested body cannot
// overflow the stack and no nesting limit makes a valid body "not JSON" here while it is JSON
// to another implementation.

import { createHash } from "node:crypto";

/** A SHA-256 request fingerprint, as stored in a record and compared by Claim. */
export class Fingerprint {
  /** The 32 digest bytes, as the wire protocol carries them. */
  readonly bytes: Buffer;

  constructor(bytes: Uint8Array) {
    if (bytes.length !== 32) {
      throw new RangeError(`a fingerprint is 32 bytes, not ${bytes.length}`);
    }
    this.bytes = Buffer.from(bytes);
  }

  /** Lowercase hex, 64 characters: the form the test vectors and logs use. */
  toHex(): string {
    return this.bytes.toString("hex");
  }

  toString(): string {
    return this.toHex();
  }

  equals(other: Fingerprint): boolean {
    return this.bytes.equals(other.bytes);
  }
}

/** Bytes given as a string mean its UTF-8 encoding. */
export type BytesLike = Uint8Array | string;

function toBytes(b: BytesLike): Buffer {
  return typeof b === "string" ? Buffer.from(b, "utf8") : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}

/**
 * The fingerprint of an HTTP request.
 *
 * `method` is upper-cased in ASCII only: Unicode case mapping would make the digest depend on
 * each implementation's Unicode tables. `path` is hashed exactly as given (query included); a
 * string path is hashed as its UTF-8 bytes. A body that {@link canonicalJson} accepts
 * contributes its canonical form; any other body contributes its raw bytes; an absent body and
 * an empty one contribute nothing (and so coincide).
 */
export function fingerprint(method: string, path: BytesLike, body?: BytesLike | null): Fingerprint {
  const hash = createHash("sha256");
  hash.update(method.replace(/[a-z]+/g, (s) => s.toUpperCase()), "utf8");
  hash.update("\n");
  hash.update(toBytes(path));
  hash.update("\n");
  if (body !== undefined && body !== null) {
    const raw = toBytes(body);
    let canonical: Buffer | undefined;
    try {
      canonical = canonicalJson(raw);
    } catch (e) {
      if (!(e instanceof CanonicalJsonError)) throw e;
    }
    hash.update(canonical ?? raw);
  }
  return new Fingerprint(hash.digest());
}

/**
 * A fingerprint of a list of byte strings, for work that is not an HTTP request (a queue
 * message, a job's arguments). Each part is hashed as its length (u64 big-endian) and its
 * bytes, so the list reads back unambiguously: ["ab","c"], ["a","bc"] and ["abc"] differ.
 */
export function fingerprintParts(parts: readonly BytesLike[]): Fingerprint {
  const hash = createHash("sha256");
  for (const part of parts) {
    const bytes = toBytes(part);
    const len = Buffer.alloc(8);
    len.writeBigUInt64BE(BigInt(bytes.length));
    hash.update(len);
    hash.update(bytes);
  }
  return new Fingerprint(hash.digest());
}

/** What made a body not canonicalizable JSON. */
export type CanonicalJsonProblem =
  | "invalid_utf8"
  | "unexpected_end"
  | "unexpected"
  | "control_character"
  | "lone_surrogate"
  | "number_out_of_range"
  | "duplicate_key";

/** Why a body is not canonicalizable JSON, and where (an offset in UTF-16 code units). */
export class CanonicalJsonError extends Error {
  constructor(
    readonly problem: CanonicalJsonProblem,
    readonly offset: number,
    detail: string,
  ) {
    super(`not canonicalizable JSON at offset ${offset}: ${detail}`);
    this.name = "CanonicalJsonError";
  }
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * The RFC 8785 canonical form of a JSON text, as UTF-8 bytes: members sorted by the UTF-16
 * code units of their keys at every depth, array order kept, no insignificant whitespace,
 * numbers in ECMAScript `Number.prototype.toString` form, strings with only the escapes RFC
 * 8785 prescribes. Throws {@link CanonicalJsonError} on anything else.
 */
export function canonicalJson(text: BytesLike): Buffer {
  let source: string;
  if (typeof text === "string") {
    source = text;
  } else {
    try {
      // ignoreBOM keeps a leading U+FEFF in the text, where the grammar refuses it, as the
      // Rust reader does: a BOM is not JSON whitespace.
      source = strictUtf8.decode(text);
    } catch {
      throw new CanonicalJsonError("invalid_utf8", 0, "the bytes are not valid UTF-8");
    }
  }
  return Buffer.from(new Parser(source).document(), "utf8");
}

/** A parsed value: scalars already in canonical text; containers refer to child indices. */
type Node =
  | { t: "leaf"; text: string }
  | { t: "array"; items: number[] }
  | { t: "object"; members: Member[] };

interface Member {
  key: string;
  /** Offset of the key in the input, to point at a duplicate. */
  offset: number;
  value: number;
}

type Frame =
  | { t: "array"; items: number[] }
  | { t: "object"; members: Member[]; key: string; keyOffset: number };

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);

const SIMPLE_ESCAPES = new Map<number, string>([
  [0x22, '"'],
  [0x5c, "\\"],
  [0x2f, "/"],
  [0x62, "\b"],
  [0x66, "\f"],
  [0x6e, "\n"],
  [0x72, "\r"],
  [0x74, "\t"],
]);

class Parser {
  private pos = 0;
  private readonly nodes: Node[] = [];

  constructor(private readonly s: string) {}

  document(): string {
    const open: Frame[] = [];
    let root: number;
    value: for (;;) {
      this.ws();
      let done: number;
      const c = this.s.charCodeAt(this.pos);
      if (c === 0x5b /* [ */) {
        this.pos++;
        this.ws();
        if (this.eat(0x5d)) {
          done = this.push({ t: "array", items: [] });
        } else {
          open.push({ t: "array", items: [] });
          continue value;
        }
      } else if (c === 0x7b /* { */) {
        this.pos++;
        this.ws();
        if (this.eat(0x7d)) {
          done = this.push({ t: "object", members: [] });
        } else {
          const [key, keyOffset] = this.memberKey();
          open.push({ t: "object", members: [], key, keyOffset });
          continue value;
        }
      } else {
        done = this.scalar();
      }
      // `done` is a complete value: hand it to the innermost open container, and close every
      // container that ends right after it.
      for (;;) {
        const frame = open.pop();
        if (frame === undefined) {
          root = done;
          break value;
        }
        this.ws();
        if (frame.t === "array") {
          frame.items.push(done);
          if (this.eat(0x2c)) {
            open.push(frame);
            continue value;
          }
          this.expect(0x5d, "',' or ']'");
          done = this.push({ t: "array", items: frame.items });
        } else {
          frame.members.push({ key: frame.key, offset: frame.keyOffset, value: done });
          if (this.eat(0x2c)) {
            this.ws();
            const [key, keyOffset] = this.memberKey();
            open.push({ t: "object", members: frame.members, key, keyOffset });
            continue value;
          }
          this.expect(0x7d, "',' or '}'");
          done = this.closeObject(frame.members);
        }
      }
    }
    this.ws();
    if (this.pos < this.s.length) {
      throw this.unexpected("the end of the input after the JSON value");
    }
    return this.emit(root);
  }

  private ws(): void {
    while (WS.has(this.s.charCodeAt(this.pos))) this.pos++;
  }

  private eat(code: number): boolean {
    if (this.s.charCodeAt(this.pos) === code) {
      this.pos++;
      return true;
    }
    return false;
  }

  private expect(code: number, expected: string): void {
    if (!this.eat(code)) throw this.unexpected(expected);
  }

  private unexpected(expected: string): CanonicalJsonError {
    if (this.pos >= this.s.length) {
      return new CanonicalJsonError("unexpected_end", this.pos, `expected ${expected}, found the end of the input`);
    }
    const found = String.fromCodePoint(this.s.codePointAt(this.pos) ?? 0);
    return new CanonicalJsonError("unexpected", this.pos, `expected ${expected}, found ${JSON.stringify(found)}`);
  }

  private push(node: Node): number {
    this.nodes.push(node);
    return this.nodes.length - 1;
  }

  private memberKey(): [string, number] {
    const offset = this.pos;
    if (this.s.charCodeAt(this.pos) !== 0x22) throw this.unexpected("a string key");
    const key = this.string();
    this.ws();
    this.expect(0x3a, "':' after the key");
    return [key, offset];
  }

  private closeObject(members: Member[]): number {
    // JavaScript compares strings by UTF-16 code units, which is RFC 8785's order. The sort
    // is stable, so of two equal keys the later one (the one to report) comes second.
    members.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    for (let i = 1; i < members.length; i++) {
      if (members[i - 1].key === members[i].key) {
        throw new CanonicalJsonError(
          "duplicate_key",
          members[i].offset,
          `object key ${JSON.stringify(members[i].key)} appears twice; RFC 8785 forbids duplicate keys`,
        );
      }
    }
    return this.push({ t: "object", members });
  }

  private scalar(): number {
    const c = this.s.charCodeAt(this.pos);
    let text: string;
    if (c === 0x22) {
      text = JSON.stringify(this.string());
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      text = this.number();
    } else if (c === 0x74) {
      text = this.literal("true");
    } else if (c === 0x66) {
      text = this.literal("false");
    } else if (c === 0x6e) {
      text = this.literal("null");
    } else {
      throw this.unexpected("a JSON value");
    }
    return this.push({ t: "leaf", text });
  }

  private literal(word: string): string {
    if (this.s.startsWith(word, this.pos)) {
      this.pos += word.length;
      return word;
    }
    throw this.unexpected(word);
  }

  private digit(): boolean {
    const c = this.s.charCodeAt(this.pos);
    return c >= 0x30 && c <= 0x39;
  }

  private digits(): void {
    while (this.digit()) this.pos++;
  }

  private oneOrMoreDigits(): void {
    if (!this.digit()) throw this.unexpected("a digit");
    this.digits();
  }

  /** Reads a number per the RFC 8259 grammar and renders the nearest double. */
  private number(): string {
    const start = this.pos;
    this.eat(0x2d);
    if (this.eat(0x30)) {
      // A leading zero stands alone.
    } else if (this.digit()) {
      this.digits();
    } else {
      throw this.unexpected("a digit");
    }
    if (this.eat(0x2e)) this.oneOrMoreDigits();
    const e = this.s.charCodeAt(this.pos);
    if (e === 0x65 || e === 0x45) {
      this.pos++;
      const sign = this.s.charCodeAt(this.pos);
      if (sign === 0x2b || sign === 0x2d) this.pos++;
      this.oneOrMoreDigits();
    }
    // Number() on a decimal literal is correctly rounded (ties to even), which is what "an
    // integer beyond 2^53 is rounded as JavaScript would" means; String() of a double is the
    // ECMAScript form RFC 8785 prescribes, and prints -0 as "0".
    const value = Number(this.s.slice(start, this.pos));
    if (!Number.isFinite(value)) {
      throw new CanonicalJsonError(
        "number_out_of_range",
        start,
        "number is beyond the range of an IEEE-754 double; RFC 8785 numbers must be finite doubles",
      );
    }
    return String(value);
  }

  /** Reads a string whose opening quote is at the current position; returns its value. */
  private string(): string {
    this.pos++;
    const s = this.s;
    let value = "";
    for (;;) {
      const run = this.pos;
      let c = s.charCodeAt(this.pos);
      while (this.pos < s.length && c !== 0x22 && c !== 0x5c && c >= 0x20) {
        c = s.charCodeAt(++this.pos);
      }
      value += s.slice(run, this.pos);
      if (this.pos >= s.length) throw this.unexpected("'\"' closing the string");
      if (c === 0x22) {
        this.pos++;
        return value;
      }
      if (c === 0x5c) {
        this.pos++;
        value += this.escape();
        continue;
      }
      const hex = c.toString(16).padStart(4, "0");
      throw new CanonicalJsonError(
        "control_character",
        this.pos,
        `control character U+${hex.toUpperCase()} written raw in a string; escape it as \\u${hex}`,
      );
    }
  }

  /** Reads the escape after a backslash. */
  private escape(): string {
    const c = this.s.charCodeAt(this.pos);
    const simple = SIMPLE_ESCAPES.get(c);
    if (simple !== undefined) {
      this.pos++;
      return simple;
    }
    if (c !== 0x75) throw this.unexpected('an escape: \\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX');
    const at = this.pos - 1;
    this.pos++;
    const unit = this.hex4();
    const lone = (u: number) =>
      new CanonicalJsonError(
        "lone_surrogate",
        at,
        `\\u${u.toString(16).padStart(4, "0")} is half of a UTF-16 surrogate pair; RFC 8785 requires I-JSON, which forbids lone surrogates`,
      );
    if (unit >= 0xdc00 && unit <= 0xdfff) throw lone(unit);
    if (unit >= 0xd800 && unit <= 0xdbff) {
      if (!this.s.startsWith("\\u", this.pos)) throw lone(unit);
      this.pos += 2;
      const low = this.hex4();
      if (low < 0xdc00 || low > 0xdfff) throw lone(unit);
      return String.fromCharCode(unit, low);
    }
    return String.fromCharCode(unit);
  }

  private hex4(): number {
    let unit = 0;
    for (let i = 0; i < 4; i++) {
      const c = this.s.charCodeAt(this.pos);
      let d: number;
      if (c >= 0x30 && c <= 0x39) d = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) d = c - 0x61 + 10;
      else if (c >= 0x41 && c <= 0x46) d = c - 0x41 + 10;
      else throw this.unexpected("a hex digit of a \\u escape");
      unit = (unit << 4) | d;
      this.pos++;
    }
    return unit;
  }

  /** Writes the canonical text of `root`, walking the tree with an explicit stack. */
  private emit(root: number): string {
    const out: string[] = [];
    // Each open container and the index of its next child.
    const open: Array<[number, number]> = [];
    const enter = (n: number) => {
      const node = this.nodes[n];
      if (node.t === "leaf") {
        out.push(node.text);
      } else {
        out.push(node.t === "object" ? "{" : "[");
        open.push([n, 0]);
      }
    };
    enter(root);
    while (open.length > 0) {
      const top = open[open.length - 1];
      const node = this.nodes[top[0]];
      const next = top[1];
      if (node.t === "array") {
        if (next >= node.items.length) {
          out.push("]");
          open.pop();
          continue;
        }
        top[1]++;
        if (next > 0) out.push(",");
        enter(node.items[next]);
      } else if (node.t === "object") {
        if (next >= node.members.length) {
          out.push("}");
          open.pop();
          continue;
        }
        top[1]++;
        if (next > 0) out.push(",");
        const m = node.members[next];
        out.push(JSON.stringify(m.key), ":");
        enter(m.value);
      } else {
        open.pop();
      }
    }
    return out.join("");
  }
}
