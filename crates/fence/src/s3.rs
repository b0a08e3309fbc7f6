//! A fence for objects in S3-compatible storage: the accepted token is stored with the object,
//! and every fenced write is a conditional `PUT` on the ETag the fence read.
//!
//! **The pattern.** [`S3Fence::put`] reads the object's fence state and ETag, runs [`check`],
//! and writes with `If-Match: <etag>` (or `If-None-Match: *` where there is no object yet). A
//! concurrent writer changes the ETag, so the server refuses the `PUT` with `412` (or `409`, or
//! `404` when the object went away); the fence reads again and checks again, at most
//! [`S3_ATTEMPTS_MAX`] times. Check and write are one step because the server compares the
//! ETag and publishes under one lock per key. [`S3Fence::read`] is the claim: it advances the
//! stored token to the reader's (rewriting the object under the same condition) and returns the
//! data it advanced, so no older grant can write it afterwards: claim, then read, then write.
//! [`S3Fence::update`] is a read-modify-write in one conditional `PUT` (a counter, a list).
//! [`S3Fence::delete`] leaves a tombstone that keeps the token: a plain `DELETE` would forget
//! it and let a superseded holder create the object again.
//!
//! **Where the token lives.** An S3 ETag is a hash of the object's *bytes*: user metadata does
//! not change it. A token kept in metadata alone would let a claim (same bytes, new token) keep
//! the ETag, and a superseded holder's `If-Match` would still succeed. So the fenced object's
//! body starts with one JSON line holding the fence state ([`FencedObject`], the *envelope*),
//! followed by the caller's data; the token and session are also copied into the user metadata
//! (`x-amz-meta-palisade-token`, `x-amz-meta-palisade-session`) for anyone looking with `HEAD`.
//! The body is authoritative. An object at a fenced key written by anything else (no envelope)
//! is refused as [`FenceError::Corrupt`]. Keep large data out of the fenced object: write it
//! under a unique name, unfenced, and fence only the small manifest or pointer that names it
//! (the commit point; `docs/protect-your-resource.md`).
//!
//! **Requests.** Path-style URLs (`<endpoint>/<bucket>/<key>`), signed with AWS Signature
//! Version 4 over the `reqwest` client (plain HTTP unless the caller hands in a client built with
//! TLS, [`S3Fence::with_client`]). Outcomes: a `PUT` whose answer was lost (a timeout or a
//! dropped connection after it was sent, a `5xx` other than `503`) is
//! [`FenceError::OutcomeUnknown`]; a request refused before anything was applied (connection
//! refused, `403`, `503 SlowDown`, a key that kept changing) is [`FenceError::Storage`].
//! Bounds: keys of 1..=[`S3_KEY_BYTES_MAX`] bytes, data of at most
//! [`S3Fence::with_object_bytes_max`] (default [`S3_OBJECT_BYTES_MAX_DEFAULT`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use palisade_sequencer::{BINDING_BYTES_MAX, VerifiedSequencer};
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::FenceError;
use crate::fence::{
    FenceState, Intent, LockBinding, assert_advance, check, precheck, stored_state,
};

/// Longest object key, in bytes (S3's own limit).
pub const S3_KEY_BYTES_MAX: usize = 1024;

/// Default limit on the data of one fenced object. Fence small objects (a manifest, a pointer,
/// a counter): every claim rewrites the whole object.
pub const S3_OBJECT_BYTES_MAX_DEFAULT: usize = 16 << 20;

/// How often one fenced request reads again after the object changed under it.
pub const S3_ATTEMPTS_MAX: usize = 8;

/// Longest envelope line (the fence state before the data), newline included.
pub const S3_ENVELOPE_BYTES_MAX: usize = 1024;

/// How long one HTTP request may take, from connecting to the last byte of the answer.
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const ENVELOPE_VERSION: u32 = 1;
const META_TOKEN: &str = "x-amz-meta-palisade-token";
const META_SESSION: &str = "x-amz-meta-palisade-session";

