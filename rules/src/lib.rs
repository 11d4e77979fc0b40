//! `idemraft-rules` owns Idemraft's input rules (contract §1.1 and §1.4): the shape of
//! tenants, scopes and keys, and the size and time bounds of every command. It is the one
//! place they are written: the store applies them, the node checks them at its edge, and the
//! SDK's key helpers and HTTP layer reuse them, so the three can never disagree. Each error
//! names the rule that was broken and how to fix it. No dependency beyond serde and
//! thiserror, so linking it costs a client nothing.
//!
//! Two sets of bounds exist. [`Limits::DEFAULT`] is what a node enforces at its edge unless
//! configured otherwise. [`Limits::CEILING`] is the widest any configuration may go; apply
//! enforces only the ceiling, because apply must give the same answer on every replica while
//! replicas may be configured differently for a while during a rolling change.

use serde::{Deserialize, Serialize};

/// Why an input was refused. The `Display` text is meant for the person who sent it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ValidationError {
    /// A tenant, scope or key broke its shape rule.
    #[error("{field} {problem}: a {field} must be {rule}")]
    BadIdentifier {
        /// `tenant`, `scope` or `key`.
        field: String,
        /// What is wrong with the given value.
        problem: String,
        /// The rule, in words.
        rule: String,
    },
    /// A number or size outside its bounds.
    #[error("{field} is {got}, outside the allowed range {min}..={max}{unit}; {fix}")]
    OutOfRange {
        /// Which field.
        field: String,
        /// The given value.
        got: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
        /// Unit suffix for the message, e.g. ` ms` or ` bytes`.
        unit: String,
        /// How to fix it.
        fix: String,
    },
    /// A field is missing where the command needs it.
    #[error("{field} is required: {why}")]
    Missing {
        /// Which field.
        field: String,
        /// Why it is needed.
        why: String,
    },
    /// A log entry carried more commands than a token slot can number.
    #[error("a log entry may carry at most {max} commands; split the batch")]
    BatchTooLarge {
        /// The bound.
        max: u64,
    },
    /// A compressed command that does not unpack (a damaged or forged entry). Appended last:
    /// outcomes are bincode with variant indexes.
    #[error("the compressed command does not unpack: {detail}; only a leader writes compressed commands, so report this with the entry's log index")]
    BadCompressedCommand {
        /// What is wrong with it.
        detail: String,
    },
}

const KEY_RULE: &str = "16 to 255 bytes of A-Z a-z 0-9 _ . : - (a UUID works)";
const SCOPE_RULE: &str = "1 to 128 bytes of A-Z a-z 0-9 . _ : / - (e.g. payments.create)";
const TENANT_RULE: &str = "1 to 64 bytes of A-Z a-z 0-9 . _ -";

fn check_ident(
    field: &str,
    value: &str,
    min: usize,
    max: usize,
    allowed: impl Fn(u8) -> bool,
    rule: &str,
) -> Result<(), ValidationError> {
    let bad =
        |problem: String| ValidationError::BadIdentifier { field: field.to_string(), problem, rule: rule.to_string() };
    let len = value.len();
    if len < min || len > max {
        return Err(bad(format!("is {len} bytes long")));
    }
    if let Some(pos) = value.bytes().position(|b| !allowed(b)) {
        let shown = value[pos..].chars().next().map_or(String::new(), |c| c.escape_default().to_string());
        return Err(bad(format!("has a forbidden character '{shown}' at byte {pos}")));
    }
    Ok(())
}

/// Tenant rule: 1–64 bytes of `[A-Za-z0-9._-]`.
pub fn tenant(value: &str) -> Result<(), ValidationError> {
    check_ident("tenant", value, 1, 64, |b| b.is_ascii_alphanumeric() || b"._-".contains(&b), TENANT_RULE)
}

/// Scope rule: 1–128 bytes of `[A-Za-z0-9._:/-]`.
pub fn scope(value: &str) -> Result<(), ValidationError> {
    check_ident("scope", value, 1, 128, |b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b), SCOPE_RULE)
}

/// The shortest key, in bytes.
pub const KEY_MIN_LEN: usize = 16;
/// The longest key, in bytes.
pub const KEY_MAX_LEN: usize = 255;

/// Whether a byte may appear in a key: `[A-Za-z0-9_.:-]`.
pub fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_.:-".contains(&b)
}

/// Key rule: 16–255 bytes of `[A-Za-z0-9_.:-]`.
pub fn key(value: &str) -> Result<(), ValidationError> {
    check_ident("key", value, KEY_MIN_LEN, KEY_MAX_LEN, is_key_byte, KEY_RULE)
}

/// Size and time bounds of contract §1.4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Shortest lease a claim may ask for.
    pub lease_min_ms: u64,
    /// Longest lease a claim may ask for.
    pub lease_max_ms: u64,
    /// Shortest TTL/retention.
    pub ttl_min_ms: u64,
    /// Longest TTL/retention.
    pub ttl_max_ms: u64,
    /// Longest owner id, bytes.
    pub owner_max_bytes: usize,
    /// Longest recovery point, bytes.
    pub recovery_point_max_bytes: usize,
    /// Largest checkpoint data, bytes.
    pub checkpoint_max_bytes: usize,
    /// Most stored response headers.
    pub headers_max_count: usize,
    /// Largest stored response headers, names plus values, bytes.
    pub headers_max_bytes: usize,
    /// Largest stored response body, bytes.
    pub body_max_bytes: usize,
    /// Most records one Sweep may delete: sweeps stay bounded batches.
    pub sweep_limit_max: u32,
}

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const DAY: u64 = 24 * 60 * MINUTE;

