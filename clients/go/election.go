package palisade

import (
	"context"
	"sync"
)

// Election is leader election on a lock, as etcd's concurrency.Election and the Rust and Python
// clients' Election: a candidate campaigns by acquiring the lock with a value (its address, say)
// and waiting in the lock's FIFO queue; it leads while its session holds the lock. The grant's
// fencing token is the leader's epoch: every new leader's epoch is higher than every earlier
// one's, so whatever the leader writes is fenced with its Sequencer exactly as a lock holder's
// writes are. Leadership ends with the session (Session.Done).
type Election struct {
	session *Session
	name    string

	mu    sync.Mutex
	mutex *Mutex
}

// Leader is who leads an election.
type Leader struct {
	Session uint64
	// Epoch is the leader's grant's fencing token, higher than every earlier leader's.
	Epoch uint64
	// Value is what the leader proclaimed (its campaign's value, or a later proclaim).
	Value string
}

// NewElection is the election named name, campaigned in with session.
func NewElection(session *Session, name string) *Election {
	return &Election{session: session, name: name}
}

// Campaign waits (in FIFO order behind earlier candidates) until this session leads, or ctx
// ends (the wait is then withdrawn). value is what observers see of the leader.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := validateLockName(e.name); err != nil {
		return err
	}
	m := e.session.Mutex(e.name, WithValue(value))
	if err := m.Lock(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	e.mutex = m
	e.mu.Unlock()
	return nil
}

func (e *Election) held() *Mutex {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mutex
}

// Proclaim tells observers a new value ("" removes it). ErrNotHolder once this leadership ended.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	m := e.held()
	if m == nil {
		return &Error{Class: ErrRefused, Kind: ErrNotHolder, Message: "proclaim in election " + e.name + ", which this candidate does not lead"}
	}
	return m.Proclaim(ctx, value)
}

// Resign steps down: the next candidate in line leads. A *SessionLostError if the leadership was
// already lost with the session.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	m := e.mutex
	e.mutex = nil
	e.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Unlock(ctx)
}

// Epoch is this candidate's epoch while it leads (0 otherwise).
func (e *Election) Epoch() uint64 {
	if m := e.held(); m != nil {
		return m.Token()
	}
	return 0
}

// Sequencer is the signed form of the epoch, to present to resources (""when not leading).
func (e *Election) Sequencer() string {
	if m := e.held(); m != nil {
		return m.Sequencer()
	}
	return ""
}

// Leader is the current leader, or nil while nobody leads (read linearizably).
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	status, err := e.session.client.Status(ctx, e.name)
	if err != nil || status.Holder == nil {
		return nil, err
	}
	return &Leader{status.Holder.Session, status.Holder.Token, status.Holder.Value}, nil
}

// Observe follows the leader until ctx ends: the first value is the leader now, then one per
// change (a new leader, a new value proclaimed, nobody leading: nil). The channel is closed when
// ctx ends or the watch cannot go on.
func (e *Election) Observe(ctx context.Context) (<-chan *Leader, error) {
	w, err := e.session.client.Watch(ctx, e.name)
	if err != nil {
		return nil, err
	}
	out := make(chan *Leader)
	go func() {
		defer close(out)
		var last *Leader
		first := true
		for event := range w.Events() {
			var leader *Leader
			switch event.Kind {
			case "snapshot", "granted", "value_set":
				if event.Session != 0 || event.Token != 0 {
					leader = &Leader{event.Session, event.Token, event.Value}
				}
			case "released", "expired":
			default:
				continue // says nothing about the leader
			}
			if !first && (leader == nil) == (last == nil) && (leader == nil || *leader == *last) {
				continue
			}
			first, last = false, leader
			select {
			case out <- leader:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
