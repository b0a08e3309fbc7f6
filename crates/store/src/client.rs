//! [`StoreClient`]: the HTTP client of the fenced store, used by the `palisade store` CLI.
//!
//! It returns a [`StoreClientError`]: the refusal the server sent (read back by
//! [`crate::wire::client_error`], so a Rust caller matches on `StoreError::Stale { accepted, .. }`
//! whether it called the store in-process or over HTTP), or one of the two transport failures
//! that matter for retries: [`StoreClientError::Unavailable`] (the request never reached the
//! store: nothing was applied) and [`StoreClientError::OutcomeUnknown`] (a write was sent and no
//! answer came: retry with the same request id to find out).

use std::time::Duration;

use palisade_core::error_chain::error_chain;
use reqwest::Method;
use serde::de::DeserializeOwned;

use crate::error::{StoreClientError, StoreError};
use crate::server::{REQUEST_ID_HEADER, SEQUENCER_HEADER};
use crate::types::{BatchOp, BatchRequest, ClaimAck, Entry, FenceView, WriteAck};

/// How long to wait for a TCP connection to the store.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// How long to wait for a whole request, including the store's fsync.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;

/// A client of one store server.
#[derive(Debug, Clone)]
pub struct StoreClient {
    base_url: String,
    http: reqwest::Client,
}

impl StoreClient {
    /// A client of the store at `base_url` (`http://host:port`).
    pub fn new(base_url: &str) -> Result<StoreClient, StoreClientError> {
        StoreClient::with_tls(base_url, None)
    }

