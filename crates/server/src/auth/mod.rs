//! Who a caller is, and what it may do: authentication by bearer tokens ([`tokens`]),
//! authorization by a policy file ([`policy`]), and per-identity quotas.
//!
//! - [`Auth::identity`] reads a request's credential and returns its [`Caller`]: the one place
//!   an identity comes from.
//! - [`Auth::require`] and its siblings check a right before the service does anything.
//! - [`Auth::check_owner`] keeps a session to the identity that opened it.
//! - [`Auth::reserve`] and [`Auth::watch_permit`] hold an identity to its quotas, on the leader
//!   before anything is proposed; [`Auth::keepalive_permit`] to one keepalive stream per session
//!   of its quota.
//!
//! Without a policy nothing is refused for want of a right or a quota (a loopback-only
//! deployment, see `docs/security.md`); a token that is presented is still checked, and a
//! session opened with one still belongs to its identity. Once a policy is configured,
//! everything is denied that it does not grant, and a caller without a credential is refused.
//!
//! The files are read at start and again on [`Auth::reload`] (SIGHUP); a file that fails to
//! load leaves what was loaded before in force. A call that stays open (a keepalive stream, a
//! watch, a live view of the web UI) holds a [`LiveCaller`]: its credential, judged again after
//! each reload, so a token removed or a right taken away ends the calls that relied on it.

pub mod policy;
pub mod tokens;

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use palisade_core::{CoreError, CredentialError, Identity, Quota, Right, SessionId, Usage};

pub use policy::{Policy, Quotas};
pub use tokens::TokenFile;

/// A token or policy file that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {bytes_max} bytes", path.display())]
    TooLarge { path: PathBuf, bytes_max: u64 },
    #[error("{} is not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    #[error("{} line {line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// Reads at most `bytes_max` bytes of the file at `path`, refusing a larger one.
fn read_limited(path: &Path, bytes_max: u64) -> Result<String, FileError> {
    let read_error = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(bytes_max + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > bytes_max {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            bytes_max,
        });
    }
    String::from_utf8(bytes).map_err(|_| FileError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

/// Who made a request: an authenticated identity, or nobody (allowed only without a policy).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    identity: Option<Identity>,
    /// Without a policy: the caller presented the cluster's admin token
    /// ([`crate::admin_token`]).
    admin_token: bool,
}

impl Caller {
    /// A caller that presented no credential.
    pub fn anonymous() -> Caller {
        Caller::default()
    }

    pub fn authenticated(identity: Identity) -> Caller {
        Caller {
            identity: Some(identity),
            admin_token: false,
        }
    }

    /// A caller without an identity that presented the cluster's admin token, on a server
    /// without a policy.
    pub fn with_admin_token() -> Caller {
        Caller {
            identity: None,
            admin_token: true,
        }
    }

    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }
}

/// The authentication and authorization of one server: its token file, its policy, and the
/// quota accounting of the identities it serves.
#[derive(Debug, Default)]
pub struct Auth {
    tokens_path: Option<PathBuf>,
    policy_path: Option<PathBuf>,
    tokens: RwLock<Arc<TokenFile>>,
    policy: RwLock<Option<Arc<Policy>>>,
    /// Sessions and locks each identity has asked for and not yet seen applied.
    pending: Mutex<HashMap<Identity, Pending>>,
    /// Watches each identity has open on this node.
    watches: OpenCounts,
    /// Keepalive streams each identity has open on this node.
    keepalives: OpenCounts,
    /// Counts the reloads, so calls that stay open judge their caller again ([`LiveCaller`]).
    reloads: watch::Sender<u64>,
    /// Where the cluster's admin token comes from (it follows the founding key); without one,
    /// and without a policy, no caller may administer the cluster.
    admin_token: RwLock<Option<AdminTokenSource>>,
}

/// The cluster's current admin token, on demand ([`Auth::set_admin_token`]).
#[derive(Clone)]
struct AdminTokenSource(Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for AdminTokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminTokenSource(..)")
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Pending {
    sessions: usize,
    locks: usize,
    waiters: usize,
}

/// What an identity asks of its quotas ([`Auth::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// A new session.
    Session,
    /// New locks (one, or a multi-lock's), held or (with `waits`) possibly waited for first.
    Locks { locks: usize, waits: bool },
}

impl Auth {
    /// Nothing configured: every caller may do everything, as before authentication existed.
    pub fn open() -> Auth {
        Auth::default()
    }

