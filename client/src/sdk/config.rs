//! Client settings: endpoints, tenant, deadlines and backoff, TLS and the bearer token.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Status;

use super::*;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Client addresses of some or all nodes, `host:port` or `http://host:port`.
    pub endpoints: Vec<String>,
    /// Tenant of every record this client touches. Empty (the default) lets the node decide:
    /// the bearer token's tenant when the node checks tokens, `default` when it does not. A
    /// node that checks tokens refuses any other tenant than the token's.
    pub tenant: String,
    /// Deadline of a call when the caller gives none.
    pub deadline: Duration,
    /// Longest single attempt, so a hung node costs one attempt and not the whole deadline.
    pub attempt_timeout: Duration,
    /// First backoff after an UNAVAILABLE; doubles up to `backoff_max`, with full jitter.
    pub backoff_base: Duration,
    /// Backoff bound.
    pub backoff_max: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// PEM of the CA that signed the nodes' certificates. Set, endpoints without a scheme (and
    /// the leader addresses nodes hand back) are dialled with `https://`, verified against
    /// this CA only: the system's roots are never trusted for a cluster.
    pub tls_ca: Option<Vec<u8>>,
    /// A client certificate, for nodes started with `--tls-client-ca`.
    pub tls_identity: Option<TlsIdentity>,
    /// Sent as `authorization: Bearer <token>` on every call, for nodes started with
    /// `--tokens-file`; the node takes the tenant from it.
    pub bearer_token: Option<BearerToken>,
}

/// A client certificate chain and its private key, both PEM. `Debug` leaves the key out.
#[derive(Clone)]
pub struct TlsIdentity {
    /// Certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Private key, PEM.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").field("cert_pem", &format!("{} bytes", self.cert_pem.len())).finish()
    }
}

/// A bearer token. `Debug` never prints it, so a logged [`ClientConfig`] leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// Wraps a token (surrounding whitespace, such as a file's trailing newline, is dropped).
    pub fn new(token: impl Into<String>) -> BearerToken {
        BearerToken(token.into().trim().to_string())
    }

    /// The token itself.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

pub(super) fn read_pem(what: &str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Config(format!("cannot read the {what} {}: {e}", path.display())))
}

impl ClientConfig {
    /// Settings for these endpoints with the defaults: the node's tenant, deadline 10 s,
    /// attempts of at most 2 s, backoff 20 ms doubling to 250 ms.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tenant: String::new(),
            deadline: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(500),
            tls_ca: None,
            tls_identity: None,
            bearer_token: None,
        }
    }

    /// Reads the CA (and optionally a client certificate and key) from PEM files into
    /// [`ClientConfig::tls_ca`] and [`ClientConfig::tls_identity`].
    pub fn with_tls_files(
        mut self,
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<ClientConfig, Error> {
        self.tls_ca = Some(read_pem("CA certificate", ca)?);
        if let Some((cert, key)) = identity {
            self.tls_identity = Some(TlsIdentity {
                cert_pem: read_pem("client certificate", cert)?,
                key_pem: read_pem("client key", key)?,
            });
        }
        Ok(self)
    }
}

/// Adds the bearer token, if any, to every call. An interceptor on the channel rather than a
/// line per call, so no call (a new one included) can go out without it.
#[derive(Clone)]
pub struct AddBearer(Option<MetadataValue<Ascii>>);

impl AddBearer {
    pub(super) fn new(config: &ClientConfig) -> Result<AddBearer, Error> {
        let Some(token) = &config.bearer_token else { return Ok(AddBearer(None)) };
        if token.secret().is_empty() {
            return Err(Error::Config("the bearer token is empty: give the token from the tokens file's owner".into()));
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {}", token.secret()).parse().map_err(|_| {
            Error::Config("the bearer token has characters that cannot go in a header: use printable ASCII".into())
        })?;
        // Never put the token in HPACK's dynamic table, where a compression side channel
        // could recover it.
        value.set_sensitive(true);
        Ok(AddBearer(Some(value)))
    }
}

impl tonic::service::Interceptor for AddBearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A connection to one node, with the bearer token attached to every call.
pub type Conn = InterceptedService<Channel, AddBearer>;
