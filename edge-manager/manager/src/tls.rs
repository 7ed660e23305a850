//! Certificates: the manager's own (device listener) and one per EPS
//! instance (protocol spec §2.3). Both are self-signed; devices pin the
//! SHA-256 of the SubjectPublicKeyInfo instead of trusting a CA: the
//! manager's pin travels inside the user's credential, the instance's in
//! its enrolment bundle.

use std::path::Path;

use sha2::{Digest, Sha256};

/// Makes a key and a self-signed certificate for `names` (IP addresses or
/// DNS names) unless `dir` already holds them; returns the SPKI pin (hex).
pub fn ensure_cert(dir: &Path, names: &[String]) -> Result<String, String> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if !(cert.exists() && key.exists()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let key_pair = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
        let c = params.self_signed(&key_pair).map_err(|e| e.to_string())?;
        write_private(&key, key_pair.serialize_pem().as_bytes())?;
        std::fs::write(&cert, c.pem()).map_err(|e| format!("{}: {e}", cert.display()))?;
    }
    pin_of(&key)
}

/// The SPKI pin (hex) of the key in a PEM file.
pub fn pin_of(key_pem: &Path) -> Result<String, String> {
    let pem = std::fs::read_to_string(key_pem).map_err(|e| format!("{}: {e}", key_pem.display()))?;
    let key = rcgen::KeyPair::from_pem(&pem).map_err(|e| format!("{}: {e}", key_pem.display()))?;
    Ok(hex::encode(Sha256::digest(key.public_key_der())))
}

/// Writes a file readable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A rustls server configuration from a cert and key in `dir`.
pub fn server_config(dir: &Path) -> Result<rustls::ServerConfig, String> {
    let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(std::fs::File::open(dir.join("cert.pem")).map_err(|e| e.to_string())?))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key =
        rustls_pemfile::private_key(&mut std::io::BufReader::new(std::fs::File::open(dir.join("key.pem")).map_err(|e| e.to_string())?))
            .map_err(|e| e.to_string())?
            .ok_or("no private key in key.pem")?;
    rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())
}
