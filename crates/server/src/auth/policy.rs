//! The policy file (`palisade serve --policy FILE`): which identity has which right on which
//! lock-name prefixes, and each identity's quotas.
//!
//! ```text
//! # comment
//! grant IDENTITY RIGHTS PREFIX        # RIGHTS: lock, read, admin, comma-separated
//! quota IDENTITY sessions=N locks=N waiters=N watches=N   # any subset of the four
//! ```
//!
//! - `IDENTITY` is a name from the token file, or `*`: every authenticated identity.
//! - `PREFIX` is compared byte for byte with a lock's name (`jobs/` covers `jobs/nightly`, not
//!   `jobs`); `*` alone covers every lock. A prefix holds no white space.
//! - `admin` is cluster-wide: it is granted on `*` only.
//! - Rights add up over every line that names the identity or `*`; nothing is ever taken away.
//! - A `quota` line for an identity replaces the default for the quotas it names; `quota *`
//!   changes the default of every identity without a line of its own.
//!
//! Default-deny: what no line grants is refused.

use std::collections::BTreeMap;
use std::path::Path;

use palisade_core::limits::LOCK_NAME_BYTES_MAX;
use palisade_core::{Identity, Quota, Right};

use super::FileError;
use crate::limits::{POLICY_FILE_BYTES_MAX, POLICY_RULES_MAX};

/// Quotas of an identity without a `quota` line, unless `quota *` says otherwise: well below
/// the service's global caps, so that no one identity can take them.
pub const DEFAULT_QUOTAS: Quotas = Quotas {
    sessions: 1_000,
    locks: 10_000,
    waiters: 1_000,
    watches: 1_000,
};

/// The largest value each quota may be given: the service's cap of the same thing.
pub fn quota_ceiling(quota: Quota) -> u32 {
    let ceiling = match quota {
        Quota::Sessions => palisade_core::limits::SESSIONS_MAX,
        Quota::Locks => palisade_core::limits::LOCKS_MAX,
        Quota::Waiters => crate::limits::WAITING_ACQUIRES_MAX,
        Quota::Watches => crate::limits::WATCHES_MAX,
    };
    u32::try_from(ceiling).expect("every cap fits a u32")
}

const _: () = assert!(DEFAULT_QUOTAS.sessions as usize <= palisade_core::limits::SESSIONS_MAX);
const _: () = assert!(DEFAULT_QUOTAS.locks as usize <= palisade_core::limits::LOCKS_MAX);
const _: () = assert!(DEFAULT_QUOTAS.waiters as usize <= crate::limits::WAITING_ACQUIRES_MAX);
const _: () = assert!(DEFAULT_QUOTAS.watches as usize <= crate::limits::WATCHES_MAX);

/// How much one identity may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub sessions: u32,
    pub locks: u32,
    pub waiters: u32,
    pub watches: u32,
}

impl Quotas {
    pub fn get(&self, quota: Quota) -> u32 {
        match quota {
            Quota::Sessions => self.sessions,
            Quota::Locks => self.locks,
            Quota::Waiters => self.waiters,
            Quota::Watches => self.watches,
        }
    }

    fn set(&mut self, quota: Quota, value: u32) {
        match quota {
            Quota::Sessions => self.sessions = value,
            Quota::Locks => self.locks = value,
            Quota::Waiters => self.waiters = value,
            Quota::Watches => self.watches = value,
        }
    }
}

/// Whom a line is about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    Everyone,
    One(Identity),
}

impl Subject {
    fn covers(&self, identity: &Identity) -> bool {
        match self {
            Subject::Everyone => true,
            Subject::One(one) => one == identity,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    subject: Subject,
    rights: Vec<Right>,
    /// Empty: every lock.
    prefix: String,
}

/// A parsed policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    grants: Vec<Grant>,
    quotas: BTreeMap<Identity, Quotas>,
    default_quotas: Quotas,
    /// Lines that mean something other than they seem to (N15), as `(line number, why)`.
    warnings: Vec<(usize, String)>,
}

impl Policy {
    /// Reads and parses the file at `path`.
    /// Reads and parses the file at `path`, logging a warning for each line whose prefix
    /// covers other locks than it seems to ([`Policy::warnings`]).
    pub fn load(path: &Path) -> Result<Policy, FileError> {
        let text = super::read_limited(path, POLICY_FILE_BYTES_MAX)?;
        let policy = Policy::parse(&text).map_err(|(line, message)| FileError::Line {
            path: path.to_path_buf(),
            line,
            message,
        })?;
        for (line, warning) in &policy.warnings {
            tracing::warn!("{}:{line}: {warning}", path.display());
        }
        Ok(policy)
    }

