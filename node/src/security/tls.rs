//! TLS for the node's two gRPC ports (rustls through tonic): loading and checking the PEM
//! files at start, the server side of the client port (TLS, optionally requiring client
//! certificates) and of the peer port (mutual TLS: a peer must present a certificate signed by
//! `--peer-tls-ca`), and the client side of peer channels (the node presents its own
//! certificate and verifies the peer's against the same CA, by the host part of the peer's
//! advertised address).
//!
//! It also owns the rule for running without TLS: plaintext is accepted only where it cannot
//! leave the machine (every address involved is loopback), unless `--insecure-plaintext` says
//! otherwise. The HTTP health port is outside this rule: it carries no keys or tokens.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

use crate::error::ConfigError;

/// A TLS handshake that takes longer is dropped, so half-open connections cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A private key's PEM. `Debug` prints only its length, so a logged configuration leaks nothing.
#[derive(Clone)]
pub struct KeyPem(Vec<u8>);

impl std::fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPem(<{} bytes, redacted>)", self.0.len())
    }
}

/// The client port's TLS: `--tls-cert`, `--tls-key`, `--tls-client-ca`.
#[derive(Clone, Debug)]
pub struct ClientPortTls {
    /// Certificate chain, PEM.
    pub cert: Vec<u8>,
    /// Private key.
    pub key: KeyPem,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<Vec<u8>>,
}

/// Mutual TLS between peers: `--peer-tls-cert`, `--peer-tls-key`, `--peer-tls-ca`.
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// This node's certificate chain, PEM: served on the peer port and presented when dialling.
    pub cert: Vec<u8>,
    /// Its private key.
    pub key: KeyPem,
    /// The CA every peer's certificate must be signed by, PEM.
    pub ca: Vec<u8>,
}

fn bad(option: &str, problem: String, fix: &str) -> ConfigError {
    ConfigError { option: option.to_string(), problem, fix: fix.to_string() }
}

fn read(option: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        bad(option, format!("cannot read {}: {e}", path.display()), "check the path and that the node may read it")
    })
}

/// Reads a PEM certificate (chain) file, refusing one that holds no certificate.
pub fn load_cert(option: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let pem = read(option, path)?;
    let certs: Result<Vec<CertificateDer<'_>>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(pem),
        Ok(_) => Err(bad(
            option,
            format!("{} holds no PEM certificate", path.display()),
            "give a file with -----BEGIN CERTIFICATE----- blocks (idemctl dev-certs makes some)",
        )),
        Err(e) => Err(bad(
            option,
            format!("{} is not a readable PEM certificate file: {e}", path.display()),
            "give a PEM file with -----BEGIN CERTIFICATE----- blocks",
        )),
    }
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(option: &str, path: &Path) -> Result<KeyPem, ConfigError> {
    let pem = read(option, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        bad(
            option,
            format!("{} holds no usable PEM private key: {e}", path.display()),
            "give the key that belongs to the certificate, PEM (-----BEGIN PRIVATE KEY-----)",
        )
    })?;
    Ok(KeyPem(pem))
}

/// Whether a host (an IP address or a name) is this machine's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    match h.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => h.eq_ignore_ascii_case("localhost"),
    }
}

/// The host part of `HOST:PORT` (brackets of an IPv6 literal removed).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Refuses plaintext on a port that other machines could reach, unless the operator said
/// `--insecure-plaintext`. `peers` are the addresses this node dials (initial cluster, routes).
pub fn check_plaintext(
    insecure: bool,
    client: (SocketAddr, bool),
    peer: (SocketAddr, bool),
    peers: &[&str],
) -> Result<(), ConfigError> {
    if insecure {
        return Ok(());
    }
    let (client_addr, client_tls) = client;
    if !client_tls && !client_addr.ip().is_loopback() {
        return Err(bad(
            "--client-addr",
            format!("{client_addr} is reachable from other machines, and the client port has no TLS"),
            "give --tls-cert and --tls-key (idemctl dev-certs makes a test set), listen on 127.0.0.1, \
             or accept plaintext explicitly with --insecure-plaintext",
        ));
    }
    let (peer_addr, peer_tls) = peer;
    if !peer_tls {
        let remote = std::iter::once(peer_addr.to_string())
            .chain(peers.iter().map(|p| p.to_string()))
            .find(|a| !is_loopback_host(host_of(a)));
        if let Some(a) = remote {
            return Err(bad(
                "--peer-addr",
                format!("peer traffic would cross the network in plaintext ({a} is not loopback)"),
                "give --peer-tls-cert, --peer-tls-key and --peer-tls-ca for mutual TLS between nodes, \
                 keep every node on 127.0.0.0/8, or accept plaintext explicitly with --insecure-plaintext",
            ));
        }
    }
    Ok(())
}

fn server_builder(identity: Identity, ca: Option<&[u8]>, option: &str) -> Result<Server, String> {
    let mut tls = ServerTlsConfig::new().identity(identity).timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = ca {
        // client_auth_optional stays false: a client without a certificate signed by `ca` is
        // refused during the handshake, before any gRPC call is read.
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    Server::builder().tls_config(tls).map_err(|e| {
        format!("{option}: the certificate or key cannot be used: {e}; check that the key belongs to the certificate")
    })
}

/// The server builder for the client port: TLS when configured, else plaintext.
pub fn client_server(tls: Option<&ClientPortTls>) -> Result<Server, String> {
    match tls {
        None => Ok(Server::builder()),
        Some(t) => {
            server_builder(Identity::from_pem(&t.cert, &t.key.0), t.client_ca.as_deref(), "--tls-cert/--tls-key")
        }
    }
}

/// The server builder for the peer port: mutual TLS when configured, else plaintext.
pub fn peer_server(tls: Option<&PeerTls>) -> Result<Server, String> {
    match tls {
        None => Ok(Server::builder()),
        Some(t) => server_builder(Identity::from_pem(&t.cert, &t.key.0), Some(&t.ca), "--peer-tls-cert/--peer-tls-key"),
    }
}

/// An endpoint for dialling a peer at `dial` (its advertised address, or a `--peer-route`).
/// With mutual TLS the peer's certificate must be valid for the host of `advertised`: a route
/// (a proxy, a sidecar) changes where the bytes go, not whom the node expects to reach.
pub fn peer_endpoint(dial: &str, advertised: &str, tls: Option<&PeerTls>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{dial}"))
        .map_err(|e| format!("peer address '{dial}' is not usable: {e}"))?;
    let Some(t) = tls else { return Ok(endpoint) };
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&t.ca))
        .identity(Identity::from_pem(&t.cert, &t.key.0))
        .domain_name(host_of(advertised));
    endpoint.tls_config(config).map_err(|e| format!("mutual TLS towards '{advertised}' cannot be set up: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "127.77.3.4", "::1", "[::1]", "localhost", "LOCALHOST"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["0.0.0.0", "10.0.0.1", "node1.internal", "::", "[2001:db8::1]"] {
            assert!(!is_loopback_host(h), "{h}");
        }
        assert_eq!(host_of("[::1]:7201"), "::1");
        assert_eq!(host_of("node1:7201"), "node1");
    }
}
