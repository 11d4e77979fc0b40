//! Request fingerprints (contract §6): the digest that binds an idempotency key to one
//! request, so that a retry carrying a different payload is refused as `MISMATCH` instead of
//! being answered with the response of another request.
//!
//! Every SDK and the node must compute the same 32 bytes for the same request, so this module
//! owns the whole definition: `SHA-256(UPPER(method) "\n" path "\n" canonical(body))`, with
//! `canonical` the JSON Canonicalization Scheme of RFC 8785. `tests/vectors/fingerprint.json`
//! (contract §6.4) pins it against an independent implementation.
//!
//! The JSON reader is hand-written rather than `serde_json`'s, because RFC 8785 needs three
//! things `serde_json` does not give without optional features this crate does not turn on:
//! - every number correctly rounded to an IEEE-754 double: `serde_json`'s default float parser
//!   may be one ulp off, and one ulp is a different digest;
//! - duplicate object keys reported: `serde_json` silently keeps the last one;
//! - no recursion: the reader and writer keep explicit stacks, so a deeply nested body cannot
//!   overflow the thread's stack, and no nesting limit makes a valid body "not JSON" here while
//!   it is JSON to another implementation.

use std::fmt;

use sha2::{Digest, Sha256};

/// A SHA-256 request fingerprint, as stored in a record and compared by `Claim`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Lowercase hex, 64 characters: the form the test vectors and logs use.
    #[must_use]
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(64);
        push_hex(&mut out, &self.0);
        out
    }

    /// The raw digest bytes, as the wire protocol carries them.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

// Hex rather than 32 decimal numbers, so logs and test failures can be compared with the vectors.
impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl From<[u8; 32]> for Fingerprint {
    fn from(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }
}

impl From<Fingerprint> for [u8; 32] {
    fn from(fingerprint: Fingerprint) -> Self {
        fingerprint.0
    }
}

/// Appends `bytes` as lowercase hex; shared with the key generators so both spell hex alike.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// The fingerprint of an HTTP request (contract §6.1).
///
/// `method` is upper-cased in ASCII only: HTTP methods are ASCII tokens, and Unicode case
/// mapping would make the digest depend on the Unicode tables of each implementation.
/// `path` is hashed exactly as given (query string included), since two paths that differ
/// in any byte may be routed differently.
///
/// A body that [`canonical_json`] accepts contributes its canonical form, so key order and
/// whitespace do not change the digest. Any other body (not UTF-8, not JSON, JSON with a
/// duplicate key or a number beyond the range of a double) contributes its raw bytes: the
/// request is still bound to exactly what was sent. `None` contributes nothing, and so does
/// `Some(b"")`, which is not JSON and has no bytes: the two digests coincide, as they should
/// for an HTTP request without content.
#[must_use]
pub fn fingerprint(method: &str, path: &str, body: Option<&[u8]>) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(method.to_ascii_uppercase().as_bytes());
    hasher.update(b"\n");
    hasher.update(path.as_bytes());
    hasher.update(b"\n");
    if let Some(body) = body {
        match canonical_json(body) {
            Ok(canonical) => hasher.update(&canonical),
            Err(_) => hasher.update(body),
        }
    }
    Fingerprint(hasher.finalize().into())
}

/// A fingerprint of a list of byte strings, for callers that bind a key to something other
/// than an HTTP request (a queue message, a job's arguments).
///
/// Each part is hashed as its length (u64, big-endian) followed by its bytes, so the list
/// can be read back unambiguously: `["ab", "c"]`, `["a", "bc"]` and `["abc"]` all differ,
/// and so do `[]` and `[""]`.
#[must_use]
pub fn fingerprint_parts(parts: &[&[u8]]) -> Fingerprint {
    let mut hasher = Sha256::new();
    for part in parts {
        // usize is at most 64 bits on every target Rust supports, so this never saturates.
        let len = u64::try_from(part.len()).unwrap_or(u64::MAX);
        hasher.update(len.to_be_bytes());
        hasher.update(part);
    }
    Fingerprint(hasher.finalize().into())
}

