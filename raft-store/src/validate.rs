//! Input rules of contract §1.1 and §1.4: the shape of tenants, scopes and keys, and the size and time
//! bounds of every command. Each error names the rule that was broken and how to fix it.
//!
//! Two sets of bounds exist. [`Limits::DEFAULT`] is what a node enforces at its edge unless
//! configured otherwise. [`Limits::CEILING`] is the widest any configuration may go; apply
//! enforces only the ceiling, because apply must give the same answer on every replica while
//! replicas may be configured differently for a while during a rolling change.

use serde::{Deserialize, Serialize};

use crate::types::{Op, Response};

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

/// Key rule: 16–255 bytes of `[A-Za-z0-9_.:-]`.
pub fn key(value: &str) -> Result<(), ValidationError> {
    check_ident("key", value, 16, 255, |b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b), KEY_RULE)
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

    /// An upper bound on the encoded size of one command that passes [`Limits::check_op`]
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

    /// Checks every field of an operation against these bounds.
    pub fn check_op(&self, op: &Op) -> Result<(), ValidationError> {
        if let Some(id) = op.record_key() {
            id.validate()?;
        }
        match op {
            Op::Claim { owner, lease_ms, ttl_ms, .. } => {
                self.owner(owner)?;
                self.lease(*lease_ms)?;
                range(
                    "ttl_ms",
                    *ttl_ms,
                    self.ttl_min_ms,
                    self.ttl_max_ms,
                    " ms",
                    "choose a TTL within the server's bounds, or leave it to the scope default",
                )
            }
            Op::Complete { response, .. } => self.response(response),
            Op::Fail { retryable, response, .. } => match (retryable, response) {
                (_, Some(r)) => self.response(r),
                (true, None) => Ok(()),
                (false, None) => Err(ValidationError::Missing {
                    field: "response".into(),
                    why:
                        "a terminal failure is stored and replayed like any response; send the error response to store"
                            .into(),
                }),
            },
            Op::ExtendLease { lease_ms, .. } => self.lease(*lease_ms),
            Op::Checkpoint { recovery_point, data, lease_ms, .. } => {
                self.lease(*lease_ms)?;
                size(
                    "recovery_point",
                    recovery_point.len(),
                    self.recovery_point_max_bytes,
                    "keep the recovery point a short marker and put detail in the checkpoint data",
                )?;
                size(
                    "checkpoint data",
                    data.len(),
                    self.checkpoint_max_bytes,
                    "store large progress state elsewhere and checkpoint a reference to it",
                )
            }
            Op::Takeover { owner, lease_ms, .. } => {
                self.owner(owner)?;
                self.lease(*lease_ms)
            }
            Op::Sweep { limit } => range(
                "sweep limit",
                u64::from(*limit),
                0,
                u64::from(self.sweep_limit_max),
                "",
                "sweep in smaller batches, more often",
            ),
            Op::Resume { sweep_interval_ms, max_stretch_ms } => {
                let fix = "keep the sweep interval and the lease stretch within the longest lease";
                range("sweep_interval_ms", *sweep_interval_ms, 0, self.lease_max_ms, " ms", fix)?;
                range("max_stretch_ms", *max_stretch_ms, 0, self.lease_max_ms, " ms", fix)
            }
            // Any count is a valid quota, 0 included (the tenant may create no new record).
            Op::SetQuota { tenant, .. } => tenant.as_deref().map_or(Ok(()), self::tenant),
        }
    }

    fn owner(&self, owner: &str) -> Result<(), ValidationError> {
        if owner.is_empty() {
            return Err(ValidationError::Missing {
                field: "owner".into(),
                why: "a claim needs an owner id so its retries are recognised as the same claim".into(),
            });
        }
        size("owner", owner.len(), self.owner_max_bytes, "use a shorter owner id, e.g. a UUID")
    }

    fn lease(&self, lease_ms: u64) -> Result<(), ValidationError> {
        range(
            "lease_ms",
            lease_ms,
            self.lease_min_ms,
            self.lease_max_ms,
            " ms",
            "ask for a lease within the server's bounds and extend it while the work runs",
        )
    }

    /// Checks a response against the stored-response bounds.
    pub fn response(&self, response: &Response) -> Result<(), ValidationError> {
        size(
            "response body",
            response.body.len(),
            self.body_max_bytes,
            "store a smaller body, or a marker that points to where the full response lives",
        )?;
        size(
            "response header count",
            response.headers.len(),
            self.headers_max_count,
            "store only the headers a replay needs",
        )?;
        let header_bytes: usize = response.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        size("response headers", header_bytes, self.headers_max_bytes, "store only the headers a replay needs")
    }
}

