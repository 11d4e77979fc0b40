//! Proves that nothing a peer can send crashes a node's decoder: arbitrary bytes fed to the
//! node's own bounded peer codec (`idemraft_node::wire::decode`, the call the peer gRPC service
//! makes on every `RaftMessage` payload) never panic and never allocate without bound.
//!
//! Covered, exactly as the node decodes them: a forwarded call (`Request`) and its answer
//! (`Forwarded`), openraft's `AppendEntriesRequest`, `VoteRequest` and `InstallSnapshotRequest`
//! (what the peer service hands to Raft), and the three replies the Raft network decodes from
//! a peer, and the header of a peer-link request frame. Whatever decodes must re-encode and
//! decode again to the same bytes.

#![no_main]

use std::fmt::Debug;

use idemraft_node::wire::{self, Forwarded, Request};
use idemraft_store::TypeConfig;
use libfuzzer_sys::fuzz_target;
use openraft::error::{Infallible, InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Decodes `data` as `T` with the node's peer codec; when that succeeds, checks that
/// encode → decode → encode gives the same bytes. Most of these types have no `PartialEq`,
/// so the bytes are what is compared.
fn round_trip<T: Serialize + DeserializeOwned + Debug>(what: &str, data: &[u8]) {
    let Ok(value) = wire::decode::<T>(what, data) else { return };
    let first = match wire::encode(&value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("{what}: decoded {value:?} but it does not encode: {e}"),
    };
    let again: T = match wire::decode(what, &first) {
        Ok(v) => v,
        Err(e) => panic!("{what}: its own encoding {first:?} of {value:?} does not decode: {e}"),
    };
    let second = match wire::encode(&again) {
        Ok(bytes) => bytes,
        Err(e) => panic!("{what}: re-decoded {again:?} does not encode: {e}"),
    };
    assert_eq!(first, second, "{what}: encoding is not stable across a round trip of {value:?}");
}

fuzz_target!(|data: &[u8]| {
    // What the peer service decodes (node/src/api/client.rs, PeerApi::open).
    round_trip::<Request>("forwarded call", data);
    round_trip::<AppendEntriesRequest<TypeConfig>>("append-entries request", data);
    round_trip::<VoteRequest<u64>>("vote request", data);
    round_trip::<InstallSnapshotRequest<TypeConfig>>("install-snapshot request", data);
    // What a follower and the Raft network decode from a peer's answer (node/src/cluster/node.rs,
    // node/src/cluster/network.rs).
    round_trip::<Forwarded>("forwarded reply", data);
    round_trip::<Result<AppendEntriesResponse<u64>, RaftError<u64, Infallible>>>("append-entries reply", data);
    round_trip::<Result<VoteResponse<u64>, RaftError<u64, Infallible>>>("vote reply", data);
    round_trip::<Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>>(
        "install-snapshot reply",
        data,
    );
    // The body of a peer-link request frame (node/src/cluster/link.rs): its header is checked
    // before its payload reaches the decoders above.
    if let Ok(request) = idemraft_node::cluster::link::parse_request(data) {
        assert!(request.msg.payload.len() <= data.len(), "a frame's payload is never larger than the frame");
    }
});
