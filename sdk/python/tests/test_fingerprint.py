"""Fingerprints: every shared vector, and the Rust SDK's own unit cases (ES6 numbers,
RFC 8785 appendix B, UTF-16 key order, escapes, raw hashing of non-JSON)."""

import hashlib
import json
import struct

import pytest

from idemraft.fingerprint import CanonicalError, canonical_json, es6_number, fingerprint, fingerprint_parts

from conftest import REPO

VECTORS = REPO / "client" / "tests" / "vectors" / "fingerprint.json"


def test_every_shared_vector_is_reproduced():
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    assert vectors, "no vectors read"
    failures = []
    for i, v in enumerate(vectors):
        body = v["body"]
        if body is not None:
            got = canonical_json(body.encode("utf-8")).decode("utf-8")
            if got != v["canonical_body"]:
                failures.append("vector %d (%s): canonical %r != %r" % (i, v["note"], got, v["canonical_body"]))
        else:
            assert v["canonical_body"] == ""
        digest = fingerprint(v["method"], v["path"], None if body is None else body.encode("utf-8")).hex()
        if digest != v["sha256"]:
            failures.append("vector %d (%s): sha256 %s != %s" % (i, v["note"], digest, v["sha256"]))
    assert not failures, "%d of %d vectors failed:\n%s" % (len(failures), len(vectors), "\n".join(failures))


def canon(text):
    return canonical_json(text.encode("utf-8")).decode("utf-8")


def test_keys_sorted_at_every_depth_arrays_keep_order():
    assert canon('{"b":1,"a":2,"c":{"z":[3,1,2],"y":{"k":true,"j":null}}}') == '{"a":2,"b":1,"c":{"y":{"j":null,"k":true},"z":[3,1,2]}}'
    assert canon('[{"b":1,"a":2},[{"d":0,"c":0}]]') == '[{"a":2,"b":1},[{"c":0,"d":0}]]'


def test_keys_sort_by_utf16_code_units():
    assert canon('{"\ufb01":1,"\U0001f600":2}') == '{"\U0001f600":2,"\ufb01":1}'
    src = ('{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh",'
           '"1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control",'
           '"\\u00f6":"Latin Small Letter O With Diaeresis"}')
    want = ('{"\\r":"Carriage Return","1":"One","\u0080":"Control",'
            '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
            '"\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}')
    assert canon(src) == want


def test_whitespace_goes():
    assert canon(' \t\r\n{ "a" : [ 1 , 2 ] ,\n"b":"x y" }\n') == '{"a":[1,2],"b":"x y"}'
    assert canon("[ ]") == "[]"
    assert canon("{ }") == "{}"


