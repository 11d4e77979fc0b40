// Request fingerprints: every shared vector of client/tests/vectors/fingerprint.json (computed
// by an independent RFC 8785 implementation), and the edge cases the Rust SDK pins, so that
// this SDK computes the same 32 bytes as every other for every request.

import { test } from "node:test";
import * as assert from "node:assert/strict";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";

import { canonicalJson, CanonicalJsonError, fingerprint, fingerprintParts } from "../../src/fingerprint";
import { repoRoot } from "../support/cluster";

const sha256 = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");
const canon = (s: string) => canonicalJson(s).toString("utf8");
const problemOf = (s: string | Buffer): string => {
  try {
    canonicalJson(s);
  } catch (e) {
    assert.ok(e instanceof CanonicalJsonError, String(e));
    return `${e.problem}@${e.offset}`;
  }
  assert.fail(`${JSON.stringify(String(s))} was accepted`);
};

test("every shared fingerprint vector is reproduced", () => {
  const file = JSON.parse(fs.readFileSync(path.join(repoRoot(), "client", "tests", "vectors", "fingerprint.json"), "utf8"));
  const vectors: Array<Record<string, string | null>> = file.vectors;
  assert.ok(Array.isArray(vectors) && vectors.length >= 15, "the vectors file has its vectors");
  const failures: string[] = [];
  vectors.forEach((v, i) => {
    const body = v.body;
    if (body !== null && body !== undefined) {
      let got: string;
      try {
        got = canonicalJson(Buffer.from(body, "utf8")).toString("utf8");
      } catch (e) {
        failures.push(`vector ${i} (${v.note}): not canonicalizable: ${(e as Error).message}`);
        return;
      }
      if (got !== v.canonical_body) failures.push(`vector ${i} (${v.note}): canonical\n  got  ${got}\n  want ${v.canonical_body}`);
    } else {
      assert.equal(v.canonical_body, "", `vector ${i}: an absent body has an empty canonical form`);
    }
    const digest = fingerprint(String(v.method), String(v.path), body === null ? null : Buffer.from(body as string, "utf8")).toHex();
    if (digest !== v.sha256) failures.push(`vector ${i} (${v.note}): sha256\n  got  ${digest}\n  want ${v.sha256}`);
  });
  assert.deepEqual(failures, [], `${failures.length} of ${vectors.length} vectors failed:\n${failures.join("\n")}`);
});

test("keys are sorted by UTF-16 code units at every depth; arrays keep their order", () => {
  assert.equal(canon('[{"b":1,"a":2},[{"d":0,"c":0}]]'), '[{"a":2,"b":1},[{"c":0,"d":0}]]');
  // U+FB01 sorts after U+1F600 in UTF-16 (0xD83D...) though before it in code points / UTF-8.
  assert.equal(canon('{"\ufb01":1,"\u{1f600}":2}'), '{"\u{1f600}":2,"\ufb01":1}');
  assert.equal(canon(' \t\r\n{ "a" : [ 1 , 2 ] ,\n"b":"x y" }\n'), '{"a":[1,2],"b":"x y"}');
  assert.equal(canon("[ ]"), "[]");
  assert.equal(canon("{ }"), "{}");
});

