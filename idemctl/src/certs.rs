//! Throwaway certificates for a development or test cluster (`idemctl dev-certs`): one CA,
//! one certificate per node (usable as a TLS server on the client and peer ports and as a TLS
//! client between peers), and one client certificate for `idemctl` or an SDK user when the
//! client port asks for client certificates. Production clusters should use certificates from
//! their own PKI; nothing here is meant to live long.
//!
//! The CA's private key is never written: the set is regenerated as a whole, so a leaked
//! directory cannot be used to mint more certificates.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Names every generated certificate carries, so a local cluster on 127.0.0.1 (or `localhost`)
/// verifies without extra flags.
pub const DEFAULT_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The files one [`generate`] call wrote.
#[derive(Clone, Debug)]
pub struct DevCerts {
    /// The CA certificate: `--tls-client-ca`, `--peer-tls-ca`, `idemctl --ca`.
    pub ca: PathBuf,
    /// Per node, `(certificate, private key)`: `--tls-cert`/`--tls-key` and
    /// `--peer-tls-cert`/`--peer-tls-key`.
    pub nodes: Vec<(PathBuf, PathBuf)>,
    /// A client certificate and key: `idemctl --cert`/`--key`.
    pub client: (PathBuf, PathBuf),
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("cannot make the {what}: {e}")
}

fn write(path: &Path, text: &str, secret: bool) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot make {} private: {e}", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    Ok(())
}

fn leaf(
    name: &str,
    sans: &[String],
    usages: &[ExtendedKeyUsagePurpose],
    ca: &Issuer<'_, KeyPair>,
) -> Result<(String, String), String> {
    let mut params = CertificateParams::new(sans.to_vec()).map_err(|e| err(&format!("{name} certificate"), e))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = usages.to_vec();
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(|e| err(&format!("{name} key"), e))?;
    let cert = params.signed_by(&key, ca).map_err(|e| err(&format!("{name} certificate"), e))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes a fresh CA, `nodes` node certificates and a client certificate into `dir`
/// (created if missing; existing files of the same names are replaced). Every certificate
/// names [`DEFAULT_SANS`] plus `extra_sans` (DNS names or IP addresses).
///
/// Files: `ca.pem`, `node-<i>.pem` / `node-<i>.key` for i in 1..=nodes, `client.pem` /
/// `client.key`. Keys are written readable by their owner only.
pub fn generate(dir: &Path, nodes: u32, extra_sans: &[String]) -> Result<DevCerts, String> {
    if nodes == 0 || nodes > 99 {
        return Err(format!("{nodes} nodes is out of range: make certificates for 1 to 99 nodes"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut sans: Vec<String> = DEFAULT_SANS.iter().map(|s| s.to_string()).collect();
    for s in extra_sans {
        let s = s.trim();
        if !s.is_empty() && !sans.iter().any(|x| x == s) {
            sans.push(s.to_string());
        }
    }

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA", e))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "idemraft development CA");
    ca_params.distinguished_name = dn;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(|e| err("CA", e))?;
    let issuer = Issuer::new(ca_params, ca_key);

    let ca = dir.join("ca.pem");
    write(&ca, &ca_cert.pem(), false)?;
    // A node's certificate serves TLS on its ports and is also its client certificate when it
    // dials a peer: both extended key usages.
    let both = [ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let mut out = Vec::new();
    for i in 1..=nodes {
        let (cert, key) = leaf(&format!("idemraft node {i}"), &sans, &both, &issuer)?;
        let (cp, kp) = (dir.join(format!("node-{i}.pem")), dir.join(format!("node-{i}.key")));
        write(&cp, &cert, false)?;
        write(&kp, &key, true)?;
        out.push((cp, kp));
    }
    let (cert, key) = leaf("idemraft client", &sans, &[ExtendedKeyUsagePurpose::ClientAuth], &issuer)?;
    let client = (dir.join("client.pem"), dir.join("client.key"));
    write(&client.0, &cert, false)?;
    write(&client.1, &key, true)?;
    Ok(DevCerts { ca, nodes: out, client })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_nodes_and_a_client() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let certs = generate(dir.path(), 2, &["127.77.1.1".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(certs.nodes.len(), 2);
        for p in [&certs.ca, &certs.nodes[1].0, &certs.client.0] {
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{e}"));
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{}", p.display());
        }
        let key = std::fs::read_to_string(&certs.nodes[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert!(key.contains("PRIVATE KEY"));
        assert!(!dir.path().join("ca.key").exists(), "the CA key is never written");
        assert!(generate(dir.path(), 0, &[]).is_err());
    }
}
