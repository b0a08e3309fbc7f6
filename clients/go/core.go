package palisade

// What every call shares: endpoints, failures, retries, ids and checks. This mirrors the Rust
// client (crates/client) and the Python client (clients/python/src/palisade/_core.py) rule for
// rule, so a Go program behaves as they do against a cluster:
//
//   - Endpoints. Every attempt goes to the current endpoint. After a failure, afterFailure picks
//     the next: an UNAVAILABLE naming the leader (palisade-leader-addr) makes the leader current
//     if it is one of the configured endpoints, or, with TLS only, wherever it is (the member
//     that named it and the server it names both proved themselves with a certificate); any
//     other retryable failure, and a hint outside the list without TLS, moves to the next
//     configured endpoint, wrapping around; a refusal moves nothing. A failure seen on an
//     endpoint that is no longer current moves nothing (another call already moved).
//   - Retries. A failure that applied nothing is retried, at once after a leader hint (at most
//     retriesAtOnceMax in a row), else after a pause (50 ms doubling to 1 s, jittered), within a
//     time budget. An attempt whose outcome is unknown is retried only as the same request (one
//     request id, one open key), which the service deduplicates; if the budget ends after an
//     unknown outcome, the call is reported unknown, never failed.
//   - Ids. Request ids are 64 random bits, open keys 16 random bytes, from crypto/rand.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"example.invalid/palisade/clients/go/palisadev1"
)

// Limits shared with the service and the other clients.
const (
	// EndpointsMax is the most endpoints one client takes: a cluster has at most 9 members.
	EndpointsMax = 16
	// EndpointBytesMax is the longest endpoint text.
	EndpointBytesMax = 512
	// LockNameBytesMax is the longest lock name, in bytes of UTF-8.
	LockNameBytesMax = 256
	// ValueBytesMax is the longest value a grant carries, in bytes of UTF-8.
	ValueBytesMax = 1024
	// SessionTTLMin and SessionTTLMax bound the TTLs the service accepts.
	SessionTTLMin = time.Second
	SessionTTLMax = 24 * time.Hour
	// WaitMax is the longest wait the service accepts.
	WaitMax = 24 * time.Hour
	// MessageBytesMax is the largest gRPC message either side accepts.
	MessageBytesMax = 64 * 1024
	// SessionSecretBytes is the length of a session secret.
	SessionSecretBytes = 32
	// OpenKeyBytes is the length of an open key drawn by this client.
	OpenKeyBytes = 16
	// BearerTokenBytesMax is the longest bearer token.
	BearerTokenBytesMax = 256
	// AuthTokenEnv holds the bearer token when Config.BearerToken is empty. Not PALISADE_TOKEN:
	// that is the fencing token `palisade lock` gives its command.
	AuthTokenEnv = "PALISADE_AUTH_TOKEN"

	backoffInitial   = 50 * time.Millisecond
	backoffMax       = time.Second
	retriesAtOnceMax = 3
	listPagesMax     = 100_000
	leaderAddrHeader = "palisade-leader-addr"
)

// --- endpoints ------------------------------------------------------------------------------

// parseEndpoints checks the endpoints and returns them as host:port. http:// is accepted and
// dropped without TLS, refused with it; https:// is accepted and dropped with TLS, refused
// without (the Rust client's with_scheme).
func parseEndpoints(entries []string, withTLS bool) ([]string, error) {
	if len(entries) == 1 && strings.Contains(entries[0], ",") {
		entries = strings.Split(entries[0], ",")
	}
	if len(entries) == 0 {
		return nil, misconfigured(ErrInvalidEndpoint, "no endpoint given; expected e.g. 127.0.0.1:7457")
	}
	if len(entries) > EndpointsMax {
		return nil, misconfigured(ErrInvalidEndpoint, "%d endpoints given, at most %d are allowed", len(entries), EndpointsMax)
	}
	targets := make([]string, 0, len(entries))
	for i, entry := range entries {
		where := "endpoint"
		if len(entries) > 1 {
			where = fmt.Sprintf("endpoint %d of %d", i+1, len(entries))
		}
		text := strings.TrimSpace(entry)
		if text == "" {
			return nil, misconfigured(ErrInvalidEndpoint, "%s is empty", where)
		}
		if len(text) > EndpointBytesMax {
			return nil, misconfigured(ErrInvalidEndpoint, "%s is over %d bytes", where, EndpointBytesMax)
		}
		switch {
		case strings.HasPrefix(text, "https://"):
			if !withTLS {
				return nil, misconfigured(ErrInvalidEndpoint, "%s %q: https:// needs TLS settings (Config.TLS): the CA to check the server's certificate with", where, text)
			}
			text = strings.TrimRight(strings.TrimPrefix(text, "https://"), "/")
		case strings.HasPrefix(text, "http://"):
			if withTLS {
				return nil, misconfigured(ErrInvalidEndpoint, "%s %q: http:// asks for plaintext but TLS is configured; use https:// or leave the scheme out", where, text)
			}
			text = strings.TrimRight(strings.TrimPrefix(text, "http://"), "/")
		}
		target, ok := hostPort(text)
		if !ok {
			return nil, misconfigured(ErrInvalidEndpoint, "%s %q is not host:port (e.g. 127.0.0.1:7457)", where, entry)
		}
		targets = append(targets, target)
	}
	return targets, nil
}