    /// The lines whose prefix covers other locks than it seems to, as `(line number, why)`:
    /// a prefix that does not end in a separator (`jobs` covers `jobs2` and `jobs-prod` too),
    /// and a `*` inside a prefix (a literal character, not a wildcard). They load all the same.
    pub fn warnings(&self) -> &[(usize, String)] {
        &self.warnings
    }

    /// Parses a policy's text; an error is `(line number, what is wrong)`.
    pub fn parse(text: &str) -> Result<Policy, (usize, String)> {
        let mut grants = Vec::new();
        let mut warnings = Vec::new();
        // Quota lines, in order, applied on top of the defaults once all are read.
        let mut quota_lines: Vec<(Subject, Vec<(Quota, u32)>)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if grants.len() + quota_lines.len() == POLICY_RULES_MAX {
                return Err((number, format!("more than {POLICY_RULES_MAX} rules")));
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let fail = |message: String| Err((number, message));
            match fields[0] {
                "grant" => {
                    let [_, subject, rights, prefix] = fields[..] else {
                        return fail(format!(
                            "expected `grant IDENTITY RIGHTS PREFIX`, found {} fields",
                            fields.len()
                        ));
                    };
                    let subject = parse_subject(subject).map_err(|e| (number, e))?;
                    let rights = parse_rights(rights).map_err(|e| (number, e))?;
                    let prefix = parse_prefix(prefix).map_err(|e| (number, e))?;
                    if rights.contains(&Right::Admin) && !prefix.is_empty() {
                        return fail(format!(
                            "admin is cluster-wide: grant it on `*`, not on the prefix {prefix:?}"
                        ));
                    }
                    warnings.extend(prefix_warning(&prefix).map(|w| (number, w)));
                    grants.push(Grant {
                        subject,
                        rights,
                        prefix,
                    });
                }
                "quota" => {
                    if fields.len() < 3 {
                        return fail(
                            "expected `quota IDENTITY NAME=N ...` with at least one of sessions, locks, waiters, watches"
                                .to_string(),
                        );
                    }
                    let subject = parse_subject(fields[1]).map_err(|e| (number, e))?;
                    let mut values = Vec::new();
                    for field in &fields[2..] {
                        let value = parse_quota(field).map_err(|e| (number, e))?;
                        if values.iter().any(|(q, _)| *q == value.0) {
                            return fail(format!("{} is given twice", value.0));
                        }
                        values.push(value);
                    }
                    quota_lines.push((subject, values));
                }
                other => {
                    return fail(format!(
                        "unknown rule {:?}: a line is `grant ...`, `quota ...` or a `#` comment",
                        other.chars().take(40).collect::<String>()
                    ));
                }
            }
        }
        let mut default_quotas = DEFAULT_QUOTAS;
        for (subject, values) in &quota_lines {
            if *subject == Subject::Everyone {
                for &(quota, value) in values {
                    default_quotas.set(quota, value);
                }
            }
        }
        let mut quotas: BTreeMap<Identity, Quotas> = BTreeMap::new();
        for (subject, values) in quota_lines {
            if let Subject::One(identity) = subject {
                let entry = quotas.entry(identity).or_insert(default_quotas);
                for (quota, value) in values {
                    entry.set(quota, value);
                }
            }
        }
        Ok(Policy {
            grants,
            quotas,
            default_quotas,
            warnings,
        })
    }

    /// True when a line grants `identity` the `right` on a prefix of `lock`.
    pub fn allows(&self, identity: &Identity, right: Right, lock: &str) -> bool {
        self.grants.iter().any(|g| {
            g.subject.covers(identity) && g.rights.contains(&right) && lock.starts_with(&g.prefix)
        })
    }

