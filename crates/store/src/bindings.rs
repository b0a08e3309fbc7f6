//! [`Bindings`]: which lock may write which keys, set by the store's operator.
//!
//! Without bindings, a key is bound to the lock of its first fenced write, for ever: whoever
//! holds *any* lock first can take a key another job expects to write (key squatting). With
//! bindings, the operator says it instead: each binding gives every key starting with a prefix
//! to one lock, the longest matching prefix wins, and a key no binding covers is refused to
//! every sequencer (default-deny). What the first writer of a key recorded is then ignored, so
//! a key squatted before the bindings were configured goes to the lock they name.
//!
//! Text form, one binding per line (`#` starts a comment line; blank lines are skipped), or one
//! per `--bind` flag: `PREFIX=LOCK`, such as `reports/=jobs/nightly`. The prefix is compared
//! byte for byte (`reports/` does not cover `reports`); an empty prefix (`=shared`) covers every
//! key no longer prefix covers.

use crate::StoreError;
use crate::limits::{BINDINGS_MAX, KEY_BYTES_MAX};

/// The operator's key → lock bindings (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bindings {
    /// `(prefix, lock)`, longest prefix first.
    rules: Vec<(String, String)>,
}

/// What the bindings say about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding<'a> {
    /// Only this lock may write or fence-read the key.
    Lock(&'a str),
    /// No binding covers the key: nobody may write it.
    Unbound,
}

impl Bindings {
    /// Bindings from `PREFIX=LOCK` texts (the `--bind` flags). Refuses a malformed binding, a
    /// prefix bound twice, none at all, and more than [`BINDINGS_MAX`].
    pub fn from_rules<'a>(rules: impl IntoIterator<Item = &'a str>) -> Result<Bindings, String> {
        let mut parsed: Vec<(String, String)> = Vec::new();
        for rule in rules {
            let (prefix, lock) = parse_rule(rule)?;
            if parsed.iter().any(|(known, _)| *known == prefix) {
                return Err(format!("the key prefix {prefix:?} is bound twice"));
            }
            if parsed.len() == BINDINGS_MAX {
                return Err(format!("more than {BINDINGS_MAX} bindings"));
            }
            parsed.push((prefix, lock));
        }
        if parsed.is_empty() {
            return Err("no binding given".to_owned());
        }
        // Longest prefix first, so the first match is the longest.
        parsed.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Ok(Bindings { rules: parsed })
    }

    /// Bindings from a file's text: one `PREFIX=LOCK` per line, `#` comment lines, blank lines
    /// skipped. An error names the line.
    pub fn parse(text: &str) -> Result<Bindings, String> {
        let mut rules = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            parse_rule(line).map_err(|error| format!("line {}: {error}", index + 1))?;
            rules.push(line);
        }
        Bindings::from_rules(rules)
    }

    /// The lock the longest matching prefix names, or [`Binding::Unbound`].
    pub fn lock_for(&self, key: &str) -> Binding<'_> {
        self.rules
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix.as_str()))
            .map_or(Binding::Unbound, |(_, lock)| Binding::Lock(lock))
    }

    /// The bindings, longest prefix first.
    pub fn rules(&self) -> impl Iterator<Item = (&str, &str)> {
        self.rules
            .iter()
            .map(|(prefix, lock)| (prefix.as_str(), lock.as_str()))
    }

    /// Refuses `key` unless the bindings give it to `lock`.
    pub(crate) fn check(&self, key: &str, lock: &str) -> Result<(), StoreError> {
        match self.lock_for(key) {
            Binding::Lock(bound) if bound == lock => Ok(()),
            Binding::Lock(bound) => Err(StoreError::WrongLock {
                key: Some(key.to_owned()),
                expected: bound.to_owned(),
                presented: lock.to_owned(),
            }),
            Binding::Unbound => Err(StoreError::Unbound {
                key: key.to_owned(),
            }),
        }
    }
}

/// `PREFIX=LOCK`, split at the first `=` (a lock name may hold `=`, a prefix may not).
fn parse_rule(rule: &str) -> Result<(String, String), String> {
    let (prefix, lock) = rule
        .split_once('=')
        .ok_or_else(|| format!("{rule:?} is not PREFIX=LOCK"))?;
    if prefix.len() > KEY_BYTES_MAX {
        return Err(format!(
            "the key prefix of {rule:?} is longer than {KEY_BYTES_MAX} bytes"
        ));
    }
    if prefix.chars().any(char::is_control) {
        return Err(format!(
            "the key prefix of {rule:?} holds a control character"
        ));
    }
    palisade_core::LockName::new(lock)
        .map_err(|error| format!("the lock of {rule:?} is not a valid lock name: {error}"))?;
    Ok((prefix.to_owned(), lock.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_decides_and_unlisted_keys_are_unbound() {
        let bindings =
            Bindings::from_rules(["reports/=jobs/nightly", "reports/daily/=jobs/daily"]).unwrap();
        assert_eq!(
            bindings.lock_for("reports/x"),
            Binding::Lock("jobs/nightly")
        );
        assert_eq!(
            bindings.lock_for("reports/daily/x"),
            Binding::Lock("jobs/daily")
        );
        assert_eq!(bindings.lock_for("reports"), Binding::Unbound);
        assert_eq!(bindings.lock_for("other"), Binding::Unbound);
        let catch_all = Bindings::from_rules(["=shared", "a/=a"]).unwrap();
        assert_eq!(catch_all.lock_for("b"), Binding::Lock("shared"));
        assert_eq!(catch_all.lock_for("a/b"), Binding::Lock("a"));
    }

    #[test]
    fn bad_bindings_are_refused_with_the_reason() {
        for (rules, expected) in [
            (vec!["reports/"], "not PREFIX=LOCK"),
            (vec!["reports/="], "not a valid lock name"),
            (vec!["a=x", "a=y"], "bound twice"),
            (vec![], "no binding"),
            (vec!["a\u{1}=x"], "control character"),
        ] {
            let error = Bindings::from_rules(rules.iter().copied()).unwrap_err();
            assert!(error.contains(expected), "{rules:?}: {error}");
        }
        let error = Bindings::parse("# ok\nreports/=jobs/nightly\n\nbroken\n").unwrap_err();
        assert!(error.starts_with("line 4:"), "{error}");
    }
}
