//! Which names an HTTP listener answers to: the web UI's and the fenced store's defence against
//! DNS rebinding.
//!
//! A web page an operator visits can point a name it controls at 127.0.0.1 (or any address the
//! operator's browser reaches) and then read that address's answers as its own origin. Every
//! such request carries the attacker's name in its `Host` header. So a listener answers only
//! requests whose `Host` is:
//!
//! - `localhost` (or a name under `.localhost`, which browsers resolve to loopback themselves);
//! - an IP address literal: a page can only be served from an address the attacker's own
//!   origin does not share, so a literal cannot be rebound;
//! - a name the operator configured ([`AllowedHosts::new`]), compared without case and port;
//! - or absent (HTTP/1.0 clients; a browser always sends one).
//!
//! Anything else is refused with `421 Misdirected Request` by the listener, naming the flag
//! that would allow it.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Longest host name accepted (RFC 1035's limit on a name's text form).
pub const HOST_NAME_BYTES_MAX: usize = 253;
/// Most names one listener may be configured with.
pub const ALLOWED_HOSTS_MAX: usize = 64;

/// The names a listener answers to besides loopback names and IP literals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    names: Vec<String>,
}

/// Checks a configured host name: letters, digits, `-` and `.`, no port, at most
/// [`HOST_NAME_BYTES_MAX`] bytes. Returns it lower-cased, without a trailing dot.
pub fn parse_host_name(text: &str) -> Result<String, String> {
    let name = text.trim().trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() || name.len() > HOST_NAME_BYTES_MAX {
        return Err(format!(
            "{text:?} is not a host name: give a name of 1 to {HOST_NAME_BYTES_MAX} characters, such as locks.example.com"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "{text:?} is not a host name: give the name alone (letters, digits, '-' and '.'), without a scheme, port or path"
        ));
    }
    Ok(name)
}

impl AllowedHosts {
    /// Loopback names and IP literals, and `names` (each checked by [`parse_host_name`]).
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<AllowedHosts, String> {
        let mut parsed = Vec::new();
        for name in names {
            let name = parse_host_name(name.as_ref())?;
            if !parsed.contains(&name) {
                parsed.push(name);
            }
            if parsed.len() > ALLOWED_HOSTS_MAX {
                return Err(format!(
                    "at most {ALLOWED_HOSTS_MAX} host names can be given"
                ));
            }
        }
        Ok(AllowedHosts { names: parsed })
    }

    /// The configured names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether a request whose `Host` header is `host` (`None`: absent) is answered; the name
    /// it refused otherwise, for the answer to show.
    pub fn check(&self, host: Option<&[u8]>) -> Result<(), String> {
        let Some(host) = host else {
            return Ok(());
        };
        let Ok(host) = std::str::from_utf8(host) else {
            return Err(String::from_utf8_lossy(host).into_owned());
        };
        let refused = || Err(host.to_owned());
        // `[v6]` or `[v6]:port`.
        if let Some(rest) = host.strip_prefix('[') {
            let Some((literal, after)) = rest.split_once(']') else {
                return refused();
            };
            let port_ok = after.is_empty()
                || after
                    .strip_prefix(':')
                    .is_some_and(|port| port.parse::<u16>().is_ok());
            return if port_ok && literal.parse::<Ipv6Addr>().is_ok() {
                Ok(())
            } else {
                refused()
            };
        }
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.parse::<u16>().is_ok() => name,
            Some(_) => return refused(),
            None => host,
        };
        if name.parse::<Ipv4Addr>().is_ok() {
            return Ok(());
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") || self.names.contains(&name) {
            Ok(())
        } else {
            refused()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_literals_and_configured_names_are_answered_others_not() {
        let hosts = AllowedHosts::new(["Locks.Example.com."]).unwrap();
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "ui.localhost:1",
            "127.0.0.1:31207",
            "10.0.0.5",
            "[::1]:80",
            "[::1]",
            "locks.example.com",
            "locks.example.com.:443",
        ] {
            assert_eq!(hosts.check(Some(host.as_bytes())), Ok(()), "{host}");
        }
        assert_eq!(hosts.check(None), Ok(()));
        for host in [
            "attacker.example:31207",
            "attacker.example",
            "localhost.attacker.example",
            "locks.example.com.evil",
            "127.0.0.1.nip.io",
            "[::1",
            "[nonsense]:80",
            "localhost:notaport",
            "",
        ] {
            assert!(hosts.check(Some(host.as_bytes())).is_err(), "{host}");
        }
    }

    #[test]
    fn configured_names_are_checked() {
        assert!(AllowedHosts::new(["http://locks.example.com"]).is_err());
        assert!(AllowedHosts::new(["locks.example.com:80"]).is_err());
        assert!(AllowedHosts::new([""]).is_err());
        assert!(AllowedHosts::new(["a".repeat(254)]).is_err());
        assert_eq!(
            AllowedHosts::new(["A.example", "a.example."])
                .unwrap()
                .names(),
            ["a.example"]
        );
    }
}
