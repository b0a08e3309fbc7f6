//go:build ignore

// Writes the shared sequencer vectors, spec/sequencer/v1/*.json (pal2) and
// spec/sequencer/v2/*.json (pal3 beside pal2: the access and the fence binding), from fixed
// Ed25519 seeds (the Rust tests' key is the seed of 32 bytes of 7). Run from clients/go:
//
//	go run scripts/gen-sequencer-vectors.go ../../spec/sequencer
//
// The output is committed; the vectors are what every implementation checks, so they change
// only on purpose (a new case is appended to its file). v1's files stay byte for byte as they
// were when v2 was added.
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
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run scripts/gen-sequencer-vectors.go SPEC_SEQUENCER_DIR (writes its v1/ and v2/)")
		os.Exit(2)
	}
	writeV1(filepath.Join(os.Args[1], "v1"))
	writeV2(filepath.Join(os.Args[1], "v2"))
}

// writeFiles writes each file of vectors as {"_about": about, "cases": [...]}.
func writeFiles[V any](dir, about string, files map[string][]V) {
	for name, vectors := range files {
		out, err := json.MarshalIndent(map[string]any{"_about": about, "cases": vectors}, "", " ")
		if err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(out, '\n'), 0o644); err != nil {
			panic(err)
		}
	}
}

