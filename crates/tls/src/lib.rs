//! TLS for Palisade: rustls configurations built from PEM files, the name of a verified
//! certificate, and new certificates made with rcgen (`palisade tls init`, tests).
//!
//! Every configuration uses rustls's `ring` provider explicitly (no process-wide default, no
//! aws-lc), TLS 1.2 and 1.3 with rustls's safe defaults. The lock service's gRPC listener, its
//! peer links and the fenced store all build their configurations here, so they load files,
//! check keys and report bad input the same way:
//!
//! - [`ClientTls`]: what a client trusts (a CA file) and, for mutual TLS, the certificate it
//!   presents;
//! - [`server_config`]: a server's certificate and key and, optionally, the CA its clients'
//!   certificates must chain to (required or optional);
//! - [`certificate_name`]: the identity of a verified certificate (its subject's common name,
//!   else its first DNS name);
//! - [`generate`]: a CA and certificates signed by it.
//!
//! **API Boundary:** a file that is missing, holds no PEM block of the expected kind, or a key
//! that does not match its certificate is a [`TlsError`] naming the file, at load time; nothing
//! here defers a bad file to the first handshake.

pub mod generate;
pub mod host;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The ALPN protocol of gRPC (HTTP/2).
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN protocol of the fenced store (HTTP/1.1).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why a TLS configuration could not be built. Each names the file and says what was wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file holds no usable PEM block of the expected kind, or a malformed one.
    #[error("{what} {} is not valid PEM: {reason}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The certificate and the key were read but rustls refuses them together (the key does
    /// not belong to the certificate, or is of a kind it does not support).
    #[error("certificate {} and key {} do not go together: {reason}", cert.display(), key.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    /// A CA file whose certificates rustls cannot use as trust anchors.
    #[error("CA {} cannot be trusted: {reason}", path.display())]
    Ca { path: PathBuf, reason: String },
    /// A client certificate was given without its key, or the other way round.
    #[error("{0}")]
    Incomplete(String),
    /// A host name that cannot be checked against a certificate.
    #[error("{host:?} is not a DNS name or IP address a certificate can be checked against")]
    ServerName { host: String },
    /// rcgen could not make a certificate.
    #[error("cannot generate a certificate: {0}")]
    Generate(String),
    /// Writing generated files.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The crypto provider every configuration here uses: rustls's `ring`.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its private key, read from PEM files and checked to match.
#[derive(Clone)]
pub struct Identity {
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Identity")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish()
    }
}

impl Identity {
    /// Reads the certificate chain in `cert` (PEM, leaf first) and the private key in `key`
    /// (PEM: PKCS#8, PKCS#1 or SEC1), and checks that the key is the certificate's.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        let certs = read_certs("certificate", cert)?;
        let pem = read("key", key)?;
        let private = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
            what: "key",
            path: key.to_path_buf(),
            reason: pem_reason(e, "PRIVATE KEY"),
        })?;
        let identity = Identity {
            certs,
            key: Arc::new(private),
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
        };
        // rustls checks that the key's public half is the certificate's.
        let signing = provider()
            .key_provider
            .load_private_key(identity.key.clone_key())
            .map_err(|e| identity.mismatch(e))?;
        rustls::sign::CertifiedKey::new(identity.certs.clone(), signing)
            .keys_match()
            .map_err(|e| identity.mismatch(e))?;
        Ok(identity)
    }

    fn mismatch(&self, error: rustls::Error) -> TlsError {
        TlsError::Mismatch {
            cert: self.cert_path.clone(),
            key: self.key_path.clone(),
            reason: error.to_string(),
        }
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.certs[0]
    }
}

/// Trust anchors read from a PEM file of one or more CA certificates.
#[derive(Clone)]
pub struct Roots {
    store: Arc<RootCertStore>,
    path: PathBuf,
}

impl fmt::Debug for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Roots").field("ca", &self.path).finish()
    }
}

impl Roots {
    /// Reads the CA certificates in `ca` (PEM); each must be usable as a trust anchor.
    pub fn from_file(ca: &Path) -> Result<Roots, TlsError> {
        Roots::from_files(&[ca])
    }