@pytest.mark.parametrize("text,want", [
    ("1.0", "1"), ("10e0", "10"), ("1E2", "100"), ("1e21", "1e+21"), ("1e20", "100000000000000000000"),
    ("123e18", "123000000000000000000"), ("1e-7", "1e-7"), ("1.5e-7", "1.5e-7"), ("0.000001", "0.000001"),
    ("2.5e-6", "0.0000025"), ("-0", "0"), ("-0.0", "0"), ("0.1", "0.1"),
    ("0.30000000000000004", "0.30000000000000004"), ("99.5", "99.5"), ("-12.5e3", "-12500"),
    ("9007199254740993", "9007199254740992"), ("18446744073709551615", "18446744073709552000"),
    ("12345678901234567890123", "1.2345678901234568e+22"), ("5e-324", "5e-324"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"), ("1e-400", "0"), ("-1e-400", "0"),
])
def test_numbers_take_the_es6_form(text, want):
    assert canon(text) == want


@pytest.mark.parametrize("bits,want", [
    (0x0000000000000000, "0"), (0x8000000000000000, "0"), (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"), (0x7fefffffffffffff, "1.7976931348623157e+308"),
    (0xffefffffffffffff, "-1.7976931348623157e+308"), (0x4340000000000000, "9007199254740992"),
    (0xc340000000000000, "-9007199254740992"), (0x4430000000000000, "295147905179352830000"),
    (0x44b52d02c7e14af5, "9.999999999999997e+22"), (0x44b52d02c7e14af6, "1e+23"),
    (0x44b52d02c7e14af7, "1.0000000000000001e+23"), (0x444b1ae4d6e2ef4e, "999999999999999700000"),
    (0x444b1ae4d6e2ef4f, "999999999999999900000"), (0x444b1ae4d6e2ef50, "1e+21"),
    (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"), (0x3eb0c6f7a0b5ed8d, "0.000001"),
    (0x41b3de4355555553, "333333333.3333332"), (0x41b3de4355555554, "333333333.33333325"),
    (0x41b3de4355555555, "333333333.3333333"), (0x41b3de4355555556, "333333333.3333334"),
    (0x41b3de4355555557, "333333333.33333343"), (0xbecbf647612f3696, "-0.0000033333333333333333"),
    (0x43143ff3c1cb0959, "1424953923781206.2"),
])
def test_number_serialization_matches_rfc_8785_appendix_b(bits, want):
    assert es6_number(struct.unpack(">d", bits.to_bytes(8, "big"))[0]) == want


def test_numbers_read_back_as_the_same_double(rng):
    for _ in range(5000):
        v = struct.unpack(">d", rng.getrandbits(64).to_bytes(8, "big"))[0]
        if v != v or v in (float("inf"), float("-inf")):
            continue
        text = es6_number(v)
        assert float(text) == v, (v, text)
        assert canon(text) == text


def test_strings_are_escaped_as_rfc_8785_says():
    assert canon(r'"\u0000\u0001\u001f"') == r'"\u0000\u0001\u001f"'
    assert canon(r'"\b\f\n\r\t\"\\\/"') == r'"\b\f\n\r\t\"\\/"'
    assert canon(r'"\u0008\u000C\u000a"') == r'"\b\f\n"'
    assert canon(r'"\u007f\u2028\u00e9\ud83d\ude00\u20AC"') == '"\x7f\u2028\u00e9\U0001f600\u20ac"'
    assert canon(r'{"a\nb":1}') == r'{"a\nb":1}'


@pytest.mark.parametrize("text,offset", [
    (b"", 0), (b"   ", 3), (b'{"a":1,}', 7), (b"[1,]", 3), (b"[1 2]", 3), (b'{"a" 1}', 5), (b"{1:2}", 1),
    (b"[1] [2]", 4), (b"01", 1), (b"1.", 2), (b"1e", 2), (b"-", 1), (b".5", 0), (b"+1", 0), (b"NaN", 0),
    (b"tru", 0), (b'"\\x"', 2), (b'"\\u12g4"', 5), (b"[1, 1e400]", 4), (b'{"a":1,"b":2}x', 13),
])
def test_not_json_is_an_error_with_its_offset(text, offset):
    with pytest.raises(CanonicalError) as e:
        canonical_json(text)
    assert e.value.offset == offset


def test_rfc_8785_exclusions_are_errors():
    for text in [b'"abc', b'"a\x01"', b'"\xff"', b"\xef\xbb\xbf{}", b'"\\ud800"', b'"\\ud800x"',
                 b'"\\ud800\\u0041"', b'"\\udc00"', b'{"\\ud83d":1}', b'{"a":1,"\\u0061":2}']:
        with pytest.raises(CanonicalError):
            canonical_json(text)
    with pytest.raises(CanonicalError) as e:
        canonical_json(b'{"a":1,"b":{"k":1,"j":2,"k":3}}')
    assert e.value.offset == 24
    assert canon('[{"a":1},{"a":2}]') == '[{"a":1},{"a":2}]'


def test_deep_nesting_does_not_overflow():
    depth = 100_000
    text = ('[{"a":' * depth + "}]" * depth).replace(":}", ":0}")
    assert len(canon(text)) == len(text)


def sha(b):
    return hashlib.sha256(b).digest()


def test_fingerprint_is_sha256_of_method_path_canonical_body():
    body = b'{ "currency": "usd", "amount": 100 }'
    want = sha(b'POST\n/v1/charges\n{"amount":100,"currency":"usd"}')
    assert fingerprint("post", "/v1/charges", body) == want
    assert fingerprint("POST", "/v1/charges", body.decode()) == want
    assert fingerprint("POST", "/v1/charge", body) != want
    assert fingerprint("PUT", "/v1/charges", body) != want
    assert len(fingerprint("PUT", "/", None)) == 32


def test_non_json_bodies_are_hashed_raw():
    for body in [b"amount=100&currency=usd", b'{"a":1,"a":2}', b"[1e999]", b"\xff\xfe", b"  "]:
        assert fingerprint("POST", "/upload", body) == sha(b"POST\n/upload\n" + body)


def test_absent_and_empty_bodies_coincide():
    want = sha(b"DELETE\n/v1/items/42\n")
    assert fingerprint("DELETE", "/v1/items/42") == want
    assert fingerprint("DELETE", "/v1/items/42", b"") == want
    assert fingerprint("DELETE", "/v1/items/42", b'""') != want


def test_fingerprint_parts_are_length_prefixed():
    assert fingerprint_parts([b"ab", b"c"]) != fingerprint_parts([b"a", b"bc"])
    assert fingerprint_parts([]) != fingerprint_parts([b""])
    assert fingerprint_parts(["ab", "c"]) == sha(b"\0\0\0\0\0\0\0\x02ab\0\0\0\0\0\0\0\x01c")
    assert fingerprint_parts([]) == sha(b"")