fn range(field: &str, got: u64, min: u64, max: u64, unit: &str, fix: &str) -> Result<(), ValidationError> {
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

fn size(field: &str, got: usize, max: usize, fix: &str) -> Result<(), ValidationError> {
    range(field, got as u64, 0, max as u64, " bytes", fix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RecordKey;

    /// The largest command each limit set admits, built field by field at its bound, encodes
    /// within `max_command_bytes`: the node's entry and message budgets rest on it.
    #[test]
    fn the_largest_admitted_commands_fit_the_command_bound() {
        use crate::types::{Command, Response, Token};
        for limits in [Limits::DEFAULT, Limits::CEILING] {
            let id = RecordKey::new("t".repeat(64), "s".repeat(128), "k".repeat(255)).unwrap_or_else(|e| panic!("{e}"));
            let n = limits.headers_max_count.max(1);
            let value_len = (limits.headers_max_bytes / n).saturating_sub(1);
            let headers: Vec<(String, String)> = (0..n).map(|_| ("h".to_string(), "v".repeat(value_len))).collect();
            let response = Response { status: 599, headers, body: vec![0xAB; limits.body_max_bytes] };
            let ops = [
                Op::Complete { id: id.clone(), token: Token(u64::MAX), response: response.clone() },
                Op::Fail { id: id.clone(), token: Token(u64::MAX), retryable: false, response: Some(response) },
                Op::Checkpoint {
                    id: id.clone(),
                    token: Token(u64::MAX),
                    recovery_point: "r".repeat(limits.recovery_point_max_bytes),
                    data: vec![1; limits.checkpoint_max_bytes],
                    lease_ms: limits.lease_max_ms,
                },
                Op::Claim {
                    id,
                    fingerprint: Some([7; 32]),
                    owner: "o".repeat(limits.owner_max_bytes),
                    lease_ms: limits.lease_max_ms,
                    ttl_ms: limits.ttl_max_ms,
                    allow_takeover: true,
                },
            ];
            for op in ops {
                assert!(limits.check_op(&op).is_ok(), "{:?} is not admitted", limits.check_op(&op));
                let size =
                    crate::codec::encode(&Command { now_ms: u64::MAX, op }).map(|b| b.len()).unwrap_or(usize::MAX);
                assert!(size <= limits.max_command_bytes(), "{size} > {}", limits.max_command_bytes());
            }
        }
    }

    #[test]
    fn key_rules_name_the_rule() {
        let err = RecordKey::new("default", "payments.create", "short").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("key is 5 bytes long"), "{msg}");
        assert!(msg.contains("16 to 255 bytes"), "{msg}");

        let err = RecordKey::new("default", "payments.create", "0123456789abcdef ").unwrap_err();
        assert!(err.to_string().contains("forbidden character ' ' at byte 16"), "{err}");

        let err = RecordKey::new("default", "pay ments", "0123456789abcdef").unwrap_err();
        assert!(err.to_string().starts_with("scope has a forbidden character"), "{err}");

        let err = RecordKey::new("", "payments", "0123456789abcdef").unwrap_err();
        assert!(err.to_string().starts_with("tenant is 0 bytes long"), "{err}");

        assert!(RecordKey::new("default", "a", "x".repeat(255)).is_ok());
        assert!(RecordKey::new("default", "a", "x".repeat(256)).is_err());
        assert!(RecordKey::new("default", "s".repeat(128), "x".repeat(16)).is_ok());
        assert!(RecordKey::new("default", "s".repeat(129), "x".repeat(16)).is_err());
        assert!(RecordKey::new("t", "s", "é".repeat(8)).is_err());
    }

    #[test]
    fn key_encoding_round_trips_and_sorts_like_the_struct() {
        let a = RecordKey::new("a", "s", "0123456789abcdef").unwrap();
        let b = RecordKey::new("ab", "s", "0123456789abcdef").unwrap();
        let c = RecordKey::new("a", "s/x", "0123456789abcdef").unwrap();
        assert_eq!(RecordKey::decode(&a.encode()), Some(a.clone()));
        let mut by_struct = [b.clone(), c.clone(), a.clone()];
        by_struct.sort();
        let mut by_bytes = [b.encode(), c.encode(), a.encode()];
        by_bytes.sort();
        assert_eq!(by_struct.iter().map(RecordKey::encode).collect::<Vec<_>>(), by_bytes);
        assert_eq!(RecordKey::decode(b"no-separators"), None);
    }

    #[test]
    fn limits_default_is_a_valid_config_and_ceiling_is_too() {
        Limits::DEFAULT.check_config().unwrap();
        Limits::CEILING.check_config().unwrap();
        let bad = Limits { body_max_bytes: 64 * 1024 * 1024, ..Limits::DEFAULT };
        let msg = bad.check_config().unwrap_err().to_string();
        assert!(msg.starts_with("body_max_bytes is 67108864"), "{msg}");
    }

    #[test]
    fn terminal_fail_needs_a_response() {
        let op = Op::Fail {
            id: RecordKey::new("t", "s", "0123456789abcdef").unwrap(),
            token: crate::Token(1),
            retryable: false,
            response: None,
        };
        let msg = Limits::DEFAULT.check_op(&op).unwrap_err().to_string();
        assert!(msg.contains("response is required"), "{msg}");
    }
}