/// Why a body is not canonicalizable JSON, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalError {
    offset: usize,
    kind: CanonicalErrorKind,
}

impl CanonicalError {
    /// Byte offset into the input where the problem was found.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// What the problem is.
    #[must_use]
    pub fn kind(&self) -> &CanonicalErrorKind {
        &self.kind
    }
}

/// The kinds of [`CanonicalError`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CanonicalErrorKind {
    /// The bytes are not UTF-8; JSON text exchanged between systems must be (RFC 8259 §8.1).
    InvalidUtf8,
    /// The input ended early.
    UnexpectedEnd {
        /// What the grammar needed next.
        expected: &'static str,
    },
    /// A character the grammar does not allow here.
    Unexpected {
        /// The character found.
        found: char,
        /// What the grammar needed instead.
        expected: &'static str,
    },
    /// A control character (below U+0020) written raw inside a string.
    ControlCharacter(char),
    /// A `\uXXXX` escape naming half of a UTF-16 surrogate pair without the other half.
    LoneSurrogate(u16),
    /// A number that rounds to infinity as a double, such as `1e400`.
    NumberOutOfRange,
    /// An object with the same key twice (the offset is that of the second).
    DuplicateKey(String),
}

impl fmt::Display for CanonicalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not canonicalizable JSON at byte {}: {}", self.offset, self.kind)
    }
}

impl fmt::Display for CanonicalErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUtf8 => f.write_str("the bytes are not valid UTF-8"),
            Self::UnexpectedEnd { expected } => write!(f, "expected {expected}, found the end of the input"),
            Self::Unexpected { found, expected } => write!(f, "expected {expected}, found {found:?}"),
            Self::ControlCharacter(c) => {
                let code = u32::from(*c);
                write!(f, "control character U+{code:04X} written raw in a string; escape it as \\u{code:04x}")
            }
            Self::LoneSurrogate(unit) => write!(
                f,
                "\\u{unit:04x} is half of a UTF-16 surrogate pair; RFC 8785 requires I-JSON, which forbids \
                 lone surrogates"
            ),
            Self::NumberOutOfRange => {
                f.write_str("number is beyond the range of an IEEE-754 double; RFC 8785 numbers must be finite doubles")
            }
            // Rejected rather than last-wins: servers disagree on which copy they keep, so the
            // payload has no single meaning to fingerprint; the raw bytes are hashed instead.
            Self::DuplicateKey(key) => write!(f, "object key {key:?} appears twice; RFC 8785 forbids duplicate keys"),
        }
    }
}

impl std::error::Error for CanonicalError {}

/// The RFC 8785 canonical form of a JSON text: object members sorted by the UTF-16 code units
/// of their keys at every depth, array order kept, no insignificant whitespace, numbers in the
/// ECMAScript `Number.prototype.toString` form of the nearest double, strings with only the
/// escapes RFC 8785 prescribes.
///
/// Fails on anything that is not a single JSON value (surrounding whitespace is allowed), and
/// on the JSON that RFC 8785 excludes: duplicate keys, numbers beyond the range of a double,
/// lone surrogates.
///
/// # Errors
///
/// A [`CanonicalError`] with the byte offset of the first problem found and what it is.
pub fn canonical_json(text: &[u8]) -> Result<Vec<u8>, CanonicalError> {
    let text = std::str::from_utf8(text)
        .map_err(|e| CanonicalError { offset: e.valid_up_to(), kind: CanonicalErrorKind::InvalidUtf8 })?;
    Parser { text, pos: 0, nodes: Vec::new(), leaves: Vec::new() }.document()
}

fn error(offset: usize, kind: CanonicalErrorKind) -> CanonicalError {
    CanonicalError { offset, kind }
}