    /// Loads the token file and the policy, if given.
    pub fn load(tokens: Option<&Path>, policy: Option<&Path>) -> Result<Auth, FileError> {
        let auth = Auth {
            tokens_path: tokens.map(Path::to_path_buf),
            policy_path: policy.map(Path::to_path_buf),
            ..Auth::default()
        };
        auth.reload()?;
        Ok(auth)
    }

    /// Reads the token file and the policy again. Either file that fails to load is reported
    /// and left as it was; the other still takes effect.
    pub fn reload(&self) -> Result<(), FileError> {
        let mut first_error = None;
        if let Some(path) = &self.tokens_path {
            match TokenFile::load(path) {
                Ok(tokens) => {
                    tracing::info!(path = %path.display(), tokens = tokens.len(), "tokens loaded");
                    *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
                }
                Err(e) => first_error = Some(e),
            }
        }
        if let Some(path) = &self.policy_path {
            match Policy::load(path) {
                Ok(policy) => {
                    tracing::info!(path = %path.display(), rules = policy.rule_count(), "policy loaded");
                    *self.policy.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(Arc::new(policy));
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        // Even a partial reload may have taken something away.
        self.reloads.send_modify(|reloads| *reloads += 1);
        first_error.map_or(Ok(()), Err)
    }

    /// Takes the cluster's admin token from `token` (called for each request that presents a
    /// bearer token to a server without a policy): see `admin_token`.
    pub fn set_admin_token(&self, token: impl Fn() -> String + Send + Sync + 'static) {
        *self.admin_token.write().unwrap_or_else(|e| e.into_inner()) =
            Some(AdminTokenSource(Arc::new(token)));
    }

    /// Whether `token` is the cluster's admin token and no policy is configured (with one, the
    /// policy alone says who administers).
    fn is_admin_token(&self, token: &str) -> bool {
        if self.has_policy() {
            return false;
        }
        let source = self
            .admin_token
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        source.is_some_and(|source| crate::admin_token::same(token, &(source.0)()))
    }

    /// True once a policy is configured: default-deny.
    pub fn has_policy(&self) -> bool {
        self.policy_path.is_some()
    }

    /// True when a token file is configured.
    pub fn has_tokens(&self) -> bool {
        self.tokens_path.is_some()
    }

    fn policy(&self) -> Option<Arc<Policy>> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Who sent `request`.
    ///
    /// Sources of identity:
    ///
    /// 1. A verified client certificate (mutual TLS): its name, from the request's extensions
    ///    (`connection::ClientCertName`), checked with [`Identity::new`].
    /// 2. An `authorization: Bearer <token>` header whose token the token file has.
    ///
    /// A request with both must name the same identity with each, or it is refused. A request
    /// with neither is anonymous, which is refused once a policy is configured. A header that
    /// is present is always checked: a wrong token is refused, policy or not.
    pub fn identity<T>(&self, request: &tonic::Request<T>) -> Result<Caller, CoreError> {
        self.authenticate(&Credential::of(request))
    }

    /// Who presented `credential`: [`Auth::identity`] for a credential kept.
    pub fn authenticate(&self, credential: &Credential) -> Result<Caller, CoreError> {
        let mut metadata = tonic::metadata::MetadataMap::new();
        if let Some(header) = &credential.authorization {
            metadata.insert("authorization", header.clone());
        }
        self.identity_of(credential.certificate.as_deref(), &metadata)
    }

    /// The caller of a call that stays open, who presented `credential`: authenticated now,
    /// and again after each reload ([`LiveCaller::still_authenticated`]).
    pub fn live_caller(&self, credential: Credential) -> Result<LiveCaller, CoreError> {
        // Subscribed first, so a reload while this authenticates is seen by the call.
        let reloads = self.reloads.subscribe();
        let caller = self.authenticate(&credential)?;
        Ok(LiveCaller {
            caller,
            credential,
            reloads,
        })
    }

    /// [`Auth::identity`] from a request's certificate name and metadata.
    pub fn identity_of(
        &self,
        certificate: Option<&str>,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, CoreError> {
        let refuse = |reason| CoreError::Unauthenticated { reason };
        let certified = certificate
            .map(|name| Identity::new(name).map_err(|_| refuse(CredentialError::CertificateName)))
            .transpose()?;
        let Some(header) = metadata.get("authorization") else {
            return match certified {
                Some(identity) => Ok(Caller::authenticated(identity)),
                None if self.has_policy() => Err(refuse(CredentialError::Missing)),
                None => Ok(Caller::anonymous()),
            };
        };
        let token = header
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .filter(|token| tokens::valid_token(token))
            .ok_or(refuse(CredentialError::Malformed))?;
        if certified.is_none() && self.is_admin_token(token) {
            return Ok(Caller::with_admin_token());
        }
        let tokens = self
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let identity = tokens
            .identify(token)
            .ok_or(refuse(CredentialError::Unknown))?;
        match certified {
            Some(certified) if certified != identity => Err(refuse(CredentialError::Conflict)),
            _ => Ok(Caller::authenticated(identity)),
        }
    }

    /// [`Auth::identity`] from a request's metadata alone (no client certificate).
    pub fn identity_from(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, CoreError> {
        self.identity_of(None, metadata)
    }

    /// Checks that `caller` has `right` on the lock `scope` (for [`Right::Admin`], `scope` is
    /// ignored: admin is cluster-wide). Always allowed without a policy.
    pub fn require(&self, caller: &Caller, right: Right, scope: &str) -> Result<(), CoreError> {
        self.check(caller, right, scope, |policy, identity| {
            policy.allows(identity, right, scope)
        })
    }

    /// Checks that `caller` has `right` on every lock whose name starts with `prefix` (a
    /// listing).
    pub fn require_under(
        &self,
        caller: &Caller,
        right: Right,
        prefix: &str,
    ) -> Result<(), CoreError> {
        self.check(caller, right, prefix, |policy, identity| {
            policy.allows_all_under(identity, right, prefix)
        })
    }

    /// The locks under `prefix` that `caller` may read, for a view that shows only those (the
    /// web UI) where [`Auth::require_under`] refuses a listing of the whole prefix. Refused
    /// only when the policy grants the caller the read right on no lock at all, or the caller
    /// is anonymous under a policy; everything under `prefix` without a policy.
    pub fn readable_under(&self, caller: &Caller, prefix: &str) -> Result<ReadScope, CoreError> {
        self.check(caller, Right::Read, "", |policy, identity| {
            policy
                .prefixes_granting(identity, Right::Read)
                .next()
                .is_some()
        })?;
        Ok(match (self.policy(), caller.identity()) {
            (Some(policy), Some(identity)) => {
                ReadScope::under(prefix, policy.prefixes_granting(identity, Right::Read))
            }
            _ => ReadScope::under(prefix, std::iter::once("")),
        })
    }

    /// Checks that `caller` may administer the cluster: the admin right under a policy; the
    /// cluster's admin token without one (a backup holds the signing key, and the membership
    /// decides who receives it).
    pub fn require_admin(&self, caller: &Caller) -> Result<(), CoreError> {
        if !self.has_policy() && !caller.admin_token {
            return Err(CoreError::Unauthenticated {
                reason: CredentialError::AdminTokenNeeded,
            });
        }
        self.require(caller, Right::Admin, "")
    }

    /// Checks that `caller` may look at the cluster (its members, its public keys): the admin
    /// right under a policy; anyone without one, as the web UI and `PublicKey` show as much.
    pub fn require_viewer(&self, caller: &Caller) -> Result<(), CoreError> {
        self.require(caller, Right::Admin, "")
    }

    /// Checks that `caller` is authenticated when a policy is configured (a call that needs no
    /// right, such as reading the public keys).
    pub fn require_authenticated(&self, caller: &Caller) -> Result<(), CoreError> {
        self.check(caller, Right::Read, "", |_, _| true)
    }

    fn check(
        &self,
        caller: &Caller,
        right: Right,
        scope: &str,
        allowed: impl FnOnce(&Policy, &Identity) -> bool,
    ) -> Result<(), CoreError> {
        let Some(policy) = self.policy() else {
            return Ok(());
        };
        let Some(identity) = caller.identity() else {
            return Err(CoreError::Unauthenticated {
                reason: CredentialError::Missing,
            });
        };
        if allowed(&policy, identity) {
            Ok(())
        } else {
            Err(CoreError::PermissionDenied {
                identity: identity.to_string(),
                right,
                scope: if right == Right::Admin || scope.is_empty() {
                    "*".to_string()
                } else {
                    scope.to_string()
                },
            })
        }
    }

    /// Checks that `caller` may act for `session`, whose owner is `owner`: a session opened by
    /// an identity is that identity's alone; one opened without an identity (no tokens then,
    /// or an older version) is acted for with its secret alone, as when it was opened.
    pub fn check_owner(
        caller: &Caller,
        session: SessionId,
        owner: Option<&Identity>,
    ) -> Result<(), CoreError> {
        match owner {
            None => Ok(()),
            Some(owner) if caller.identity() == Some(owner) => Ok(()),
            Some(_) => Err(CoreError::SessionNotOwned { session }),
        }
    }

    /// The quotas `caller` is held to: `None` without a policy or without an identity.
    pub fn quotas(&self, caller: &Caller) -> Option<Quotas> {
        Some(self.policy()?.quotas(caller.identity()?))
    }

    /// Holds `caller` to its quotas for `ask`, before it is proposed: `usage` reads what the
    /// identity's sessions take in the table now. The returned reservation counts the ask as
    /// taken until it is dropped, which the caller does once the proposal was applied (and the
    /// table counts it) or failed; so concurrent asks of one identity cannot together pass its
    /// quota. `None` when no quota applies.
    ///
    /// `usage` is read under the reservations' lock, so a reservation given back after its
    /// entry was applied is never missed by both counts.
    pub fn reserve<E: From<CoreError>>(
        &self,
        caller: &Caller,
        ask: Ask,
        usage: impl FnOnce(&Identity) -> Result<Usage, E>,
    ) -> Result<Option<Reservation<'_>>, E> {
        let (Some(quotas), Some(identity)) = (self.quotas(caller), caller.identity()) else {
            return Ok(None);
        };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let used = usage(identity)?;
        let mine = pending.get(identity).copied().unwrap_or_default();
        let reached = |quota: Quota| {
            CoreError::QuotaReached {
                identity: identity.to_string(),
                quota,
                quota_max: quotas.get(quota),
            }
            .into()
        };
        let taken = match ask {
            Ask::Session => {
                if used.sessions + mine.sessions >= quotas.sessions as usize {
                    return Err(reached(Quota::Sessions));
                }
                Pending {
                    sessions: 1,
                    ..Pending::default()
                }
            }
            Ask::Locks { locks, waits } => {
                // A wait may become a hold: it counts against the locks too, so no identity
                // ever holds more than its quota of locks.
                if used.held + used.waiting + mine.locks + locks > quotas.locks as usize {
                    return Err(reached(Quota::Locks));
                }
                if waits && used.waiting + mine.waiters + locks > quotas.waiters as usize {
                    return Err(reached(Quota::Waiters));
                }
                Pending {
                    locks,
                    waiters: if waits { locks } else { 0 },
                    ..Pending::default()
                }
            }
        };
        let entry = pending.entry(identity.clone()).or_default();
        entry.sessions += taken.sessions;
        entry.locks += taken.locks;
        entry.waiters += taken.waiters;
        Ok(Some(Reservation {
            auth: self,
            identity: identity.clone(),
            taken,
        }))
    }

    /// Holds `caller` to its quota of watches on this node. The permit is given back when the
    /// watch ends (dropped). `None` when no quota applies.
    pub fn watch_permit(&self, caller: &Caller) -> Result<Option<OpenPermit>, CoreError> {
        let (Some(quotas), Some(identity)) = (self.quotas(caller), caller.identity()) else {
            return Ok(None);
        };
        OpenPermit::take(&self.watches, identity, quotas.watches)
            .map(Some)
            .ok_or_else(|| CoreError::QuotaReached {
                identity: identity.to_string(),
                quota: Quota::Watches,
                quota_max: quotas.watches,
            })
    }

    /// Holds `caller` to as many keepalive streams on this node as its quota of sessions (a
    /// client needs one per session), so that one identity cannot take every stream the server
    /// allows. The permit is given back when the stream ends (dropped); `Ok(None)` when no
    /// quota applies; `Err((identity, limit))` when the identity has `limit` streams open.
    pub fn keepalive_permit(&self, caller: &Caller) -> Result<Option<OpenPermit>, (Identity, u32)> {
        let (Some(quotas), Some(identity)) = (self.quotas(caller), caller.identity()) else {
            return Ok(None);
        };
        OpenPermit::take(&self.keepalives, identity, quotas.sessions)
            .map(Some)
            .ok_or_else(|| (identity.clone(), quotas.sessions))
    }
}

/// What a caller presented to authenticate: a verified client certificate's name and the
/// `authorization` header, kept by a call that stays open to authenticate it again
/// ([`LiveCaller`]). `Debug` shows no token.
#[derive(Clone, Default)]
pub struct Credential {
    certificate: Option<String>,
    authorization: Option<tonic::metadata::AsciiMetadataValue>,
}

impl Credential {
    /// The credential `request` presents.
    pub fn of<T>(request: &tonic::Request<T>) -> Credential {
        Credential {
            certificate: request
                .extensions()
                .get::<crate::connection::ClientCertName>()
                .map(|name| name.0.clone()),
            ..Credential::from_metadata(request.metadata())
        }
    }

    /// The credential in `metadata` alone (no client certificate).
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Credential {
        Credential {
            certificate: None,
            authorization: metadata.get("authorization").cloned(),
        }
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("certificate", &self.certificate)
            .field("authorization", &self.authorization.is_some())
            .finish()
    }
}

/// The caller of a call that stays open, with the credential it presented, so the call can
/// judge it again after a reload of the token file or the policy ([`Auth::live_caller`]).
#[derive(Debug)]
pub struct LiveCaller {
    caller: Caller,
    credential: Credential,
    reloads: watch::Receiver<u64>,
}

impl LiveCaller {
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Resolves after the next reload (at once if one happened since the last time it did).
    pub async fn reloaded(&mut self) {
        if self.reloads.changed().await.is_err() {
            // The `Auth` is gone, and with it any reload.
            std::future::pending::<()>().await;
        }
    }

    /// Checks that the credential still authenticates the same caller under `auth`'s files as
    /// now loaded: a token removed from the file, or given to another identity, is refused as
    /// unknown.
    pub fn still_authenticated(&self, auth: &Auth) -> Result<(), CoreError> {
        if auth.authenticate(&self.credential)? == self.caller {
            Ok(())
        } else {
            Err(CoreError::Unauthenticated {
                reason: CredentialError::Unknown,
            })
        }
    }
}

/// How many calls of one kind each identity has open on this node.
type OpenCounts = Arc<Mutex<HashMap<Identity, u32>>>;

/// Which locks a caller may read under a prefix ([`Auth::readable_under`]): the locks whose
/// names start with one of `prefixes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadScope {
    /// Sorted, none a prefix of another, so the locks under each form one run of names, the
    /// runs disjoint and in the prefixes' order. Empty: no lock.
    prefixes: Vec<String>,
}

impl ReadScope {
    /// The part of `prefix` that `granted` (prefixes with the read right) covers.
    fn under<'a>(prefix: &str, granted: impl Iterator<Item = &'a str>) -> ReadScope {
        let mut narrower = Vec::new();
        for granted in granted {
            if prefix.starts_with(granted) {
                return ReadScope {
                    prefixes: vec![prefix.to_string()],
                };
            }
            if granted.starts_with(prefix) {
                narrower.push(granted);
            }
        }
        narrower.sort_unstable();
        let mut prefixes: Vec<String> = Vec::with_capacity(narrower.len());
        for granted in narrower {
            // Sorted, a prefix comes right before every name it covers.
            if prefixes
                .last()
                .is_some_and(|kept| granted.starts_with(kept.as_str()))
            {
                continue;
            }
            prefixes.push(granted.to_string());
        }
        ReadScope { prefixes }
    }

    /// The prefixes, sorted, none covering another.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// True if `lock` is in scope: one binary search, however many prefixes.
    pub fn covers(&self, lock: &str) -> bool {
        // The only prefix that can cover `lock` is the last one not after it.
        let after = self.prefixes.partition_point(|p| p.as_str() <= lock);
        after > 0 && lock.starts_with(self.prefixes[after - 1].as_str())
    }
}

/// An identity's ask counted against its quotas until dropped ([`Auth::reserve`]).
#[derive(Debug)]
pub struct Reservation<'a> {
    auth: &'a Auth,
    identity: Identity,
    taken: Pending,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut pending = self.auth.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = pending.get_mut(&self.identity) {
            entry.sessions -= self.taken.sessions;
            entry.locks -= self.taken.locks;
            entry.waiters -= self.taken.waiters;
            if entry.sessions == 0 && entry.locks == 0 && entry.waiters == 0 {
                pending.remove(&self.identity);
            }
        }
    }
}

