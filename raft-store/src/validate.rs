//! Input rules of contract §1.1 and §1.4, from `idemraft-rules` (the one place they are
//! written), plus what needs the store's own types: checking a whole command ([`CheckOp`]).

pub use idemraft_rules::*;

use crate::types::{Op, Response};

/// The bounds applied to a whole command or stored response.
pub trait CheckOp {
    /// Checks every field of an operation against these bounds.
    fn check_op(&self, op: &Op) -> Result<(), ValidationError>;
    /// Checks a response against the stored-response bounds.
    fn response(&self, response: &Response) -> Result<(), ValidationError>;
}

impl CheckOp for Limits {
    fn check_op(&self, op: &Op) -> Result<(), ValidationError> {
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
            Op::Compressed(packed) => self.check_op(&packed.unpack()?),
        }
    }

    fn response(&self, response: &Response) -> Result<(), ValidationError> {
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
