// Package fence is the resource side: verify a sequencer, then claim its scope inside the
// caller's transaction, so that a superseded lock holder, however long it was paused, is refused
// at the resource.
//
// The helpers share the storage layout of the Rust crate palisade-fence and the Python client's
// palisade.fence exactly (the palisade_fence table of PostgreSQL and MySQL, its columns and its
// statements; the Redis hash palisade:fence:<scope> with fields lock, token, session and the
// same Lua script), so a Rust, a Python and a Go writer fence the same rows: whichever presents
// the newer token first shuts the others out. Subpackages postgres and mysql work through
// database/sql, redis through go-redis.
//
// Claim first, then read, then write, all in one transaction:
//
//	verified, err := verifier.Verify(presented)      // ErrMissing, ErrMalformed, ErrForged
//	tx, err := db.BeginTx(ctx, nil)
//	err = postgres.Claim(ctx, tx, "reports/nightly", verified, "")   // ErrStale if superseded
//	... read, compute, write in tx ...
//	err = postgres.Commit(tx)
//
// Shared grants and permits: a read-write lock's readers share one token per phase, so a scope
// stores holder session 0 for a maximum accepted from a shared grant ("a shared phase"), and a
// semaphore's permit binds its scope to its slot (sequencer.Binding: the lock, U+001F, the slot),
// so each slot keeps a maximum of its own. Check states the rule, with the caller's Intent:
//
//  1. another binding than the scope's (or the expected one) is ErrWrongLock;
//  2. a shared grant that writes is ErrSharedWrite;
//  3. a token below the maximum is ErrStale;
//  4. the maximum again is accepted, unchanged, from a shared grant while the stored holder is 0,
//     and from an exclusive grant or a permit while the stored holder is its session; anything
//     else is ErrTokenReissued;
//  5. a larger token is accepted and stored, with holder 0 for a shared grant.
//
// The SQL helpers' Claim is for a transaction that writes (IntentWrite: a shared grant is
// refused); a reader's transaction claims with ClaimRead. Redis's Read is a read, Write and
// WriteIf are writes.
//
// Every *Error matches with errors.Is exactly one of: a final refusal (ErrStale,
// ErrTokenReissued, ErrSharedWrite, ErrWrongLock, ErrMissing, ErrMalformed, ErrForged, ErrInvalidScope,
// ErrInvalidRequest, ErrCorrupt), ErrStorage (retryable: nothing was applied) or
// ErrOutcomeUnknown (read back under a claim before deciding). Kind is the same
// machine-readable name the Rust FenceError and the Python FenceError have.
package fence

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"example.invalid/palisade/clients/go/sequencer"
)

// Limits.
const (
	// ScopeBytesMax is the longest scope name, in bytes of UTF-8.
	ScopeBytesMax = 512
	// TokenMax is the largest token the service grants.
	TokenMax = uint64(1<<63 - 1)
	// VerifiedCachedMax is how many verified sequencer texts a Verifier remembers.
	VerifiedCachedMax = 4096
)

// The kinds of fence error, one sentinel each.
var (
	ErrStale          = errors.New("stale")
	ErrTokenReissued  = errors.New("token_reissued")
	ErrSharedWrite    = errors.New("shared_write")
	ErrWrongLock      = errors.New("wrong_lock")
	ErrMissing        = errors.New("missing")
	ErrMalformed      = errors.New("malformed")
	ErrForged         = errors.New("forged")
	ErrInvalidScope   = errors.New("invalid_scope")
	ErrInvalidRequest = errors.New("invalid_request")
	ErrCorrupt        = errors.New("corrupt")
	ErrStorage        = errors.New("storage")
	ErrOutcomeUnknown = errors.New("outcome_unknown")
)

// Error is why a fenced claim, read or write did not happen, or why its outcome is unknown.
type Error struct {
	// Kind is one of the sentinels above; errors.Is matches it.
	Kind    error
	Message string
	// Accepted and HolderSession are set for ErrStale and ErrTokenReissued: the scope's
	// accepted token and the session that presented it first.
	Accepted, HolderSession uint64
	// Cause is the storage's own error, for ErrStorage and ErrOutcomeUnknown.
	Cause error
}

func (e *Error) Error() string { return e.Message }

// Is matches the kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap is the storage's error.
func (e *Error) Unwrap() error { return e.Cause }

// Rejection reports whether the sequencer was refused (retrying with it cannot succeed).
func (e *Error) Rejection() bool {
	switch e.Kind {
	case ErrStale, ErrTokenReissued, ErrSharedWrite, ErrWrongLock, ErrMissing, ErrMalformed, ErrForged:
		return true
	}
	return false
}

