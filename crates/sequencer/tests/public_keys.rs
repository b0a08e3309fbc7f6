//! Scenarios for the public key's text form: what `palisade pubkey` prints, `--public-key` accepts.

use palisade_sequencer::{
    KEY_SET_KEYS_MAX, KEY_SET_TEXT_BYTES_MAX, KeyId, KeySet, KeySetError, PublicKey,
    PublicKeyError, SigningKey,
};

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

#[test]
fn a_key_id_is_sixteen_hex_digits_of_the_keys_sha256() {
    let key = SigningKey::from_bytes([1; 32]).public_key();
    let id = key.id().to_string();
    assert_eq!(id.len(), 16);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
    );
    assert_eq!(id.parse::<KeyId>().unwrap(), key.id());
    assert_ne!(key.id(), SigningKey::from_bytes([2; 32]).public_key().id());
    assert_eq!(
        serde_json::to_string(&key.id()).unwrap(),
        format!("\"{id}\"")
    );
}

#[test]
fn a_key_set_reads_flags_environment_values_and_files() {
    let a = SigningKey::from_bytes([1; 32]).public_key();
    let b = SigningKey::from_bytes([2; 32]).public_key();
    let both = KeySet::new([a, b]).unwrap();
    for text in [
        format!("{a},{b}"),
        format!("{a}, {b}"),
        format!("{a}\n{b}\n"),
        format!("# the keys of the lock service\n\n  {a}\n# next key\n{b}\n{a}\n"),
    ] {
        assert_eq!(KeySet::parse(&text).unwrap(), both, "for {text:?}");
    }
    assert_eq!(both.to_string(), format!("{a},{b}"));
    assert_eq!(both.to_string().parse::<KeySet>().unwrap(), both);
    assert_eq!(both.get(b.id()), Some(&b));
    let json = serde_json::to_string(&both).unwrap();
    assert_eq!(serde_json::from_str::<KeySet>(&json).unwrap(), both);
}

#[test]
fn a_bad_key_set_is_refused_with_what_and_where() {
    let a = SigningKey::from_bytes([1; 32]).public_key();
    assert_eq!(KeySet::parse("").unwrap_err(), KeySetError::Empty);
    assert_eq!(
        KeySet::parse("# only a comment\n").unwrap_err(),
        KeySetError::Empty
    );
    assert_eq!(
        KeySet::parse(&format!("{a}\n# x\n{a} ed25519:00")).unwrap_err(),
        KeySetError::Key {
            line: 3,
            item: 2,
            error: PublicKeyError::Length { found: 2 },
        }
    );
    let many: Vec<String> = (1..=KEY_SET_KEYS_MAX as u8 + 1)
        .map(|seed| SigningKey::from_bytes([seed; 32]).public_key().to_string())
        .collect();
    assert_eq!(
        KeySet::parse(&many.join(",")).unwrap_err(),
        KeySetError::TooMany {
            keys_max: KEY_SET_KEYS_MAX
        }
    );
    assert_eq!(
        KeySet::parse(&many[..KEY_SET_KEYS_MAX].join(","))
            .unwrap()
            .keys()
            .len(),
        KEY_SET_KEYS_MAX
    );
    let long = " ".repeat(KEY_SET_TEXT_BYTES_MAX + 1);
    assert!(matches!(
        KeySet::parse(&long).unwrap_err(),
        KeySetError::TooLong { .. }
    ));
}