// hostPort is text if it is host:port with a port in 1..=65535.
func hostPort(text string) (string, bool) {
	if text == "" || strings.ContainsAny(text, "/@,?#") || strings.IndexFunc(text, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}) >= 0 {
		return "", false
	}
	i := strings.LastIndexByte(text, ':')
	if i <= 0 {
		return "", false
	}
	host, portText := text[:i], text[i+1:]
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 || strings.Trim(portText, "0123456789") != "" {
		return "", false
	}
	if strings.HasPrefix(host, "[") != strings.HasSuffix(host, "]") {
		return "", false
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.FormatUint(port, 10)), true
}

// current is the endpoint in use, with a generation bumped at every switch.
type current struct {
	target     string
	stub       palisadev1.LocksClient
	generation uint64
	index      int
}

// failedEndpointPassedOverFor is how long an endpoint whose attempt failed is passed over while
// another has not failed since, as in the Rust client.
const failedEndpointPassedOverFor = 10 * time.Second

// endpoints are the endpoints a client was given, and the one it sends to now.
//
// After a failure that is not an answer about the request, the next attempt goes to the next
// configured endpoint in order, passing over those whose own attempt failed within
// failedEndpointPassedOverFor while one has not (so that members lost for good, still in the
// list, do not cost a connection timeout at every failover); when all have, to the one that
// failed longest ago.
type endpoints struct {
	configured []string
	withTLS    bool
	dial       func(target string) (*grpc.ClientConn, error)
	log        *slog.Logger
	// now is the clock failures are timed on: time.Now when nil.
	now func() time.Time

	mu       sync.Mutex
	conns    map[string]*grpc.ClientConn
	cur      current
	failedAt []time.Time // zero: never failed
}

// nextAfterFailure is the configured endpoint to try after the current one, whose attempt
// just failed. The current endpoint is marked failed if it is a configured one (a leader
// followed outside the list is not, and the member that named it answered). Called with e.mu
// held.
func (e *endpoints) nextAfterFailure() int {
	now := time.Now()
	if e.now != nil {
		now = e.now()
	}
	if e.failedAt == nil {
		e.failedAt = make([]time.Time, len(e.configured))
	}
	failed := e.cur.index
	if e.configured[failed] == e.cur.target {
		e.failedAt[failed] = now
	}
	count := len(e.configured)
	oldest := -1
	for step := 1; step <= count; step++ {
		i := (failed + step) % count
		at := e.failedAt[i]
		if at.IsZero() || now.Sub(at) >= failedEndpointPassedOverFor {
			return i
		}
		if oldest < 0 || at.Before(e.failedAt[oldest]) {
			oldest = i
		}
	}
	return oldest
}

func (e *endpoints) conn(target string) (*grpc.ClientConn, error) {
	if conn, ok := e.conns[target]; ok {
		return conn, nil
	}
	conn, err := e.dial(target)
	if err != nil {
		return nil, err
	}
	e.conns[target] = conn
	return conn, nil
}

func (e *endpoints) current() current {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

func (e *endpoints) afterFailure(used uint64, f *failure) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.cur
	if cur.generation != used {
		return // another call already moved on from that endpoint
	}
	var target string
	var index int
	switch f.kind {
	case failNotLeader:
		found := false
		for i, t := range e.configured {
			if t == f.leader && t != cur.target {
				target, index, found = t, i, true
			}
		}
		switch {
		case found:
		case f.leader == cur.target:
			// a member naming itself as the leader it is not is confused: try another
			index = e.nextAfterFailure()
			target = e.configured[index]
		case e.withTLS:
			// With TLS the hint came over an authenticated connection, and the new connection
			// sends the bearer token and session secrets only once its server has shown a
			// certificate from the CA.
			target, index = f.leader, cur.index
		default:
			e.log.Warn("not following the leader hint to an address outside the configured endpoints (without TLS nothing proves it is a member): give the client every member's address", "leader", f.leader)
			index = e.nextAfterFailure()
			target = e.configured[index]
		}
	case failNotApplied, failUnknown:
		index = e.nextAfterFailure()
		target = e.configured[index]
	default:
		return // an answer about the request itself: the member spoke for the cluster
	}
	if target == cur.target && index == cur.index {
		return // one endpoint: nowhere else to go
	}
	conn, err := e.conn(target)
	if err != nil {
		return
	}
	e.cur = current{target, palisadev1.NewLocksClient(conn), cur.generation + 1, index}
}

