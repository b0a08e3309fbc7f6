package palisade_test

import (
	"context"
	"errors"
	"testing"
	"time"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/internal/testserver"
)

func TestAnElectionHandsLeadershipOnWithAHigherEpochAndObserversFollow(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := connect(t, server.Endpoint)
	first := palisade.NewElection(session(t, c), "services/scheduler")
	if err := first.Campaign(ctx, "10.0.0.1:80"); err != nil {
		t.Fatal(err)
	}
	observed, err := first.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if leader := <-observed; leader == nil || leader.Epoch != first.Epoch() || leader.Value != "10.0.0.1:80" {
		t.Fatalf("the first observation: %+v", leader)
	}
	second := palisade.NewElection(session(t, c), "services/scheduler")
	campaigned := make(chan error, 1)
	go func() { campaigned <- second.Campaign(ctx, "10.0.0.2:80") }()
	if err := first.Proclaim(ctx, "10.0.0.1:81"); err != nil {
		t.Fatal(err)
	}
	if leader := <-observed; leader == nil || leader.Value != "10.0.0.1:81" {
		t.Fatalf("after a proclaim: %+v", leader)
	}
	epoch := first.Epoch()
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-campaigned; err != nil {
		t.Fatal(err)
	}
	if second.Epoch() <= epoch {
		t.Fatalf("the next leader's epoch %d is not above %d", second.Epoch(), epoch)
	}
	for leader := range observed {
		if leader != nil && leader.Epoch == second.Epoch() && leader.Value == "10.0.0.2:80" {
			break
		}
	}
	leader, err := second.Leader(ctx)
	if err != nil || leader == nil || leader.Epoch != second.Epoch() {
		t.Fatalf("Leader: %+v %v", leader, err)
	}
	if err := first.Proclaim(ctx, "x"); !errors.Is(err, palisade.ErrNotHolder) {
		t.Fatalf("a proclaim after resigning: %v", err)
	}
	// A campaign bounded by a deadline ends without leading.
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	if err := palisade.NewElection(session(t, c), "services/scheduler").Campaign(short, "c"); !errors.Is(err, palisade.ErrWaitEnded) {
		t.Fatalf("a campaign past its deadline: %v", err)
	}
}
