//! Scenarios for the public key's text form: what `palisade pubkey` prints, `--public-key` accepts.

use palisade_sequencer::{PublicKey, PublicKeyError, SigningKey};

#[test]
fn a_public_key_prints_as_lowercase_hex_and_parses_back() {
    let key = SigningKey::from_bytes([1; 32]).public_key();
    let text = key.to_string();
    assert!(text.starts_with("ed25519:"));
    assert_eq!(text.len(), 8 + 64);
    assert!(
        text[8..]
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
    );
    assert_eq!(text.parse::<PublicKey>().unwrap(), key);
    assert_eq!(
        PublicKey::parse(&text.to_uppercase().replace("ED25519", "ed25519")).unwrap(),
        key
    );
    assert_eq!(PublicKey::from_bytes(key.to_bytes()).unwrap(), key);
}

#[test]
fn a_public_key_survives_json() {
    let key = SigningKey::from_bytes([3; 32]).public_key();
    let json = serde_json::to_string(&key).unwrap();
    assert_eq!(json, format!("\"{key}\""));
    assert_eq!(serde_json::from_str::<PublicKey>(&json).unwrap(), key);
    assert!(serde_json::from_str::<PublicKey>("\"ed25519:00\"").is_err());
}

#[test]
fn malformed_public_keys_are_refused_precisely() {
    let good = SigningKey::from_bytes([1; 32]).public_key().to_string();
    let hex = &good[8..];
    let cases = [
        (hex.to_string(), PublicKeyError::Prefix),
        (format!("ED25519:{hex}"), PublicKeyError::Prefix),
        (format!(" ed25519:{hex}"), PublicKeyError::Prefix),
        (
            format!("ed25519:{}", &hex[..63]),
            PublicKeyError::Length { found: 63 },
        ),
        (
            format!("ed25519:{hex}0"),
            PublicKeyError::Length { found: 65 },
        ),
        (
            format!("ed25519:{hex}\n"),
            PublicKeyError::Length { found: 65 },
        ),
        ("ed25519:".to_string(), PublicKeyError::Length { found: 0 }),
        (
            format!("ed25519:{}g", &hex[..63]),
            PublicKeyError::NotHex { position: 63 },
        ),
        (
            format!("ed25519:{}é", &hex[..63]),
            PublicKeyError::Length { found: 64 },
        ),
        (
            format!("ed25519:x{}", &hex[1..]),
            PublicKeyError::NotHex { position: 0 },
        ),
        // The identity point has small order: anyone could forge for it.
        (
            format!("ed25519:01{}", "0".repeat(62)),
            PublicKeyError::InvalidPoint,
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            PublicKey::parse(&text).unwrap_err(),
            expected,
            "for {text:?}"
        );
    }
}
