package palisade_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/internal/testserver"
	"example.invalid/palisade/clients/go/sequencer"
)

// A multi-lock of three locks in three modes holds each with its own token, access and
// verifiable sequencer; releasing one leaves the others held (docs/locks.md § Multi-locks).
func TestMultiLockHoldsEachPartOnItsOwn(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))

	held, err := s.AcquireAll(ctx, []palisade.LockPart{{Name: "m/a"}, {Name: "m/b", Shared: true}, {Name: "m/c", Permits: 3}}, palisade.MultiAcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := c.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []sequencer.AccessKind{sequencer.Exclusive, sequencer.Shared, sequencer.Slot}
	tokens := map[uint64]bool{}
	for i, m := range held {
		if want := []string{"m/a", "m/b", "m/c"}[i]; m.Name() != want || m.Access().Kind != kinds[i] {
			t.Fatalf("part %d: lock %q with %v, want %q with %v", i, m.Name(), m.Access(), want, kinds[i])
		}
		v, err := sequencer.Verify(m.Sequencer(), keys)
		if err != nil || v.Lock() != m.Name() || v.Token() != m.Token() || v.Session() != s.ID() || v.Access() != m.Access() {
			t.Fatalf("part %d's sequencer: %v %v", i, v, err)
		}
		tokens[m.Token()] = true
	}
	if len(tokens) != 3 {
		t.Fatalf("tokens %d, %d, %d are not distinct", held[0].Token(), held[1].Token(), held[2].Token())
	}

	if err := held[1].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if status, err := c.Status(ctx, "m/b"); err != nil || status.Holder != nil || len(status.Sharers) != 0 {
		t.Fatalf("m/b after its release: %+v %v", status, err)
	}
	if status, err := c.Status(ctx, "m/a"); err != nil || status.Holder == nil || status.Holder.Session != s.ID() || status.Holder.Token != held[0].Token() {
		t.Fatalf("m/a after m/b's release: %+v %v", status, err)
	}
	if status, err := c.Status(ctx, "m/c"); err != nil || len(status.Sharers) != 1 || status.Sharers[0].Session != s.ID() || status.Permits != 3 {
		t.Fatalf("m/c after m/b's release: %+v %v", status, err)
	}
}

// A multi-lock that overlaps a held lock waits holding none of its locks, leaves every queue
// when ctx ends, and is granted all of them once the holder releases.
func TestMultiLockWaitsHoldingNothing(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	a := session(t, c, palisade.WithTTL(5*time.Second))
	b := session(t, c, palisade.WithTTL(5*time.Second))

	first, err := a.AcquireAll(ctx, []palisade.LockPart{{Name: "w/a"}, {Name: "w/b"}}, palisade.MultiAcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AcquireAll(ctx, []palisade.LockPart{{Name: "w/b"}, {Name: "w/d"}}, palisade.MultiAcquireOptions{TryOnly: true}); !errors.Is(err, palisade.ErrBusy) {
		t.Fatalf("a try of a held lock: %v, want busy", err)
	}
	// A wait that ctx ends is withdrawn from every queue.
	short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = b.AcquireAll(short, []palisade.LockPart{{Name: "w/b"}, {Name: "w/d"}}, palisade.MultiAcquireOptions{})
	cancelShort()
	if !errors.Is(err, palisade.ErrWaitEnded) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait that ctx ended: %v", err)
	}
	for _, lock := range []string{"w/b", "w/d"} {
		if status, err := c.Status(ctx, lock); err != nil || slices.Contains(status.Waiters, b.ID()) || (status.Holder != nil && status.Holder.Session == b.ID()) {
			t.Fatalf("%s after the wait ended: %+v %v", lock, status, err)
		}
	}
	type result struct {
		held []*palisade.Mutex
		err  error
	}
	done := make(chan result, 1)
	go func() {
		held, err := b.AcquireAll(ctx, []palisade.LockPart{{Name: "w/b"}, {Name: "w/d"}}, palisade.MultiAcquireOptions{})
		done <- result{held, err}
	}()
	for {
		status, err := c.Status(ctx, "w/b")
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(status.Waiters, b.ID()) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, err := c.Status(ctx, "w/d"); err != nil || status.Holder != nil || !slices.Contains(status.Waiters, b.ID()) {
		t.Fatalf("w/d, free, while the group waits for w/b: %+v %v (want no holder, b waiting)", status, err)
	}
	if err := first[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("the group was answered while w/b was held: %v %v", r.held, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := first[1].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, m := range r.held {
		if status, err := c.Status(ctx, m.Name()); err != nil || status.Holder == nil || status.Holder.Session != b.ID() || status.Holder.Token != m.Token() {
			t.Fatalf("%s after the grant: %+v %v", m.Name(), status, err)
		}
	}
}

// Two sessions taking {A, B} and {B, A} at once both get both, one after the other: no lock
// order is needed.
func TestMultiLocksInOppositeOrdersBothComplete(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, server.Endpoint)
	orders := [][]palisade.LockPart{{{Name: "o/a"}, {Name: "o/b"}}, {{Name: "o/b"}, {Name: "o/a"}}}
	var wg sync.WaitGroup
	errs := make([]error, len(orders))
	for i, parts := range orders {
		s := session(t, c, palisade.WithTTL(5*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 20 {
				held, err := s.AcquireAll(ctx, parts, palisade.MultiAcquireOptions{})
				if err != nil {
					errs[i] = fmt.Errorf("round %d: %w", round, err)
					return
				}
				for _, m := range held {
					if err := m.Unlock(ctx); err != nil {
						errs[i] = fmt.Errorf("round %d: %w", round, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("session %d: %v", i, err)
		}
	}
}

// The refusals: more than MultiLockMax locks or none (refused before sending), a name twice,
// and a name the session already holds.
func TestMultiLockRefusals(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))

	var many []palisade.LockPart
	for i := range palisade.MultiLockMax + 1 {
		many = append(many, palisade.LockPart{Name: fmt.Sprintf("r/%d", i)})
	}
	for _, parts := range [][]palisade.LockPart{many, nil} {
		if _, err := s.AcquireAll(ctx, parts, palisade.MultiAcquireOptions{}); !errors.Is(err, palisade.ErrInvalidArgument) {
			t.Fatalf("a multi-lock of %d locks: %v, want invalid argument", len(parts), err)
		}
	}
	if _, err := s.AcquireAll(ctx, many[:palisade.MultiLockMax], palisade.MultiAcquireOptions{TryOnly: true}); err != nil {
		t.Fatalf("a multi-lock of %d locks: %v", palisade.MultiLockMax, err)
	}
	refused := func(parts []palisade.LockPart, kind string) {
		t.Helper()
		_, err := s.AcquireAll(ctx, parts, palisade.MultiAcquireOptions{})
		var perr *palisade.Error
		if !errors.As(err, &perr) || !errors.Is(err, palisade.ErrRefused) || !errors.Is(err, palisade.ErrInvalidArgument) || perr.ErrorKind() != kind {
			t.Fatalf("%v: %v, want %s", parts, err, kind)
		}
	}
	refused([]palisade.LockPart{{Name: "x/a"}, {Name: "x/b"}, {Name: "x/a"}}, "multi_lock_repeated")
	refused([]palisade.LockPart{{Name: "x/a"}, {Name: "r/0"}}, "multi_lock_held")
	if status, err := c.Status(ctx, "x/a"); err != nil || status.Holder != nil {
		t.Fatalf("x/a after the refusals: %+v %v", status, err)
	}
}
