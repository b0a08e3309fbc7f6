// Package sequencer parses and verifies Palisade sequencers offline: the signed, lock-scoped
// tokens a resource checks before it accepts a write.
//
// The text form of an exclusive grant is pal2.<key id>.<lock b64url>.<token>.<session>.<ed25519
// sig b64url>; a shared grant (a reader of a read-write lock's phase) or a semaphore's permit is
// pal3.<key id>.<lock b64url>.<access>.<token>.<session>.<sig>, the access "s" (shared) or
// "p<k>" (the permit in slot k < PermitsMax), the session >= 1. At most 512 printable ASCII
// bytes, every field with exactly one accepted encoding, as the Rust crate palisade-sequencer and
// the Python client parse it. The signature covers every byte before the
// last dot and is checked as ed25519-dalek's verify_strict does (no key or R of small order, a
// canonical S). The key id, 16 lowercase hex digits, is the first 8 bytes of the SHA-256 of the
// 32-byte public key: a resource trusting several keys during a rotation (a KeySet) checks the
// signature with that key alone and refuses a sequencer naming a key outside the set.
//
// Only Verify (or KeySet.Verify) makes a Verified, and the fence helpers take nothing else: a
// resource cannot forget to check the signature. The shared vectors in spec/sequencer/v1 and v2
// are run by this package's tests, the Rust crate's and the Python client's.
package sequencer

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"filippo.io/edwards25519"
)

// Limits and constants of the format.
const (
	// Prefix is the version of an exclusive grant's text; PrefixAccess that of the others.
	Prefix       = "pal2"
	PrefixAccess = "pal3"
	// PermitsMax bounds a semaphore's slots: a slot is below it.
	PermitsMax = 4096
	// SlotSeparator (U+001F) joins a lock and a slot in a permit's fence binding.
	SlotSeparator   = "\x1f"
	BytesMax        = 512
	PublicKeyPrefix = "ed25519:"
	KeyIDHexDigits  = 16
	SignatureBytes  = 64
	// TokenMax is the largest token the service grants (i64::MAX: it fits a SQL bigint).
	TokenMax = uint64(1<<63 - 1)
	// LockNameBytesMax is the longest lock name, in bytes of UTF-8.
	LockNameBytesMax = 256
	// KeySetKeysMax is the most keys a KeySet holds; KeySetTextBytesMax the longest text parsed.
	KeySetKeysMax      = 16
	KeySetTextBytesMax = 16 * 1024
)

// longestAccess is the longest pal3 text: a lock of LockNameBytesMax bytes, slot PermitsMax-1,
// the largest token and session. The constant below does not compile if it exceeds BytesMax.
const longestAccess = len(PrefixAccess) + 1 + KeyIDHexDigits + 1 + (LockNameBytesMax*4+2)/3 + 1 +
	len("p4095") + 1 + len("9223372036854775807") + 1 + len("18446744073709551615") + 1 + (SignatureBytes*4+2)/3

const _ = uint(BytesMax - longestAccess)

// ErrMalformed is what every parse failure wraps: the text is not a sequencer (or not a public
// key, or not a key set).
var ErrMalformed = errors.New("malformed")

// ErrForged is what every verification failure wraps: the signature does not verify, or names a
// key the resource does not trust.
var ErrForged = errors.New("forged")

// Error is a refused sequencer or key; errors.Is(err, ErrMalformed) or ErrForged tells which.
type Error struct {
	Kind    error // ErrMalformed or ErrForged
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the kind, for errors.Is.
func (e *Error) Unwrap() error { return e.Kind }

func malformed(format string, args ...any) error {
	return &Error{Kind: ErrMalformed, Message: fmt.Sprintf(format, args...)}
}

func forged(format string, args ...any) error {
	return &Error{Kind: ErrForged, Message: fmt.Sprintf(format, args...)}
}

var b64 = base64.RawURLEncoding.Strict()

// decodeB64 decodes unpadded base64url with exactly one accepted encoding.
func decodeB64(text string) ([]byte, bool) {
	if text == "" {
		return nil, false
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, false
		}
	}
	raw, err := b64.DecodeString(text)
	if err != nil || b64.EncodeToString(raw) != text {
		return nil, false
	}
	return raw, true
}

