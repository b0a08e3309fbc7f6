package palisade_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/internal/testserver"
	"example.invalid/palisade/clients/go/sequencer"
)

// A handoff to the lock itself takes it again with a new, higher token and a verifiable
// sequencer; the lock stays with the same session, and the old Mutex holds nothing.
func TestAHandoffToTheSameLockTakesItAgainWithANewToken(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))
	m := s.Mutex("h/a")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := m.Token()

	next, err := m.ReleaseThenAcquire(ctx, "h/a", palisade.AcquireOptions{Value: "round-2"})
	if err != nil {
		t.Fatal(err)
	}
	if next.Name() != "h/a" || next.Token() <= first {
		t.Fatalf("the handoff holds lock %q with token %d, want h/a above %d", next.Name(), next.Token(), first)
	}
	keys, err := c.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sequencer.Verify(next.Sequencer(), keys); err != nil || v.Lock() != "h/a" || v.Token() != next.Token() || v.Session() != s.ID() {
		t.Fatalf("the new grant's sequencer: %v %v", v, err)
	}
	status, err := c.Status(ctx, "h/a")
	if err != nil {
		t.Fatal(err)
	}
	if status.Holder == nil || status.Holder.Session != s.ID() || status.Holder.Token != next.Token() || status.Holder.Value != "round-2" || status.LastToken != next.Token() {
		t.Fatalf("status after the handoff: %+v (holder %+v), want session %d with token %d", status, status.Holder, s.ID(), next.Token())
	}
	if m.Token() != 0 {
		t.Fatalf("the handed-off Mutex still shows token %d", m.Token())
	}
	if err := m.Unlock(ctx); !errors.Is(err, palisade.ErrInvalidArgument) {
		t.Fatalf("Unlock of the handed-off Mutex: %v, want invalid argument", err)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A handoff to the lock itself goes behind a waiter of another session: the waiter is granted
// at once, the handoff only once the waiter releases.
func TestAHandoffToTheSameLockWaitsBehindItsWaiters(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))
	other := session(t, c, palisade.WithTTL(5*time.Second))
	m := s.Mutex("h/b")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := m.Token()
	waiter := other.Mutex("h/b")
	waiterDone := make(chan error, 1)
	go func() { waiterDone <- waiter.Lock(ctx) }()
	waitFor(t, func() bool {
		status, err := c.Status(ctx, "h/b")
		return err == nil && slices.Equal(status.Waiters, []uint64{other.ID()})
	})

	type result struct {
		next *palisade.Mutex
		err  error
	}
	handoffDone := make(chan result, 1)
	go func() {
		next, err := m.ReleaseThenAcquire(ctx, "h/b", palisade.AcquireOptions{})
		handoffDone <- result{next, err}
	}()
	select {
	case err := <-waiterDone:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case r := <-handoffDone:
		t.Fatalf("the handoff was answered before the waiter was granted: %v %v", r.next, r.err)
	}
	waiterToken := waiter.Token()
	if waiterToken <= first {
		t.Fatalf("the waiter's token %d is not above %d", waiterToken, first)
	}
	waitFor(t, func() bool {
		status, err := c.Status(ctx, "h/b")
		return err == nil && slices.Equal(status.Waiters, []uint64{s.ID()})
	})
	if status, err := c.Status(ctx, "h/b"); err != nil || status.Holder == nil || status.Holder.Session != other.ID() || status.Holder.Token != waiterToken {
		t.Fatalf("status while the handoff waits: %+v %v, want the waiter holding", status, err)
	}
	select {
	case r := <-handoffDone:
		t.Fatalf("the handoff was answered while the waiter held the lock: %v %v", r.next, r.err)
	case <-time.After(200 * time.Millisecond):
	}

	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-handoffDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.next.Token() <= waiterToken {
		t.Fatalf("the handoff's token %d is not above the waiter's %d", r.next.Token(), waiterToken)
	}
	if status, err := c.Status(ctx, "h/b"); err != nil || status.Holder == nil || status.Holder.Session != s.ID() || status.Holder.Token != r.next.Token() || len(status.Waiters) != 0 {
		t.Fatalf("status after the handoff: %+v %v", status, err)
	}
}

// A handoff to another lock frees the first and holds the second, with the options' value.
func TestAHandoffToAnotherLockFreesTheFirstAndHoldsTheSecond(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))
	m := s.Mutex("h/c1")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	next, err := m.ReleaseThenAcquire(ctx, "h/c2", palisade.AcquireOptions{Value: "stage-2"})
	if err != nil {
		t.Fatal(err)
	}
	if next.Name() != "h/c2" || next.Token() == 0 {
		t.Fatalf("the handoff holds lock %q with token %d", next.Name(), next.Token())
	}
	if status, err := c.Status(ctx, "h/c1"); err != nil || status.Holder != nil || len(status.Waiters) != 0 {
		t.Fatalf("h/c1 after the handoff: %+v %v, want free", status, err)
	}
	status, err := c.Status(ctx, "h/c2")
	if err != nil || status.Holder == nil || status.Holder.Session != s.ID() || status.Holder.Token != next.Token() || status.Holder.Value != "stage-2" {
		t.Fatalf("h/c2 after the handoff: %+v %v, want session %d with token %d", status, err, s.ID(), next.Token())
	}
}

// A try-handoff to a lock another session holds is ErrBusy naming the holder, and the lock
// handed off is released all the same.
func TestATryHandoffToAHeldLockIsBusyAndStillReleases(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))
	holder := session(t, c, palisade.WithTTL(5*time.Second)).Mutex("h/d2")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m := s.Mutex("h/d1")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	next, err := m.ReleaseThenAcquire(ctx, "h/d2", palisade.AcquireOptions{TryOnly: true})
	var perr *palisade.Error
	if next != nil || !errors.Is(err, palisade.ErrBusy) || !errors.As(err, &perr) || perr.Detail.GetHolderToken() != holder.Token() {
		t.Fatalf("a try-handoff to a held lock: %v %v, want busy naming token %d", next, err, holder.Token())
	}
	if status, err := c.Status(ctx, "h/d1"); err != nil || status.Holder != nil || len(status.Waiters) != 0 {
		t.Fatalf("h/d1 after the busy handoff: %+v %v, want free", status, err)
	}
	if status, err := c.Status(ctx, "h/d2"); err != nil || status.Holder == nil || status.Holder.Token != holder.Token() || len(status.Waiters) != 0 {
		t.Fatalf("h/d2 after the busy handoff: %+v %v, want the holder's and no waiter", status, err)
	}
	if m.Token() != 0 {
		t.Fatalf("the handed-off Mutex still shows token %d", m.Token())
	}
}
