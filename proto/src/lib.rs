//! `idemraft-proto` owns Idemraft's wire contract: `proto/idemraft/v1/idemraft.proto`, with
//! the client API (`Idempotency`), the operator API (`Admin`) and the peer service (`Raft`),
//! and the tonic/prost code generated from it at build time with a crate-shipped `protoc`.
//!
//! The build also emits the encoded descriptors as [`FILE_DESCRIPTOR_SET`], which the node
//! serves through gRPC reflection.
//!
//! Generated code is not committed: the build regenerates it, so the `.proto` file is the one
//! source of truth, and its comments are the API reference.

#![allow(missing_docs)] // the generated code carries the .proto comments, not Rust doc conventions
#![allow(clippy::all)]

/// Version 1 of the API. Names follow the `.proto` file.
pub mod v1 {
    tonic::include_proto!("idemraft.v1");
}

/// The encoded `FileDescriptorSet` of `idemraft.proto`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idemraft_descriptor.bin"));

/// gRPC metadata key of the leader's node id, set on UNAVAILABLE when the leader is known.
pub const LEADER_ID_HEADER: &str = "idemraft-leader-id";
/// gRPC metadata key of the leader's client address, set on UNAVAILABLE when it is known.
pub const LEADER_ADDR_HEADER: &str = "idemraft-leader-addr";
/// gRPC metadata key set on RESOURCE_EXHAUSTED when the leader's write queue refused the call
/// before proposing it, so it certainly had no effect. RESOURCE_EXHAUSTED without it may come
/// from the transport (HTTP/2 closing a connection with ENHANCE_YOUR_CALM) after the call
/// was already taken.
pub const NOT_PROPOSED_HEADER: &str = "idemraft-not-proposed";
/// gRPC metadata key naming the node that answered (its id), set on every reply.
pub const SERVED_BY_HEADER: &str = "idemraft-served-by";
/// gRPC metadata key of the tenant whose record quota refused a claim (FAILED_PRECONDITION).
pub const QUOTA_TENANT_HEADER: &str = "idemraft-quota-tenant";
/// gRPC metadata key of the quota that refused a claim: its presence marks a quota refusal.
pub const QUOTA_LIMIT_HEADER: &str = "idemraft-quota-limit";
/// gRPC metadata key of the records the tenant held when its claim was refused.
pub const QUOTA_RECORDS_HEADER: &str = "idemraft-quota-records";