/// A parsed value. Scalars are already rendered in canonical form into `Parser::leaves`;
/// containers refer to their children by index into `Parser::nodes`.
enum Node {
    Leaf { start: usize, end: usize },
    Array(Vec<usize>),
    Object(Vec<Member>),
}

struct Member {
    key: String,
    /// Byte offset of the key in the input, to point at a duplicate.
    offset: usize,
    value: usize,
}

/// A container still being read. The object form holds the key of the value being read.
enum Frame {
    Array(Vec<usize>),
    Object { members: Vec<Member>, key: String, key_offset: usize },
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    nodes: Vec<Node>,
    leaves: Vec<u8>,
}

impl Parser<'_> {
    fn document(mut self) -> Result<Vec<u8>, CanonicalError> {
        let mut open: Vec<Frame> = Vec::new();
        let root = 'value: loop {
            self.skip_whitespace();
            let mut done = match self.peek() {
                Some(b'[') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.eat(b']') {
                        self.push(Node::Array(Vec::new()))
                    } else {
                        open.push(Frame::Array(Vec::new()));
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.eat(b'}') {
                        self.push(Node::Object(Vec::new()))
                    } else {
                        let (key, key_offset) = self.member_key()?;
                        open.push(Frame::Object { members: Vec::new(), key, key_offset });
                        continue 'value;
                    }
                }
                _ => self.scalar()?,
            };
            // `done` is a complete value: give it to the innermost open container, and close
            // every container that ends right after it.
            loop {
                let Some(frame) = open.pop() else { break 'value done };
                self.skip_whitespace();
                match frame {
                    Frame::Array(mut items) => {
                        items.push(done);
                        if self.eat(b',') {
                            open.push(Frame::Array(items));
                            continue 'value;
                        }
                        self.expect(b']', "',' or ']'")?;
                        done = self.push(Node::Array(items));
                    }
                    Frame::Object { mut members, key, key_offset } => {
                        members.push(Member { key, offset: key_offset, value: done });
                        if self.eat(b',') {
                            self.skip_whitespace();
                            let (key, key_offset) = self.member_key()?;
                            open.push(Frame::Object { members, key, key_offset });
                            continue 'value;
                        }
                        self.expect(b'}', "',' or '}'")?;
                        done = self.close_object(members)?;
                    }
                }
            }
        };
        self.skip_whitespace();
        if self.pos < self.text.len() {
            return Err(self.unexpected("the end of the input after the JSON value"));
        }
        Ok(self.emit(root))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, byte: u8, expected: &'static str) -> Result<(), CanonicalError> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// The error for whatever is at the current position, given what should have been there.
    fn unexpected(&self, expected: &'static str) -> CanonicalError {
        let kind = match self.text[self.pos..].chars().next() {
            Some(found) => CanonicalErrorKind::Unexpected { found, expected },
            None => CanonicalErrorKind::UnexpectedEnd { expected },
        };
        CanonicalError { offset: self.pos, kind }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// A key and the colon after it; returns the key and where it starts.
    fn member_key(&mut self) -> Result<(String, usize), CanonicalError> {
        let offset = self.pos;
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("a string key"));
        }
        let key = self.string()?;
        self.skip_whitespace();
        self.expect(b':', "':' after the key")?;
        Ok((key, offset))
    }

    fn close_object(&mut self, mut members: Vec<Member>) -> Result<usize, CanonicalError> {
        // Stable, so equal keys stay in input order and the second of a pair is the later one.
        members.sort_by(|a, b| a.key.encode_utf16().cmp(b.key.encode_utf16()));
        if let Some(pair) = members.windows(2).find(|pair| pair[0].key == pair[1].key) {
            return Err(error(pair[1].offset, CanonicalErrorKind::DuplicateKey(pair[1].key.clone())));
        }
        Ok(self.push(Node::Object(members)))
    }

    fn scalar(&mut self) -> Result<usize, CanonicalError> {
        let start = self.leaves.len();
        match self.peek() {
            Some(b'"') => {
                let value = self.string()?;
                write_string(&value, &mut self.leaves);
            }
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(b't') => self.literal("true")?,
            Some(b'f') => self.literal("false")?,
            Some(b'n') => self.literal("null")?,
            _ => return Err(self.unexpected("a JSON value")),
        }
        let end = self.leaves.len();
        Ok(self.push(Node::Leaf { start, end }))
    }

    fn literal(&mut self, word: &'static str) -> Result<(), CanonicalError> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.leaves.extend_from_slice(word.as_bytes());
            Ok(())
        } else {
            Err(self.unexpected(word))
        }
    }

    /// Reads a number per the RFC 8259 grammar and renders the nearest double.
    fn number(&mut self) -> Result<(), CanonicalError> {
        let start = self.pos;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.unexpected("a digit")),
        }
        if self.eat(b'.') {
            self.one_or_more_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
        }
        // The standard library's parser is correctly rounded for any length of input, which
        // is what "an integer beyond 2^53 is rounded exactly as JavaScript would" needs.
        let value: f64 = match self.text[start..self.pos].parse() {
            Ok(value) => value,
            Err(_) => return Err(error(start, CanonicalErrorKind::NumberOutOfRange)),
        };
        if !value.is_finite() {
            return Err(error(start, CanonicalErrorKind::NumberOutOfRange));
        }
        write_number(value, &mut self.leaves);
        Ok(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Result<(), CanonicalError> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.unexpected("a digit"));
        }
        self.digits();
        Ok(())
    }

    /// Reads a string, the opening quote at the current position, and returns its value.
    fn string(&mut self) -> Result<String, CanonicalError> {
        self.pos += 1;
        let bytes = self.text.as_bytes();
        let mut value = String::new();
        loop {
            let run = self.pos;
            while matches!(bytes.get(self.pos), Some(&b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            // The run stops at an ASCII byte or the end, so it is on a char boundary.
            value.push_str(&self.text[run..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(value);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self.escape()?;
                    value.push(c);
                }
                Some(control) => {
                    return Err(error(self.pos, CanonicalErrorKind::ControlCharacter(char::from(control))));
                }
                None => return Err(self.unexpected("'\"' closing the string")),
            }
        }
    }

    /// Reads the escape after a backslash.
    fn escape(&mut self) -> Result<char, CanonicalError> {
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let at = self.pos - 1;
                self.pos += 1;
                let unit = self.hex4()?;
                return match unit {
                    0xD800..=0xDBFF => {
                        let low_at = self.pos;
                        if !self.text[self.pos..].starts_with("\\u") {
                            return Err(error(at, CanonicalErrorKind::LoneSurrogate(unit)));
                        }
                        self.pos += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(error(at, CanonicalErrorKind::LoneSurrogate(unit)));
                        }
                        let code = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                        char::from_u32(code).ok_or_else(|| error(low_at, CanonicalErrorKind::LoneSurrogate(low)))
                    }
                    0xDC00..=0xDFFF => Err(error(at, CanonicalErrorKind::LoneSurrogate(unit))),
                    _ => char::from_u32(u32::from(unit))
                        .ok_or_else(|| error(at, CanonicalErrorKind::LoneSurrogate(unit))),
                };
            }
            _ => return Err(self.unexpected("an escape: \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX")),
        };
        self.pos += 1;
        Ok(c)
    }

    fn hex4(&mut self) -> Result<u16, CanonicalError> {
        let mut unit: u16 = 0;
        for _ in 0..4 {
            let digit = match self.peek() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(self.unexpected("a hex digit of a \\u escape")),
            };
            unit = (unit << 4) | u16::from(digit);
            self.pos += 1;
        }
        Ok(unit)
    }

    /// Writes the canonical text of `root`, walking the tree with an explicit stack.
    fn emit(&self, root: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.leaves.len() + 2 * self.nodes.len());
        // Each open container and the index of its next child.
        let mut open: Vec<(usize, usize)> = Vec::new();
        self.enter(root, &mut out, &mut open);
        while let Some(&(node, next)) = open.last() {
            let child = match &self.nodes[node] {
                Node::Array(items) => items.get(next).map(|&item| (None, item)),
                Node::Object(members) => members.get(next).map(|member| (Some(&member.key), member.value)),
                Node::Leaf { .. } => None,
            };
            let Some((key, child)) = child else {
                out.push(if matches!(self.nodes[node], Node::Object(_)) { b'}' } else { b']' });
                open.pop();
                continue;
            };
            if let Some(top) = open.last_mut() {
                top.1 += 1;
            }
            if next > 0 {
                out.push(b',');
            }
            if let Some(key) = key {
                write_string(key, &mut out);
                out.push(b':');
            }
            self.enter(child, &mut out, &mut open);
        }
        out
    }

    fn enter(&self, node: usize, out: &mut Vec<u8>, open: &mut Vec<(usize, usize)>) {
        match &self.nodes[node] {
            Node::Leaf { start, end } => out.extend_from_slice(&self.leaves[*start..*end]),
            Node::Array(_) => {
                out.push(b'[');
                open.push((node, 0));
            }
            Node::Object(_) => {
                out.push(b'{');
                open.push((node, 0));
            }
        }
    }
}

