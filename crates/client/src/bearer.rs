//! The bearer token a client authenticates with: sent as `authorization: Bearer <token>` on
//! every call, to a lock service that has a token file (`palisade serve --tokens`).

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;

/// Longest token, in bytes (the server's limit too).
pub const BEARER_TOKEN_BYTES_MAX: usize = 256;

/// Environment variable holding the bearer token ([`crate::Client::from_env`], `palisade`).
/// Not `PALISADE_TOKEN`: that is the fencing token `palisade lock` gives its command.
pub const AUTH_TOKEN_ENV: &str = "PALISADE_AUTH_TOKEN";

/// A bearer token: 1 to [`BEARER_TOKEN_BYTES_MAX`] printable ASCII characters. `Debug` never
/// shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken {
    header: AsciiMetadataValue,
}

impl BearerToken {
    /// A token, refused unless it is printable ASCII within the length limit (surrounding
    /// white space, such as a file's final newline, is dropped first).
    pub fn new(token: &str) -> Result<BearerToken, String> {
        let token = token.trim();
        if token.is_empty() || token.len() > BEARER_TOKEN_BYTES_MAX {
            return Err(format!(
                "a bearer token is 1 to {BEARER_TOKEN_BYTES_MAX} characters, not {}",
                token.len()
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a bearer token is printable ASCII without spaces".to_string());
        }
        let mut header: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|e| format!("a bearer token cannot be sent: {e}"))?;
        header.set_sensitive(true);
        Ok(BearerToken { header })
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(…)")
    }
}

/// Adds the `authorization` header to every request of a channel, if there is a token.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<BearerToken>);

impl Bearer {
    pub fn new(token: Option<BearerToken>) -> Bearer {
        Bearer(token)
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_sent_as_a_bearer_header_and_never_shown() {
        let token = BearerToken::new("pst_abc\n").unwrap();
        assert_eq!(format!("{token:?}"), "BearerToken(…)");
        let request = Bearer::new(Some(token))
            .call(tonic::Request::new(()))
            .unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer pst_abc"
        );
        let request = Bearer::default().call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get("authorization").is_none());
        assert!(BearerToken::new("").is_err());
        assert!(BearerToken::new("a b").is_err());
        assert!(BearerToken::new(&"a".repeat(257)).is_err());
    }
}