test("numbers take the ES6 form of the nearest double", () => {
  const cases: Array<[string, string]> = [
    ["1.0", "1"],
    ["10e0", "10"],
    ["1E2", "100"],
    ["1e21", "1e+21"],
    ["1e20", "100000000000000000000"],
    ["123e18", "123000000000000000000"],
    ["1e-7", "1e-7"],
    ["1.5e-7", "1.5e-7"],
    ["0.000001", "0.000001"],
    ["2.5e-6", "0.0000025"],
    ["-0", "0"],
    ["-0.0", "0"],
    ["0.1", "0.1"],
    ["0.30000000000000004", "0.30000000000000004"],
    ["99.5", "99.5"],
    ["-12.5e3", "-12500"],
    // 2^53 + 1 is not a double: it rounds (ties to even) to 2^53, as JavaScript does.
    ["9007199254740993", "9007199254740992"],
    ["18446744073709551615", "18446744073709552000"],
    ["12345678901234567890123", "1.2345678901234568e+22"],
    ["5e-324", "5e-324"],
    ["1.7976931348623157e308", "1.7976931348623157e+308"],
    ["1e-400", "0"],
    ["-1e-400", "0"],
  ];
  for (const [text, want] of cases) assert.equal(canon(text), want, text);
  // RFC 8785 appendix B, by bit pattern.
  const bits: Array<[string, string]> = [
    ["0000000000000000", "0"],
    ["8000000000000000", "0"],
    ["0000000000000001", "5e-324"],
    ["8000000000000001", "-5e-324"],
    ["7fefffffffffffff", "1.7976931348623157e+308"],
    ["ffefffffffffffff", "-1.7976931348623157e+308"],
    ["4340000000000000", "9007199254740992"],
    ["c340000000000000", "-9007199254740992"],
    ["4430000000000000", "295147905179352830000"],
    ["44b52d02c7e14af5", "9.999999999999997e+22"],
    ["44b52d02c7e14af6", "1e+23"],
    ["44b52d02c7e14af7", "1.0000000000000001e+23"],
    ["444b1ae4d6e2ef4e", "999999999999999700000"],
    ["444b1ae4d6e2ef4f", "999999999999999900000"],
    ["444b1ae4d6e2ef50", "1e+21"],
    ["3eb0c6f7a0b5ed8c", "9.999999999999997e-7"],
    ["3eb0c6f7a0b5ed8d", "0.000001"],
    ["41b3de4355555553", "333333333.3333332"],
    ["41b3de4355555554", "333333333.33333325"],
    ["41b3de4355555555", "333333333.3333333"],
    ["41b3de4355555556", "333333333.3333334"],
    ["41b3de4355555557", "333333333.33333343"],
    ["becbf647612f3696", "-0.0000033333333333333333"],
    ["43143ff3c1cb0959", "1424953923781206.2"],
  ];
  for (const [hex, want] of bits) {
    const value = Buffer.from(hex, "hex").readDoubleBE(0);
    // Printed with 17 significant digits, the double reads back exactly; its canonical form is `want`.
    assert.equal(canon(value.toPrecision(17)), want, hex);
  }
});

test("strings carry only the escapes RFC 8785 prescribes", () => {
  assert.equal(canon('"\\u0000\\u0001\\u001f"'), '"\\u0000\\u0001\\u001f"');
  assert.equal(canon('"\\b\\f\\n\\r\\t\\"\\\\\\/"'), '"\\b\\f\\n\\r\\t\\"\\\\/"');
  assert.equal(canon('"\\u0008\\u000C\\u000a"'), '"\\b\\f\\n"');
  assert.equal(canon('"\\u007f\\u2028\\u00e9\\ud83d\\ude00\\u20AC"'), '"\u007f\u2028\u00e9\u{1f600}\u20ac"');
  assert.equal(canon('"\u007f\u2028\u00e9\u{1f600}"'), '"\u007f\u2028\u00e9\u{1f600}"');
  assert.equal(canon('{"a\\nb":1}'), '{"a\\nb":1}');
});

test("what is not canonicalizable JSON is refused, naming the problem and where", () => {
  assert.equal(problemOf(""), "unexpected_end@0");
  assert.equal(problemOf("   "), "unexpected_end@3");
  assert.equal(problemOf('{"a":1,}'), "unexpected@7");
  assert.equal(problemOf("[1,]"), "unexpected@3");
  assert.equal(problemOf("[1 2]"), "unexpected@3");
  assert.equal(problemOf('{"a" 1}'), "unexpected@5");
  assert.equal(problemOf("{1:2}"), "unexpected@1");
  assert.equal(problemOf("[1] [2]"), "unexpected@4");
  for (const [text, at] of [["01", 1], ["1.", 2], ["1e", 2], ["-", 1], [".5", 0], ["+1", 0], ["NaN", 0], ["tru", 0]] as const) {
    assert.match(problemOf(text), new RegExp(`@${at}$`), text);
  }
  assert.equal(problemOf('"abc'), "unexpected_end@4");
  assert.equal(problemOf('"a\u0001"'), "control_character@2");
  assert.equal(problemOf('"\\x"'), "unexpected@2");
  assert.equal(problemOf('"\\u12g4"'), "unexpected@5");
  assert.equal(problemOf(Buffer.from([0x22, 0xff, 0x22])), "invalid_utf8@0");
  assert.equal(problemOf("[1, 1e400]"), "number_out_of_range@4");
  assert.equal(problemOf("-1e400"), "number_out_of_range@0");
  // A byte order mark is not JSON whitespace.
  assert.equal(problemOf(Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d])), "unexpected@0");
});