func writeV1(dir string) {
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
	writeFiles(dir, "Shared sequencer vectors, version 1: see README.md beside this file.", files)
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

// signBody is body followed by '.' and k's signature of body: the signature of any text,
// well-formed or not, so that a malformed case is refused by its format and not by its signature.
func signBody(k key, body string) string {
	return body + "." + b64.EncodeToString(ed25519.Sign(k.private, []byte(body)))
}

// sign3 is the pal3 sequencer of (lock, access, token, session) signed by k; access is the field's
// text ("s", "p<k>", or anything else for a malformed case).
func sign3(k key, keyID, lock, access string, token, session uint64) string {
	return signBody(k, fmt.Sprintf("pal3.%s.%s.%s.%d.%d", keyID, b64.EncodeToString([]byte(lock)), access, token, session))
}

// expectValid is what a valid v2 case reads back: every field present, slot null unless the
// access is a slot, and the fence binding (the lock, or lock + U+001F + slot for a permit).
type expectValid struct {
	Result  string  `json:"result"`
	Lock    string  `json:"lock"`
	Access  string  `json:"access"`
	Slot    *uint32 `json:"slot"`
	Binding string  `json:"binding"`
	Token   uint64  `json:"token"`
	Session uint64  `json:"session"`
	KeyID   string  `json:"key_id"`
}

type expectRefused struct {
	Result string `json:"result"`
}

type vectorV2 struct {
	Description string `json:"description"`
	Keys        string `json:"keys"`
	Sequencer   string `json:"sequencer"`
	Expect      any    `json:"expect"`
}

// writeV2 writes spec/sequencer/v2: pal3 (shared grants and semaphore permits) beside pal2.
func writeV2(dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		panic(err)
	}
	a, b := newKey(7), newKey(8)
	// valid: access is "" (pal2, exclusive), "s" or "p<k>".
	valid := func(desc, keys string, k key, lock, access string, token, session uint64) vectorV2 {
		e := expectValid{Result: "valid", Lock: lock, Binding: lock, Token: token, Session: session, KeyID: k.id()}
		text := ""
		switch {
		case access == "":
			e.Access = "exclusive"
			text = sign(k, k.id(), lock, token, session)
		case access == "s":
			e.Access = "shared"
			text = sign3(k, k.id(), lock, access, token, session)
		default:
			var slot uint32
			if _, err := fmt.Sscanf(access, "p%d", &slot); err != nil {
				panic(access)
			}
			e.Access, e.Slot = "slot", &slot
			e.Binding = fmt.Sprintf("%s\x1f%d", lock, slot)
			text = sign3(k, k.id(), lock, access, token, session)
		}
		return vectorV2{desc, keys, text, e}
	}
	bad := func(result, desc, keys, text string) vectorV2 {
		return vectorV2{desc, keys, text, expectRefused{result}}
	}
	keys := a.public()
	// A signed text whose access field is access: for the refusals of the format, validly signed.
	withAccess := func(access string) string { return sign3(a, a.id(), "jobs/nightly", access, 42, 9) }
	shared := sign3(a, a.id(), "jobs/nightly", "s", 42, 9)
	permit := sign3(a, a.id(), "shards", "p3", 42, 9)
	exclusive := sign(a, a.id(), "jobs/nightly", 42, 9)
	field := func(text string, i int, value string) string {
		f := strings.Split(text, ".")
		f[i] = value
		return strings.Join(f, ".")
	}
	flipSig := func(text string) string {
		f := strings.Split(text, ".")
		sig, _ := b64.DecodeString(f[len(f)-1])
		sig[20] ^= 1
		f[len(f)-1] = b64.EncodeToString(sig)
		return strings.Join(f, ".")
	}
	// Re-labelled: the same fields and signature under the other version.
	pal2AsPal3 := func(text string, access string) string {
		f := strings.Split(text, ".")
		return strings.Join(append([]string{"pal3", f[1], f[2], access}, f[3:]...), ".")
	}
	pal3AsPal2 := func(text string) string {
		f := strings.Split(text, ".")
		return strings.Join(append([]string{"pal2", f[1], f[2]}, f[4:]...), ".")
	}
	longLock := strings.Repeat("z", 256)
	files := map[string][]vectorV2{
		"valid.json": {
			valid("A reader of a shared phase (pal3, access s): its lock, access, token, session, key id and binding (the lock) are read back.", keys, a, "jobs/nightly", "s", 42, 9),
			valid("The permit in slot 0 of a semaphore (p0): the binding is the lock, U+001F and the slot.", keys, a, "shards", "p0", 7, 3),
			valid("The permit in the last slot, 4095 (PERMITS_MAX - 1).", keys, a, "shards", "p4095", 8, 4),
			valid("A shared grant of a lock whose UTF-8 name has a dot, the largest token (2^63 - 1) and session (2^64 - 1).", keys, a, "région/é.b", "s", 1<<63-1, 1<<64-1),
			valid("A permit of a lock with a dot, the smallest token and session (1).", keys, a, "a.b", "p12", 1, 1),
			valid("The longest pal3: a lock of 256 bytes, slot 4095, the largest token and session (498 bytes, within 512).", keys, a, longLock, "p4095", 1<<63-1, 1<<64-1),
			valid("An exclusive grant stays pal2: access exclusive, no slot, the binding is the lock.", keys, a, "jobs/nightly", "", 42, 9),
			valid("An exclusive pal2 with session 0 (allowed in pal2, unlike pal3).", keys, a, "x", "", 1, 0),
			valid("During a rotation: a pal3 naming the second trusted key.", a.public()+","+b.public(), b, "shards", "p1", 5, 2),
		},
		"forged.json": {
			bad("forged", "One bit of a shared sequencer's signature flipped.", keys, flipSig(shared)),
			bad("forged", "A permit's slot changed by one bit (p3 to p2); the signature covers it.", keys, field(permit, 3, "p2")),
			bad("forged", "A permit's slot changed by one bit (p3 to p7); the signature covers it.", keys, field(permit, 3, "p7")),
			bad("forged", "A shared grant's access changed to a permit (s to p0).", keys, field(shared, 3, "p0")),
			bad("forged", "A permit's access changed to shared (p3 to s).", keys, field(permit, 3, "s")),
			bad("forged", "A shared grant's token raised; the signature covers it.", keys, field(shared, 4, "43")),
			bad("forged", "A permit's session changed; the signature covers it.", keys, field(permit, 5, "10")),
			bad("forged", "A shared grant's lock changed; the signature covers it.", keys, field(shared, 2, b64.EncodeToString([]byte("jobs/other")))),
			bad("forged", "A pal2 (exclusive) signature re-labelled pal3 shared: the prefix is signed, so it does not verify.", keys, pal2AsPal3(exclusive, "s")),
			bad("forged", "A pal2 (exclusive) signature re-labelled pal3 slot 0.", keys, pal2AsPal3(exclusive, "p0")),
			bad("forged", "A pal3 shared signature re-labelled pal2 (exclusive): a reader cannot pass as a writer.", keys, pal3AsPal2(shared)),
			bad("forged", "A pal3 permit signature re-labelled pal2.", keys, pal3AsPal2(permit)),
			bad("forged", "A pal3 signed by another key, naming its own key id: not trusted here.", keys, sign3(b, b.id(), "shards", "p3", 42, 9)),
			bad("forged", "A pal3 signed by another key, naming the trusted key's id.", keys, sign3(b, a.id(), "shards", "p3", 42, 9)),
		},
		"non-canonical.json": {
			bad("malformed", "A slot with a leading zero (p01).", keys, withAccess("p01")),
			bad("malformed", "Slot 0 written p00.", keys, withAccess("p00")),
			bad("malformed", "A permit in uppercase (P3).", keys, withAccess("P3")),
			bad("malformed", "Shared in uppercase (S).", keys, withAccess("S")),
			bad("malformed", "A '+' sign before the slot (p+1).", keys, withAccess("p+1")),
			bad("malformed", "A '-' sign before the slot (p-0).", keys, withAccess("p-0")),
			bad("malformed", "A permit with no digits (p).", keys, withAccess("p")),
			bad("malformed", "A space inside the access (p 3).", keys, withAccess("p 3")),
			bad("malformed", "A space after the access (s ).", keys, withAccess("s ")),
			bad("malformed", "A space before the access ( s).", keys, withAccess(" s")),
			bad("malformed", "Shared spelled out (shared).", keys, withAccess("shared")),
			bad("malformed", "A slot in hexadecimal (p0x1).", keys, withAccess("p0x1")),
		},
		"malformed.json": {
			bad("malformed", "Slot 4096 (PERMITS_MAX): out of range.", keys, withAccess("p4096")),
			bad("malformed", "A slot above 2^32 - 1.", keys, withAccess("p4294967296")),
			bad("malformed", "A slot above 2^64 - 1.", keys, withAccess("p18446744073709551616")),
			bad("malformed", "A shared grant with session 0 (pal3 needs a session >= 1).", keys, sign3(a, a.id(), "jobs/nightly", "s", 42, 0)),
			bad("malformed", "A permit with session 0.", keys, sign3(a, a.id(), "shards", "p3", 42, 0)),
			bad("malformed", "An unknown access letter x (exclusive has no pal3 form).", keys, withAccess("x")),
			bad("malformed", "An unknown access letter e.", keys, withAccess("e")),
			bad("malformed", "An empty access field.", keys, withAccess("")),
			bad("malformed", "A pal3 with pal2's field count (no access field), validly signed.", keys, signBody(a, "pal3."+a.id()+"."+b64.EncodeToString([]byte("jobs/nightly"))+".42.9")),
			bad("malformed", "A pal2 with pal3's field count (an access field), validly signed.", keys, signBody(a, "pal2."+a.id()+"."+b64.EncodeToString([]byte("jobs/nightly"))+".s.42.9")),
			bad("malformed", "A pal3 with eight fields.", keys, signBody(a, "pal3."+a.id()+"."+b64.EncodeToString([]byte("jobs/nightly"))+".s.s.42.9")),
			bad("malformed", "A pal3 with token 0.", keys, sign3(a, a.id(), "jobs/nightly", "s", 0, 9)),
			bad("malformed", "A pal3 with a token above 2^63 - 1.", keys, sign3(a, a.id(), "shards", "p3", 1<<63, 9)),
			bad("malformed", "A pal3 over 512 bytes (a lock of 300 bytes).", keys, sign3(a, a.id(), strings.Repeat("x", 300), "s", 42, 9)),
			bad("malformed", "Another version (pal4) with pal3's fields.", keys, signBody(a, "pal4."+a.id()+"."+b64.EncodeToString([]byte("jobs/nightly"))+".s.42.9")),
		},
	}
	writeFiles(dir, "Shared sequencer vectors, version 2 (pal3 and pal2): see README.md beside this file.", files)
}
