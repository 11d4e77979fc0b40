//! The fingerprint test vectors (contract §6.4), computed by an independent RFC 8785
//! implementation: every SDK must reproduce every digest, so this test checks all of them and
//! reports every mismatch at once rather than stopping at the first.
//!
//! `tests/vectors/fingerprint.json` holds vectors computed by an independent RFC 8785
//! implementation (contract §6.4); add new ones the same way, never from this SDK's output.

use idemraft_client::fingerprint::{canonical_json, fingerprint};
use serde_json::Value;

const VECTORS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/fingerprint.json"));

fn field<'a>(vector: &'a Value, name: &str, index: usize) -> &'a str {
    match vector.get(name).and_then(Value::as_str) {
        Some(text) => text,
        None => panic!("vector {index} has no string field {name:?}: {vector}"),
    }
}

#[test]
fn every_shared_vector_is_reproduced() {
    let file: Value = serde_json::from_str(VECTORS).unwrap();
    let vectors = file.get("vectors").and_then(Value::as_array).expect("a \"vectors\" array");
    assert!(!vectors.is_empty(), "no vectors read from tests/vectors/fingerprint.json");

    let mut failures = Vec::new();
    for (index, vector) in vectors.iter().enumerate() {
        let note = vector.get("note").and_then(Value::as_str).unwrap_or("");
        let method = field(vector, "method", index);
        let path = field(vector, "path", index);
        let want_canonical = field(vector, "canonical_body", index);
        let want_digest = field(vector, "sha256", index);
        // The file writes an absent body as `"body": null`.
        let body = match vector.get("body") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.as_str()),
            Some(other) => panic!("vector {index} ({note}): body must be a string or null, not {other}"),
        };

        if let Some(body) = body {
            // Every body in the file is JSON; one that is not would be hashed raw, and its
            // `canonical_body` would say nothing about canonicalization.
            match canonical_json(body.as_bytes()) {
                Ok(canonical) if canonical == want_canonical.as_bytes() => {}
                Ok(canonical) => failures.push(format!(
                    "vector {index} ({note}): canonical body\n  got  {}\n  want {want_canonical}",
                    String::from_utf8_lossy(&canonical)
                )),
                Err(e) => failures.push(format!("vector {index} ({note}): body is not canonicalizable: {e}")),
            }
        } else {
            assert_eq!(want_canonical, "", "vector {index} ({note}): an absent body has an empty canonical form");
        }

        let digest = fingerprint(method, path, body.map(str::as_bytes)).to_hex();
        if digest != want_digest {
            failures.push(format!("vector {index} ({note}): sha256\n  got  {digest}\n  want {want_digest}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} vectors failed:\n{}", failures.len(), vectors.len(), failures.join("\n"));
}