test("lone surrogates are refused", () => {
  for (const text of ['"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', '"\\ud800x"', '["\\udfff", 1]']) {
    assert.match(problemOf(text), /^lone_surrogate@/, text);
  }
});

test("duplicate keys are refused at the second occurrence", () => {
  assert.equal(problemOf('{"k":1,"other":2,"k":3}'), "duplicate_key@17");
  assert.match(problemOf('{"a":1,"\\u0061":2}'), /^duplicate_key@/);
  assert.equal(canon('[{"a":1},{"a":2}]'), '[{"a":1},{"a":2}]');
});

test("deep nesting does not overflow the stack", () => {
  const depth = 200_000;
  const text = ('[{"a":'.repeat(depth) + "}]".repeat(depth)).replace(":}", ":0}");
  assert.equal(canonicalJson(text).length, text.length);
});

test("the fingerprint is SHA-256 of method, path and canonical body", () => {
  const body = '{ "currency": "usd", "amount": 100 }';
  const want = sha256('POST\n/v1/charges\n{"amount":100,"currency":"usd"}');
  assert.equal(fingerprint("post", "/v1/charges", body).toHex(), want);
  assert.equal(fingerprint("POST", "/v1/charges", Buffer.from(body)).toHex(), want);
  assert.notEqual(fingerprint("POST", "/v1/charge", body).toHex(), want);
  assert.notEqual(fingerprint("PUT", "/v1/charges", body).toHex(), want);
  // Only ASCII letters are upper-cased.
  assert.equal(fingerprint("pöst", "/", null).toHex(), sha256("PöST\n/\n"));
});

test("a body that is not JSON is hashed raw", () => {
  const bodies: Buffer[] = [
    Buffer.from("amount=100&currency=usd"),
    Buffer.from([0x00, 0xff, 0xfe, 0x01]),
    Buffer.from('{"a":1,"a":2}'),
    Buffer.from("[1e400]"),
    Buffer.from('"\\ud800"'),
    Buffer.from("{} trailing"),
  ];
  for (const b of bodies) {
    assert.equal(fingerprint("POST", "/upload", b).toHex(), sha256(Buffer.concat([Buffer.from("POST\n/upload\n"), b])), b.toString("hex"));
  }
});

test("an absent body and an empty body coincide", () => {
  const want = sha256("DELETE\n/v1/items/42\n");
  assert.equal(fingerprint("DELETE", "/v1/items/42").toHex(), want);
  assert.equal(fingerprint("DELETE", "/v1/items/42", null).toHex(), want);
  assert.equal(fingerprint("DELETE", "/v1/items/42", "").toHex(), want);
  assert.notEqual(fingerprint("DELETE", "/v1/items/42", '""').toHex(), want);
});

test("fingerprint parts are length-prefixed", () => {
  const of = (parts: string[]) => fingerprintParts(parts).toHex();
  assert.notEqual(of(["ab", "c"]), of(["a", "bc"]));
  assert.notEqual(of(["abc"]), of(["ab", "c"]));
  assert.notEqual(of([]), of([""]));
  assert.notEqual(of([""]), of(["", ""]));
  assert.equal(of(["ab", "c"]), sha256(Buffer.from("\0\0\0\0\0\0\0\x02ab\0\0\0\0\0\0\0\x01c", "latin1")));
  assert.equal(of([]), sha256(""));
});
