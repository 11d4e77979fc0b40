//! `idemraft-node` will own the `idemraft` server process: configuration (flags, `IDEMRAFT_*`
//! environment variables, TOML file), the client and peer gRPC services, the openraft network,
//! the proposer that groups client commands into one log entry, leader forwarding, the expiry
//! sweeper, metrics and health endpoints, and graceful shutdown.
//!
//! It is empty today on purpose: the replicated state machine and its storage
//! (`idemraft-store`) come first, and no server binary is shipped until it really serves.
