//! New certificates made with rcgen: a CA, a node certificate signed by it (for the lock
//! service's listener, its peer links and the fenced store), and a client certificate.
//!
//! Private keys are written with mode 0600 and no file is ever overwritten: [`init`] refuses a
//! directory that already holds any of the files it would write.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::TlsError;

/// The mode of every private key file written here.
pub const KEY_FILE_MODE: u32 = 0o600;
/// How long the certificates [`init`] makes are valid.
pub const VALIDITY_DAYS: i64 = 825;

/// The files [`init`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// The node's certificate: server authentication for clients, client authentication
    /// towards its peers.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Generated {
    fn in_dir(dir: &Path) -> Generated {
        Generated {
            ca_cert: dir.join("ca.pem"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    fn all(&self) -> [&PathBuf; 6] {
        [
            &self.ca_cert,
            &self.ca_key,
            &self.server_cert,
            &self.server_key,
            &self.client_cert,
            &self.client_key,
        ]
    }
}

/// Makes a new CA in `dir` (created if missing), a node certificate valid for `hosts` (DNS
/// names or IP addresses, at least one) and a client certificate whose common name is
/// `client_name`, all signed by the CA.
pub fn init(dir: &Path, hosts: &[String], client_name: &str) -> Result<Generated, TlsError> {
    if hosts.is_empty() {
        return Err(TlsError::Generate(
            "a node certificate needs at least one host".into(),
        ));
    }
    let files = Generated::in_dir(dir);
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    if let Some(existing) = files.all().into_iter().find(|p| p.exists()) {
        return Err(TlsError::Write {
            path: existing.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "already exists; init never overwrites (use another directory)",
            ),
        });
    }
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());

    let ca_key = KeyPair::generate().map_err(generate)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    ca.distinguished_name = name("palisade CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key).map_err(generate)?;
    let issuer = Issuer::new(ca, &ca_key);

    let server_key = KeyPair::generate().map_err(generate)?;
    let mut server = CertificateParams::new(hosts.to_vec()).map_err(generate)?;
    server.distinguished_name = name("palisade node");
    server.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    server.use_authority_key_identifier_extension = true;
    validity(&mut server);
    let server_cert = server.signed_by(&server_key, &issuer).map_err(generate)?;

    let client_key = KeyPair::generate().map_err(generate)?;
    let mut client = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    client.distinguished_name = name(client_name);
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client.use_authority_key_identifier_extension = true;
    validity(&mut client);
    let client_cert = client.signed_by(&client_key, &issuer).map_err(generate)?;

    write_new(&files.ca_cert, ca_cert.pem().as_bytes(), 0o644)?;
    write_new(
        &files.ca_key,
        ca_key.serialize_pem().as_bytes(),
        KEY_FILE_MODE,
    )?;
    write_new(&files.server_cert, server_cert.pem().as_bytes(), 0o644)?;
    write_new(
        &files.server_key,
        server_key.serialize_pem().as_bytes(),
        KEY_FILE_MODE,
    )?;
    write_new(&files.client_cert, client_cert.pem().as_bytes(), 0o644)?;
    write_new(
        &files.client_key,
        client_key.serialize_pem().as_bytes(),
        KEY_FILE_MODE,
    )?;
    Ok(files)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn validity(params: &mut CertificateParams) {
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
    // An hour back, for clocks a little behind this one.
    params.not_before = now - std::time::Duration::from_secs(3_600);
    params.not_after = now + std::time::Duration::from_secs(VALIDITY_DAYS as u64 * 86_400);
}

/// Writes `bytes` to a new file `path` with `mode`; an existing file is an error.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().map_err(|source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn init_writes_keys_0600_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let files = init(dir.path(), &["localhost".into(), "127.0.0.1".into()], "ops").unwrap();
        for key in [&files.ca_key, &files.server_key, &files.client_key] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let error = init(dir.path(), &["localhost".into()], "ops").unwrap_err();
        assert!(error.to_string().contains("already exists"), "{error}");
    }
}