    /// A client of the store at `base_url`: `http://host:port` without `tls`, `https://host:port`
    /// with it (the CA the store's certificate is checked against and, for mutual TLS, the
    /// client's certificate; build it with `palisade_tls::ALPN_HTTP1`).
    pub fn with_tls(
        base_url: &str,
        tls: Option<&palisade_tls::ClientTls>,
    ) -> Result<StoreClient, StoreClientError> {
        let base_url = base_url.trim().trim_end_matches('/');
        let invalid = |message: String| StoreClientError::InvalidRequest { message };
        match (
            tls.is_some(),
            base_url.split_once("://").map(|(scheme, _)| scheme),
        ) {
            (false, Some("http")) | (true, Some("https")) => {}
            (false, Some("https")) => {
                return Err(invalid(format!(
                    "store URL {base_url:?} is https:// but no CA is given to check its certificate (--tls-ca or PALISADE_TLS_CA)"
                )));
            }
            (true, _) => {
                return Err(invalid(format!(
                    "store URL {base_url:?} must start with https:// when TLS is configured (for example https://127.0.0.1:7458)"
                )));
            }
            (false, _) => {
                return Err(invalid(format!(
                    "store URL {base_url:?} must start with http:// (for example http://127.0.0.1:7458)"
                )));
            }
        }
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS));
        let builder = match tls {
            Some(tls) => builder
                .https_only(true)
                .use_preconfigured_tls(rustls::ClientConfig::clone(tls.config())),
            None => builder,
        };
        let http = builder
            .build()
            .map_err(|error| StoreClientError::InvalidRequest {
                message: format!("cannot build an HTTP client: {error}"),
            })?;
        Ok(StoreClient {
            base_url: base_url.to_owned(),
            http,
        })
    }

    /// The store's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Sets `key` to `value` under `sequencer`.
    pub async fn put(
        &self,
        key: &str,
        value: &[u8],
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreClientError> {
        let request = self
            .write_request(Method::PUT, &kv_path(key), sequencer, request_id)
            .body(value.to_vec());
        self.send(request, true).await
    }

    /// Deletes `key` under `sequencer`.
    pub async fn delete(
        &self,
        key: &str,
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreClientError> {
        let request = self.write_request(Method::DELETE, &kv_path(key), sequencer, request_id);
        self.send(request, true).await
    }

    /// Applies `ops` as one fenced unit under `sequencer`.
    pub async fn batch(
        &self,
        ops: &[BatchOp],
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreClientError> {
        let body = BatchRequest {
            compare: Vec::new(),
            ops: ops.to_vec(),
        };
        self.txn(&body, sequencer, request_id).await
    }

    /// A transaction under `sequencer`: every compare must hold, then the operations are
    /// applied in order, all or nothing ([`StoreError::CompareFailed`] if a compare fails).
    pub async fn txn(
        &self,
        request: &BatchRequest,
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreClientError> {
        let request = self
            .write_request(Method::POST, "/v1/txn", sequencer, request_id)
            .json(request);
        self.send(request, true).await
    }

    /// Sets `key` to `value` only if the key is at `revision` (0: only if it has no value),
    /// sent as `If-Match` / `If-None-Match: *`.
    pub async fn put_if_revision(
        &self,
        key: &str,
        value: &[u8],
        revision: u64,
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreClientError> {
        let request = self.write_request(Method::PUT, &kv_path(key), sequencer, request_id);
        let request = match revision {
            0 => request.header(reqwest::header::IF_NONE_MATCH, "*"),
            revision => request.header(reqwest::header::IF_MATCH, format!("\"{revision}\"")),
        };
        self.send(request.body(value.to_vec()), true).await
    }

    /// The value of `key` and the grant that wrote it; `None` if it has none. Unfenced: it only
    /// looks (see [`StoreClient::read`]).
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, StoreClientError> {
        self.read(key, None).await
    }

    /// A read of `key`; with a sequencer it is fenced: refused if stale, and otherwise the
    /// lock's accepted token advances to the sequencer's, durably, before the value comes back.
    pub async fn read(
        &self,
        key: &str,
        sequencer: Option<&str>,
    ) -> Result<Option<Entry>, StoreClientError> {
        let request = self.write_request(Method::GET, &kv_path(key), sequencer, None);
        // A fenced read is a write of the accepted token: no answer means an unknown outcome.
        match self.send(request, sequencer.is_some()).await {
            Ok(entry) => Ok(Some(entry)),
            Err(StoreClientError::Store(StoreError::NotFound { .. })) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Announces `sequencer`'s grant to the store: the accepted token of its lock advances to
    /// it and nothing else changes. `lock`, if given, must be the sequencer's lock.
    pub async fn claim(
        &self,
        lock: Option<&str>,
        sequencer: Option<&str>,
    ) -> Result<ClaimAck, StoreClientError> {
        let path = match lock {
            Some(lock) => format!("/v1/claim/{}", percent_encode(lock)),
            None => "/v1/claim".to_owned(),
        };
        let request = self.write_request(Method::POST, &path, sequencer, None);
        self.send(request, true).await
    }

    /// What the store has accepted for `lock`.
    pub async fn fence(&self, lock: &str) -> Result<FenceView, StoreClientError> {
        let request = self
            .http
            .get(self.url(&format!("/v1/fence/{}", percent_encode(lock))));
        self.send(request, false).await
    }

    /// Succeeds if the store is up and can read its database.
    pub async fn health(&self) -> Result<(), StoreClientError> {
        let request = self.http.get(self.url("/healthz"));
        self.send::<serde_json::Value>(request, false).await?;
        Ok(())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    fn write_request(
        &self,
        method: Method,
        path: &str,
        sequencer: Option<&str>,
        request_id: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method, self.url(path));
        if let Some(sequencer) = sequencer {
            request = request.header(SEQUENCER_HEADER, sequencer.trim());
        }
        if let Some(request_id) = request_id {
            request = request.header(REQUEST_ID_HEADER, request_id);
        }
        request
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        is_write: bool,
    ) -> Result<T, StoreClientError> {
        let response = request
            .send()
            .await
            .map_err(|error| self.transport_error(&error, is_write))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|error| self.transport_error(&error, is_write))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|error| {
                StoreClientError::UnexpectedResponse {
                    status: status.as_u16(),
                    message: format!("cannot parse the answer: {error}"),
                }
            });
        }
        Err(crate::wire::client_error(status.as_u16(), &body))
    }

    fn transport_error(&self, error: &reqwest::Error, is_write: bool) -> StoreClientError {
        let message = format!("{}: {}", self.base_url, error_chain(error));
        if error.is_connect() || !is_write {
            StoreClientError::Unavailable { message }
        } else {
            StoreClientError::OutcomeUnknown { message }
        }
    }
}

fn kv_path(key: &str) -> String {
    format!("/v1/kv/{}", percent_encode(key))
}

/// Percent-encodes everything but unreserved characters, `/` included, so any key survives
/// the trip through a URL path.
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}
