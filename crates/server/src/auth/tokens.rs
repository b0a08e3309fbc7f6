//! Bearer tokens: the token file (`palisade serve --tokens FILE`) and the look-up of a
//! presented token.
//!
//! The file holds one `NAME SHA256HEX` line per token, the identity the token authenticates and
//! the SHA-256 of the token, so the server never stores a token itself: a leaked file gives no
//! one a credential. `#` starts a comment line; blank lines are ignored. An identity may have
//! several tokens (to rotate one without downtime); a digest may appear once.

use std::path::Path;

use palisade_core::Identity;
use sha2::{Digest, Sha256};

use super::FileError;
use crate::limits::{TOKEN_BYTES_MAX, TOKEN_FILE_BYTES_MAX, TOKENS_MAX};

/// The SHA-256 of a token.
type TokenDigest = [u8; 32];

/// The tokens a server accepts, each with the identity it authenticates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenFile {
    entries: Vec<(Identity, TokenDigest)>,
}

impl TokenFile {
    /// Reads and parses the file at `path`; an error names the path and, for a bad line, its
    /// number.
    pub fn load(path: &Path) -> Result<TokenFile, FileError> {
        let text = super::read_limited(path, TOKEN_FILE_BYTES_MAX)?;
        TokenFile::parse(&text).map_err(|(line, message)| FileError::Line {
            path: path.to_path_buf(),
            line,
            message,
        })
    }

    /// Parses a token file's text; an error is `(line number, what is wrong)`.
    pub fn parse(text: &str) -> Result<TokenFile, (usize, String)> {
        let mut entries: Vec<(Identity, TokenDigest)> = Vec::new();
        let mut lines_of: Vec<usize> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, hex] = fields[..] else {
                return Err((
                    number,
                    format!(
                        "expected `NAME SHA256HEX` (two fields), found {} fields",
                        fields.len()
                    ),
                ));
            };
            let identity = Identity::new(name).map_err(|e| (number, e))?;
            let digest = parse_digest(hex).ok_or_else(|| {
                (
                    number,
                    "the second field must be the token's SHA-256 as 64 hex digits (what `palisade token new` prints)"
                        .to_string(),
                )
            })?;
            if let Some(earlier) = entries.iter().position(|(_, d)| *d == digest) {
                return Err((
                    number,
                    format!(
                        "the same token digest is on line {} already",
                        lines_of[earlier]
                    ),
                ));
            }
            if entries.len() == TOKENS_MAX {
                return Err((number, format!("more than {TOKENS_MAX} tokens")));
            }
            entries.push((identity, digest));
            lines_of.push(number);
        }
        Ok(TokenFile { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The identity `token` authenticates, if the file has it.
    ///
    /// The token is hashed, and its digest compared with every entry's without an early exit
    /// (each comparison touches every byte, and the loop visits every entry), so the time taken
    /// says nothing about how close a guess came, nor which entry matched.
    pub fn identify(&self, token: &str) -> Option<Identity> {
        let presented: TokenDigest = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<usize> = None;
        for (index, (_, digest)) in self.entries.iter().enumerate() {
            let difference = presented
                .iter()
                .zip(digest)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(difference) == 0 {
                found = Some(index);
            }
        }
        found.map(|index| self.entries[index].0.clone())
    }
}

/// Bytes of randomness in a token [`new_token`] draws: 256 bits, beyond guessing.
pub const NEW_TOKEN_RANDOM_BYTES: usize = 32;

/// A fresh token: `pst_` and 64 hex digits of the operating system's randomness. The prefix
/// lets secret scanners recognise one.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; NEW_TOKEN_RANDOM_BYTES];
    crate::entropy::fill(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("pst_{hex}"))
}

/// The line a token file needs for `token` to authenticate `identity`.
pub fn token_file_line(identity: &Identity, token: &str) -> String {
    let digest: TokenDigest = Sha256::digest(token.as_bytes()).into();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{identity} {hex}")
}

/// Checks a presented token's form: 1 to [`TOKEN_BYTES_MAX`] printable ASCII characters.
pub fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= TOKEN_BYTES_MAX
        && token.bytes().all(|b| b.is_ascii_graphic())
}

fn parse_digest(hex: &str) -> Option<TokenDigest> {
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let high = (pair[0] as char).to_digit(16)?;
        let low = (pair[1] as char).to_digit(16)?;
        digest[i] = (high * 16 + low) as u8;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_authenticates_the_identity_of_its_line_only() {
        let alice = Identity::new("alice").unwrap();
        let file = format!(
            "# tokens\n\n{}\n{}\n",
            token_file_line(&alice, "pst_one"),
            token_file_line(&Identity::new("bob").unwrap(), "pst_two"),
        );
        let tokens = TokenFile::parse(&file).unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.identify("pst_one"), Some(alice));
        assert_eq!(tokens.identify("pst_two").unwrap().as_str(), "bob");
        assert_eq!(tokens.identify("pst_on"), None);
        assert_eq!(tokens.identify(""), None);
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        let line = token_file_line(&Identity::new("a").unwrap(), "t");
        for (text, number, words) in [
            ("a b c\n".to_string(), 1, "two fields"),
            ("\n#\nalice\n".to_string(), 3, "two fields"),
            ("al ice 00\n".to_string(), 1, "two fields"),
            ("a*b 00\n".to_string(), 1, "identity"),
            ("alice 0011\n".to_string(), 1, "64 hex digits"),
            (format!("{line}\n{line}\n"), 2, "line 1 already"),
        ] {
            let (found, message) = TokenFile::parse(&text).unwrap_err();
            assert_eq!(found, number, "{text:?}: {message}");
            assert!(message.contains(words), "{text:?}: {message}");
        }
    }

    #[test]
    fn tokens_are_printable_ascii_within_the_limit() {
        assert!(valid_token("pst_abc"));
        assert!(!valid_token(""));
        assert!(!valid_token("a b"));
        assert!(!valid_token("é"));
        assert!(!valid_token(&"a".repeat(TOKEN_BYTES_MAX + 1)));
    }
}
