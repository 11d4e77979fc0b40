"""Request fingerprints (contract §6): the digest that binds an idempotency key to one
request, identical to the Rust SDK's ``fingerprint`` byte for byte.

``SHA-256(UPPER_ASCII(method) "\\n" path "\\n" canonical(body))``, where ``canonical`` is the
JSON Canonicalization Scheme of RFC 8785: object members sorted by the UTF-16 code units of
their keys at every depth, no insignificant whitespace, numbers in ECMAScript
``Number.prototype.toString`` form of the nearest double, strings with only the escapes
RFC 8785 prescribes. A body that is not such JSON (not UTF-8, not JSON, a duplicate key, a
number beyond a double's range, a lone surrogate) is hashed raw. An absent body and an empty
body both contribute nothing.

The JSON reader is hand-written rather than the ``json`` module's because RFC 8785 needs
duplicate keys and lone surrogates reported (``json`` accepts both), and because ``json``
recurses: a deeply nested body would be "not JSON" here while it is JSON to the other SDKs.
This reader keeps explicit stacks.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import List, Optional, Tuple, Union

__all__ = ["Fingerprint", "fingerprint", "fingerprint_parts", "canonical_json", "CanonicalError"]


class Fingerprint(bytes):
    """A SHA-256 request fingerprint: 32 bytes, as Claim carries it. ``hex()`` gives the
    lowercase form the test vectors and logs use."""

    def __repr__(self) -> str:
        return "Fingerprint(%s)" % self.hex()


class CanonicalError(ValueError):
    """Why a body is not canonicalizable JSON, and at which byte offset."""

    def __init__(self, offset: int, problem: str):
        super().__init__("not canonicalizable JSON at byte %d: %s" % (offset, problem))
        self.offset = offset
        self.problem = problem


BytesLike = Union[bytes, bytearray, memoryview, str]


def fingerprint(method: str, path: str, body: Optional[BytesLike] = None) -> Fingerprint:
    """The fingerprint of an HTTP request. ``path`` is hashed exactly as given (query string
    included); ``method`` is upper-cased in ASCII only. A ``str`` body is taken as UTF-8."""
    h = hashlib.sha256()
    h.update(_ascii_upper(method).encode("utf-8"))
    h.update(b"\n")
    h.update(path.encode("utf-8"))
    h.update(b"\n")
    if body is not None:
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        try:
            h.update(canonical_json(raw))
        except CanonicalError:
            h.update(raw)
    return Fingerprint(h.digest())


def fingerprint_parts(parts) -> Fingerprint:
    """A fingerprint of a list of byte strings (a queue message, a job's arguments): each
    part is hashed as its length (u64, big-endian) then its bytes, so the list reads back
    unambiguously."""
    h = hashlib.sha256()
    for p in parts:
        p = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return Fingerprint(h.digest())


def _ascii_upper(s: str) -> str:
    # str.upper() would apply Unicode case mapping (e.g. 'ß' -> 'SS'); HTTP methods are ASCII.
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


# --- reader -----------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# A run of string characters that need no attention: not a quote, backslash or control.
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Reader:
    __slots__ = ("text", "pos", "to_byte")

    def __init__(self, text: str, raw: bytes):
        self.text = text
        self.pos = 0
        self.to_byte = None if len(text) == len(raw) else raw

    def offset(self, pos: Optional[int] = None) -> int:
        # Offsets are of the UTF-8 input, as the Rust SDK reports them.
        pos = self.pos if pos is None else pos
        return pos if self.to_byte is None else len(self.text[:pos].encode("utf-8"))

    def fail(self, problem: str, pos: Optional[int] = None) -> CanonicalError:
        return CanonicalError(self.offset(pos), problem)

    def unexpected(self, expected: str) -> CanonicalError:
        if self.pos >= len(self.text):
            return self.fail("expected %s, found the end of the input" % expected)
        return self.fail("expected %s, found %r" % (expected, self.text[self.pos]))

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def eat(self, c: str) -> bool:
        if self.pos < len(self.text) and self.text[self.pos] == c:
            self.pos += 1
            return True
        return False

    def string(self) -> str:
        """Reads a string whose opening quote is at the current position."""
        text = self.text
        self.pos += 1
        out: List[str] = []
        while True:
            m = _PLAIN.match(text, self.pos)
            out.append(m.group())
            self.pos = m.end()
            if self.pos >= len(text):
                raise self.unexpected("'\"' closing the string")
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\":
                self.pos += 1
                out.append(self.escape())
            else:
                raise self.fail("control character U+%04X written raw in a string" % ord(c))

    def hex4(self) -> int:
        s = self.text[self.pos : self.pos + 4]
        for i, ch in enumerate(s + " " * (4 - len(s))):
            if ch not in "0123456789abcdefABCDEF":
                self.pos += i
                raise self.unexpected("a hex digit of a \\u escape")
        self.pos += 4
        return int(s, 16)

    def escape(self) -> str:
        c = self.peek()
        if c in _ESCAPES and c:
            self.pos += 1
            return _ESCAPES[c]
        if c != "u":
            raise self.unexpected("an escape: \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX")
        at = self.pos - 1
        self.pos += 1
        unit = self.hex4()
        if 0xD800 <= unit <= 0xDBFF:
            if not self.text.startswith("\\u", self.pos):
                raise self.fail("lone surrogate \\u%04x" % unit, at)
            self.pos += 2
            low = self.hex4()
            if not 0xDC00 <= low <= 0xDFFF:
                raise self.fail("lone surrogate \\u%04x" % unit, at)
            return chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
        if 0xDC00 <= unit <= 0xDFFF:
            raise self.fail("lone surrogate \\u%04x" % unit, at)
        return chr(unit)

    def number(self) -> str:
        m = _NUMBER.match(self.text, self.pos)
        if m is None:
            # Point at what broke the grammar, as the Rust reader does.
            self.eat("-")
            raise self.unexpected("a digit")
        end = m.end()
        # The regex stops early at "1." or "1e": the grammar needs a digit there.
        if end < len(self.text) and self.text[end] in ".eE":
            tail = self.text[end:]
            bad = end + 1 + (1 if tail[:1] in ("e", "E") and tail[1:2] in ("+", "-") else 0)
            self.pos = bad
            raise self.unexpected("a digit")
        start = self.pos
        self.pos = end
        # float() is correctly rounded for any length of input, which is what "an integer
        # beyond 2^53 is rounded exactly as JavaScript would" needs.
        value = float(self.text[start:end])
        if math.isinf(value):
            raise self.fail("number is beyond the range of an IEEE-754 double", start)
        return es6_number(value)

    def literal(self, word: str) -> str:
        if self.text.startswith(word, self.pos):
            self.pos += len(word)
            return word
        raise self.unexpected(word)


def _key_order(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as the code units do.
    return key.encode("utf-16-be", "surrogatepass")


def canonical_json(data: BytesLike) -> bytes:
    """The RFC 8785 canonical form of a JSON text; ``CanonicalError`` if it is not a single
    JSON value (surrounding whitespace allowed) or is JSON that RFC 8785 excludes."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CanonicalError(e.start, "the bytes are not valid UTF-8") from None
    r = _Reader(text, raw)
    # Each open container: ("a", [items]) or ("o", [(key, value)], key_of_value_being_read, key_pos).
    stack: List[list] = []
    while True:
        r.ws()
        c = r.peek()
        if c == "[":
            r.pos += 1
            r.ws()
            if r.eat("]"):
                done = ("[", [])
            else:
                stack.append(["a", []])
                continue
        elif c == "{":
            r.pos += 1
            r.ws()
            if r.eat("}"):
                done = ("{", [])
            else:
                stack.append(["o", [], *_member_key(r)])
                continue
        elif c == '"':
            done = _write_string(r.string())
        elif c == "-" or "0" <= c <= "9" and c:
            done = r.number()
        elif c == "t":
            done = r.literal("true")
        elif c == "f":
            done = r.literal("false")
        elif c == "n":
            done = r.literal("null")
        else:
            raise r.unexpected("a JSON value")
        # `done` is a complete value: give it to the innermost container and close every
        # container that ends right after it.
        while True:
            if not stack:
                r.ws()
                if r.pos < len(text):
                    raise r.unexpected("the end of the input after the JSON value")
                return _emit(done).encode("utf-8")
            frame = stack[-1]
            r.ws()
            if frame[0] == "a":
                frame[1].append(done)
                if r.eat(","):
                    break
                if not r.eat("]"):
                    raise r.unexpected("',' or ']'")
                stack.pop()
                done = ("[", frame[1])
            else:
                frame[1].append((frame[2], frame[3], done))
                if r.eat(","):
                    r.ws()
                    frame[2], frame[3] = _member_key(r)
                    break
                if not r.eat("}"):
                    raise r.unexpected("',' or '}'")
                stack.pop()
                done = _close_object(r, frame[1])


def _member_key(r: _Reader) -> Tuple[str, int]:
    at = r.pos
    if r.peek() != '"':
        raise r.unexpected("a string key")
    key = r.string()
    r.ws()
    if not r.eat(":"):
        raise r.unexpected("':' after the key")
    return key, at


def _close_object(r: _Reader, members) -> str:
    # Stable, so equal keys stay in input order and the second of a pair is the later one.
    members.sort(key=lambda m: _key_order(m[0]))
    for a, b in zip(members, members[1:]):
        if a[0] == b[0]:
            raise r.fail("object key %r appears twice; RFC 8785 forbids duplicate keys" % b[0], b[1])
    return ("{", [(_write_string(k) + ":", v) for k, _, v in members])


def _emit(root) -> str:
    """Writes the canonical text of a parsed value. Containers are ("[", items) or
    ("{", [(key_prefix, value)]), scalars are already canonical text. Built as a tree and
    written with an explicit stack: joining strings level by level would copy a deeply
    nested body once per level."""
    out: List[str] = []
    stack = [(root, 0)]
    while stack:
        node, i = stack.pop()
        if isinstance(node, str):
            out.append(node)
            continue
        opener, children = node
        if i == 0:
            out.append(opener)
        if i == len(children):
            out.append("]" if opener == "[" else "}")
            continue
        if i > 0:
            out.append(",")
        stack.append((node, i + 1))
        child = children[i]
        if opener == "{":
            out.append(child[0])
            child = child[1]
        stack.append((child, 0))
    return "".join(out)


_STRING_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: "re.Match[str]") -> str:
    c = m.group()
    return _SHORT.get(c) or "\\u%04x" % ord(c)


def _write_string(value: str) -> str:
    """As ECMAScript ``JSON.stringify``: the two-character escapes where they exist,
    ``\\u00xx`` for the other control characters, everything else (U+007F, U+2028) literal."""
    return '"' + _STRING_ESCAPE.sub(_escape_char, value) + '"'


def es6_number(value: float) -> str:
    """A finite double as ECMAScript ``Number::toString`` (ECMA-262 §6.1.6.1.20) writes it."""
    if value == 0.0:
        return "0"  # both zeros: JavaScript prints -0 as "0"
    sign = "-" if value < 0 else ""
    # repr() gives the shortest digits that read back as the same double, the nearest of
    # them, ties to even: ECMAScript's choice.
    text = repr(abs(value))
    mantissa, _, exp = text.partition("e")
    exponent = int(exp) if exp else 0
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    # The value is 0.DIGITS x 10^n, with k digits.
    n = point + exponent
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    rest = "." + digits[1:] if k > 1 else ""
    return sign + digits[0] + rest + "e" + ("+" if e > 0 else "-") + str(abs(e))