    /// True when a line grants `identity` the `right` on every lock whose name starts with
    /// `prefix` (its own prefix is a prefix of `prefix`).
    pub fn allows_all_under(&self, identity: &Identity, right: Right, prefix: &str) -> bool {
        self.allows(identity, right, prefix)
    }

    /// The prefixes on which some line grants `identity` the `right` (`""`: every lock), in
    /// the file's order, repeats included.
    pub fn prefixes_granting<'a>(
        &'a self,
        identity: &'a Identity,
        right: Right,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.grants
            .iter()
            .filter(move |g| g.subject.covers(identity) && g.rights.contains(&right))
            .map(|g| g.prefix.as_str())
    }

    /// The quotas of `identity`.
    pub fn quotas(&self, identity: &Identity) -> Quotas {
        self.quotas
            .get(identity)
            .copied()
            .unwrap_or(self.default_quotas)
    }

    /// How many rules the policy has, for the log.
    pub fn rule_count(&self) -> usize {
        self.grants.len() + self.quotas.len()
    }
}

fn parse_subject(text: &str) -> Result<Subject, String> {
    if text == "*" {
        return Ok(Subject::Everyone);
    }
    Identity::new(text).map(Subject::One)
}

fn parse_rights(text: &str) -> Result<Vec<Right>, String> {
    let mut rights = Vec::new();
    for name in text.split(',') {
        let right = Right::from_name(name).ok_or_else(|| {
            format!(
                "unknown right {:?}: rights are lock, read and admin, separated by commas",
                name.chars().take(40).collect::<String>()
            )
        })?;
        if !rights.contains(&right) {
            rights.push(right);
        }
    }
    Ok(rights)
}

fn parse_prefix(text: &str) -> Result<String, String> {
    if text == "*" {
        return Ok(String::new());
    }
    if text.len() > LOCK_NAME_BYTES_MAX {
        return Err(format!(
            "a prefix is at most {LOCK_NAME_BYTES_MAX} bytes, like a lock name"
        ));
    }
    if text.chars().any(char::is_control) {
        return Err("a prefix holds no control characters, like a lock name".to_string());
    }
    Ok(text.to_string())
}

/// Why a prefix covers other locks than it seems to, if it does (N15). A prefix is compared
/// byte for byte, so only a separator at its end (anything but a letter or a digit: `/`, `:`,
/// `.`, `-`, `_`) stops it at a boundary between names.
fn prefix_warning(prefix: &str) -> Option<String> {
    if prefix.contains('*') {
        let suggested = prefix.split('*').next().unwrap_or_default();
        return Some(format!(
            "the prefix {prefix:?} holds `*`, which is a literal character inside a prefix, not a wildcard: \
             it covers only locks whose names start with {prefix:?}. To cover every lock under {suggested:?}, \
             write {suggested:?}; `*` alone covers every lock"
        ));
    }
    let last = prefix.chars().next_back()?;
    last.is_alphanumeric().then(|| {
        format!(
            "the prefix {prefix:?} does not end in a separator, so it covers every lock whose name starts \
             with it ({prefix}2, {prefix}-old, ...), not only {prefix:?} and the locks under it; \
             end it with a separator (\"{prefix}/\") unless that is meant"
        )
    })
}

