// Package k8s is a client-go resourcelock.Interface backed by a Palisade lock, so that
// leaderelection.RunOrDie works unchanged and the leader gets a real epoch: the lock's fencing
// token, higher for every new leader, and its signed sequencer, to fence whatever it changes.
//
// Kubernetes' own leader election says in its source that it does not fence: two processes can
// both believe they lead. With this lock the lease lives in Palisade (no API server is needed
// for it): a candidate leads while its Palisade session holds the lock, and a resource that
// checks the leader's sequencer (package fence) refuses a deposed leader's late write, however
// long it was paused. See docs/kubernetes.md.
//
//	lock, err := k8s.NewLock(client, "controllers/my-operator", "pod-a", 10*time.Second)
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second,
//		RetryPeriod: 2 * time.Second, ReleaseOnCancel: true,
//		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(ctx context.Context) {
//			epoch, sequencer := lock.Epoch(), lock.Sequencer()
//			...
//		}},
//	})
//
// How the record maps: Get reports the lock's holder (its grant's value is the holder's
// identity) and NotFound while the lock is free; Create and Update take the lock if it is free
// (never waiting), or keep it if this candidate holds it; an Update with an empty holder (the
// elector's release on cancel) releases it. Expiry is Palisade's: a holder's lease ends when
// its session does, not when the record's renew time is old, so Get reports a record that never
// looks expired while the lock is held.
package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	palisade "example.invalid/palisade/clients/go"
)

// Lock is a resourcelock.Interface on the Palisade lock Name.
type Lock struct {
	client   *palisade.Client
	name     string
	identity string
	ttl      time.Duration

	mu      sync.Mutex
	session *palisade.Session
	mutex   *palisade.Mutex
	grant   palisade.Grant
	held    bool
	record  resourcelock.LeaderElectionRecord
}

var _ resourcelock.Interface = (*Lock)(nil)

// NewLock is the lock name, campaigned for as identity, in sessions of ttl (opened when needed:
// a candidate whose session was lost campaigns again in a new one).
func NewLock(client *palisade.Client, name, identity string, ttl time.Duration) (*Lock, error) {
	if identity == "" {
		return nil, errors.New("a leader election identity is not empty")
	}
	return &Lock{client: client, name: name, identity: identity, ttl: ttl}, nil
}

// Epoch is this candidate's fencing token while it leads (0 otherwise).
func (l *Lock) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.holding() {
		return 0
	}
	return l.grant.Token
}

// Sequencer is the signed form of the epoch while it leads ("" otherwise): what resources check.
func (l *Lock) Sequencer() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.holding() {
		return ""
	}
	return l.grant.Sequencer
}

// Session is the session the lock is held in now (nil before the first campaign).
func (l *Lock) Session() *palisade.Session {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.session
}

// holding: l.mu held.
func (l *Lock) holding() bool {
	return l.held && l.session != nil && l.session.Err() == nil
}

var resource = schema.GroupResource{Group: "palisade", Resource: "locks"}

// Get is the record of the lock's holder, or NotFound while the lock is free.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	status, err := l.client.Status(ctx, l.name)
	if err != nil {
		return nil, nil, err
	}
	if status.Holder == nil {
		return nil, nil, apierrors.NewNotFound(resource, l.name)
	}
	l.mu.Lock()
	record := l.record
	l.mu.Unlock()
	if record.HolderIdentity != status.Holder.Value {
		record = resourcelock.LeaderElectionRecord{HolderIdentity: status.Holder.Value}
	}
	// Never expired while held: the renew time is now, and the raw record changes with every
	// read, so the elector keeps counting from now. Palisade decides when the lease ends.
	record.RenewTime = metav1.NewTime(time.Now())
	record.LeaseDurationSeconds = max(int(l.ttl/time.Second), 1)
	raw, err := json.Marshal(struct {
		Record  resourcelock.LeaderElectionRecord
		Session uint64
		Token   uint64
		Lease   time.Duration
	}{record, status.Holder.Session, status.Holder.Token, status.Holder.LeaseRemaining})
	return &record, raw, err
}

// Create takes the lock for this candidate if it is free.
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.take(ctx, ler)
}

// Update keeps the lock if this candidate holds it, takes it if it is free, and releases it for
// a record with no holder (the elector's release on cancel).
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.held {
			return nil
		}
		l.held = false
		return l.mutex.Unlock(ctx)
	}
	return l.take(ctx, ler)
}

func (l *Lock) take(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity != l.identity {
		return fmt.Errorf("palisade lock %q: a record for %q, but this candidate is %q", l.name, ler.HolderIdentity, l.identity)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holding() {
		l.record = ler
		return nil
	}
	if l.session == nil || l.session.Err() != nil {
		if l.session != nil {
			_ = l.session.Close(ctx) // lost: end it for good before campaigning in a new one
		}
		session, err := l.client.NewSession(ctx, palisade.WithTTL(l.ttl))
		if err != nil {
			return err
		}
		l.session, l.held = session, false
		l.mutex = session.Mutex(l.name, palisade.WithValue(l.identity))
	}
	if err := l.mutex.TryLock(ctx); err != nil {
		return err
	}
	grant, ok := l.mutex.Grant()
	if !ok {
		return l.session.Err()
	}
	l.grant, l.held, l.record = grant, true, ler
	return nil
}

// RecordEvent does nothing: there is no Kubernetes object to record events on.
func (l *Lock) RecordEvent(string) {}

// Identity is this candidate's identity.
func (l *Lock) Identity() string { return l.identity }

// Describe names the lock.
func (l *Lock) Describe() string { return "palisade lock " + l.name }

// Close ends the candidate's session (releasing the lock if it holds it).
func (l *Lock) Close(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = false
	if l.session == nil {
		return nil
	}
	return l.session.Close(ctx)
}