    /// The CA certificates of all of `cas` (PEM files), trusted alike.
    pub fn from_files(cas: &[&Path]) -> Result<Roots, TlsError> {
        let mut store = RootCertStore::empty();
        for ca in cas {
            for cert in read_certs("CA", ca)? {
                store.add(cert).map_err(|e| TlsError::Ca {
                    path: ca.to_path_buf(),
                    reason: e.to_string(),
                })?;
            }
        }
        let path = cas
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(",");
        Ok(Roots {
            store: Arc::new(store),
            path: PathBuf::from(path),
        })
    }

    /// A verifier of client certificates chaining to these roots; one without a certificate
    /// is let through when `optional`.
    pub fn client_verifier(&self, optional: bool) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let builder = WebPkiClientVerifier::builder_with_provider(self.store.clone(), provider());
        let builder = if optional {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        builder.build().map_err(|e| TlsError::Ca {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    /// Whether these roots and `other` hold a trust anchor in common (the same public key): a
    /// certificate chaining to one of them may then chain to the other.
    pub fn shares_a_root_with(&self, other: &Roots) -> bool {
        self.store.roots.iter().any(|mine| {
            other
                .store
                .roots
                .iter()
                .any(|theirs| mine.subject_public_key_info == theirs.subject_public_key_info)
        })
    }

    /// Whether `chain` (leaf first), presented by a client, chains to these roots and is valid
    /// for client authentication now.
    pub fn verifies_client(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        match self.client_verifier(false) {
            Ok(verifier) => verifier
                .verify_client_cert(leaf, intermediates, UnixTime::now())
                .is_ok(),
            Err(_) => false,
        }
    }
}

/// What a client of a Palisade server trusts, and what it presents for mutual TLS: a rustls
/// client configuration. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    description: String,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.description)
            .finish()
    }
}

/// Two configurations are equal when built from the same files.
impl PartialEq for ClientTls {
    fn eq(&self, other: &ClientTls) -> bool {
        self.description == other.description
    }
}

impl Eq for ClientTls {}

impl ClientTls {
    /// Trusts the CAs in `ca` and presents `identity`, if any, to servers that ask for a
    /// client certificate. `alpn` is the protocol offered ([`ALPN_H2`] for gRPC,
    /// [`ALPN_HTTP1`] for the store).
    pub fn new(
        roots: &Roots,
        identity: Option<&Identity>,
        alpn: &[u8],
    ) -> Result<ClientTls, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Ca {
                path: roots.path.clone(),
                reason: e.to_string(),
            })?
            .with_root_certificates(roots.store.clone());
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some(identity) => builder
                .with_client_auth_cert(identity.certs.clone(), identity.key.clone_key())
                .map_err(|e| identity.mismatch(e))?,
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        let description = match identity {
            None => format!("ca={}", roots.path.display()),
            Some(identity) => format!(
                "ca={} cert={} key={}",
                roots.path.display(),
                identity.cert_path.display(),
                identity.key_path.display()
            ),
        };
        Ok(ClientTls {
            config: Arc::new(config),
            description,
        })
    }

    /// [`ClientTls::new`] from files: the CA to trust and, for mutual TLS, a certificate and
    /// its key (both or neither).
    pub fn from_files(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
        alpn: &[u8],
    ) -> Result<ClientTls, TlsError> {
        let roots = Roots::from_file(ca)?;
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(Identity::from_files(cert, key)?),
            (Some(_), None) => {
                return Err(TlsError::Incomplete(
                    "a client certificate needs its key (--tls-key)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(TlsError::Incomplete(
                    "a client key needs its certificate (--tls-cert)".into(),
                ));
            }
        };
        ClientTls::new(&roots, identity.as_ref(), alpn)
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<rustls::ClientConfig> {
        &self.config
    }

    /// A connector for tokio streams.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.config.clone())
    }
}

/// A server configuration presenting `identity`, offering `alpn`. With `client_roots`, client
/// certificates are verified against them: required unless `client_optional`, in which case a
/// client without one is let in (and one with a certificate that does not verify is still
/// refused).
pub fn server_config(
    identity: &Identity,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    alpn: &[u8],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| identity.mismatch(e))?;
    let builder = match client_verifier {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    let mut config = builder
        .with_single_cert(identity.certs.clone(), identity.key.clone_key())
        .map_err(|e| identity.mismatch(e))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// The name a server's certificate is checked against for `host` (a DNS name or an IP
/// address, IPv6 with or without brackets).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string()).map_err(|_| TlsError::ServerName {
        host: host.to_string(),
    })
}

