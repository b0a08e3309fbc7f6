//! New certificates made with rcgen, for `palisade tls init`: two CAs, so that no client can
//! hold a certificate a node takes for a peer's.
//!
//! - the **cluster CA** (`ca.pem`) signs the nodes' certificates (server and client
//!   authentication: for clients, and for the node's links to its peers) and the fenced
//!   store's (server authentication only, so a store host is no peer). Clients trust it
//!   (`--tls-ca`) and nodes check their peers against it (`--tls-peer-ca`);
//! - the **client CA** (`client-ca.pem`) signs client certificates, which the lock service and
//!   the store check clients against (`--tls-client-ca`).
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
    /// The cluster CA: it signs the nodes' and the store's certificates. Clients trust it, and
    /// nodes check their peers against it.
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// A node's certificate: server authentication for clients, client authentication towards
    /// its peers. Only nodes may hold it: it makes its holder a peer.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// The fenced store's certificate: server authentication only.
    pub store_cert: PathBuf,
    pub store_key: PathBuf,
    /// The client CA: it signs client certificates only.
    pub client_ca_cert: PathBuf,
    pub client_ca_key: PathBuf,
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
            store_cert: dir.join("store.pem"),
            store_key: dir.join("store.key"),
            client_ca_cert: dir.join("client-ca.pem"),
            client_ca_key: dir.join("client-ca.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    fn all(&self) -> [&PathBuf; 10] {
        [
            &self.ca_cert,
            &self.ca_key,
            &self.server_cert,
            &self.server_key,
            &self.store_cert,
            &self.store_key,
            &self.client_ca_cert,
            &self.client_ca_key,
            &self.client_cert,
            &self.client_key,
        ]
    }
}

/// A new CA named `common_name`, self-signed.
fn new_ca(common_name: &str) -> Result<(Issuer<'static, KeyPair>, String, String), TlsError> {
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params);
    let cert = params.self_signed(&key).map_err(generate)?;
    let key_pem = key.serialize_pem();
    Ok((Issuer::new(params, key), cert.pem(), key_pem))
}

/// A certificate signed by `issuer`: for `hosts` (DNS names or IP addresses), named
/// `common_name`, for `usages`. Returns the certificate and its key, in PEM.
fn new_leaf(
    issuer: &Issuer<'_, KeyPair>,
    hosts: &[String],
    common_name: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> Result<(String, String), TlsError> {
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(generate)?;
    params.distinguished_name = name(common_name);
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params);
    let cert = params.signed_by(&key, issuer).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Makes, in `dir` (created if missing): the cluster CA, a node certificate and a store
/// certificate signed by it, valid for `hosts` (DNS names or IP addresses, at least one); and
/// the client CA with a client certificate whose common name is `client_name`.
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

    let (cluster_ca, ca_cert, ca_key) = new_ca("palisade cluster CA")?;
    let (server_cert, server_key) = new_leaf(
        &cluster_ca,
        hosts,
        "palisade node",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )?;
    let (store_cert, store_key) = new_leaf(
        &cluster_ca,
        hosts,
        "palisade store",
        vec![ExtendedKeyUsagePurpose::ServerAuth],
    )?;
    let (client_ca, client_ca_cert, client_ca_key) = new_ca("palisade client CA")?;
    let (client_cert, client_key) = new_leaf(
        &client_ca,
        &[],
        client_name,
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;

    let written: [(&PathBuf, &String, u32); 10] = [
        (&files.ca_cert, &ca_cert, 0o644),
        (&files.ca_key, &ca_key, KEY_FILE_MODE),
        (&files.server_cert, &server_cert, 0o644),
        (&files.server_key, &server_key, KEY_FILE_MODE),
        (&files.store_cert, &store_cert, 0o644),
        (&files.store_key, &store_key, KEY_FILE_MODE),
        (&files.client_ca_cert, &client_ca_cert, 0o644),
        (&files.client_ca_key, &client_ca_key, KEY_FILE_MODE),
        (&files.client_cert, &client_cert, 0o644),
        (&files.client_key, &client_key, KEY_FILE_MODE),
    ];
    for (path, pem, mode) in written {
        write_new(path, pem.as_bytes(), mode)?;
    }
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
        for key in [
            &files.ca_key,
            &files.server_key,
            &files.store_key,
            &files.client_ca_key,
            &files.client_key,
        ] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let error = init(dir.path(), &["localhost".into()], "ops").unwrap_err();
        assert!(error.to_string().contains("already exists"), "{error}");
    }
}