/// Where the bucket is and how to sign for it.
#[derive(Clone)]
pub struct S3Config {
    /// `http://host:port` (or `https://…` with a TLS client), no trailing path.
    pub endpoint: String,
    /// The signing region (`us-east-1` for most S3-compatible servers).
    pub region: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// The first line of a fenced object's body: the fence state, and whether data follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FencedObject {
    /// The envelope format, 1.
    pub palisade_fence: u32,
    pub lock: String,
    pub token: u64,
    pub session: u64,
    /// `false` for a tombstone ([`S3Fence::delete`]) or a claim of a key with no data yet.
    pub data: bool,
}

/// A fenced object as stored: its data (`None`: no data, only the fence state) and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    pub data: Option<Vec<u8>>,
    pub state: FenceState,
    /// The ETag the object had when it was read or written.
    pub etag: String,
}

/// Fences writes to objects of one bucket, per key.
#[derive(Clone)]
pub struct S3Fence {
    config: S3Config,
    client: reqwest::Client,
    expected_lock: Option<String>,
    object_bytes_max: usize,
}

impl std::fmt::Debug for S3Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Fence")
            .field("config", &self.config)
            .field("expected_lock", &self.expected_lock)
            .field("object_bytes_max", &self.object_bytes_max)
            .finish_non_exhaustive()
    }
}

/// The condition of a `PUT`.
#[derive(Debug, Clone, Copy)]
pub enum PutCondition<'a> {
    /// `If-None-Match: *`: only if there is no object.
    Absent,
    /// `If-Match: <etag>`: only if the object is unchanged.
    Matches(&'a str),
    /// No condition: a plain `PUT` that overwrites whatever is there. Not fenced: for
    /// measurements and demonstrations of what the fence prevents.
    None,
}

/// What a raw conditional `PUT` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written; the new ETag.
    Written(String),
    /// The condition did not hold (412, 409, or 404 for `If-Match`): nothing was written.
    ConditionFailed,
}

