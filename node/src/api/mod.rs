//! The gRPC services a node serves: the client API ([`client`]), the operator API
//! ([`admin`]), the peer service ([`peer`], and the peer link beside it on the same port, [`peer_link`]) and the backup stream ([`snapshot`]), with the
//! protobuf conversions they share ([`convert`]). Checks and converts requests, hands them to
//! the cluster layer and maps its answers to gRPC statuses.

pub mod admin;
pub mod client;
pub mod convert;
pub mod in_process;
pub mod peer;
pub mod peer_link;
pub mod snapshot;
