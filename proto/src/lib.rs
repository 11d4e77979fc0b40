//! `idemraft-proto` will own Idemraft's wire contract: the `.proto` files for the client API,
//! the admin API and the peer (Raft RPC) service, and the tonic/prost code generated from them
//! at build time with a crate-shipped `protoc`.
//!
//! It is empty today on purpose. The gRPC services arrive together with the `idemraft` node;
//! until then nothing in the workspace speaks gRPC, and this crate exports nothing that could
//! be mistaken for a working API.