func decimal(text, what string, maximum uint64) (uint64, error) {
	if text == "" {
		return 0, malformed("the %s is not a decimal number", what)
	}
	for i := 0; i < len(text); i++ {
		if text[i] < '0' || text[i] > '9' {
			return 0, malformed("the %s is not a decimal number", what)
		}
	}
	if len(text) > 1 && text[0] == '0' {
		return 0, malformed("the %s has a leading zero", what)
	}
	value, err := strconv.ParseUint(text, 10, 64)
	if err != nil || value > maximum {
		return 0, malformed("the %s is above %d", what, maximum)
	}
	return value, nil
}

// smallOrder reports whether the 32 bytes encode a point of small order (or no point at all).
func smallOrder(encoded []byte) bool {
	point, err := new(edwards25519.Point).SetBytes(encoded)
	if err != nil {
		return true
	}
	return new(edwards25519.Point).MultByCofactor(point).Equal(edwards25519.NewIdentityPoint()) == 1
}

// PublicKey is an Ed25519 public key of the lock service, printed as ed25519:<64 hex digits>.
type PublicKey struct {
	raw [32]byte
}

// ParsePublicKey parses ed25519:<64 hex digits>, refusing a point of small order.
func ParsePublicKey(text string) (PublicKey, error) {
	digits, ok := strings.CutPrefix(text, PublicKeyPrefix)
	if !ok {
		return PublicKey{}, malformed("a public key starts with %q", PublicKeyPrefix)
	}
	if len(digits) != 64 {
		return PublicKey{}, malformed("a public key has 64 hex digits after %q, found %d", PublicKeyPrefix, len(digits))
	}
	raw, err := hex.DecodeString(digits)
	if err != nil {
		return PublicKey{}, malformed("a public key's digits must be hexadecimal")
	}
	if smallOrder(raw) {
		return PublicKey{}, malformed("not a valid Ed25519 public key (a point of small order, or none)")
	}
	var key PublicKey
	copy(key.raw[:], raw)
	return key, nil
}

// PublicKeyFromBytes is the key whose 32-byte encoding is raw.
func PublicKeyFromBytes(raw []byte) (PublicKey, error) {
	if len(raw) != 32 {
		return PublicKey{}, malformed("an Ed25519 public key is 32 bytes, not %d", len(raw))
	}
	return ParsePublicKey(PublicKeyPrefix + hex.EncodeToString(raw))
}

// KeyID is 16 lowercase hex digits: the first 8 bytes of the SHA-256 of the key.
func (k PublicKey) KeyID() string {
	sum := sha256.Sum256(k.raw[:])
	return hex.EncodeToString(sum[:8])
}

// Bytes is the key's 32-byte encoding.
func (k PublicKey) Bytes() []byte { return bytes.Clone(k.raw[:]) }

func (k PublicKey) String() string { return PublicKeyPrefix + hex.EncodeToString(k.raw[:]) }

func (k PublicKey) verifySignature(message []byte, signature []byte) bool {
	if smallOrder(signature[:32]) {
		return false // verify_strict refuses a small-order R
	}
	// crypto/ed25519 refuses a non-canonical S and compares R byte for byte.
	return ed25519.Verify(ed25519.PublicKey(k.raw[:]), message, signature)
}

// KeySet is one to 16 public keys a resource trusts, each with a distinct key id.
type KeySet struct {
	keys []PublicKey
}

// NewKeySet is a key set of keys (duplicates dropped).
func NewKeySet(keys ...PublicKey) (KeySet, error) {
	var chosen []PublicKey
	for _, key := range keys {
		duplicate := false
		for _, other := range chosen {
			if other == key {
				duplicate = true
				break
			}
			if other.KeyID() == key.KeyID() {
				return KeySet{}, malformed("keys %s and %s share the key id %s", other, key, key.KeyID())
			}
		}
		if duplicate {
			continue
		}
		if len(chosen) == KeySetKeysMax {
			return KeySet{}, malformed("a key set holds at most %d keys", KeySetKeysMax)
		}
		chosen = append(chosen, key)
	}
	if len(chosen) == 0 {
		return KeySet{}, malformed("a key set needs at least one public key")
	}
	return KeySet{keys: chosen}, nil
}

// ParseKeySet parses keys separated by commas or white space; a line whose first non-blank
// character is # is a comment (so `palisade pubkey`'s output, a variable and a file all work).
func ParseKeySet(text string) (KeySet, error) {
	if len(text) > KeySetTextBytesMax {
		return KeySet{}, malformed("a key set's text is at most %d bytes", KeySetTextBytesMax)
	}
	var keys []PublicKey
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, item := range strings.Fields(strings.ReplaceAll(line, ",", " ")) {
			if len(keys) == KeySetKeysMax {
				return KeySet{}, malformed("a key set holds at most %d keys", KeySetKeysMax)
			}
			key, err := ParsePublicKey(item)
			if err != nil {
				return KeySet{}, err
			}
			keys = append(keys, key)
		}
	}
	return NewKeySet(keys...)
}