fn parse_quota(field: &str) -> Result<(Quota, u32), String> {
    let (name, value) = field
        .split_once('=')
        .ok_or_else(|| format!("{field:?} is not NAME=N"))?;
    let quota = Quota::from_name(name).ok_or_else(|| {
        format!(
            "unknown quota {:?}: quotas are sessions, locks, waiters and watches",
            name.chars().take(40).collect::<String>()
        )
    })?;
    let ceiling = quota_ceiling(quota);
    let value: u32 = value
        .parse()
        .ok()
        .filter(|v| *v <= ceiling)
        .ok_or_else(|| format!("{quota}={value}: a {quota} quota is a number from 0 to {ceiling}, the service's cap"))?;
    Ok((quota, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> Identity {
        Identity::new(name).unwrap()
    }

    /// N15: a prefix without a trailing separator, or with a `*` inside, loads but is named.
    #[test]
    fn prefixes_that_cover_other_locks_than_they_seem_to_are_warned_of() {
        let policy = Policy::parse(
            "grant bob lock jobs\n\
             grant bob lock jobs/*\n\
             grant bob lock jobs/\n\
             grant bob lock team:\n\
             grant bob lock reports-\n\
             grant * read *\n",
        )
        .unwrap();
        let warnings = policy.warnings();
        assert_eq!(
            warnings.iter().map(|(line, _)| *line).collect::<Vec<_>>(),
            vec![1, 2],
            "{warnings:?}"
        );
        assert!(
            warnings[0].1.contains("does not end in a separator"),
            "{warnings:?}"
        );
        assert!(warnings[0].1.contains("jobs2"), "{warnings:?}");
        assert!(warnings[1].1.contains("not a wildcard"), "{warnings:?}");
        assert!(warnings[1].1.contains(r#"write "jobs/""#), "{warnings:?}");
        // The lines still mean what they always meant.
        assert!(policy.allows(&id("bob"), Right::Lock, "jobs-prod"));
        assert!(policy.allows(&id("bob"), Right::Lock, "jobs/*x"));
    }

    #[test]
    fn rights_are_granted_on_prefixes_and_nothing_else() {
        let policy = Policy::parse(
            "# who may do what\n\
             grant alice lock,read jobs/\n\
             grant bob read jobs/\n\
             grant * read public/\n\
             grant ops admin,read *\n",
        )
        .unwrap();
        assert!(policy.allows(&id("alice"), Right::Lock, "jobs/nightly"));
        assert!(!policy.allows(&id("alice"), Right::Lock, "jobs"));
        assert!(!policy.allows(&id("alice"), Right::Lock, "other/x"));
        assert!(!policy.allows(&id("bob"), Right::Lock, "jobs/nightly"));
        assert!(policy.allows(&id("bob"), Right::Read, "jobs/nightly"));
        assert!(policy.allows(&id("carol"), Right::Read, "public/x"));
        assert!(!policy.allows(&id("carol"), Right::Read, "jobs/x"));
        assert!(policy.allows(&id("ops"), Right::Admin, ""));
        assert!(policy.allows(&id("ops"), Right::Read, "anything"));
        assert!(!policy.allows(&id("alice"), Right::Admin, ""));
        assert!(policy.allows_all_under(&id("alice"), Right::Read, "jobs/n"));
        assert!(!policy.allows_all_under(&id("alice"), Right::Read, "jo"));
        assert!(!policy.allows_all_under(&id("alice"), Right::Read, ""));
    }

    #[test]
    fn quotas_default_and_per_identity() {
        let policy = Policy::parse(
            "quota * sessions=5\n\
             quota alice locks=2 waiters=0\n",
        )
        .unwrap();
        let alice = policy.quotas(&id("alice"));
        assert_eq!(
            (alice.sessions, alice.locks, alice.waiters, alice.watches),
            (5, 2, 0, DEFAULT_QUOTAS.watches)
        );
        let bob = policy.quotas(&id("bob"));
        assert_eq!((bob.sessions, bob.locks), (5, DEFAULT_QUOTAS.locks));
    }

    #[test]
    fn bad_lines_are_refused_with_their_number_and_reason() {
        for (text, number, words) in [
            ("grant alice lock\n", 1, "grant IDENTITY RIGHTS PREFIX"),
            ("\ngrant alice write jobs/\n", 2, "unknown right"),
            ("grant alice admin jobs/\n", 1, "cluster-wide"),
            ("grant al/ice lock jobs/\n", 1, "identity"),
            ("quota alice\n", 1, "at least one"),
            ("quota alice sessions=x\n", 1, "a number from 0"),
            ("quota alice sessions=60000\n", 1, "50000"),
            ("quota alice files=1\n", 1, "unknown quota"),
            ("quota alice locks=1 locks=2\n", 1, "twice"),
            ("allow alice lock x\n", 1, "unknown rule"),
        ] {
            let (found, message) = Policy::parse(text).unwrap_err();
            assert_eq!(found, number, "{text:?}: {message}");
            assert!(message.contains(words), "{text:?}: {message}");
        }
    }
}