// Errorf is an *Error of kind; for the subpackages.
func Errorf(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// State is what a scope has accepted so far, stored with its data.
type State struct {
	// Lock is the scope's binding: the lock, or a permit's lock and slot (sequencer.Binding).
	Lock     string
	TokenMax uint64
	// HolderSession presented TokenMax first; 0 means a shared phase (the readers of one phase).
	HolderSession uint64
}

// Intent is what the caller does with an accepted sequencer: a shared grant may read, never
// write.
type Intent int

const (
	// IntentRead is a claim before a read, or a read: any grant may.
	IntentRead Intent = iota
	// IntentWrite is a write, or a claim that authorizes the writes after it (a transaction
	// that writes): exclusive grants and permits only.
	IntentWrite
)

func (i Intent) String() string {
	if i == IntentRead {
		return "read"
	}
	return "write"
}

// StoredHolder is the holder session a scope stores when it accepts q: its session, or 0 for a
// shared grant. A scope accepts q's token again exactly when the stored holder equals it, which
// is how the SQL statements and the Lua script state rule 4.
func StoredHolder(q sequencer.Verified) uint64 {
	if q.Access().Kind == sequencer.Shared {
		return 0
	}
	return q.Session()
}

// ValidateScope refuses an empty scope or one over ScopeBytesMax bytes.
func ValidateScope(scope string) error {
	if scope == "" {
		return Errorf(ErrInvalidScope, "invalid fence scope: scope name is empty")
	}
	if len(scope) > ScopeBytesMax {
		return Errorf(ErrInvalidScope, "invalid fence scope: scope name is %d bytes, the limit is %d", len(scope), ScopeBytesMax)
	}
	return nil
}

// Stale is the refusal of token presented by a superseded holder; binding is the scope's.
func Stale(binding string, presented, accepted, holder uint64) *Error {
	setBy := fmt.Sprintf("set by session %d", holder)
	if holder == 0 {
		setBy = "set by a shared phase's readers"
	}
	return &Error{Kind: ErrStale, Accepted: accepted, HolderSession: holder, Message: fmt.Sprintf(
		"stale sequencer for lock %q: token %d is older than the accepted token %d (%s); a newer holder has claimed, read or written here, so re-acquire the lock and re-read before writing",
		sequencer.DisplayBinding(binding), presented, accepted, setBy)}
}

// Check is the pure decision every backend runs under its own atomicity: the state to store, or
// the refusal, by the rule of the package docs. It accepts a token equal to the maximum from the
// grant that presented it first (one grant may write many times; every reader of a shared phase
// may claim), and refuses it from any other (ErrTokenReissued). expectBinding, if not empty,
// refuses other bindings' sequencers even for the first claim (a lock name, or
// sequencer.Binding of a lock and a slot).
func Check(accepted *State, expectBinding string, q sequencer.Verified, intent Intent) (State, error) {
	if q.Token() == 0 {
		return State{}, Errorf(ErrMissing, "no sequencer presented: fenced writes need the verified sequencer of the lock holder")
	}
	binding := q.Binding()
	if expectBinding != "" && binding != expectBinding {
		return State{}, WrongLock(expectBinding, binding)
	}
	if accepted != nil && binding != accepted.Lock {
		return State{}, WrongLock(accepted.Lock, binding)
	}
	if q.Access().Kind == sequencer.Shared && intent == IntentWrite {
		return State{}, SharedWrite(q)
	}
	holder := StoredHolder(q)
	if accepted == nil {
		return State{binding, q.Token(), holder}, nil
	}
	if q.Token() < accepted.TokenMax {
		return State{}, Stale(accepted.Lock, q.Token(), accepted.TokenMax, accepted.HolderSession)
	}
	// One grant has one session (one phase, holder 0): the same token from another is a second
	// grant of it, which only a lock service that was restored or lost its log can issue.
	if q.Token() == accepted.TokenMax && holder != accepted.HolderSession {
		return State{}, TokenReissued(accepted.Lock, accepted.TokenMax, accepted.HolderSession, q.Session())
	}
	return State{accepted.Lock, q.Token(), holder}, nil
}

// Precheck refuses what Check refuses without stored state (an unexpected binding, a shared
// grant's write); the backends run it before their I/O.
func Precheck(expectBinding string, q sequencer.Verified, intent Intent) error {
	_, err := Check(nil, expectBinding, q, intent)
	return err
}

// SharedWrite is the refusal of a write by a shared grant (a reader of a read-write lock).
func SharedWrite(q sequencer.Verified) *Error {
	return Errorf(ErrSharedWrite, "a reader (shared grant) cannot write: token %d of lock %q is a shared grant, so this write is refused; acquire the lock exclusive to write", q.Token(), q.Lock())
}

// TokenReissued is the refusal of the accepted token presented again by another session;
// binding is the scope's, first 0 a shared phase.
func TokenReissued(binding string, token, first, presented uint64) *Error {
	firstText := fmt.Sprintf("session %d", first)
	if first == 0 {
		firstText = "the readers of a shared phase"
	}
	return &Error{Kind: ErrTokenReissued, Accepted: token, HolderSession: first, Message: fmt.Sprintf(
		"token %d of lock %q was first presented here by %s, and session %d presents it now: the lock service issued this token twice (restored from a backup, or its log was lost or rolled back), so this grant is refused; tell the lock service's operator, then release the lock and acquire it again for a newer token",
		token, sequencer.DisplayBinding(binding), firstText, presented)}
}

// WrongLock is the refusal of a sequencer of another binding than the scope's (or the expected).
func WrongLock(expected, presented string) *Error {
	expected, presented = sequencer.DisplayBinding(expected), sequencer.DisplayBinding(presented)
	return Errorf(ErrWrongLock, "sequencer is for lock %q, but this resource is protected by lock %q: acquire %q instead", presented, expected, expected)
}

// ExplainRefusal is why a database refused q for intent given the row that refused it; a row
// that would have accepted is corruption, never success.
func ExplainRefusal(scope string, accepted State, q sequencer.Verified, intent Intent) error {
	if _, err := Check(&accepted, "", q, intent); err != nil {
		return err
	}
	return Errorf(ErrCorrupt, "fence state of scope %q is corrupt: the database refused token %d but the stored state %+v accepts it", scope, q.Token(), accepted)
}

// StoredState checks a state read back from storage: a token outside 1..=TokenMax is corruption.
func StoredState(scope, lock string, tokenMax, holder uint64) (State, error) {
	if tokenMax < 1 || tokenMax > TokenMax {
		return State{}, Errorf(ErrCorrupt, "fence state of scope %q is corrupt: stored token %d is outside 1..=%d", scope, tokenMax, TokenMax)
	}
	return State{lock, tokenMax, holder}, nil
}

// VerifyPresented verifies the sequencer a client presented: blank is ErrMissing, text that is
// no sequencer ErrMalformed, a bad signature or an untrusted key ErrForged.
func VerifyPresented(presented string, keys sequencer.KeySet) (sequencer.Verified, error) {
	if strings.TrimSpace(presented) == "" {
		return sequencer.Verified{}, Errorf(ErrMissing, "no sequencer presented: fenced writes need the sequencer of the lock holder")
	}
	v, err := sequencer.Verify(presented, keys)
	switch {
	case errors.Is(err, sequencer.ErrForged):
		return v, &Error{Kind: ErrForged, Message: "forged sequencer: " + err.Error()}
	case err != nil:
		return v, &Error{Kind: ErrMalformed, Message: "malformed sequencer: " + err.Error()}
	}
	return v, nil
}

// Verifier verifies sequencers with the lock service's public keys, remembering recent successes
// (by exact text, forgotten when the keys change), so each sequencer pays for one check. Safe for
// concurrent use.
type Verifier struct {
	mu       sync.Mutex
	keys     sequencer.KeySet
	gen      uint64 // bumped by SetKeys
	verified map[string]sequencer.Verified
}

// NewVerifier trusts keys.
func NewVerifier(keys sequencer.KeySet) *Verifier {
	return &Verifier{keys: keys, verified: map[string]sequencer.Verified{}}
}

// SetKeys trusts keys from now on instead, and forgets every remembered sequencer.
func (v *Verifier) SetKeys(keys sequencer.KeySet) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.keys = keys
	v.gen++
	v.verified = map[string]sequencer.Verified{}
}

// Verify is VerifyPresented with the verifier's keys.
func (v *Verifier) Verify(presented string) (sequencer.Verified, error) {
	text := strings.TrimSpace(presented)
	v.mu.Lock()
	hit, ok := v.verified[text]
	keys, gen := v.keys, v.gen
	v.mu.Unlock()
	if ok {
		return hit, nil
	}
	verified, err := VerifyPresented(text, keys)
	if err != nil {
		return verified, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gen != gen {
		return verified, nil // verified with the keys of before; not remembered
	}
	if len(v.verified) >= VerifiedCachedMax {
		v.verified = map[string]sequencer.Verified{}
	}
	v.verified[text] = verified
	return verified, nil
}
