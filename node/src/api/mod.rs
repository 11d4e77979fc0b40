//! The gRPC services a node serves: the client and admin API and the peer service
//! ([`grpc`]), and the backup stream ([`snapshot`]). Checks and converts requests, hands them
//! to the cluster layer and maps its answers to gRPC statuses.

pub mod grpc;
pub mod snapshot;