func (e *endpoints) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, conn := range e.conns {
		_ = conn.Close()
	}
}

// --- failures -------------------------------------------------------------------------------

type failKind int

const (
	failCore       failKind = iota // the lock table refused, with an ErrorDetail: nothing changed
	failNotApplied                 // retrying may succeed
	failNotLeader                  // not applied; leader is where to go
	failUnknown                    // may or may not have been applied
	failRejected                   // any other status: final
)

// failure is what a failed attempt means, before it is named for one operation.
type failure struct {
	kind    failKind
	message string
	code    codes.Code
	detail  *palisadev1.ErrorDetail
	leader  string
	cause   error
}

func (f *failure) final() bool { return f.kind == failCore || f.kind == failRejected }

// broken are markers of transport failures whose request may have been sent.
var broken = []string{
	"transport is closing", "connection reset", "broken pipe", "goaway", "keepalive",
	"ping timeout", "stream removed", "eof", "rst_stream", "connection closed",
}

// classify turns an attempt's error (and the trailer it came with) into a failure.
func classify(err error, trailer metadata.MD) *failure {
	if err == context.Canceled || err == context.DeadlineExceeded {
		return &failure{kind: failUnknown, message: err.Error(), code: status.FromContextError(err).Code(), cause: err}
	}
	st, ok := status.FromError(err)
	if !ok {
		return &failure{kind: failUnknown, message: err.Error(), code: codes.Unknown}
	}
	message := st.Message()
	if message == "" {
		message = st.Code().String()
	}
	for _, d := range st.Details() {
		if detail, ok := d.(*palisadev1.ErrorDetail); ok {
			return &failure{kind: failCore, message: message, code: st.Code(), detail: detail}
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		if values := trailer.Get(leaderAddrHeader); len(values) > 0 {
			if leader, ok := hostPort(strings.TrimPrefix(strings.TrimSpace(values[0]), "http://")); ok {
				return &failure{kind: failNotLeader, message: message + " (the leader is at " + leader + ")", code: st.Code(), leader: leader}
			}
		}
		lowered := strings.ToLower(message)
		if strings.Contains(lowered, "while dialing") || strings.Contains(lowered, "connection refused") {
			return &failure{kind: failNotApplied, message: message, code: st.Code()}
		}
		for _, marker := range broken {
			if strings.Contains(lowered, marker) {
				return &failure{kind: failUnknown, message: message, code: st.Code()}
			}
		}
		return &failure{kind: failNotApplied, message: message, code: st.Code()}
	case codes.ResourceExhausted:
		return &failure{kind: failNotApplied, message: message, code: st.Code()}
	case codes.Unknown, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return &failure{kind: failUnknown, message: message, code: st.Code()}
	}
	return &failure{kind: failRejected, message: message, code: st.Code()}
}

// asError names the failure for one operation (what, e.g. "acquire of lock \"a\"").
func (f *failure) asError(what string) *Error {
	e := &Error{Code: f.code, cause: f.cause}
	switch f.kind {
	case failCore:
		e.Detail = f.detail
		if k, ok := kinds[f.detail.GetKind()]; ok {
			e.Class, e.Kind = k.class, k.kind
		} else {
			e.Class, e.Kind = ofCode(f.code)
		}
		e.Message = what + ": " + f.message
	case failNotApplied, failNotLeader:
		e.Class = ErrUnavailable
		e.Message = fmt.Sprintf("the lock service is unavailable, %s was not applied (%s); retry later", what, f.message)
	case failUnknown:
		e.Class = ErrOutcomeUnknown
		e.Message = fmt.Sprintf("%s has an unknown outcome (%s); it may have taken effect", what, f.message)
	default:
		e.Class, e.Kind = ofCode(f.code)
		if e.Class == ErrUnavailable || e.Class == ErrOutcomeUnknown {
			e.Class = ErrRefused
		}
		e.Message = fmt.Sprintf("%s was refused (%s): %s", what, f.code, f.message)
	}
	return e
}

// --- retries --------------------------------------------------------------------------------

// backoff is exponential backoff with jitter within a time budget, and a few attempts at once.
type backoff struct {
	budget     time.Duration
	next       time.Duration
	giveUpAt   time.Time
	atOnceLeft int
}

func newBackoff(budget time.Duration) *backoff {
	b := &backoff{budget: budget}
	b.reset()
	return b
}

func (b *backoff) reset() {
	b.next = backoffInitial
	b.giveUpAt = time.Now().Add(b.budget)
	b.atOnceLeft = retriesAtOnceMax
}

func (b *backoff) atOnce() bool {
	if b.atOnceLeft == 0 || !time.Now().Before(b.giveUpAt) {
		return false
	}
	b.atOnceLeft--
	return true
}

// nextDelay is the pause before the next attempt, or false when the budget is spent.
func (b *backoff) nextDelay() (time.Duration, bool) {
	left := time.Until(b.giveUpAt)
	if left <= 0 {
		return 0, false
	}
	delay := min(time.Duration(float64(b.next)*(0.5+mathrand.Float64()/2)), left)
	b.next = min(b.next*2, backoffMax)
	b.atOnceLeft = retriesAtOnceMax
	return delay, true
}

// call runs attempt at the current endpoint, retried within budget as the package doc says.
// attempt gets the stub and a call option that collects the trailer.
func call[T any](ctx context.Context, c *Client, what string, budget time.Duration,
	attempt func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (T, error)) (T, uint64, error) {
	b := newBackoff(budget)
	var earlierUnknown *failure
	for {
		cur := c.endpoints.current()
		var trailer metadata.MD
		result, err := attempt(ctx, cur.stub, grpc.Trailer(&trailer))
		if err == nil {
			return result, cur.generation, nil
		}
		var zero T
		f := classify(err, trailer)
		if ctx.Err() != nil {
			// The caller's context ended the call: whatever was in flight may have been applied.
			if earlierUnknown == nil && f.kind != failUnknown {
				f.kind = failNotApplied
			} else {
				f.kind = failUnknown
			}
			f.cause = ctx.Err()
			f.message = ctx.Err().Error()
			return zero, 0, f.asError(what)
		}
		c.endpoints.afterFailure(cur.generation, f)
		if f.final() {
			return zero, 0, f.asError(what)
		}
		if f.kind == failNotLeader && b.atOnce() {
			continue
		}
		delay, ok := b.nextDelay()
		if !ok {
			if earlierUnknown != nil && (f.kind == failNotApplied || f.kind == failNotLeader) {
				f = &failure{kind: failUnknown, message: earlierUnknown.message + "; then " + f.message, code: f.code}
			}
			return zero, 0, f.asError(what)
		}
		if f.kind == failUnknown {
			earlierUnknown = f
		}
		select {
		case <-ctx.Done():
			kind := failNotApplied
			if earlierUnknown != nil {
				kind = failUnknown
			}
			return zero, 0, (&failure{kind: kind, message: f.message + "; then " + ctx.Err().Error(), code: f.code, cause: ctx.Err()}).asError(what)
		case <-time.After(delay):
		}
	}
}

// --- ids and checks -------------------------------------------------------------------------

// requestID is a fresh 64-bit request id for an acquire or a release.
func requestID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics on an unusable source)
	return binary.LittleEndian.Uint64(b[:])
}

