// Tests of the client against a real `palisade serve` (internal/testserver): what a user of the
// package observes through its API.
package palisade_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/internal/testserver"
	"example.invalid/palisade/clients/go/sequencer"
)

func connect(t *testing.T, endpoint string) *palisade.Client {
	t.Helper()
	c, err := palisade.New(context.Background(), palisade.Config{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func session(t *testing.T, c *palisade.Client, opts ...palisade.SessionOption) *palisade.Session {
	t.Helper()
	s, err := c.NewSession(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func TestALockIsHeldWithATokenAndAVerifiableSequencerUntilUnlocked(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(5*time.Second))
	m := s.Mutex("jobs/nightly", palisade.WithValue("worker-1"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() == 0 {
		t.Fatal("a held lock has token 0")
	}
	keys, err := c.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	verified, err := sequencer.Verify(m.Sequencer(), keys)
	if err != nil {
		t.Fatalf("the grant's sequencer does not verify: %v", err)
	}
	if verified.Lock() != "jobs/nightly" || verified.Token() != m.Token() || verified.Session() != s.ID() {
		t.Fatalf("sequencer %s names lock %q token %d session %d", m.Sequencer(), verified.Lock(), verified.Token(), verified.Session())
	}
	status, err := c.Status(ctx, "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	if status.Holder == nil || status.Holder.Session != s.ID() || status.Holder.Token != m.Token() || status.Holder.Value != "worker-1" {
		t.Fatalf("status while held: %+v", status.Holder)
	}
	if err := m.Proclaim(ctx, "worker-1b"); err != nil {
		t.Fatal(err)
	}
	if status, _ = c.Status(ctx, "jobs/nightly"); status.Holder.Value != "worker-1b" {
		t.Fatalf("value after proclaim: %q", status.Holder.Value)
	}
	first := m.Token()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if status, _ = c.Status(ctx, "jobs/nightly"); status.Holder != nil {
		t.Fatalf("still held after unlock: %+v", status.Holder)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() <= first {
		t.Fatalf("the next grant's token %d is not above %d", m.Token(), first)
	}
	locks, err := c.ListLocks(ctx, "jobs/")
	if err != nil || len(locks) != 1 || locks[0].Lock != "jobs/nightly" {
		t.Fatalf("ListLocks: %+v, %v", locks, err)
	}
}

func TestTryLockOfAHeldLockIsErrBusyNamingTheHolder(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	holder := session(t, c).Mutex("a")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	err := session(t, c).Mutex("a").TryLock(ctx)
	if !errors.Is(err, palisade.ErrBusy) || !errors.Is(err, palisade.ErrNotAcquired) || errors.Is(err, palisade.ErrRefused) {
		t.Fatalf("TryLock of a held lock: %v", err)
	}
	var perr *palisade.Error
	if !errors.As(err, &perr) || perr.ErrorKind() != "busy" || perr.Detail.GetHolderToken() != holder.Token() || !perr.Retryable() {
		t.Fatalf("the error does not carry the detail: %#v", err)
	}
}

func TestAWaitEndedByTheContextsDeadlineIsWaitEndedAndWithdrawn(t *testing.T) {
	server := testserver.Start(t)
	c := connect(t, server.Endpoint)
	if err := session(t, c).Mutex("b").Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	err := session(t, c).Mutex("b").Lock(ctx)
	if !errors.Is(err, palisade.ErrWaitEnded) {
		t.Fatalf("a wait past the deadline: %v", err)
	}
	status, err := c.Status(context.Background(), "b")
	if err != nil || len(status.Waiters) != 0 {
		t.Fatalf("waiters after the wait ended: %+v, %v", status.Waiters, err)
	}
}

func TestACancelledWaitIsWithdrawnAndTheNextWaiterIsServed(t *testing.T) {
	server := testserver.Start(t)
	c := connect(t, server.Endpoint)
	holder := session(t, c).Mutex("c")
	if err := holder.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- session(t, c).Mutex("c").Lock(ctx) }()
	waitFor(t, func() bool {
		status, err := c.Status(context.Background(), "c")
		return err == nil && len(status.Waiters) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Lock: %v", err)
	}
	waitFor(t, func() bool {
		status, err := c.Status(context.Background(), "c")
		return err == nil && len(status.Waiters) == 0
	})
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if status, _ := c.Status(context.Background(), "c"); status.Holder != nil {
		t.Fatalf("the withdrawn waiter was granted the lock: %+v", status.Holder)
	}
}

func TestTheKeepaliveHoldsAShortLeaseForManyTTLs(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(time.Second))
	m := s.Mutex("d")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
		t.Fatalf("the session ended: %v", s.Err())
	case <-time.After(3500 * time.Millisecond):
	}
	status, err := c.Status(ctx, "d")
	if err != nil || status.Holder == nil || status.Holder.Token != m.Token() {
		t.Fatalf("after 3.5 TTLs: %+v, %v", status.Holder, err)
	}
	if left, ok := s.LeaseRemaining(); !ok || left <= 0 {
		t.Fatalf("lease remaining %v, %v", left, ok)
	}
}

func TestASessionClosedElsewhereEndsWithNotFoundAndItsLockIsLost(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(3*time.Second))
	m := s.Mutex("e")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	workCtx, stop := s.Context(ctx)
	defer stop()
	if err := connect(t, server.Endpoint).CloseSession(ctx, s.Credential()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end")
	}
	var lost *palisade.SessionLostError
	if !errors.As(s.Err(), &lost) || lost.Reason != palisade.LostNotFound || !errors.Is(s.Err(), palisade.ErrSessionLost) {
		t.Fatalf("Err: %v", s.Err())
	}
	<-workCtx.Done()
	if !errors.Is(context.Cause(workCtx), palisade.ErrSessionLost) {
		t.Fatalf("the session's context ended with %v", context.Cause(workCtx))
	}
	if m.Token() != 0 || m.Sequencer() != "" {
		t.Fatal("a lost lock still shows its grant")
	}
	if err := m.Unlock(ctx); !errors.Is(err, palisade.ErrSessionLost) {
		t.Fatalf("Unlock of a lost lock: %v", err)
	}
	if err := s.Close(ctx); !errors.Is(err, palisade.ErrSessionNotFound) {
		t.Fatalf("Close of a session closed elsewhere: %v", err)
	}
}

func TestAWrongSecretIsUnauthenticated(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	s := session(t, c)
	forged := s.Credential()
	forged.Secret = make([]byte, palisade.SessionSecretBytes)
	_, err := c.Acquire(ctx, forged, "f", palisade.AcquireOptions{TryOnly: true})
	var perr *palisade.Error
	if !errors.Is(err, palisade.ErrUnauthenticated) || !errors.As(err, &perr) || perr.ErrorKind() != "session_secret_wrong" {
		t.Fatalf("acquire with a wrong secret: %v", err)
	}
	parsed, err := palisade.ParseSessionCredential(s.Credential().String())
	if err != nil || parsed.ID != s.ID() || string(parsed.Secret) != string(s.Credential().Secret) {
		t.Fatalf("the credential's text does not round-trip: %v", err)
	}
}

func TestOneShotCallsKeepASessionOnlyAsLongAsItIsRenewed(t *testing.T) {
	server := testserver.Start(t)
	ctx := context.Background()
	c := connect(t, server.Endpoint)
	cred, ttl, err := c.OpenSessionWithoutKeepAlive(ctx, time.Second)
	if err != nil || ttl != time.Second {
		t.Fatal(ttl, err)
	}
	grant, err := c.Acquire(ctx, cred, "g", palisade.AcquireOptions{Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if remaining, err := c.Renew(ctx, cred); err != nil || remaining <= 0 {
		t.Fatal(remaining, err)
	}
	token, held, err := c.Release(ctx, cred, "g")
	if err != nil || !held || token != grant.Token {
		t.Fatalf("release: %d %v %v", token, held, err)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := c.Renew(ctx, cred); !errors.Is(err, palisade.ErrSessionNotFound) {
		t.Fatalf("renewal of an expired session: %v", err)
	}
}

func TestInvalidInputIsRefusedBeforeAnythingIsSent(t *testing.T) {
	for _, endpoints := range [][]string{nil, {""}, {"localhost"}, {"https://h:1"}, {"h:0"}, {"a b:1"}} {
		_, err := palisade.New(context.Background(), palisade.Config{Endpoints: endpoints})
		if !errors.Is(err, palisade.ErrInvalidEndpoint) || !errors.Is(err, palisade.ErrMisconfigured) {
			t.Errorf("endpoints %q: %v", endpoints, err)
		}
	}
	_, err := palisade.New(context.Background(), palisade.Config{Endpoints: []string{"http://h:1"}, TLS: &tls.Config{}})
	if !errors.Is(err, palisade.ErrInvalidEndpoint) {
		t.Errorf("http:// with TLS: %v", err)
	}
	_, err = palisade.New(context.Background(), palisade.Config{Endpoints: []string{"127.0.0.1:1"}, ConnectTimeout: 200 * time.Millisecond})
	if !errors.Is(err, palisade.ErrUnreachable) || !errors.Is(err, palisade.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("nothing listening (with gRPC's reason): %v", err)
	}
	t.Setenv(palisade.AuthTokenEnv, "has space")
	if _, err = palisade.New(context.Background(), palisade.Config{Endpoints: []string{"127.0.0.1:1"}}); !errors.Is(err, palisade.ErrMisconfigured) {
		t.Errorf("an invalid $%s: %v", palisade.AuthTokenEnv, err)
	}
}

func TestBearerTokensAuthenticateAndThePolicyIsEnforced(t *testing.T) {
	bin := testserver.Binary(t)
	_ = bin
	dir := t.TempDir()
	tokens := map[string]string{}
	lines := []string{"# NAME SHA256HEX"}
	for _, name := range []string{"alice", "bob"} {
		out := strings.Split(testserver.Run(t, "token", "new", name), "\n")
		tokens[name] = out[0]
		lines = append(lines, out[1])
	}
	write(t, filepath.Join(dir, "tokens"), strings.Join(lines, "\n")+"\n")
	write(t, filepath.Join(dir, "policy"), "grant alice lock,read jobs/\ngrant bob read jobs/\n")
	server := testserver.Start(t, "--tokens", filepath.Join(dir, "tokens"), "--policy", filepath.Join(dir, "policy"))
	ctx := context.Background()

	anonymous := connect(t, server.Endpoint)
	_, err := anonymous.Status(ctx, "jobs/x")
	var perr *palisade.Error
	if !errors.Is(err, palisade.ErrUnauthenticated) || !errors.As(err, &perr) || perr.Detail.GetReason() != "credential_missing" {
		t.Fatalf("without a token: %v", err)
	}

	t.Setenv(palisade.AuthTokenEnv, tokens["alice"]+"\n") // a file's final newline
	alice := connect(t, server.Endpoint)
	if err := session(t, alice).Mutex("jobs/x").Lock(ctx); err != nil {
		t.Fatalf("alice, by the environment variable: %v", err)
	}
	bob, err := palisade.New(ctx, palisade.Config{Endpoints: []string{server.Endpoint}, BearerToken: tokens["bob"]})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	_, err = bob.NewSession(ctx)
	if err == nil {
		if _, err = bob.Status(ctx, "jobs/x"); err != nil {
			t.Fatalf("bob reads: %v", err)
		}
		s, _ := bob.NewSession(ctx)
		err = s.Mutex("jobs/x").TryLock(ctx)
	}
	if !errors.Is(err, palisade.ErrPermissionDenied) || !errors.As(err, &perr) || perr.Detail.GetRight() != "lock" {
		t.Fatalf("bob locks: %v", err)
	}
	if strings.Contains(err.Error(), tokens["bob"]) {
		t.Fatal("an error shows the bearer token")
	}
}

func TestTLSWithTheClusterCA(t *testing.T) {
	dir := t.TempDir()
	testserver.Run(t, "tls", "init", dir)
	server := testserver.Start(t, "--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server.key"))
	pem, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	ctx := context.Background()
	var c *palisade.Client
	waitFor(t, func() bool {
		c, err = palisade.New(ctx, palisade.Config{Endpoints: []string{"https://" + server.Endpoint}, TLS: &tls.Config{RootCAs: roots}, ConnectTimeout: time.Second})
		return err == nil
	})
	defer c.Close()
	s := session(t, c)
	if err := s.Mutex("tls").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// Another CA: the handshake fails, and the error says so as gRPC reports it.
	other := t.TempDir()
	testserver.Run(t, "tls", "init", other)
	otherPEM, err := os.ReadFile(filepath.Join(other, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(otherPEM)
	_, err = palisade.New(ctx, palisade.Config{Endpoints: []string{server.Endpoint}, TLS: &tls.Config{RootCAs: otherRoots}, ConnectTimeout: 500 * time.Millisecond})
	if !errors.Is(err, palisade.ErrUnreachable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a server whose certificate is from another CA: %v", err)
	}
	// Without TLS settings, the same server is not reached in plaintext.
	plain, err := palisade.New(ctx, palisade.Config{Endpoints: []string{server.Endpoint}, ConnectTimeout: 500 * time.Millisecond, RetryBudget: 500 * time.Millisecond})
	if err == nil {
		_, err = plain.Status(ctx, "tls")
		_ = plain.Close()
	}
	if err == nil {
		t.Fatal("a plaintext client was answered by a TLS server")
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestASessionWhoseServerDiesIsLostOnceItsLeaseCannotBeProven(t *testing.T) {
	server := testserver.Start(t)
	c := connect(t, server.Endpoint)
	s := session(t, c, palisade.WithTTL(time.Second))
	server.Kill()
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived its server by 5 s")
	}
	var lost *palisade.SessionLostError
	if !errors.As(s.Err(), &lost) || lost.Reason != palisade.LostLeaseUnproven {
		t.Fatalf("Err: %v", s.Err())
	}
	if _, ok := s.LeaseRemaining(); ok {
		t.Fatal("a lost session still reports a lease")
	}
}
