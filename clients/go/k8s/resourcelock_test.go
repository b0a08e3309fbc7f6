// client-go's real leaderelection package on a Palisade lock, against a real palisade serve:
// two candidates, the leader "killed" (its keepalive stops, as after kill -9), the next leader's
// epoch higher, and the deposed leader's late write, with its old sequencer, refused.
package k8s_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/internal/testserver"
	"example.invalid/palisade/clients/go/k8s"
)

type candidate struct {
	client *palisade.Client
	lock   *k8s.Lock
	led    chan [2]any // epoch, sequencer read in OnStartedLeading
	cancel context.CancelFunc
}

func run(t *testing.T, endpoint, identity string) *candidate {
	t.Helper()
	client, err := palisade.New(context.Background(), palisade.Config{Endpoints: []string{endpoint}, RetryBudget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := k8s.NewLock(client, "controllers/demo", identity, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{client, lock, make(chan [2]any, 1), cancel}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: 2 * time.Second,
		RenewDeadline: 1500 * time.Millisecond,
		RetryPeriod:   100 * time.Millisecond,
		Name:          "demo",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) { c.led <- [2]any{lock.Epoch(), lock.Sequencer()} },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go elector.Run(ctx)
	t.Cleanup(func() {
		cancel()
		_ = lock.Close(context.Background())
		_ = client.Close()
	})
	return c
}

func TestTheNextLeaderHasAHigherEpochAndTheDeposedLeadersWriteIsRefused(t *testing.T) {
	server := testserver.Start(t)
	a := run(t, server.Endpoint, "pod-a")
	var first [2]any
	select {
	case first = <-a.led:
	case <-time.After(10 * time.Second):
		t.Fatal("pod-a did not lead")
	}
	b := run(t, server.Endpoint, "pod-b")
	select {
	case <-b.led:
		t.Fatal("pod-b leads while pod-a holds the lock")
	case <-time.After(1500 * time.Millisecond):
	}
	// pod-a stops renewing (its process is gone, as after kill -9): its session expires.
	_ = a.client.Close()
	var second [2]any
	select {
	case second = <-b.led:
	case <-time.After(15 * time.Second):
		t.Fatal("pod-b did not lead after pod-a's session expired")
	}
	if second[0].(uint64) <= first[0].(uint64) {
		t.Fatalf("the next leader's epoch %d is not above %d", second[0], first[0])
	}
	keys, err := b.client.PublicKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	verifier := fence.NewVerifier(keys)
	newer, err := verifier.Verify(second[1].(string))
	if err != nil {
		t.Fatal(err)
	}
	older, err := verifier.Verify(first[1].(string))
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := fence.Check(nil, "controllers/demo", newer, fence.IntentWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Check(&accepted, "controllers/demo", older, fence.IntentWrite); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the deposed leader's write: %v", err)
	}
}
