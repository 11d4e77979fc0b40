//! `idemraft-node` owns the `idemraft` server process: configuration (flags, `IDEMRAFT_*`
//! environment variables, TOML file), the openraft instance over the `idemraft-store` sled
//! stores, the gRPC network between peers, the proposer that groups client commands into one
//! log entry and stamps the leader's clock, routing of calls to the leader (followers
//! forward), linearizable reads, the expiry sweeper, the HTTP health endpoints, metrics and
//! tracing ([`metrics`], [`instrument`], [`health`]), elections after a pre-vote
//! ([`election`]) and graceful shutdown.
//!
//! A claim's path through this crate: [`grpc`] checks and converts the request, [`node`]
//! routes it to the leader, [`proposer`] batches and proposes it, openraft replicates and
//! commits it, `idemraft-store` applies it, and the outcome flows back the same way.
//! Before [`grpc`] sees a call, [`tls`] has terminated TLS and [`auth`] has checked its bearer
//! token and bound its tenant.
//! A claim whose answer is already settled (a replay, a mismatch) is answered on the leader by
//! [`fast_read`] with a linearizable read instead.

pub mod auth;
pub mod backup;
pub mod config;
pub mod election;
pub mod error;
pub mod fast_read;
pub mod grpc;
pub mod health;
pub mod http;
pub mod identity;
pub mod instrument;
pub mod metrics;
pub mod network;
pub mod node;
pub mod proposer;
pub mod server;
pub mod tls;
pub mod wire;

pub use config::{Config, Options};
pub use node::Node;
