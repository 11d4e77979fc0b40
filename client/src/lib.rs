//! `idemraft-client` will own the client side of Idemraft: the SDK (leader discovery and
//! caching, retries with jittered backoff inside the caller's deadline, the `execute` helper
//! that keeps a lease alive while work runs, request fingerprints per RFC 8785) and the
//! `idemctl` operator CLI.
//!
//! It is empty today on purpose: there is no server to talk to until the node lands.
