//! A token file and a policy as an operator writes them, for a `palisade serve` started with
//! `--tokens` and `--policy` ([`crate::ServerProcess::with_auth`]): tokens made by
//! `palisade token new`, and the edits a reload (SIGHUP) is tested with: a policy rewritten, an
//! identity's token line removed.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// `tokens` and `policy` in a directory of the test's.
#[derive(Debug)]
pub struct AuthFiles {
    dir: PathBuf,
    /// Each identity's token, and its line of the token file.
    tokens: BTreeMap<String, (String, String)>,
}

impl AuthFiles {
    /// Writes `dir/tokens`, with a token for each of `identities` (made by `bin token new`),
    /// and `dir/policy`.
    pub fn write(bin: impl AsRef<OsStr>, dir: &Path, identities: &[&str], policy: &str) -> Self {
        let tokens = identities
            .iter()
            .map(|name| (name.to_string(), crate::new_token(bin.as_ref(), name)))
            .collect();
        let files = AuthFiles {
            dir: dir.to_path_buf(),
            tokens,
        };
        files.write_tokens(|_| true);
        files.set_policy(policy);
        files
    }

    /// `name`'s bearer token.
    pub fn token(&self, name: &str) -> String {
        self.tokens[name].0.clone()
    }

    pub fn tokens_path(&self) -> PathBuf {
        self.dir.join("tokens")
    }

    pub fn policy_path(&self) -> PathBuf {
        self.dir.join("policy")
    }

    /// Replaces the policy file (a running server reads it on its next SIGHUP).
    pub fn set_policy(&self, policy: &str) {
        std::fs::write(self.policy_path(), policy).expect("write the policy");
    }

    /// Rewrites the token file without `name`'s line: its token is revoked at the next SIGHUP.
    pub fn remove_token(&self, name: &str) {
        assert!(self.tokens.contains_key(name), "no token for {name}");
        self.write_tokens(|other| other != name);
    }

    fn write_tokens(&self, keep: impl Fn(&str) -> bool) {
        let mut file = String::from("# NAME SHA256HEX\n");
        for (name, (_, line)) in &self.tokens {
            if keep(name) {
                file.push_str(line);
                file.push('\n');
            }
        }
        std::fs::write(self.tokens_path(), file).expect("write the token file");
    }
}