/// The identity of a (verified) certificate: its subject's common name, or else its first DNS
/// subject alternative name. `None` for a certificate that has neither, or that does not parse.
pub fn certificate_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    if let Some(cn) = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
    {
        return Some(cn.to_string());
    }
    let sans = parsed.subject_alternative_name().ok()??;
    sans.value.general_names.iter().find_map(|name| match name {
        x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_string()),
        _ => None,
    })
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            reason: pem_reason(e, "CERTIFICATE"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_path_buf(),
            reason: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

fn pem_reason(error: rustls_pki_types::pem::Error, expected: &str) -> String {
    match error {
        rustls_pki_types::pem::Error::NoItemsFound => format!("no {expected} block found"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_refused_naming_the_file_and_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate::init(dir.path(), &["localhost".into()], "ops").unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();

        let missing = dir.path().join("missing.pem");
        let error = Roots::from_file(&missing).unwrap_err().to_string();
        assert!(
            error.contains("cannot read CA") && error.contains("missing.pem"),
            "{error}"
        );

        let error = Roots::from_file(&garbage).unwrap_err().to_string();
        assert!(
            error.contains("not valid PEM") && error.contains("no CERTIFICATE"),
            "{error}"
        );

        let error = Identity::from_files(&files.server_cert, &garbage)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("key") && error.contains("no PRIVATE KEY"),
            "{error}"
        );

        // The client's key with the server's certificate.
        let error = Identity::from_files(&files.server_cert, &files.client_key)
            .unwrap_err()
            .to_string();
        assert!(error.contains("do not go together"), "{error}");

        let error = ClientTls::from_files(&files.ca_cert, Some(&files.client_cert), None, ALPN_H2)
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs its key"), "{error}");

        assert!(Identity::from_files(&files.server_cert, &files.server_key).is_ok());
    }

    #[test]
    fn a_certificate_is_named_by_its_common_name() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate::init(dir.path(), &["localhost".into()], "ops-team").unwrap();
        let client = Identity::from_files(&files.client_cert, &files.client_key).unwrap();
        assert_eq!(certificate_name(client.leaf()).as_deref(), Some("ops-team"));
        let roots = Roots::from_file(&files.client_ca_cert).unwrap();
        assert!(roots.verifies_client(&client.certs));
        let other = tempfile::tempdir().unwrap();
        let other = generate::init(other.path(), &["localhost".into()], "ops-team").unwrap();
        let stranger = Identity::from_files(&other.client_cert, &other.client_key).unwrap();
        assert!(!roots.verifies_client(&stranger.certs));
    }

    /// What `init` makes keeps clients from being peers: only a node's certificate verifies as
    /// a client of the cluster CA; a client's chains to the other CA, and the store's is for
    /// server authentication only.
    #[test]
    fn only_a_node_certificate_authenticates_to_the_cluster_ca() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate::init(dir.path(), &["localhost".into()], "ops").unwrap();
        let cluster = Roots::from_file(&files.ca_cert).unwrap();
        let clients = Roots::from_file(&files.client_ca_cert).unwrap();
        let node = Identity::from_files(&files.server_cert, &files.server_key).unwrap();
        let store = Identity::from_files(&files.store_cert, &files.store_key).unwrap();
        let client = Identity::from_files(&files.client_cert, &files.client_key).unwrap();
        assert!(cluster.verifies_client(&node.certs));
        assert!(!cluster.verifies_client(&client.certs));
        assert!(!cluster.verifies_client(&store.certs));
        assert!(!clients.verifies_client(&node.certs));
        assert!(!cluster.shares_a_root_with(&clients));
        let both = Roots::from_files(&[&files.client_ca_cert, &files.ca_cert]).unwrap();
        assert!(both.shares_a_root_with(&cluster));
        assert!(cluster.shares_a_root_with(&Roots::from_file(&files.ca_cert).unwrap()));
    }

    #[test]
    fn server_names_take_dns_names_and_ip_addresses() {
        assert!(server_name("localhost").is_ok());
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("[::1]").is_ok());
        assert!(server_name("bad host").is_err());
    }
}
