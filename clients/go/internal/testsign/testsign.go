// Package testsign signs sequencers with a fixed test key, for the fence helpers' tests (as the
// Python client's tests/signing.py does): the lock service's own signing is tested against a
// real server elsewhere.
package testsign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"testing"

	"example.invalid/palisade/clients/go/sequencer"
)

var private = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))

// Keys is the key set that trusts the test key.
func Keys(t testing.TB) sequencer.KeySet {
	t.Helper()
	key, err := sequencer.PublicKeyFromBytes(private.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sequencer.NewKeySet(key)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// Sign is the verified sequencer of (lock, token, session) signed by the test key.
func Sign(t testing.TB, lock string, token, session uint64) sequencer.Verified {
	t.Helper()
	sum := sha256.Sum256(private.Public().(ed25519.PublicKey))
	b64 := base64.RawURLEncoding
	body := fmt.Sprintf("pal2.%s.%s.%d.%d", hex.EncodeToString(sum[:8]), b64.EncodeToString([]byte(lock)), token, session)
	text := body + "." + b64.EncodeToString(ed25519.Sign(private, []byte(body)))
	v, err := sequencer.Verify(text, Keys(t))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