/// Writes a string as RFC 8785 §3.2.2.2 (that is, ECMAScript `JSON.stringify`) does: the
/// two-character escapes where they exist, `\u00xx` for the other control characters, and
/// everything else, U+007F and U+2028 included, as literal UTF-8.
fn write_string(value: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        if short.is_empty() {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(DIGITS[usize::from(b >> 4)]);
            out.push(DIGITS[usize::from(b & 0x0f)]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Writes a finite double as ECMAScript `Number::toString` (ECMA-262 §6.1.6.1.20) does.
fn write_number(value: f64, out: &mut Vec<u8>) {
    if value == 0.0 {
        // Both zeros: JavaScript prints -0 as "0".
        out.push(b'0');
        return;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    let (digits, n) = shortest_digits(value.abs());
    // In the spec's terms the value is 0.DIGITS × 10^n, and k is the number of digits.
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let zeros =
        |count: i64, out: &mut Vec<u8>| out.extend(std::iter::repeat_n(b'0', usize::try_from(count).unwrap_or(0)));
    if k <= n && n <= 21 {
        out.extend_from_slice(&digits);
        zeros(n - k, out);
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(usize::try_from(n).unwrap_or(0));
        out.extend_from_slice(int);
        out.push(b'.');
        out.extend_from_slice(frac);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        zeros(-n, out);
        out.extend_from_slice(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.extend_from_slice(first);
        if !rest.is_empty() {
            out.push(b'.');
            out.extend_from_slice(rest);
        }
        out.extend_from_slice(format!("e{}{}", if n > 0 { '+' } else { '-' }, (n - 1).abs()).as_bytes());
    }
}

/// The significant digits ECMAScript prints for a positive finite double, and the decimal
/// exponent `n` that makes the value `0.DIGITS × 10^n`.
///
/// ECMAScript wants the fewest digits that read back as the same double and, of those, the
/// one closest to it, ties to the even digit. Rust's `{:e}` gives the fewest digits but breaks
/// an exact tie in the last digit upwards (0x43143ff3c1cb0959 is 1424953923781206.25: Rust
/// prints ...206.3, JavaScript ...206.2). `{:.*e}` rounds the exact binary value to a given
/// number of digits, ties to even, so that is used when it still reads back as the same double.
fn shortest_digits(value: f64) -> (Vec<u8>, i64) {
    let shortest = format!("{value:e}");
    let k = shortest.bytes().take_while(|&b| b != b'e').filter(u8::is_ascii_digit).count();
    let nearest = format!("{:.*e}", k.saturating_sub(1), value);
    let chosen = if nearest.parse::<f64>() == Ok(value) { nearest } else { shortest };
    let (mantissa, exponent) = chosen.split_once('e').unwrap_or((&chosen, "0"));
    let mut digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    (digits, exponent.parse::<i64>().unwrap_or(0) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        String::from_utf8(canonical_json(text.as_bytes()).unwrap()).unwrap()
    }

    fn number(value: f64) -> String {
        let mut out = Vec::new();
        write_number(value, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn sha256(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }

    #[test]
    fn keys_are_sorted_at_every_depth_and_arrays_keep_their_order() {
        assert_eq!(
            canon(r#"{"b":1,"a":2,"c":{"z":[3,1,2],"y":{"k":true,"j":null}}}"#),
            r#"{"a":2,"b":1,"c":{"y":{"j":null,"k":true},"z":[3,1,2]}}"#
        );
        assert_eq!(canon(r#"[{"b":1,"a":2},[{"d":0,"c":0}]]"#), r#"[{"a":2,"b":1},[{"c":0,"d":0}]]"#);
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_utf8_bytes() {
        // U+FB01 is EF AC 81 in UTF-8 and FB01 in UTF-16; U+1F600 is F0 9F 98 80 and D83D DE00.
        // By UTF-8 bytes the emoji sorts last; by UTF-16 code units it sorts first.
        assert_eq!(canon("{\"\u{fb01}\":1,\"\u{1f600}\":2}"), "{\"\u{1f600}\":2,\"\u{fb01}\":1}");
        // The example of RFC 8785 §3.2.3.
        let input = concat!(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","#,
            r#""1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","#,
            r#""\u00f6":"Latin Small Letter O With Diaeresis"}"#
        );
        let want = concat!(
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",",
            "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",",
            "\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
        assert_eq!(canon(input), want);
    }

    #[test]
    fn insignificant_whitespace_goes() {
        assert_eq!(canon(" \t\r\n{ \"a\" : [ 1 , 2 ] ,\n\"b\":\"x y\" }\n"), r#"{"a":[1,2],"b":"x y"}"#);
        assert_eq!(canon("[ ]"), "[]");
        assert_eq!(canon("{ }"), "{}");
    }

    #[test]
    fn numbers_take_the_es6_form() {
        for (text, want) in [
            ("1.0", "1"),
            ("10e0", "10"),
            ("1E2", "100"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123e18", "123000000000000000000"),
            ("1e-7", "1e-7"),
            ("1.5e-7", "1.5e-7"),
            ("0.000001", "0.000001"),
            ("2.5e-6", "0.0000025"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0.1", "0.1"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("99.5", "99.5"),
            ("-12.5e3", "-12500"),
            // 2^53 + 1 is not a double: it rounds (ties to even) to 2^53, as in JavaScript.
            ("9007199254740993", "9007199254740992"),
            ("18446744073709551615", "18446744073709552000"),
            ("12345678901234567890123", "1.2345678901234568e+22"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            // Below half the smallest subnormal: rounds to zero, as JavaScript's parser does.
            ("1e-400", "0"),
            ("-1e-400", "0"),
        ] {
            assert_eq!(canon(text), want, "{text}");
        }
    }

    #[test]
    fn number_serialization_matches_rfc_8785_appendix_b() {
        // IEEE-754 bit patterns and the text ECMAScript (node) prints for them.
        for (bits, want) in [
            (0x0000000000000000_u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            assert_eq!(number(f64::from_bits(bits)), want, "{bits:#018x}");
        }
    }

    #[test]
    fn numbers_read_back_as_the_same_double() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            // xorshift64: any finite bit pattern, subnormals included.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let value = f64::from_bits(state);
            if !value.is_finite() {
                continue;
            }
            let text = number(value);
            let back: f64 = text.parse().unwrap();
            assert!(back == value, "{value:e} printed as {text}");
            assert_eq!(canon(&text), text, "canonical text is a fixed point");
        }
    }

    #[test]
    fn strings_are_escaped_as_rfc_8785_says() {
        assert_eq!(canon(r#""\u0000\u0001\u001f""#), r#""\u0000\u0001\u001f""#);
        assert_eq!(canon(r#""\b\f\n\r\t\"\\\/""#), r#""\b\f\n\r\t\"\\/""#);
        assert_eq!(canon(r#""\u0008\u000C\u000a""#), r#""\b\f\n""#);
        // U+007F, U+2028, non-ASCII and astral characters are written literally.
        assert_eq!(canon(r#""\u007f\u2028\u00e9\ud83d\ude00\u20AC""#), "\"\u{7f}\u{2028}\u{e9}\u{1f600}\u{20ac}\"");
        assert_eq!(canon("\"\u{7f}\u{2028}\u{e9}\u{1f600}\""), "\"\u{7f}\u{2028}\u{e9}\u{1f600}\"");
        // Keys are escaped the same way.
        assert_eq!(canon(r#"{"a\nb":1}"#), r#"{"a\nb":1}"#);
    }

    #[test]
    fn not_json_is_an_error_naming_the_problem_and_its_offset() {
        let err = |text: &[u8]| canonical_json(text).unwrap_err();
        assert_eq!(err(b"").kind(), &CanonicalErrorKind::UnexpectedEnd { expected: "a JSON value" });
        assert_eq!(err(b"   ").offset(), 3);
        assert_eq!(err(b"{\"a\":1,}").offset(), 7);
        assert_eq!(err(b"[1,]").kind(), &CanonicalErrorKind::Unexpected { found: ']', expected: "a JSON value" });
        assert_eq!(err(b"[1 2]").offset(), 3);
        assert_eq!(err(b"{\"a\" 1}").offset(), 5);
        assert_eq!(err(b"{1:2}").offset(), 1);
        assert_eq!(err(b"[1] [2]").offset(), 4);
        assert_eq!(err(b"01").offset(), 1);
        assert_eq!(err(b"1.").offset(), 2);
        assert_eq!(err(b"1e").offset(), 2);
        assert_eq!(err(b"-").offset(), 1);
        assert_eq!(err(b".5").offset(), 0);
        assert_eq!(err(b"+1").offset(), 0);
        assert_eq!(err(b"NaN").offset(), 0);
        assert_eq!(err(b"tru").offset(), 0);
        assert_eq!(err(b"\"abc").kind(), &CanonicalErrorKind::UnexpectedEnd { expected: "'\"' closing the string" });
        assert_eq!(err(b"\"a\x01\"").kind(), &CanonicalErrorKind::ControlCharacter('\u{1}'));
        assert_eq!(err(br#""\x""#).offset(), 2);
        assert_eq!(err(br#""\u12g4""#).offset(), 5);
        assert_eq!(err(b"\"\xff\"").kind(), &CanonicalErrorKind::InvalidUtf8);
        assert_eq!(
            err(b"\xef\xbb\xbf{}").kind(),
            &CanonicalErrorKind::Unexpected { found: '\u{feff}', expected: "a JSON value" }
        );
        let too_big = err(b"[1, 1e400]");
        assert_eq!((too_big.offset(), too_big.kind()), (4, &CanonicalErrorKind::NumberOutOfRange));
        assert_eq!(
            err(b"{\"a\":1,\"b\":2}x").to_string(),
            "not canonicalizable JSON at byte 13: expected the end of the input after the JSON value, found 'x'"
        );
    }

    #[test]
    fn lone_surrogates_are_rejected() {
        for text in [r#""\ud800""#, r#""\ud800x""#, r#""\ud800\u0041""#, r#""\udc00""#, r#"{"\ud83d":1}"#] {
            let err = canonical_json(text.as_bytes()).unwrap_err();
            assert!(matches!(err.kind(), CanonicalErrorKind::LoneSurrogate(_)), "{text}: {err}");
        }
    }

    #[test]
    fn duplicate_keys_are_rejected_at_the_second_occurrence() {
        let err = canonical_json(br#"{"a":1,"b":{"k":1,"j":2,"k":3}}"#).unwrap_err();
        assert_eq!(err.kind(), &CanonicalErrorKind::DuplicateKey("k".to_string()));
        assert_eq!(err.offset(), 24);
        // The same key spelled with an escape is still the same key.
        assert!(canonical_json(br#"{"a":1,"\u0061":2}"#).is_err());
        // Equal keys in different objects are fine.
        assert_eq!(canon(r#"[{"a":1},{"a":2}]"#), r#"[{"a":1},{"a":2}]"#);
    }

    #[test]
    fn deep_nesting_does_not_overflow_the_stack() {
        let depth = 200_000;
        let text = format!("{}{}", "[{\"a\":".repeat(depth), "}]".repeat(depth)).replace(":}", ":0}");
        let canonical = canon(&text);
        assert_eq!(canonical.len(), text.len());
    }

    #[test]
    fn fingerprint_is_sha256_of_method_path_and_canonical_body() {
        let body = br#"{ "currency": "usd", "amount": 100 }"#;
        let want = sha256(b"POST\n/v1/charges\n{\"amount\":100,\"currency\":\"usd\"}");
        assert_eq!(fingerprint("post", "/v1/charges", Some(body)), want);
        assert_eq!(fingerprint("POST", "/v1/charges", Some(body)), want);
        assert_ne!(fingerprint("POST", "/v1/charge", Some(body)), want);
        assert_ne!(fingerprint("PUT", "/v1/charges", Some(body)), want);
    }

    #[test]
    fn a_body_that_is_not_json_is_hashed_raw() {
        for body in [&b"amount=100&currency=usd"[..], b"{\"a\":1,\"a\":2}", b"[1e999]", b"\xff\xfe", b"  "] {
            let mut want = b"POST\n/upload\n".to_vec();
            want.extend_from_slice(body);
            assert_eq!(fingerprint("POST", "/upload", Some(body)), sha256(&want));
        }
    }

    #[test]
    fn an_absent_body_and_an_empty_body_coincide() {
        let want = sha256(b"DELETE\n/v1/items/42\n");
        assert_eq!(fingerprint("DELETE", "/v1/items/42", None), want);
        assert_eq!(fingerprint("DELETE", "/v1/items/42", Some(b"")), want);
        // But an empty JSON string is a body.
        assert_ne!(fingerprint("DELETE", "/v1/items/42", Some(b"\"\"")), want);
    }

    #[test]
    fn fingerprint_parts_are_length_prefixed() {
        let of = |parts: &[&str]| fingerprint_parts(&parts.iter().map(|p| p.as_bytes()).collect::<Vec<_>>());
        assert_ne!(of(&["ab", "c"]), of(&["a", "bc"]));
        assert_ne!(of(&["abc"]), of(&["ab", "c"]));
        assert_ne!(of(&[]), of(&[""]));
        assert_ne!(of(&[""]), of(&["", ""]));
        assert_eq!(of(&["a", "b"]), of(&["a", "b"]));
        assert_eq!(of(&["ab", "c"]), sha256(b"\0\0\0\0\0\0\0\x02ab\0\0\0\0\0\0\0\x01c"));
        assert_eq!(of(&[]), sha256(b""));
    }

    #[test]
    fn fingerprint_prints_as_hex() {
        let mut bytes = [0u8; 32];
        bytes[0] = 0xab;
        bytes[31] = 0x01;
        let fp = Fingerprint::from(bytes);
        let hex = format!("ab{}01", "00".repeat(30));
        assert_eq!(fp.to_hex(), hex);
        assert_eq!(fp.to_string(), hex);
        assert_eq!(format!("{fp:?}"), format!("Fingerprint({hex})"));
        assert_eq!(fp.as_bytes(), &bytes);
        assert_eq!(<[u8; 32]>::from(fp), bytes);
    }
}
