//go:build ignore

// Writes the shared sequencer vectors, spec/sequencer/v1/*.json, from fixed Ed25519 seeds (the
// Rust tests' key is the seed of 32 bytes of 7). Run from clients/go:
//
//	go run scripts/gen-sequencer-vectors.go ../../spec/sequencer/v1
//
// The output is committed; the vectors are what every implementation checks, so they change
// only on purpose (a new case is appended to its file).
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
)

type key struct {
	private ed25519.PrivateKey
}

func newKey(b byte) key { return key{ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, 32))} }

func (k key) public() string {
	return "ed25519:" + hex.EncodeToString(k.private.Public().(ed25519.PublicKey))
}

func (k key) id() string {
	sum := sha256.Sum256(k.private.Public().(ed25519.PublicKey))
	return hex.EncodeToString(sum[:8])
}

var b64 = base64.RawURLEncoding

// sign is the sequencer of (lock, token, session) signed by k, naming key id keyID.
func sign(k key, keyID, lock string, token, session uint64) string {
	body := fmt.Sprintf("pal2.%s.%s.%d.%d", keyID, b64.EncodeToString([]byte(lock)), token, session)
	return body + "." + b64.EncodeToString(ed25519.Sign(k.private, []byte(body)))
}

type expect struct {
	Result  string `json:"result"`
	Lock    string `json:"lock,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Session uint64 `json:"session,omitempty"`
	KeyID   string `json:"key_id,omitempty"`
}

type vector struct {
	Description string `json:"description"`
	Keys        string `json:"keys"`
	Sequencer   string `json:"sequencer"`
	Expect      expect `json:"expect"`
}

func main() {
	dir := os.Args[1]
	a, b := newKey(7), newKey(8)
	valid := func(desc, keys string, k key, lock string, token, session uint64) vector {
		return vector{desc, keys, sign(k, k.id(), lock, token, session), expect{"valid", lock, token, session, k.id()}}
	}
	bad := func(result, desc, keys, text string) vector { return vector{desc, keys, text, expect{Result: result}} }
	good := sign(a, a.id(), "jobs/nightly", 42, 9)
	fields := strings.Split(good, ".")
	with := func(i int, value string) string {
		f := append([]string(nil), fields...)
		f[i] = value
		return strings.Join(f, ".")
	}
	sig, _ := b64.DecodeString(fields[5])
	flipped := append([]byte(nil), sig...)
	flipped[10] ^= 1
	// S + L: the same signature with a non-canonical scalar, which verify_strict refuses.
	l, _ := new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
	s := new(big.Int).SetBytes(reverse(sig[32:]))
	s.Add(s, l)
	sPlusL := append(append([]byte(nil), sig[:32]...), reverse(pad32(s.Bytes()))...)
	// A last base64url character with a non-zero unused bit: the same bytes, another text.
	lastBits := []byte(fields[5])
	lastBits[len(lastBits)-1] = nextB64(lastBits[len(lastBits)-1])
	lockB64 := b64.EncodeToString([]byte("a")) // "YQ": 4 unused bits
	files := map[string][]vector{
		"valid.json": {
			valid("A sequencer signed by the trusted key: its lock, token, session and key id are read back.", a.public(), a, "jobs/nightly", 42, 9),
			valid("The largest token (2^63 - 1) and session (2^64 - 1), a lock name of UTF-8 with a dot.", a.public(), a, "région/é.b", 1<<63-1, 1<<64-1),
			valid("During a rotation the resource trusts two keys; the sequencer names the second, which verifies it.", a.public()+","+b.public(), b, "x", 1, 0),
			valid("The key set's text as `palisade pubkey` prints it: a comment line, white space and commas.", "# keys\n "+a.public()+"\n", a, "a", 7, 3),
		},
		"forged.json": {
			bad("forged", "One bit of the signature flipped.", a.public(), with(5, b64.EncodeToString(flipped))),
			bad("forged", "The token raised; the signature covers it.", a.public(), with(3, "43")),
			bad("forged", "The session changed; the signature covers it.", a.public(), with(4, "10")),
			bad("forged", "The lock changed; the signature covers it.", a.public(), with(2, b64.EncodeToString([]byte("jobs/other")))),
			bad("forged", "The signature's scalar S replaced by S + L (the group order): a malleated signature that Ed25519 with strict checks refuses.", a.public(), with(5, b64.EncodeToString(sPlusL))),
		},
		"wrong-key.json": {
			bad("forged", "Signed by another key, which names its own key id: not trusted here.", a.public(), sign(b, b.id(), "jobs/nightly", 42, 9)),
			bad("forged", "Signed by another key but naming the trusted key's id: the signature does not verify.", a.public(), sign(b, a.id(), "jobs/nightly", 42, 9)),
		},
		"non-canonical.json": {
			bad("malformed", "The token with a leading zero.", a.public(), with(3, "042")),
			bad("malformed", "The session with a leading zero.", a.public(), with(4, "09")),
			bad("malformed", "The key id in uppercase.", a.public(), with(1, strings.ToUpper(a.id()))),
			bad("malformed", "The lock's base64url padded with '='.", a.public(), with(2, b64.EncodeToString([]byte("jobs/nightly"))+"=")),
			bad("malformed", "The lock's base64url with non-zero unused bits (\"YR\" decodes to \"a\" as \"YQ\" does).", a.public(), with(2, lockB64[:1]+"R")),
			bad("malformed", "The lock in standard base64 ('+' and '/') instead of base64url.", a.public(), with(2, "Pz8/")),
			bad("malformed", "The signature's base64url with a non-zero unused bit in its last character.", a.public(), with(5, string(lastBits))),
			bad("malformed", "A '+' sign before the token.", a.public(), with(3, "+42")),
		},
		"malformed.json": {
			bad("malformed", "Empty.", a.public(), ""),
			bad("malformed", "Another version.", a.public(), with(0, "pal1")),
			bad("malformed", "Five fields.", a.public(), strings.Join(fields[:5], ".")),
			bad("malformed", "Token 0.", a.public(), with(3, "0")),
			bad("malformed", "A token above 2^63 - 1.", a.public(), with(3, "9223372036854775808")),
			bad("malformed", "A session above 2^64 - 1.", a.public(), with(4, "18446744073709551616")),
			bad("malformed", "A space inside.", a.public(), with(3, "4 2")),
			bad("malformed", "An empty lock name.", a.public(), with(2, "")),
			bad("malformed", "A lock name with a control character.", a.public(), with(2, b64.EncodeToString([]byte("a\nb")))),
			bad("malformed", "Over 512 bytes.", a.public(), with(2, b64.EncodeToString(bytes.Repeat([]byte("x"), 300)))),
			bad("malformed", "A signature of 63 bytes.", a.public(), with(5, b64.EncodeToString(sig[:63]))),
			bad("malformed", "A trusted key of small order (the identity point), which would verify forged signatures.", "ed25519:0100000000000000000000000000000000000000000000000000000000000000", good),
		},
	}
	for name, vectors := range files {
		out, err := json.MarshalIndent(map[string]any{
			"_about": "Shared sequencer vectors, version 1: see README.md beside this file.",
			"cases":  vectors,
		}, "", " ")
		if err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(out, '\n'), 0o644); err != nil {
			panic(err)
		}
	}
}

func reverse(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[i] = b[len(b)-1-i]
	}
	return out
}

func pad32(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }

// nextB64 is the base64url character after c (same high bits, a low bit set).
func nextB64(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return alphabet[strings.IndexByte(alphabet, c)+1]
}
