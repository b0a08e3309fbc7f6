package palisade

import (
	"context"
	"fmt"
	"sync"

	"example.invalid/palisade/clients/go/sequencer"
)

// Mutex is one lock taken in a session: Lock waits in FIFO order, TryLock does not, Unlock gives
// it up. While held, Token is its fencing token and Sequencer the signed text to present to
// every resource written; the hold ends when the session does (Session.Done).
type Mutex struct {
	session *Session
	name    string
	value   string
	shared  bool
	permits uint32

	mu    sync.Mutex
	grant *Grant
}

// MutexOption configures Session.Mutex.
type MutexOption func(*Mutex)

// WithValue is what the grant tells everyone who reads the lock (Status, ListLocks, Watch): 1
// to 1024 bytes of UTF-8 without control characters.
func WithValue(value string) MutexOption { return func(m *Mutex) { m.value = value } }

// Shared takes the lock as a reader of a read-write lock: readers hold it together, each with
// its phase's token, and cannot write at a fenced resource (docs/locks.md).
func Shared() MutexOption { return func(m *Mutex) { m.shared = true } }

// Permits takes one permit of the semaphore of n permits instead: Slot says which.
func Permits(n uint32) MutexOption { return func(m *Mutex) { m.permits = n } }

// Mutex is the lock name in this session (nothing is sent until Lock or TryLock).
func (s *Session) Mutex(name string, opts ...MutexOption) *Mutex {
	m := &Mutex{session: s, name: name}
	for _, opt := range opts {
		opt(m)
	}
	return m
}

// Name is the lock's name.
func (m *Mutex) Name() string { return m.name }

// Lock takes the lock, waiting until it is granted or ctx ends (the service ends the wait just
// before ctx's deadline: ErrWaitEnded). If ctx ends while the acquire may be waiting, the wait
// is withdrawn before Lock returns. Locking a held Mutex again returns its grant unchanged.
func (m *Mutex) Lock(ctx context.Context) error { return m.acquire(ctx, false) }

// TryLock takes the lock only if it is free: ErrBusy (class ErrNotAcquired) otherwise, whose
// Detail names the holder and its token.
func (m *Mutex) TryLock(ctx context.Context) error { return m.acquire(ctx, true) }

func (m *Mutex) acquire(ctx context.Context, tryOnly bool) error {
	if err := m.session.Err(); err != nil {
		return err
	}
	grant, err := m.session.client.Acquire(ctx, m.session.cred, m.name, AcquireOptions{TryOnly: tryOnly, Value: m.value, Shared: m.shared, Permits: m.permits})
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.grant = &grant
	m.mu.Unlock()
	// A grant that arrives after the session ended is no grant: the service may have freed it.
	return m.session.Err()
}

// Unlock gives the lock up; an error if the service did not confirm it, or if the session ended
// while it was held (then the lock is lost, not released: *SessionLostError).
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	grant := m.grant
	m.grant = nil
	m.mu.Unlock()
	if grant == nil {
		return invalidArgument("unlock of lock %q, which this Mutex does not hold", m.name)
	}
	if err := m.session.Err(); err != nil {
		return err
	}
	token, held, err := m.session.client.Release(ctx, m.session.cred, m.name)
	if err != nil {
		return err
	}
	if !held || token != grant.Token {
		ended := "a wait instead"
		if held {
			ended = fmt.Sprintf("token %d", token)
		}
		return protocolError("release of lock %q with token %d ended %s", m.name, grant.Token, ended)
	}
	return nil
}

// ReleaseThenAcquire gives this lock up and takes lock (another, or this one again: behind its
// waiters, with a new token) in one call and one log write (Client.ReleaseThenAcquire): a
// handoff from one lock to the next, waiting as opts says (TryOnly: ErrBusy at once). It
// returns the new lock's Mutex, with opts' Value, Shared and Permits; this Mutex holds nothing
// afterwards either way, as after Unlock. After a refusal of the acquire (ErrBusy,
// ErrWaitEnded, ...) this lock is released and lock is not held; a refused release
// (ErrNotHolder, ErrSessionNotFound: the grant had ended already) changed nothing. After
// ErrUnavailable, or ErrProtocol with Code codes.Unimplemented from a server that predates the
// call, nothing was released: the session holds this lock until Client.Release or its end. If
// ctx ends while the handoff may be waiting or granted, both locks are released (or the wait
// withdrawn) before ReleaseThenAcquire returns.
func (m *Mutex) ReleaseThenAcquire(ctx context.Context, lock string, opts AcquireOptions) (*Mutex, error) {
	m.mu.Lock()
	held := m.grant
	m.grant = nil
	m.mu.Unlock()
	if held == nil {
		return nil, invalidArgument("handoff from lock %q, which this Mutex does not hold", m.name)
	}
	if err := m.session.Err(); err != nil {
		return nil, err
	}
	client, cred := m.session.client, m.session.cred
	grant, token, released, err := client.ReleaseThenAcquire(ctx, cred, m.name, lock, opts)
	if err != nil {
		return nil, err
	}
	if !released || token != held.Token {
		// The answer is not about this grant: give the new one up too rather than hand it on.
		client.releaseQuietly(ctx, cred, "releasing the grant of a handoff that ended another", lock)
		ended := "a wait instead"
		if released {
			ended = fmt.Sprintf("token %d", token)
		}
		return nil, protocolError("handoff from lock %q with token %d ended %s", m.name, held.Token, ended)
	}
	next := &Mutex{session: m.session, name: lock, value: opts.Value, shared: opts.Shared, permits: opts.Permits, grant: &grant}
	// A grant that arrives after the session ended is no grant: the service may have freed it.
	return next, m.session.Err()
}

// Grant is the current grant, and false when the Mutex holds nothing (or its session ended).
func (m *Mutex) Grant() (Grant, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.grant == nil || m.session.Err() != nil {
		return Grant{}, false
	}
	return *m.grant, true
}

// Token is the fencing token of the current grant (0 when none).
func (m *Mutex) Token() uint64 {
	g, _ := m.Grant()
	return g.Token
}

// Sequencer is the signed sequencer of the current grant ("" when none): what resources check.
func (m *Mutex) Sequencer() string {
	g, _ := m.Grant()
	return g.Sequencer
}

// Access is how the current grant holds the lock: exclusive, shared, or a semaphore's slot.
func (m *Mutex) Access() sequencer.Access {
	g, _ := m.Grant()
	return g.Access
}

// Proclaim replaces the value the current grant tells readers of the lock ("" removes it).
func (m *Mutex) Proclaim(ctx context.Context, value string) error {
	g, ok := m.Grant()
	if !ok {
		return &Error{Class: ErrRefused, Kind: ErrNotHolder, Message: fmt.Sprintf("proclaim on lock %q, which this Mutex does not hold", m.name)}
	}
	return m.session.client.Proclaim(ctx, m.session.cred, m.name, g.Token, value)
}
