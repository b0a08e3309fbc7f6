"""Sequencers verified in Python: real grants of a real server, and every way one can be bad."""

import base64

import pytest

import palisade
from palisade.sequencer import Forged, KeySet, Malformed, PublicKey, Sequencer, verify


def test_a_real_grant_verifies_and_names_its_key(client: palisade.Client, unique: str) -> None:
    keys = client.public_keys()
    with client.lock(unique, ttl=5) as grant:
        verified = verify(grant.sequencer, keys)
    assert verified.key_id == keys.keys[0].key_id
    assert (verified.lock, verified.token, verified.session) == (unique, grant.token, grant.session_id)
    assert str(verified) == grant.sequencer


def test_altered_foreign_and_malformed_sequencers_are_refused(client: palisade.Client, unique: str) -> None:
    keys = client.public_keys()
    with client.lock(unique, ttl=5) as grant:
        text = grant.sequencer
    fields = text.split(".")
    # Any change to a signed field breaks the signature.
    higher = ".".join(fields[:3] + [str(int(fields[3]) + 1)] + fields[4:])
    with pytest.raises(Forged, match="does not verify"):
        verify(higher, keys)
    other_lock = ".".join(fields[:2] + [base64.urlsafe_b64encode(b"other").rstrip(b"=").decode()] + fields[3:])
    with pytest.raises(Forged):
        verify(other_lock, keys)
    # A key the resource does not trust.
    stranger = PublicKey.parse("ed25519:" + "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")
    with pytest.raises(Forged, match="not trusted"):
        verify(text, KeySet([stranger]))
    for bad, says in [
        ("", "empty"),
        ("pal1" + text[4:], "version"),
        (text + ".x", "6 fields"),
        (".".join(fields[:3] + ["0" + fields[3]] + fields[4:]), "leading zero"),
        (".".join(fields[:3] + ["0"] + fields[4:]), "token is 0"),
        (".".join(fields[:3] + [str(1 << 63)] + fields[4:]), "above"),
        (".".join(fields[:1] + [fields[1].upper()] + fields[2:]), "key id"),
        (text[:-1], "signature"),
        (text + "=", "signature"),
        ("x" * 513, "limit is 512"),
        (text.replace(".", ". ", 1), "printable"),
    ]:
        with pytest.raises(Malformed, match=says):
            Sequencer.parse(bad)


def test_key_sets_parse_like_the_rust_key_set() -> None:
    a = "ed25519:3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
    b = "ed25519:fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025"
    keys = KeySet.parse(f"# the lock service's keys\n{a},\n  {b}\n{a}\n")
    assert [str(k) for k in keys.keys] == [a, b]
    assert keys.get(PublicKey.parse(a).key_id) is not None
    with pytest.raises(Malformed, match="at least one"):
        KeySet.parse("# nothing\n")
    with pytest.raises(Malformed, match="64 hex digits"):
        KeySet.parse("ed25519:abcd")
    with pytest.raises(Malformed, match="small order"):
        PublicKey.parse("ed25519:" + "01" + "00" * 31)
    with pytest.raises(Malformed, match="at most 16"):
        KeySet([PublicKey(bytes([i]) + bytes(31)) for i in range(2, 19)])
    with pytest.raises(Malformed, match="16384 bytes"):
        KeySet.parse(" " * 16385)