impl Limits {
    /// The edge bounds of contract §1.4.
    pub const DEFAULT: Limits = Limits {
        lease_min_ms: SECOND,
        lease_max_ms: 10 * MINUTE,
        ttl_min_ms: MINUTE,
        ttl_max_ms: 30 * DAY,
        owner_max_bytes: 128,
        recovery_point_max_bytes: 256,
        checkpoint_max_bytes: 64 * 1024,
        headers_max_count: 32,
        headers_max_bytes: 8 * 1024,
        body_max_bytes: 256 * 1024,
        sweep_limit_max: 1_000,
    };

    /// The widest any configuration may set; what apply itself enforces.
    pub const CEILING: Limits = Limits {
        lease_min_ms: 1,
        lease_max_ms: DAY,
        ttl_min_ms: SECOND,
        ttl_max_ms: 365 * DAY,
        owner_max_bytes: 128,
        recovery_point_max_bytes: 1024,
        checkpoint_max_bytes: 1024 * 1024,
        headers_max_count: 64,
        headers_max_bytes: 64 * 1024,
        body_max_bytes: 4 * 1024 * 1024,
        sweep_limit_max: 100_000,
    };

    /// Refuses a configuration that is inconsistent or wider than [`Limits::CEILING`].
    pub fn check_config(&self) -> Result<(), ValidationError> {
        let c = Limits::CEILING;
        let pairs: [(&str, u64, u64, u64, &str); 9] = [
            ("lease_max_ms", self.lease_max_ms, c.lease_min_ms.max(self.lease_min_ms), c.lease_max_ms, " ms"),
            ("ttl_max_ms", self.ttl_max_ms, c.ttl_min_ms.max(self.ttl_min_ms), c.ttl_max_ms, " ms"),
            ("owner_max_bytes", self.owner_max_bytes as u64, 1, c.owner_max_bytes as u64, " bytes"),
            (
                "recovery_point_max_bytes",
                self.recovery_point_max_bytes as u64,
                0,
                c.recovery_point_max_bytes as u64,
                " bytes",
            ),
            ("checkpoint_max_bytes", self.checkpoint_max_bytes as u64, 0, c.checkpoint_max_bytes as u64, " bytes"),
            ("headers_max_count", self.headers_max_count as u64, 0, c.headers_max_count as u64, ""),
            ("headers_max_bytes", self.headers_max_bytes as u64, 0, c.headers_max_bytes as u64, " bytes"),
            ("body_max_bytes", self.body_max_bytes as u64, 0, c.body_max_bytes as u64, " bytes"),
            ("sweep_limit_max", u64::from(self.sweep_limit_max), 1, u64::from(c.sweep_limit_max), ""),
        ];
        for (field, got, min, max, unit) in pairs {
            range(field, got, min, max, unit, "set it within the range in the server configuration")?;
        }
        range(
            "lease_min_ms",
            self.lease_min_ms,
            c.lease_min_ms,
            self.lease_max_ms,
            " ms",
            "set it within the range in the server configuration",
        )?;
        range(
            "ttl_min_ms",
            self.ttl_min_ms,
            c.ttl_min_ms,
            self.ttl_max_ms,
            " ms",
            "set it within the range in the server configuration",
        )
    }

    /// An upper bound on the encoded size of one command that passes the store's `check_op`
    /// with these bounds: the largest of a Complete/Fail (body plus headers) and a
    /// Checkpoint, plus room for the identity (tenant, scope, key: under 1 KiB), the owner,
    /// the fingerprint, each header's length prefixes and the encoding's framing. The node
    /// sizes its log entries and replication messages from it, so the largest command a
    /// caller may send always fits in one entry and one message.
    pub fn max_command_bytes(&self) -> usize {
        const FRAMING: usize = 4 * 1024;
        let response = self.body_max_bytes + self.headers_max_bytes + 16 * self.headers_max_count;
        let checkpoint = self.checkpoint_max_bytes + self.recovery_point_max_bytes;
        response.max(checkpoint) + self.owner_max_bytes + FRAMING
    }

    /// An owner id: present, and no longer than the bound.
    pub fn owner(&self, owner: &str) -> Result<(), ValidationError> {
        if owner.is_empty() {
            return Err(ValidationError::Missing {
                field: "owner".into(),
                why: "a claim needs an owner id so its retries are recognised as the same claim".into(),
            });
        }
        size("owner", owner.len(), self.owner_max_bytes, "use a shorter owner id, e.g. a UUID")
    }

    /// A lease length within the bounds.
    pub fn lease(&self, lease_ms: u64) -> Result<(), ValidationError> {
        range(
            "lease_ms",
            lease_ms,
            self.lease_min_ms,
            self.lease_max_ms,
            " ms",
            "ask for a lease within the server's bounds and extend it while the work runs",
        )
    }
}

/// A number within `min..=max`, or the error naming the field, the unit and the fix.
pub fn range(field: &str, got: u64, min: u64, max: u64, unit: &str, fix: &str) -> Result<(), ValidationError> {
    if got < min || got > max {
        return Err(ValidationError::OutOfRange {
            field: field.into(),
            got,
            min,
            max,
            unit: unit.into(),
            fix: fix.into(),
        });
    }
    Ok(())
}

/// A size of at most `max` bytes, or the error naming the field and the fix.
pub fn size(field: &str, got: usize, max: usize, fix: &str) -> Result<(), ValidationError> {
    range(field, got as u64, 0, max as u64, " bytes", fix)
}