// Keys are the set's keys, in the order given.
func (s KeySet) Keys() []PublicKey { return append([]PublicKey(nil), s.keys...) }

// Get is the key with this id, if the set trusts it.
func (s KeySet) Get(keyID string) (PublicKey, bool) {
	for _, key := range s.keys {
		if key.KeyID() == keyID {
			return key, true
		}
	}
	return PublicKey{}, false
}

func (s KeySet) String() string {
	texts := make([]string, len(s.keys))
	for i, key := range s.keys {
		texts[i] = key.String()
	}
	return strings.Join(texts, ",")
}

// Verify parses text and verifies it with the set's keys.
func (s KeySet) Verify(text string) (Verified, error) { return Verify(text, s) }

// AccessKind is how a grant holds its lock.
type AccessKind int

const (
	// Exclusive is the only holder: a mutex, or a read-write lock's writer (pal2).
	Exclusive AccessKind = iota
	// Shared is a reader of a read-write lock's shared phase; the phase's readers share its token.
	Shared
	// Slot is the permit in one slot of a semaphore; each slot has tokens of its own.
	Slot
)

func (k AccessKind) String() string {
	switch k {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case Slot:
		return "slot"
	}
	return fmt.Sprintf("AccessKind(%d)", int(k))
}

// Access is how a grant holds its lock: its kind, and for a Slot the slot (below PermitsMax).
// The zero value is Exclusive.
type Access struct {
	Kind AccessKind
	Slot uint32
}

func (a Access) String() string {
	if a.Kind == Slot {
		return fmt.Sprintf("slot %d", a.Slot)
	}
	return a.Kind.String()
}

// Binding is what a fence binds a scope to for a grant of lock with this access: the lock for
// exclusive and shared grants, the lock, U+001F and the slot in decimal for a permit. No lock
// name holds a control character, so no lock's binding equals a slot's.
func Binding(lock string, access Access) string {
	if access.Kind == Slot {
		return lock + SlotSeparator + strconv.FormatUint(uint64(access.Slot), 10)
	}
	return lock
}

// DisplayBinding is a binding as messages show it: the lock, or "L (slot k)" for a permit's.
func DisplayBinding(binding string) string {
	if lock, slot, ok := strings.Cut(binding, SlotSeparator); ok {
		return lock + " (slot " + slot + ")"
	}
	return binding
}

// parseAccess parses pal3's access field: "s", or "p" and a slot in decimal without a leading
// zero, below PermitsMax.
func parseAccess(text string) (Access, error) {
	if text == "s" {
		return Access{Kind: Shared}, nil
	}
	digits, ok := strings.CutPrefix(text, "p")
	if !ok {
		return Access{}, malformed("the access is %q, expected \"s\" (shared) or \"p<slot>\" (a permit)", truncate(text))
	}
	slot, err := decimal(digits, "slot", PermitsMax-1)
	if err != nil {
		return Access{}, err
	}
	return Access{Kind: Slot, Slot: uint32(slot)}, nil
}

func truncate(text string) string {
	if len(text) > 16 {
		return text[:16]
	}
	return text
}

// Sequencer is a parsed, not yet verified, sequencer: nothing in it is trustworthy yet.
type Sequencer struct {
	Text      string
	KeyID     string
	Lock      string
	Access    Access
	Token     uint64
	Session   uint64
	signature []byte
}

// Binding is the fence binding of the sequencer's lock and access (see Binding).
func (q Sequencer) Binding() string { return Binding(q.Lock, q.Access) }