impl S3Fence {
    /// A fence over `config.bucket` with a plain-HTTP client; each key is bound to the lock of
    /// its first accepted sequencer.
    pub fn new(config: S3Config) -> S3Fence {
        let client = reqwest::Client::builder()
            .timeout(S3_REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("a reqwest client with timeouts builds");
        S3Fence {
            config,
            client,
            expected_lock: None,
            object_bytes_max: S3_OBJECT_BYTES_MAX_DEFAULT,
        }
    }

    /// Sends requests through `client` (one built with TLS, proxies, other timeouts).
    pub fn with_client(mut self, client: reqwest::Client) -> S3Fence {
        self.client = client;
        self
    }

    /// Accepts sequencers of `lock` only, for every key.
    pub fn expecting_lock(mut self, lock: impl Into<String>) -> S3Fence {
        self.expected_lock = Some(lock.into());
        self
    }

    /// Refuses data longer than `bytes` (and stored objects longer than it, as corrupt).
    pub fn with_object_bytes_max(mut self, bytes: usize) -> S3Fence {
        self.object_bytes_max = bytes;
        self
    }

    /// The bucket's configuration.
    pub fn config(&self) -> &S3Config {
        &self.config
    }

    /// Writes `data` to `key` if `sequencer` is accepted, advancing the stored token in the same
    /// conditional `PUT`; returns the state stored. On any error nothing was written, except
    /// [`FenceError::OutcomeUnknown`].
    pub async fn put(
        &self,
        key: &str,
        sequencer: &VerifiedSequencer,
        data: &[u8],
    ) -> Result<FenceState, FenceError> {
        self.validate_data(data.len())?;
        let (state, _) = self.apply(key, sequencer, |_| Some(data.to_vec())).await?;
        Ok(state)
    }

    /// A read-modify-write in one conditional `PUT`: if `sequencer` is accepted, writes
    /// `change(current data)` (`None` where there is no data) under `If-Match` on the ETag of the
    /// data `change` saw. If the object changed meanwhile, reads and calls `change` again (at
    /// most [`S3_ATTEMPTS_MAX`] times). Returns the state stored and the data written.
    pub async fn update(
        &self,
        key: &str,
        sequencer: &VerifiedSequencer,
        mut change: impl FnMut(Option<&[u8]>) -> Vec<u8>,
    ) -> Result<(FenceState, Vec<u8>), FenceError> {
        let (state, data) = self
            .apply(key, sequencer, |current| Some(change(current)))
            .await?;
        Ok((state, data.unwrap_or_default()))
    }

    /// Deletes `key`'s data if `sequencer` is accepted, leaving a tombstone that keeps the
    /// token (a later [`S3Fence::read`] returns no data).
    pub async fn delete(
        &self,
        key: &str,
        sequencer: &VerifiedSequencer,
    ) -> Result<FenceState, FenceError> {
        let (state, _) = self.apply(key, sequencer, |_| None).await?;
        Ok(state)
    }

    /// The claim and the read: advances `key`'s token to `sequencer`'s (rewriting the object's
    /// envelope under `If-Match`, or creating a data-less one) and returns the data it
    /// advanced. Once it returns, no older grant can write `key`. A stale reader is refused like
    /// a stale writer. Any grant may read, a shared one included; `put`, `update` and `delete`
    /// refuse a shared grant as [`FenceError::SharedWrite`].
    pub async fn read(
        &self,
        key: &str,
        sequencer: &VerifiedSequencer,
    ) -> Result<S3Object, FenceError> {
        validate_key(key)?;
        self.check_binding(sequencer, Intent::Read)?;
        for _ in 0..S3_ATTEMPTS_MAX {
            let current = self.get(key).await?;
            let accepted = current.as_ref().map(|object| &object.state);
            let next = check(accepted, self.binding(), sequencer, Intent::Read)?;
            if let Some(object) = &current
                && object.state == next
            {
                // Already claimed by this grant: nothing to advance.
                return Ok(object.clone());
            }
            assert_advance(accepted, &next);
            let data = current.as_ref().and_then(|object| object.data.as_deref());
            let condition = match &current {
                Some(object) => PutCondition::Matches(&object.etag),
                None => PutCondition::Absent,
            };
            let body = envelope(&next, data);
            if let PutOutcome::Written(etag) = self.put_raw(key, &next, body, condition).await? {
                return Ok(S3Object {
                    data: data.map(<[u8]>::to_vec),
                    state: next,
                    etag,
                });
            }
        }
        Err(kept_changing(key))
    }

    /// The object as stored, without a claim: its data and fence state, or `None` if there is no
    /// object. Not ordered against writers: use [`S3Fence::read`] before a read-modify-write.
    pub async fn get(&self, key: &str) -> Result<Option<S3Object>, FenceError> {
        validate_key(key)?;
        let url = self.url(key);
        let request = self.signed(reqwest::Method::GET, &url, key, &[], &[]);
        let response = request.send().await.map_err(|error| {
            FenceError::storage(format!("GET {key:?} failed: {}", error_chain(&error)))
        })?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(refused("GET", key, response).await);
        }
        let etag = etag_of(&response, key)?;
        let limit = self.object_bytes_max + S3_ENVELOPE_BYTES_MAX;
        if let Some(length) = response.content_length()
            && length > limit as u64
        {
            return Err(corrupt(
                key,
                format!("the object is {length} bytes, more than the limit of {limit}"),
            ));
        }
        let body = response.bytes().await.map_err(|error| {
            FenceError::storage(format!("GET {key:?} failed: {}", error_chain(&error)))
        })?;
        if body.len() > limit {
            return Err(corrupt(
                key,
                format!(
                    "the object is {} bytes, more than the limit of {limit}",
                    body.len()
                ),
            ));
        }
        let (state, data) = open_envelope(key, &body)?;
        Ok(Some(S3Object { data, state, etag }))
    }

    /// The fence state stored at `key`, if any.
    pub async fn fence_state(&self, key: &str) -> Result<Option<FenceState>, FenceError> {
        Ok(self.get(key).await?.map(|object| object.state))
    }