// openKey is a fresh open key: compared with every client's keys, so from crypto/rand only.
func openKey() []byte {
	for {
		key := make([]byte, OpenKeyBytes)
		_, _ = rand.Read(key)
		if !bytes.Equal(key, bytes.Repeat(key[:1], OpenKeyBytes)) { // the service refuses one repeated byte
			return key
		}
	}
}

func validateLockName(lock string) error {
	shown := lock
	if len(shown) > 64 {
		shown = shown[:64] + "…"
	}
	switch {
	case lock == "":
		return invalidArgument("invalid lock name '': lock name is empty")
	case len(lock) > LockNameBytesMax:
		return invalidArgument("invalid lock name %q: lock name is %d bytes, the limit is %d", shown, len(lock), LockNameBytesMax)
	case !utf8.ValidString(lock):
		return invalidArgument("invalid lock name %q: lock name is not UTF-8", shown)
	case strings.IndexFunc(lock, unicode.IsControl) >= 0:
		return invalidArgument("invalid lock name %q: lock name contains a control character", shown)
	}
	return nil
}

// validateValue checks a grant's value ("" is none).
func validateValue(value string) error {
	switch {
	case value == "":
		return nil
	case !utf8.ValidString(value):
		return invalidArgument("invalid value: value is not valid UTF-8")
	case len(value) > ValueBytesMax:
		return invalidArgument("invalid value: value is %d bytes, the limit is %d", len(value), ValueBytesMax)
	case strings.IndexFunc(value, unicode.IsControl) >= 0:
		return invalidArgument("invalid value: value contains a control character (encode binary values, in base64 say)")
	}
	return nil
}
