//! Which failures a call retries, and what a given-up call reports: a lost reply is not a
//! refusal, and a write whose attempt may have gone through has an unknown outcome.

use idemraft_proto::NOT_PROPOSED_HEADER;
use tonic::{Code, Status};

use super::*;

/// Statuses that say only that an attempt's time ran out (tonic's server answers CANCELLED,
/// "Timeout expired", when a call's grpc-timeout passes).
pub(super) fn ran_out(code: Code) -> bool {
    matches!(code, Code::DeadlineExceeded | Code::Cancelled)
}

pub(super) fn retryable(status: &Status) -> bool {
    // Unavailable: no leader, no quorum, node down (connection refused). DeadlineExceeded
    // of one attempt while the call's own deadline still has time: try another node.
    // Cancelled: the attempt's time ran out or the stream was reset. ResourceExhausted: the
    // leader shed the call before proposing it; back off and retry. A lost reply (a broken
    // connection, whatever code tonic gave it): like a timeout. Every call is safe to repeat.
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted)
        || lost_reply(status).is_some()
}

/// Why the reply to a call was lost, when the status says it was: the connection under the
/// call broke, or HTTP/2 closed it, before an answer arrived. The call may have been carried
/// out, so this is a timeout's "outcome unknown", never a refusal.
///
/// tonic gives a broken connection no code of its own. A status made on this side of the
/// connection carries the transport's error as its source, so that chain is checked first:
/// an h2, hyper, IO or tonic transport error below the status is a broken connection, whatever code
/// tonic chose for it (INTERNAL for a reset stream or an h2 protocol error, UNKNOWN for a
/// closed connection, RESOURCE_EXHAUSTED for a GOAWAY with ENHANCE_YOUR_CALM). A status from
/// the server has no source: only tonic's own wording for an h2 failure is taken as one, so a
/// real INTERNAL error of the node (a storage failure) stays a determinate error.
pub(super) fn lost_reply(status: &Status) -> Option<&'static str> {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<h2::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
            || e.is::<tonic::transport::Error>()
        {
            return Some("the connection to the node broke before the answer arrived");
        }
        source = e.source();
    }
    match status.code() {
        Code::Internal | Code::Unknown if status.message().starts_with("h2 protocol error:") => {
            Some("the HTTP/2 connection to the node broke before the answer arrived")
        }
        // No gRPC status at all: something below gRPC ended the call.
        Code::Unknown => Some("the call ended without a gRPC status"),
        // The node marks every call it sheds; an unmarked one was ended by HTTP/2 (a GOAWAY
        // with ENHANCE_YOUR_CALM), possibly after the node had taken it.
        Code::ResourceExhausted if !never_proposed(status) => {
            Some("HTTP/2 closed the connection to the node as overloaded before the answer arrived")
        }
        _ => None,
    }
}

/// The error of a call whose deadline ran out, `last` being the most telling answer of its
/// attempts. When an earlier attempt may have taken effect, a determinate refusal after it
/// (an overloaded leader shedding the retry) does not make the outcome known.
pub(super) fn gave_up(last: &Status, maybe_applied: bool) -> Error {
    match Error::from_status(last) {
        e if e.is_indeterminate() || !maybe_applied => e,
        e => Error::Indeterminate(format!(
            "an earlier attempt got no answer and may have taken effect, and the last was refused ({e}); \
             repeat the call with the same arguments"
        )),
    }
}

/// Whether the node says the call was refused before it was proposed. The code alone does not
/// prove it: tonic also reports an HTTP/2 GOAWAY with ENHANCE_YOUR_CALM as RESOURCE_EXHAUSTED,
/// and that can end calls the leader had already taken.
pub(super) fn never_proposed(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted && status.metadata().contains_key(NOT_PROPOSED_HEADER)
}