    /// Reads, checks, computes the new data from the current data, and writes it under the ETag
    /// read, until a write lands or [`S3_ATTEMPTS_MAX`] attempts found the object changed.
    async fn apply(
        &self,
        key: &str,
        sequencer: &VerifiedSequencer,
        mut new_data: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<(FenceState, Option<Vec<u8>>), FenceError> {
        validate_key(key)?;
        self.check_binding(sequencer, Intent::Write)?;
        for _ in 0..S3_ATTEMPTS_MAX {
            let current = self.get(key).await?;
            let accepted = current.as_ref().map(|object| &object.state);
            let next = check(accepted, self.binding(), sequencer, Intent::Write)?;
            assert_advance(accepted, &next);
            let data = new_data(current.as_ref().and_then(|object| object.data.as_deref()));
            if let Some(data) = &data {
                self.validate_data(data.len())?;
            }
            let condition = match &current {
                Some(object) => PutCondition::Matches(&object.etag),
                None => PutCondition::Absent,
            };
            let body = envelope(&next, data.as_deref());
            if let PutOutcome::Written(_) = self.put_raw(key, &next, body, condition).await? {
                return Ok((next, data));
            }
        }
        Err(kept_changing(key))
    }

    fn binding(&self) -> LockBinding<'_> {
        match &self.expected_lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        }
    }

    /// The expected binding and a shared write do not depend on stored state: refuse before any
    /// request.
    fn check_binding(
        &self,
        sequencer: &VerifiedSequencer,
        intent: Intent,
    ) -> Result<(), FenceError> {
        precheck(self.binding(), sequencer, intent)
    }

    fn validate_data(&self, len: usize) -> Result<(), FenceError> {
        if len > self.object_bytes_max {
            return Err(FenceError::invalid_request(format!(
                "the data is {len} bytes, the limit of a fenced object is {}; write large data \
                 under a unique name and fence only the manifest that names it",
                self.object_bytes_max
            )));
        }
        Ok(())
    }

    /// One conditional `PUT` of `body` (an envelope of `state`), without any fence check: the
    /// step the fence is built on, public so the fence's cost can be measured against it.
    pub async fn put_raw(
        &self,
        key: &str,
        state: &FenceState,
        body: Vec<u8>,
        condition: PutCondition<'_>,
    ) -> Result<PutOutcome, FenceError> {
        validate_key(key)?;
        let url = self.url(key);
        let token = state.token_max.to_string();
        let session = state.holder_session.to_string();
        let mut headers = vec![
            (META_SESSION, session.as_str()),
            (META_TOKEN, token.as_str()),
        ];
        match condition {
            PutCondition::Absent => headers.push(("if-none-match", "*")),
            PutCondition::Matches(etag) => headers.push(("if-match", etag)),
            PutCondition::None => {}
        }
        let request = self.signed(reqwest::Method::PUT, &url, key, &headers, &body);
        let response = match request.body(body).send().await {
            Ok(response) => response,
            // Nothing reached the server.
            Err(error) if error.is_connect() => {
                return Err(FenceError::storage(format!(
                    "PUT {key:?} could not connect: {}",
                    error_chain(&error)
                )));
            }
            Err(error) => {
                return Err(FenceError::OutcomeUnknown {
                    message: format!("PUT {key:?} got no answer: {}", error_chain(&error)),
                });
            }
        };
        let status = response.status();
        match status {
            _ if status.is_success() => Ok(PutOutcome::Written(etag_of(&response, key)?)),
            StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT => {
                Ok(PutOutcome::ConditionFailed)
            }
            StatusCode::NOT_FOUND if matches!(condition, PutCondition::Matches(_)) => {
                Ok(PutOutcome::ConditionFailed)
            }
            StatusCode::SERVICE_UNAVAILABLE => Err(refused("PUT", key, response).await),
            _ if status.is_server_error() => Err(FenceError::OutcomeUnknown {
                message: format!(
                    "PUT {key:?} answered {status}: {}",
                    body_excerpt(response).await
                ),
            }),
            _ => Err(refused("PUT", key, response).await),
        }
    }

    fn url(&self, key: &str) -> String {
        format!(
            "{}/{}/{}",
            self.config.endpoint.trim_end_matches('/'),
            uri_encode(&self.config.bucket, false),
            uri_encode(key, true)
        )
    }

    fn signed(
        &self,
        method: reqwest::Method,
        url: &str,
        key: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> reqwest::RequestBuilder {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let path = format!(
            "/{}/{}",
            uri_encode(&self.config.bucket, false),
            uri_encode(key, true)
        );
        let host = self
            .config
            .endpoint
            .split_once("://")
            .map_or(self.config.endpoint.as_str(), |(_, rest)| rest)
            .trim_end_matches('/');
        let signature = sign_v4(
            &SigningInput {
                method: method.as_str(),
                path: &path,
                host,
                headers,
                payload_sha256: &hex(&Sha256::digest(body)),
                unix_seconds: now,
            },
            &self.config,
        );
        let mut request = self.client.request(method, url);
        for (name, value) in signature.headers {
            request = request.header(name, value);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    }
}

/// The body of a fenced object: the envelope line, then the data.
pub fn envelope(state: &FenceState, data: Option<&[u8]>) -> Vec<u8> {
    let line = FencedObject {
        palisade_fence: ENVELOPE_VERSION,
        lock: state.lock.clone(),
        token: state.token_max.get(),
        session: state.holder_session.get(),
        data: data.is_some(),
    };
    let mut body = serde_json::to_vec(&line).expect("the envelope serialises");
    body.push(b'\n');
    body.extend_from_slice(data.unwrap_or_default());
    body
}

/// Splits a stored body into its fence state and data; anything else is corrupt.
fn open_envelope(key: &str, body: &[u8]) -> Result<(FenceState, Option<Vec<u8>>), FenceError> {
    let window = &body[..body.len().min(S3_ENVELOPE_BYTES_MAX)];
    let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
        return Err(corrupt(
            key,
            "the object has no fence envelope line: it was not written through the fence".into(),
        ));
    };
    let line: FencedObject = serde_json::from_slice(&body[..newline]).map_err(|error| {
        corrupt(
            key,
            format!("the object's first line is not a fence envelope ({error}): it was not written through the fence"),
        )
    })?;
    if line.palisade_fence != ENVELOPE_VERSION {
        return Err(corrupt(
            key,
            format!("envelope version {} is unknown", line.palisade_fence),
        ));
    }
    if line.lock.is_empty() || line.lock.len() > BINDING_BYTES_MAX {
        return Err(corrupt(
            key,
            format!("envelope lock name is {} bytes", line.lock.len()),
        ));
    }
    let rest = &body[newline + 1..];
    if !line.data && !rest.is_empty() {
        return Err(corrupt(
            key,
            "a data-less envelope is followed by data".into(),
        ));
    }
    let state = stored_state(key, line.lock, i128::from(line.token), line.session)?;
    Ok((state, line.data.then(|| rest.to_vec())))
}