// Parse checks the text's format, every field's canonical encoding and its limits.
func Parse(text string) (Sequencer, error) {
	if text == "" {
		return Sequencer{}, malformed("the sequencer is empty")
	}
	if len(text) > BytesMax {
		return Sequencer{}, malformed("the sequencer is %d bytes, the limit is %d", len(text), BytesMax)
	}
	for i := 0; i < len(text); i++ {
		if text[i] < 0x21 || text[i] > 0x7e {
			return Sequencer{}, malformed("the sequencer has a byte that is not printable ASCII at %d", i)
		}
	}
	fields := strings.Split(text, ".")
	want := 0
	switch fields[0] {
	case Prefix:
		want = 6
	case PrefixAccess:
		want = 7
	default:
		return Sequencer{}, malformed("the sequencer's version is %q, expected %q or %q", truncate(fields[0]), Prefix, PrefixAccess)
	}
	if len(fields) != want {
		return Sequencer{}, malformed("a %s sequencer has %d fields separated by '.', found %d", fields[0], want, len(fields))
	}
	access := Access{Kind: Exclusive}
	if fields[0] == PrefixAccess {
		var err error
		if access, err = parseAccess(fields[3]); err != nil {
			return Sequencer{}, err
		}
		// The rest is laid out as pal2's: drop the access field.
		fields = append(fields[:3:3], fields[4:]...)
	}
	keyID := fields[1]
	if len(keyID) != KeyIDHexDigits || strings.Trim(keyID, "0123456789abcdef") != "" {
		return Sequencer{}, malformed("the key id is %d lowercase hex digits", KeyIDHexDigits)
	}
	rawLock, ok := decodeB64(fields[2])
	if !ok {
		return Sequencer{}, malformed("the lock name is not canonical unpadded base64url")
	}
	if !utf8.Valid(rawLock) {
		return Sequencer{}, malformed("the lock name is not UTF-8")
	}
	lock := string(rawLock)
	if lock == "" || len(rawLock) > LockNameBytesMax || strings.IndexFunc(lock, unicode.IsControl) >= 0 {
		return Sequencer{}, malformed("the lock name is empty, too long or has a control character")
	}
	token, err := decimal(fields[3], "token", TokenMax)
	if err != nil {
		return Sequencer{}, err
	}
	if token == 0 {
		return Sequencer{}, malformed("the token is 0")
	}
	session, err := decimal(fields[4], "session", ^uint64(0))
	if err != nil {
		return Sequencer{}, err
	}
	if session == 0 && access.Kind != Exclusive {
		return Sequencer{}, malformed("the session of a %s sequencer is 0; the service issues sessions from 1", PrefixAccess)
	}
	signature, ok := decodeB64(fields[5])
	if !ok {
		return Sequencer{}, malformed("the signature is not canonical unpadded base64url")
	}
	if len(signature) != SignatureBytes {
		return Sequencer{}, malformed("the signature is %d bytes, expected %d", len(signature), SignatureBytes)
	}
	return Sequencer{Text: text, KeyID: keyID, Lock: lock, Access: access, Token: token, Session: session, signature: signature}, nil
}

// Verify checks the signature with the key of keys the sequencer names.
func (q Sequencer) Verify(keys KeySet) (Verified, error) {
	key, ok := keys.Get(q.KeyID)
	if !ok {
		trusted := make([]string, len(keys.keys))
		for i, k := range keys.keys {
			trusted[i] = k.KeyID()
		}
		return Verified{}, forged("the sequencer names key %s, which is not trusted here (trusted: %s)", q.KeyID, strings.Join(trusted, ", "))
	}
	signed := q.Text[:strings.LastIndexByte(q.Text, '.')]
	if !key.verifySignature([]byte(signed), q.signature) {
		return Verified{}, forged("the sequencer's signature does not verify")
	}
	return Verified{q: q}, nil
}

func (q Sequencer) String() string { return q.Text }

// Verified is a sequencer whose signature verified with a trusted key: what the fence helpers
// take. Its zero value is no sequencer (Token 0), which they refuse.
type Verified struct {
	q Sequencer
}

func (v Verified) Lock() string    { return v.q.Lock }
func (v Verified) Token() uint64   { return v.q.Token }
func (v Verified) Session() uint64 { return v.q.Session }
func (v Verified) Access() Access  { return v.q.Access }

// Binding is what a fence binds a scope to: the lock, or the lock and slot of a permit.
func (v Verified) Binding() string { return v.q.Binding() }
func (v Verified) KeyID() string   { return v.q.KeyID }
func (v Verified) Text() string    { return v.q.Text }
func (v Verified) String() string  { return v.q.Text }

// Verify parses text (surrounding white space dropped) and verifies it with keys. A missing
// sequencer (blank) is ErrMalformed too, though the fence helpers report it as missing.
func Verify(text string, keys KeySet) (Verified, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return Verified{}, malformed("no sequencer presented")
	}
	q, err := Parse(text)
	if err != nil {
		return Verified{}, err
	}
	return q.Verify(keys)
}
