//! `idemraft-node` owns the `idemraft` server process: configuration (flags, `IDEMRAFT_*`
//! environment variables, TOML file), the openraft instance over the `idemraft-store`
//! stores, the gRPC network between peers, the proposer that groups client commands into one
//! log entry and stamps the leader's clock, routing of calls to the leader (followers
//! forward), linearizable reads, the expiry sweeper, elections after a pre-vote, the client,
//! admin and peer services, the HTTP health endpoints, metrics and tracing, and graceful
//! shutdown.
//!
//! The modules form layers whose imports only point down (top first):
//! - [`server`]: starts and stops the process, wiring every layer below;
//! - [`api`]: the gRPC services (checks, conversions, status mapping) and the backup stream;
//! - [`ops`]: metrics, per-RPC instrumentation, health and reflection, the HTTP endpoints;
//! - [`cluster`]: the node, proposer, elections, peer network, fast reads, identity and
//!   restore; it reports to `ops` only through [`cluster::observer::ClusterObserver`];
//! - [`config`]: options and their resolution into a checked [`Config`];
//! - [`security`]: TLS and bearer-token authentication;
//! - [`error`] and [`wire`]: the errors that cross layers and the peer port's messages.
//!
//! A claim's path: [`api::client`] checks and converts the request, [`cluster::node`] routes it
//! to the leader, [`cluster::proposer`] batches and proposes it, openraft replicates and
//! commits it, `idemraft-store` applies it, and the outcome flows back the same way. Before
//! [`api::client`] sees a call, [`security::tls`] has terminated TLS and [`security::auth`] has
//! checked its bearer token and bound its tenant. A claim whose answer is already settled (a
//! replay, a mismatch) is answered on the leader by [`cluster::fast_read`] with a
//! linearizable read instead.

pub mod api;
pub mod cluster;
pub mod config;
pub mod error;
pub mod ops;
pub mod security;
pub mod server;
pub mod wire;

pub use cluster::node::Node;
pub use config::{Config, Options};