/// Checks an object key: 1..=[`S3_KEY_BYTES_MAX`] bytes, no control characters.
pub fn validate_key(key: &str) -> Result<(), FenceError> {
    let message = if key.is_empty() {
        "object key is empty".to_owned()
    } else if key.len() > S3_KEY_BYTES_MAX {
        format!(
            "object key is {} bytes, the limit is {S3_KEY_BYTES_MAX}",
            key.len()
        )
    } else if key.chars().any(char::is_control) {
        "object key holds a control character".to_owned()
    } else {
        return Ok(());
    };
    Err(FenceError::InvalidScope { message })
}

fn kept_changing(key: &str) -> FenceError {
    FenceError::storage(format!(
        "object {key:?} changed under each of {S3_ATTEMPTS_MAX} attempts (other writers race \
         for it); nothing was written, try again"
    ))
}

fn corrupt(key: &str, message: String) -> FenceError {
    FenceError::Corrupt {
        scope: key.to_owned(),
        message,
    }
}

fn etag_of(response: &reqwest::Response, key: &str) -> Result<String, FenceError> {
    response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| {
            FenceError::storage(format!(
                "the server answered for {key:?} without an ETag: conditional writes need one"
            ))
        })
}

async fn refused(method: &str, key: &str, response: reqwest::Response) -> FenceError {
    let status = response.status();
    FenceError::storage(format!(
        "{method} {key:?} refused with {status}: {}",
        body_excerpt(response).await
    ))
}

/// The first 300 bytes of an error answer (S3's XML names the error).
async fn body_excerpt(response: reqwest::Response) -> String {
    let body = response.bytes().await.unwrap_or_default();
    String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

struct SigningInput<'a> {
    method: &'a str,
    /// Already URI-encoded.
    path: &'a str,
    host: &'a str,
    /// Extra headers to sign, names in lower case.
    headers: &'a [(&'a str, &'a str)],
    payload_sha256: &'a str,
    unix_seconds: u64,
}