/// One open call of an identity, a watch or a keepalive stream ([`Auth::watch_permit`],
/// [`Auth::keepalive_permit`]), counted until dropped.
#[derive(Debug)]
pub struct OpenPermit {
    counts: OpenCounts,
    identity: Identity,
}

impl OpenPermit {
    /// Counts one more call of `identity` in `counts`, unless it has `max` open.
    fn take(counts: &OpenCounts, identity: &Identity, max: u32) -> Option<OpenPermit> {
        let mut open = counts.lock().unwrap_or_else(|e| e.into_inner());
        if open.get(identity).is_some_and(|count| *count >= max) || max == 0 {
            return None;
        }
        *open.entry(identity.clone()).or_insert(0) += 1;
        Some(OpenPermit {
            counts: counts.clone(),
            identity: identity.clone(),
        })
    }
}

impl Drop for OpenPermit {
    fn drop(&mut self) {
        let mut open = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.identity) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(tokens: &str, policy: &str) -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokens"), tokens).unwrap();
        std::fs::write(dir.path().join("policy"), policy).unwrap();
        let auth = Auth::load(
            Some(&dir.path().join("tokens")),
            Some(&dir.path().join("policy")),
        )
        .unwrap();
        (dir, auth)
    }

    fn bearer(token: &str) -> tonic::metadata::MetadataMap {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        metadata
    }

    #[test]
    fn a_policy_refuses_the_anonymous_and_the_unknown() {
        let alice = Identity::new("alice").unwrap();
        let (_dir, auth) = auth(&tokens::token_file_line(&alice, "tok-a"), "");
        let none = tonic::metadata::MetadataMap::new();
        assert_eq!(
            auth.identity_from(&none),
            Err(CoreError::Unauthenticated {
                reason: CredentialError::Missing
            })
        );
        assert_eq!(
            auth.identity_from(&bearer("tok-b")),
            Err(CoreError::Unauthenticated {
                reason: CredentialError::Unknown
            })
        );
        let mut basic = tonic::metadata::MetadataMap::new();
        basic.insert("authorization", "Basic YTpi".parse().unwrap());
        assert_eq!(
            auth.identity_from(&basic),
            Err(CoreError::Unauthenticated {
                reason: CredentialError::Malformed
            })
        );
        let caller = auth.identity_from(&bearer("tok-a")).unwrap();
        assert_eq!(caller.identity(), Some(&alice));
        assert!(matches!(
            auth.require(&caller, Right::Lock, "x"),
            Err(CoreError::PermissionDenied { .. })
        ));
    }

    #[test]
    fn without_a_policy_the_anonymous_may_do_everything_but_administer_and_a_wrong_token_is_refused()
     {
        let auth = Auth::open();
        let caller = auth
            .identity_from(&tonic::metadata::MetadataMap::new())
            .unwrap();
        assert_eq!(caller, Caller::anonymous());
        assert_eq!(auth.require(&caller, Right::Lock, "x"), Ok(()));
        assert_eq!(auth.require_viewer(&caller), Ok(()));
        let needed = Err(CoreError::Unauthenticated {
            reason: CredentialError::AdminTokenNeeded,
        });
        assert_eq!(auth.require_admin(&caller), needed);
        assert!(auth.identity_from(&bearer("made-up")).is_err());
        assert!(auth.quotas(&caller).is_none());

        // The admin token administers, and does everything else an anonymous caller does.
        auth.set_admin_token(|| "padm_the-token".to_string());
        let admin = auth.identity_from(&bearer("padm_the-token")).unwrap();
        assert_eq!(admin, Caller::with_admin_token());
        assert_eq!(auth.require_admin(&admin), Ok(()));
        assert_eq!(auth.require(&admin, Right::Lock, "x"), Ok(()));
        assert_eq!(admin.identity(), None);
        assert_eq!(
            auth.identity_from(&bearer("padm_another")).unwrap_err(),
            CoreError::Unauthenticated {
                reason: CredentialError::Unknown
            }
        );
    }

    #[test]
    fn with_a_policy_the_admin_token_is_no_credential() {
        let alice = Identity::new("alice").unwrap();
        let (_dir, auth) = auth(
            &tokens::token_file_line(&alice, "tok-a"),
            "grant alice admin *\n",
        );
        auth.set_admin_token(|| "padm_the-token".to_string());
        assert_eq!(
            auth.identity_from(&bearer("padm_the-token")).unwrap_err(),
            CoreError::Unauthenticated {
                reason: CredentialError::Unknown
            }
        );
        let caller = auth.identity_from(&bearer("tok-a")).unwrap();
        assert_eq!(auth.require_admin(&caller), Ok(()));
    }

    #[tokio::test]
    async fn a_live_caller_is_refused_after_a_reload_removes_its_token_or_gives_it_to_another() {
        let alice = Identity::new("alice").unwrap();
        let bob = Identity::new("bob").unwrap();
        let (dir, auth) = auth(&tokens::token_file_line(&alice, "tok-a"), "");
        let mut live = auth
            .live_caller(Credential::from_metadata(&bearer("tok-a")))
            .unwrap();
        assert_eq!(live.caller().identity(), Some(&alice));
        let unknown = Err(CoreError::Unauthenticated {
            reason: CredentialError::Unknown,
        });
        let tokens = dir.path().join("tokens");
        for (file, judged) in [
            (tokens::token_file_line(&alice, "tok-a"), Ok(())),
            (tokens::token_file_line(&bob, "tok-a"), unknown.clone()),
            (String::new(), unknown),
        ] {
            std::fs::write(&tokens, file).unwrap();
            auth.reload().unwrap();
            live.reloaded().await;
            assert_eq!(live.still_authenticated(&auth), judged);
        }
    }

    #[test]
    fn a_read_scope_is_the_part_of_the_prefix_the_policy_lets_an_identity_read() {
        let alice = Identity::new("alice").unwrap();
        let bob = Identity::new("bob").unwrap();
        let (_dir, auth) = auth(
            &format!(
                "{}\n{}",
                tokens::token_file_line(&alice, "tok-a"),
                tokens::token_file_line(&bob, "tok-b")
            ),
            "grant alice read a/\ngrant alice read a/x/\ngrant alice read c/\ngrant alice lock b/\n",
        );
        let alice = Caller::authenticated(alice);
        let everything = auth.readable_under(&alice, "").unwrap();
        assert_eq!(everything.prefixes(), ["a/", "c/"]);
        assert!(everything.covers("a/1") && everything.covers("c/") && everything.covers("a/x/y"));
        assert!(!everything.covers("b/x") && !everything.covers("a") && !everything.covers("d"));
        assert_eq!(
            auth.readable_under(&alice, "a/x").unwrap().prefixes(),
            ["a/x"]
        );
        assert!(
            auth.readable_under(&alice, "b/")
                .unwrap()
                .prefixes()
                .is_empty()
        );
        assert!(matches!(
            auth.readable_under(&Caller::authenticated(bob), ""),
            Err(CoreError::PermissionDenied { .. })
        ));
        assert!(matches!(
            auth.readable_under(&Caller::anonymous(), ""),
            Err(CoreError::Unauthenticated { .. })
        ));
        assert_eq!(
            Auth::open()
                .readable_under(&Caller::anonymous(), "q")
                .unwrap()
                .prefixes(),
            ["q"]
        );
    }

    #[test]
    fn concurrent_asks_of_one_identity_cannot_pass_its_quota_together() {
        let alice = Identity::new("alice").unwrap();
        let (_dir, auth) = auth(
            &tokens::token_file_line(&alice, "tok-a"),
            "grant alice lock *\nquota alice sessions=2 locks=1 waiters=1\n",
        );
        let caller = Caller::authenticated(alice);
        let none = |_: &Identity| Ok::<_, CoreError>(Usage::default());
        let first = auth.reserve(&caller, Ask::Session, none).unwrap();
        let second = auth.reserve(&caller, Ask::Session, none).unwrap();
        assert!(first.is_some() && second.is_some());
        let third = auth.reserve(&caller, Ask::Session, none).unwrap_err();
        assert!(matches!(
            third,
            CoreError::QuotaReached {
                quota: Quota::Sessions,
                quota_max: 2,
                ..
            }
        ));
        drop(first);
        assert!(auth.reserve(&caller, Ask::Session, none).is_ok());
        let held = |_: &Identity| {
            Ok::<_, CoreError>(Usage {
                sessions: 1,
                held: 1,
                waiting: 0,
            })
        };
        assert!(matches!(
            auth.reserve(
                &caller,
                Ask::Locks {
                    locks: 1,
                    waits: false
                },
                held
            ),
            Err(CoreError::QuotaReached {
                quota: Quota::Locks,
                ..
            })
        ));
        let watch = auth.watch_permit(&caller).unwrap();
        assert!(watch.is_some());
    }
}
