package palisade_test

import (
	"context"
	"errors"
	"testing"
	"time"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/internal/testserver"
	"example.invalid/palisade/clients/go/sequencer"
)

// Readers share their phase's token and a writer waits for them; permits get slots and tokens
// of their own; a semaphore's size is fixed while in use (docs/locks.md).
func TestReadersSharePhaseTokensAndPermitsGetSlotsOfTheirOwn(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	a := session(t, c, palisade.WithTTL(5*time.Second))
	b := session(t, c, palisade.WithTTL(5*time.Second))

	r1, r2 := a.Mutex("config", palisade.Shared()), b.Mutex("config", palisade.Shared())
	for _, r := range []*palisade.Mutex{r1, r2} {
		if err := r.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r1.Access().Kind != sequencer.Shared || r1.Token() != r2.Token() {
		t.Fatalf("readers: %v token %d, %v token %d", r1.Access(), r1.Token(), r2.Access(), r2.Token())
	}
	keys, err := c.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sequencer.Verify(r1.Sequencer(), keys); err != nil || v.Access().Kind != sequencer.Shared {
		t.Fatalf("a reader's sequencer: %v %v", v, err)
	}
	// Status lists the phase's readers, each with the phase's token, and no exclusive holder.
	status, err := c.Status(ctx, "config")
	if err != nil {
		t.Fatal(err)
	}
	if status.Holder != nil || status.Permits != 0 || len(status.Sharers) != 2 {
		t.Fatalf("status of a shared phase: %+v", status)
	}
	for _, reader := range status.Sharers {
		if reader.Access.Kind != sequencer.Shared || reader.Token != r1.Token() || reader.LeaseRemaining <= 0 {
			t.Fatalf("a reader in the status: %+v", reader)
		}
	}
	if status.Sharers[0].Session == status.Sharers[1].Session {
		t.Fatalf("one session listed twice: %+v", status.Sharers)
	}
	w := session(t, c, palisade.WithTTL(5*time.Second)).Mutex("config")
	if err := w.TryLock(ctx); !errors.Is(err, palisade.ErrBusy) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	for _, r := range []*palisade.Mutex{r1, r2} {
		if err := r.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.TryLock(ctx); err != nil || w.Token() <= r1.Token() {
		t.Fatalf("the writer after the readers: %v, token %d", err, w.Token())
	}

	p1, p2 := a.Mutex("shards", palisade.Permits(2)), b.Mutex("shards", palisade.Permits(2))
	for _, p := range []*palisade.Mutex{p1, p2} {
		if err := p.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p1.Access().Kind != sequencer.Slot || p1.Access().Slot == p2.Access().Slot || p1.Token() == p2.Token() {
		t.Fatalf("permits: %v token %d, %v token %d", p1.Access(), p1.Token(), p2.Access(), p2.Token())
	}
	// Status gives the semaphore's size and each permit holder with its slot and token.
	status, err = c.Status(ctx, "shards")
	if err != nil {
		t.Fatal(err)
	}
	if status.Holder != nil || status.Permits != 2 || len(status.Sharers) != 2 {
		t.Fatalf("status of a semaphore: %+v", status)
	}
	for _, p := range []*palisade.Mutex{p1, p2} {
		found := false
		for _, holder := range status.Sharers {
			found = found || (holder.Access == p.Access() && holder.Token == p.Token())
		}
		if !found {
			t.Fatalf("the permit %v token %d is not in the status %+v", p.Access(), p.Token(), status.Sharers)
		}
	}
	other := session(t, c, palisade.WithTTL(5*time.Second))
	if err := other.Mutex("shards", palisade.Permits(2)).TryLock(ctx); !errors.Is(err, palisade.ErrBusy) {
		t.Fatalf("a third permit of two: %v", err)
	}
	if err := other.Mutex("shards", palisade.Permits(3)).TryLock(ctx); !errors.Is(err, palisade.ErrInvalidArgument) {
		t.Fatalf("another size: %v", err)
	}
}