struct Signature {
    headers: Vec<(&'static str, String)>,
}

/// AWS Signature Version 4 over every header sent (no query string).
fn sign_v4(input: &SigningInput<'_>, config: &S3Config) -> Signature {
    let (date, time) = utc_date_time(input.unix_seconds);
    let amz_date = format!("{date}T{time}Z");
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), input.host.to_owned()),
        (
            "x-amz-content-sha256".into(),
            input.payload_sha256.to_owned(),
        ),
        ("x-amz-date".into(), amz_date.clone()),
    ];
    headers.extend(
        input
            .headers
            .iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned())),
    );
    headers.sort();
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{}\n{}\n\n{canonical_headers}\n{signed_headers}\n{}",
        input.method, input.path, input.payload_sha256
    );
    let scope = format!("{date}/{}/s3/aws4_request", config.region);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let mut signing_key = hmac(
        format!("AWS4{}", config.secret_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [config.region.as_str(), "s3", "aws4_request"] {
        signing_key = hmac(&signing_key, part.as_bytes());
    }
    let signature = hex(&hmac(&signing_key, string_to_sign.as_bytes()));
    Signature {
        headers: vec![
            (
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
                    config.access_key
                ),
            ),
            ("x-amz-content-sha256", input.payload_sha256.to_owned()),
            ("x-amz-date", amz_date),
        ],
    }
}

fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// SigV4's URI encoding: every byte but `A-Za-z0-9-._~` as `%XX`, and `/` kept in keys.
fn uri_encode(text: &str, keep_slash: bool) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                encoded.push(byte as char)
            }
            b'/' if keep_slash => encoded.push('/'),
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

/// `YYYYMMDD` and `HHMMSS` in UTC.
fn utc_date_time(unix_seconds: u64) -> (String, String) {
    let days = (unix_seconds / 86_400) as i64;
    let seconds = unix_seconds % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}{month:02}{day:02}"),
        format!(
            "{:02}{:02}{:02}",
            seconds / 3600,
            seconds / 60 % 60,
            seconds % 60
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(utc_date_time(0), ("19700101".into(), "000000".into()));
        // 2024-02-29T23:59:59Z, a leap day.
        assert_eq!(
            utc_date_time(1_709_251_199),
            ("20240229".into(), "235959".into())
        );
        assert_eq!(
            utc_date_time(1_440_938_160),
            ("20150830".into(), "123600".into())
        );
    }

    #[test]
    fn the_signing_key_matches_the_published_example() {
        // The signing key of AWS's published SigV4 example (secret, 20150830, us-east-1,
        // iam); the rest of the signature is checked by the server accepting every request.
        let signing_key = ["us-east-1", "iam", "aws4_request"].iter().fold(
            hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830"),
            |key, part| hmac(&key, part.as_bytes()),
        );
        assert_eq!(
            hex(&signing_key),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
    }

    #[test]
    fn keys_are_encoded_as_sigv4_wants() {
        assert_eq!(uri_encode("a b/c+d~é", true), "a%20b/c%2Bd~%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn an_envelope_round_trips_and_foreign_bytes_are_corrupt() {
        let state = stored_state("k", "jobs".into(), 7, 3).unwrap();
        let body = envelope(&state, Some(b"payload\nwith lines"));
        assert_eq!(
            open_envelope("k", &body).unwrap(),
            (state.clone(), Some(b"payload\nwith lines".to_vec()))
        );
        assert_eq!(
            open_envelope("k", &envelope(&state, None)).unwrap(),
            (state, None)
        );
        for foreign in [&b"plain data"[..], b"{\"x\":1}\nrest", b""] {
            let error = open_envelope("k", foreign).unwrap_err();
            assert!(matches!(error, FenceError::Corrupt { .. }), "{error:?}");
        }
    }

    #[test]
    fn the_envelope_is_the_python_helpers_byte_for_byte() {
        // The same bytes clients/python/tests/test_fence_s3.py expects.
        let state = stored_state("k", "jobs/é".into(), 7, 3).unwrap();
        assert_eq!(
            envelope(&state, Some(b"a\nb")),
            "{\"palisade_fence\":1,\"lock\":\"jobs/é\",\"token\":7,\"session\":3,\"data\":true}\na\nb"
                .as_bytes()
        );
    }

    #[test]
    fn keys_are_bounded() {
        assert!(validate_key("a/b.json").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(S3_KEY_BYTES_MAX + 1)).is_err());
        assert!(validate_key("a\nb").is_err());
    }
}
