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

// Sign is the verified sequencer of an exclusive grant (lock, token, session) signed by the test
// key.
func Sign(t testing.TB, lock string, token, session uint64) sequencer.Verified {
	t.Helper()
	return SignAccess(t, lock, sequencer.Access{}, token, session)
}

// Shared is the verified sequencer of a shared grant (a reader of a phase).
func Shared(t testing.TB, lock string, token, session uint64) sequencer.Verified {
	t.Helper()
	return SignAccess(t, lock, sequencer.Access{Kind: sequencer.Shared}, token, session)
}

// Permit is the verified sequencer of a semaphore's permit in slot.
func Permit(t testing.TB, lock string, slot uint32, token, session uint64) sequencer.Verified {
	t.Helper()
	return SignAccess(t, lock, sequencer.Access{Kind: sequencer.Slot, Slot: slot}, token, session)
}

// SignAccess is the verified sequencer of (lock, access, token, session) signed by the test key:
// pal2 for an exclusive grant, pal3 for the others.
func SignAccess(t testing.TB, lock string, access sequencer.Access, token, session uint64) sequencer.Verified {
	t.Helper()
	sum := sha256.Sum256(private.Public().(ed25519.PublicKey))
	b64 := base64.RawURLEncoding
	body := fmt.Sprintf("pal2.%s.%s.%d.%d", hex.EncodeToString(sum[:8]), b64.EncodeToString([]byte(lock)), token, session)
	switch access.Kind {
	case sequencer.Shared:
		body = fmt.Sprintf("pal3.%s.%s.s.%d.%d", hex.EncodeToString(sum[:8]), b64.EncodeToString([]byte(lock)), token, session)
	case sequencer.Slot:
		body = fmt.Sprintf("pal3.%s.%s.p%d.%d.%d", hex.EncodeToString(sum[:8]), b64.EncodeToString([]byte(lock)), access.Slot, token, session)
	}
	text := body + "." + b64.EncodeToString(ed25519.Sign(private, []byte(body)))
	v, err := sequencer.Verify(text, Keys(t))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
