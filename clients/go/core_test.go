// Unit tests of the endpoint rules (core.go), without a server: where the next attempt goes
// after each kind of failure, as the Rust client's tests of Endpoints::after_failure check.
package palisade

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func testEndpoints(t *testing.T, withTLS bool, targets ...string) *endpoints {
	t.Helper()
	e := &endpoints{
		configured: targets, withTLS: withTLS, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		conns: map[string]*grpc.ClientConn{},
		dial: func(target string) (*grpc.ClientConn, error) {
			return grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		},
	}
	t.Cleanup(e.close)
	if _, err := e.conn(targets[0]); err != nil {
		t.Fatal(err)
	}
	e.cur = current{targets[0], nil, 0, 0}
	return e
}

func TestALeaderHintIsFollowedInsideTheListAndOutsideItOnlyWithTLS(t *testing.T) {
	e := testEndpoints(t, false, "10.0.0.1:7457", "10.0.0.2:7457", "10.0.0.3:7457")
	e.afterFailure(0, &failure{kind: failNotLeader, leader: "10.0.0.3:7457"})
	if got := e.current(); got.target != "10.0.0.3:7457" || got.generation != 1 {
		t.Fatalf("a hint inside the list: %+v", got)
	}
	e.afterFailure(0, &failure{kind: failNotApplied})
	if got := e.current(); got.target != "10.0.0.3:7457" {
		t.Fatalf("a failure seen on an endpoint no longer current moved: %+v", got)
	}
	e.afterFailure(1, &failure{kind: failNotLeader, leader: "10.9.9.9:7457"})
	if got := e.current(); got.target != "10.0.0.1:7457" {
		t.Fatalf("without TLS a hint outside the list is not followed, the next endpoint is: %+v", got)
	}
	e.afterFailure(2, &failure{kind: failCore})
	if got := e.current(); got.target != "10.0.0.1:7457" || got.generation != 2 {
		t.Fatalf("a refusal moved: %+v", got)
	}
	e.afterFailure(2, &failure{kind: failUnknown})
	if got := e.current(); got.target != "10.0.0.2:7457" {
		t.Fatalf("an unknown outcome moves to the next endpoint: %+v", got)
	}

	secure := testEndpoints(t, true, "10.0.0.1:7457")
	secure.afterFailure(0, &failure{kind: failNotLeader, leader: "10.9.9.9:7457"})
	if got := secure.current(); got.target != "10.9.9.9:7457" {
		t.Fatalf("with TLS a hint outside the list is followed: %+v", got)
	}
}

// stepper reports a failure of the attempt at generation used to e, and checks that the next
// attempt goes to want.
func stepper(t *testing.T, e *endpoints) func(used uint64, f *failure, want string) {
	return func(used uint64, f *failure, want string) {
		t.Helper()
		e.afterFailure(used, f)
		if got := e.current(); got.target != want || got.generation != used+1 {
			t.Fatalf("after %+v: %+v, want %s", f, got, want)
		}
	}
}

// The same steps as the Rust client's a_member_that_just_failed_is_passed_over_for_a_while.
func TestAnEndpointThatJustFailedIsPassedOverForAWhile(t *testing.T) {
	e := testEndpoints(t, false, "10.0.0.1:7457", "10.0.0.2:7457", "10.0.0.3:7457")
	now := time.Unix(1000, 0)
	e.now = func() time.Time { return now }
	step := stepper(t, e)
	step(0, &failure{kind: failUnknown}, "10.0.0.2:7457")
	step(1, &failure{kind: failNotLeader, leader: "10.0.0.3:7457"}, "10.0.0.3:7457")
	now = now.Add(2 * time.Second)
	// The leader fails: the next in order is the first, which failed a moment ago.
	step(2, &failure{kind: failNotApplied}, "10.0.0.2:7457")
	// All three have failed within the period: the one that failed longest ago.
	step(3, &failure{kind: failNotApplied}, "10.0.0.1:7457")
	// Once the period is over, a failed endpoint is next in order again.
	now = now.Add(failedEndpointPassedOverFor)
	step(4, &failure{kind: failUnknown}, "10.0.0.2:7457")
}

// The same steps as the Rust client's
// a_leader_outside_the_list_that_fails_does_not_mark_the_member_that_named_it.
func TestALeaderOutsideTheListThatFailsDoesNotMarkTheMemberThatNamedIt(t *testing.T) {
	e := testEndpoints(t, true, "10.0.0.3:7457", "10.0.0.1:7457", "10.0.0.2:7457")
	e.cur = current{"10.0.0.2:7457", nil, 0, 2}
	now := time.Unix(1000, 0)
	e.now = func() time.Time { return now }
	step := stepper(t, e)
	step(0, &failure{kind: failUnknown}, "10.0.0.3:7457")
	now = now.Add(time.Second)
	step(1, &failure{kind: failNotLeader, leader: "10.0.0.9:7457"}, "10.0.0.9:7457")
	// That leader fails: on to the next, and the member that named it is not marked failed.
	step(2, &failure{kind: failUnknown}, "10.0.0.1:7457")
	// The next fails: the member that named the leader has not failed, the third has.
	step(3, &failure{kind: failNotApplied}, "10.0.0.3:7457")
}

func TestEndpointsAreParsedAsTheRustClientParsesThem(t *testing.T) {
	got, err := parseEndpoints([]string{" 10.0.0.1:7457, http://10.0.0.2:7457/ ,[::1]:80"}, false)
	if err != nil || len(got) != 3 || got[1] != "10.0.0.2:7457" || got[2] != "[::1]:80" {
		t.Fatalf("%q %v", got, err)
	}
	if got, err := parseEndpoints([]string{"https://c:443", "d:1"}, true); err != nil || got[0] != "c:443" {
		t.Fatalf("with TLS: %q %v", got, err)
	}
	for _, bad := range []string{"c:65536", "c:+1", "[::1:80", "user@c:1", "c:1/x"} {
		if _, err := parseEndpoints([]string{bad}, false); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
