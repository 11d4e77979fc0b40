//! Who may talk to a node: TLS on the client and peer ports ([`tls`]) and bearer tokens bound
//! to tenants ([`auth`]). Below the configuration, which loads these materials when it
//! resolves, and below everything that serves.

pub mod auth;
pub mod tls;
