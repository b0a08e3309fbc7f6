// Package palisade is the Go client of the Palisade lock service: sessions kept alive in the
// background, FIFO locks with fencing tokens and signed sequencers, leader election, and the
// one-shot calls of the API.
//
//	client, err := palisade.New(ctx, palisade.Config{Endpoints: []string{"127.0.0.1:7457"}})
//	session, err := client.NewSession(ctx, palisade.WithTTL(10*time.Second))
//	defer session.Close(ctx)
//	mutex := session.Mutex("jobs/nightly")
//	if err := mutex.Lock(ctx); err != nil { ... }
//	defer mutex.Unlock(ctx)
//	// present mutex.Sequencer() to every resource written; stop when <-session.Done()
//
// Calls follow the leader of a cluster and retry what can be retried, with the same rules as the
// Rust and Python clients (see core.go). Errors are *Error values that errors.Is matches
// against a class (ErrRefused, ErrNotAcquired, ErrUnavailable, ErrOutcomeUnknown, ...) and, for
// a refusal of the lock table, a kind (ErrBusy, ErrSessionNotFound, ...); errors.As gives the
// service's ErrorDetail.
//
// Holding a lock is still advisory (a paused process learns of the loss late); what makes it
// safe is that resources check the grant's sequencer (package sequencer, and package fence).
package palisade

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"example.invalid/palisade/clients/go/palisadev1"
	"example.invalid/palisade/clients/go/sequencer"
)

// Config is how a client connects.
type Config struct {
	// Endpoints are host:port of one server or of the members of a cluster (at most 16; one
	// entry may also be a comma-separated list). With TLS, an entry may start with https://;
	// without, with http://.
	Endpoints []string
	// BearerToken is sent as "authorization: Bearer <token>" with every call, for a service
	// with a token file. Empty: $PALISADE_AUTH_TOKEN if set (an invalid one is refused), else
	// none.
	BearerToken string
	// TLS to every endpoint (plaintext when nil): RootCAs to check the servers' certificates
	// and, for mutual TLS, Certificates. With TLS, a leader hint naming a member outside
	// Endpoints is followed (the member that named it proved itself); without, it is not.
	TLS *tls.Config
	// ConnectTimeout bounds the first connection (default 5 s).
	ConnectTimeout time.Duration
	// RequestTimeout bounds one attempt of a call (default 10 s; an acquire adds its wait).
	RequestTimeout time.Duration
	// RetryBudget bounds the time spent retrying a call that failed transiently (default 10 s).
	RetryBudget time.Duration
	// Logger gets the client's warnings and debug lines (default: none).
	Logger *slog.Logger
}

// Client is a connection to the lock service; safe for concurrent use.
type Client struct {
	cfg       Config
	endpoints *endpoints
	closed    chan struct{}
}

// bearer adds the token to every call, unary and streaming (the Rust client's Bearer).
type bearer struct{ header string }

func (b bearer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", b.header), method, req, reply, cc, opts...)
}

func (b bearer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(metadata.AppendToOutgoingContext(ctx, "authorization", b.header), desc, cc, method, opts...)
}

// checkBearerToken is the token if it is 1 to 256 printable ASCII characters without spaces,
// after surrounding white space (a file's final newline) is dropped.
func checkBearerToken(token string) (string, error) {
	token = strings.TrimSpace(token)
	if token == "" || len(token) > BearerTokenBytesMax {
		return "", misconfigured(nil, "a bearer token is 1 to %d characters, not %d", BearerTokenBytesMax, len(token))
	}
	for i := 0; i < len(token); i++ {
		if token[i] < 0x21 || token[i] > 0x7e {
			return "", misconfigured(nil, "a bearer token is printable ASCII without spaces")
		}
	}
	return token, nil
}

// New connects to the first endpoint that accepts a connection within ConnectTimeout (or ctx),
// keeping lazily connected channels to the others.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.RetryBudget == 0 {
		cfg.RetryBudget = 10 * time.Second
	}
	for name, d := range map[string]time.Duration{"ConnectTimeout": cfg.ConnectTimeout, "RequestTimeout": cfg.RequestTimeout, "RetryBudget": cfg.RetryBudget} {
		if d < 0 || d > time.Hour {
			return nil, misconfigured(nil, "%s is in (0, 1h], not %v", name, d)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	targets, err := parseEndpoints(cfg.Endpoints, cfg.TLS != nil)
	if err != nil {
		return nil, err
	}
	token := cfg.BearerToken
	if token == "" {
		if env, ok := os.LookupEnv(AuthTokenEnv); ok {
			if token, err = checkBearerToken(env); err != nil {
				return nil, misconfigured(nil, "$%s: %s", AuthTokenEnv, err)
			}
		}
	} else if token, err = checkBearerToken(token); err != nil {
		return nil, err
	}
	transport := insecure.NewCredentials()
	if cfg.TLS != nil {
		transport = credentials.NewTLS(cfg.TLS)
	}
	options := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		// grpc-go pings no more often than every 10 s; a member that freezes with its sockets
		// open is found sooner by the session keepalive's stuck-stream rule.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MessageBytesMax), grpc.MaxCallSendMsgSize(MessageBytesMax)),
		grpc.WithDisableRetry(),
	}
	if token != "" {
		b := bearer{"Bearer " + token}
		options = append(options, grpc.WithChainUnaryInterceptor(b.unary), grpc.WithChainStreamInterceptor(b.stream))
	}
	e := &endpoints{
		configured: targets,
		withTLS:    cfg.TLS != nil,
		log:        cfg.Logger,
		conns:      map[string]*grpc.ClientConn{},
		dial: func(target string) (*grpc.ClientConn, error) {
			return grpc.NewClient("passthrough:///"+target, options...)
		},
	}
	var failures []string
	first := -1
	for i, target := range targets {
		conn, err := e.conn(target)
		if err != nil {
			e.close()
			return nil, misconfigured(ErrInvalidEndpoint, "endpoint %s: %v", target, err)
		}
		if ready(ctx, conn, cfg.ConnectTimeout) {
			first = i
			break
		}
		why, answered := whyUnreachable(ctx, conn)
		if answered {
			first = i
			break
		}
		failures = append(failures, fmt.Sprintf("%s: no connection within %v (%s)", target, cfg.ConnectTimeout, why))
		if ctx.Err() != nil {
			break
		}
	}
	if first < 0 {
		e.close()
		return nil, &Error{Class: ErrUnavailable, Kind: ErrUnreachable, cause: ctx.Err(), Message: fmt.Sprintf(
			"cannot connect to the lock service at %s: %s; is `palisade serve` running there?",
			strings.Join(targets, ","), strings.Join(failures, "; "))}
	}
	conn, _ := e.conn(targets[first])
	e.cur = current{targets[first], palisadev1.NewLocksClient(conn), 0, first}
	return &Client{cfg: cfg, endpoints: e, closed: make(chan struct{})}, nil
}

// whyUnreachableTimeout bounds the call that asks gRPC why a first connection failed.
const whyUnreachableTimeout = 500 * time.Millisecond

// whyUnreachable is gRPC's reason why conn has no connection (connection refused, a failed TLS
// handshake, ...), from one short call made on it after ready gave up; answered is true if the
// server answered that call after all (any status other than Unavailable or DeadlineExceeded),
// so that conn is connected.
func whyUnreachable(ctx context.Context, conn *grpc.ClientConn) (why string, answered bool) {
	if err := ctx.Err(); err != nil {
		return err.Error(), false
	}
	ctx, cancel := context.WithTimeout(ctx, whyUnreachableTimeout)
	defer cancel()
	_, err := palisadev1.NewLocksClient(conn).PublicKey(ctx, &palisadev1.PublicKeyRequest{})
	st := status.Convert(err)
	switch {
	case err == nil:
		return "", true
	case st.Code() != codes.Unavailable && st.Code() != codes.DeadlineExceeded && st.Code() != codes.Canceled:
		return "", true // an answer: the server is there
	}
	why = strings.TrimPrefix(st.Message(), "connection error: desc = ")
	if len(why) > errorDetailShownMax {
		why = why[:errorDetailShownMax]
	}
	return why, false
}

// errorDetailShownMax is the longest part of a gRPC error's message a message quotes.
const errorDetailShownMax = 300

// ready waits for conn to connect, up to timeout.
func ready(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return true
		}
		if !conn.WaitForStateChange(ctx, state) {
			return false
		}
	}
}

// Endpoint is where calls go now: the leader, as far as this client knows.
func (c *Client) Endpoint() string { return c.endpoints.current().target }

// Close closes every connection. Sessions of this client stop being renewed.
func (c *Client) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	c.endpoints.close()
	return nil
}

// SessionCredential is a session's id and secret: what every call for the session presents.
// Its text form <id>.<64 hex digits> is what `palisade acquire` prints as PALISADE_SESSION.
// Treat it as a password.
type SessionCredential struct {
	ID     uint64
	Secret []byte
}

// String is the text form <id>.<secret in hex>.
func (c SessionCredential) String() string { return fmt.Sprintf("%d.%x", c.ID, c.Secret) }

// ParseSessionCredential parses <id>.<64 lowercase hex digits>.
func ParseSessionCredential(text string) (SessionCredential, error) {
	id, digits, ok := strings.Cut(strings.TrimSpace(text), ".")
	invalid := invalidArgument("not a session credential: expected <id>.<64 lowercase hex digits>")
	if !ok {
		return SessionCredential{}, invalid
	}
	var cred SessionCredential
	if id == "" || len(id) > 20 || strings.Trim(id, "0123456789") != "" || (len(id) > 1 && id[0] == '0') {
		return SessionCredential{}, invalid
	}
	if _, err := fmt.Sscan(id, &cred.ID); err != nil {
		return SessionCredential{}, invalid
	}
	if len(digits) != 2*SessionSecretBytes || strings.Trim(digits, "0123456789abcdef") != "" {
		return SessionCredential{}, invalid
	}
	cred.Secret = make([]byte, SessionSecretBytes)
	if _, err := fmt.Sscanf(digits, "%x", &cred.Secret); err != nil {
		return SessionCredential{}, invalid
	}
	return cred, nil
}

// openSession opens a session of ttl; returns its credential, granted TTL and when the first
// attempt was sent (the lease is proven from then).
func (c *Client) openSession(ctx context.Context, ttl time.Duration) (SessionCredential, time.Duration, time.Time, error) {
	if ttl < SessionTTLMin || ttl > SessionTTLMax {
		return SessionCredential{}, 0, time.Time{}, invalidArgument("session ttl %v is outside the allowed range %v..=%v", ttl, SessionTTLMin, SessionTTLMax)
	}
	// One key for every attempt: a retry after an unknown outcome gets the session the first
	// attempt may have opened, not a second one.
	request := &palisadev1.OpenSessionRequest{TtlMs: uint64(ttl.Milliseconds()), OpenKey: openKey()}
	sentAt := time.Now()
	response, _, err := call(ctx, c, "opening a session", c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.OpenSessionResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.OpenSession(ctx, request, opts...)
		})
	if err != nil {
		return SessionCredential{}, 0, time.Time{}, err
	}
	if response.GetSession() == 0 || response.GetTtlMs() == 0 {
		return SessionCredential{}, 0, time.Time{}, protocolError("the lock service opened session %d with ttl %d ms", response.GetSession(), response.GetTtlMs())
	}
	if len(response.GetSessionSecret()) != SessionSecretBytes {
		return SessionCredential{}, 0, time.Time{}, protocolError("session %d came with a secret of %d bytes instead of %d (upgrade every member before its clients)",
			response.GetSession(), len(response.GetSessionSecret()), SessionSecretBytes)
	}
	return SessionCredential{response.GetSession(), response.GetSessionSecret()}, time.Duration(response.GetTtlMs()) * time.Millisecond, sentAt, nil
}

// OpenSessionWithoutKeepAlive opens a session that nothing renews: it expires ttl after it was
// opened or last renewed with Renew. Returns its credential and the TTL the service granted.
func (c *Client) OpenSessionWithoutKeepAlive(ctx context.Context, ttl time.Duration) (SessionCredential, time.Duration, error) {
	cred, granted, _, err := c.openSession(ctx, ttl)
	return cred, granted, err
}

// Renew renews a session once; returns the lease remaining as the service applied it.
func (c *Client) Renew(ctx context.Context, cred SessionCredential) (time.Duration, error) {
	return c.renew(ctx, cred, c.cfg.RetryBudget)
}

func (c *Client) renew(ctx context.Context, cred SessionCredential, budget time.Duration) (time.Duration, error) {
	request := &palisadev1.KeepAliveRequest{Session: cred.ID, SessionSecret: cred.Secret}
	response, _, err := call(ctx, c, fmt.Sprintf("renewal of session %d", cred.ID), budget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.KeepAliveResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.Renew(ctx, request, opts...)
		})
	if err != nil {
		return 0, err
	}
	if response.GetSession() != cred.ID {
		return 0, protocolError("renewal of session %d answered for session %d", cred.ID, response.GetSession())
	}
	return time.Duration(response.GetTtlRemainingMs()) * time.Millisecond, nil
}

// CloseSession ends a session: releases its locks and withdraws its waits.
func (c *Client) CloseSession(ctx context.Context, cred SessionCredential) error {
	request := &palisadev1.CloseSessionRequest{Session: cred.ID, SessionSecret: cred.Secret}
	_, _, err := call(ctx, c, fmt.Sprintf("closing session %d", cred.ID), c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.CloseSessionResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.CloseSession(ctx, request, opts...)
		})
	return err
}

// Grant is one grant of a lock: its fencing token and the signed sequencer to present to
// resources.
type Grant struct {
	Lock      string
	Session   uint64
	Token     uint64
	Sequencer string
	// Access is exclusive (the zero value), shared (a reader of the phase whose token this is)
	// or a semaphore's slot: see docs/locks.md.
	Access sequencer.Access
}

// AcquireOptions say how an acquire waits and what the grant tells readers of the lock.
type AcquireOptions struct {
	// TryOnly fails at once with ErrBusy if the lock is held.
	TryOnly bool
	// Wait bounds the wait in the queue (0: until ctx ends, or forever without a deadline).
	// A deadline of ctx bounds it too.
	Wait time.Duration
	// Value is what the grant tells everyone who reads the lock (Status, ListLocks, Watch):
	// for a leader election, the leader's address. 1 to 1024 bytes of UTF-8 without control
	// characters; "" means none.
	Value string
	// Shared takes the lock as a reader: readers run together, each with its phase's token, and
	// a writer waits until they are done. Not with Permits.
	Shared bool
	// Permits takes one permit of the semaphore lock of this many permits (1 to
	// sequencer.PermitsMax); 0 for a lock. Every holder names the same size.
	Permits uint32
}

// Acquire takes lock for the session cred, waiting as opts says. Every retry reuses one random
// request id, so a retry cannot grant twice. If ctx ends while the acquire may be waiting or
// granted, the wait is withdrawn (or the grant released) before the error returns.
func (c *Client) Acquire(ctx context.Context, cred SessionCredential, lock string, opts AcquireOptions) (Grant, error) {
	if err := validateAcquire(lock, opts); err != nil {
		return Grant{}, err
	}
	what := fmt.Sprintf("acquire of lock %q in session %d", lock, cred.ID)
	response, err := sendAcquire(ctx, c, cred, lock, opts, requestID(), what, []string{lock},
		func(ctx context.Context, stub palisadev1.LocksClient, request *palisadev1.AcquireRequest, copts ...grpc.CallOption) (*palisadev1.AcquireResponse, error) {
			return stub.Acquire(ctx, request, copts...)
		})
	if err != nil {
		return Grant{}, err
	}
	return grantOf(response, cred.ID, lock)
}

// ReleaseThenAcquire gives up release (or withdraws the session's wait for it), then takes lock
// as Acquire does, in one call and one log write where Release and Acquire take two: a handoff
// to the next lock, or to the same lock again (behind its waiters, with a new token). Returns
// the new grant and the token of the grant the release ended (false if it withdrew a wait).
//
// A refused release (ErrSessionNotFound, or ErrNotHolder: the session neither holds nor waits
// for release) changes nothing, and the acquire is not tried; after any other refusal, the
// acquire's (ErrBusy, ErrWaitEnded, ...), the release took effect and lock is not held. A server
// that predates the call answers ErrProtocol with Code codes.Unimplemented, having released
// nothing. Every retry reuses the release's and the acquire's random request ids (two different
// ones), so a retry neither grants twice nor releases the grant an earlier attempt took. If ctx
// ends while the handoff may be waiting or granted, both locks are released (or the wait
// withdrawn) before the error returns.
func (c *Client) ReleaseThenAcquire(ctx context.Context, cred SessionCredential, release, lock string, opts AcquireOptions) (grant Grant, released uint64, held bool, err error) {
	if err := validateLockName(release); err != nil {
		return Grant{}, 0, false, err
	}
	if err := validateAcquire(lock, opts); err != nil {
		return Grant{}, 0, false, err
	}
	id, releaseID := requestID(), requestID()
	for releaseID == id { // the service refuses one id for both (request_id_conflict)
		releaseID = requestID()
	}
	abandoned := []string{release, lock}
	if release == lock {
		abandoned = abandoned[:1]
	}
	what := fmt.Sprintf("release of lock %q then acquire of lock %q in session %d", release, lock, cred.ID)
	response, err := sendAcquire(ctx, c, cred, lock, opts, id, what, abandoned,
		func(ctx context.Context, stub palisadev1.LocksClient, request *palisadev1.AcquireRequest, copts ...grpc.CallOption) (*palisadev1.ReleaseThenAcquireResponse, error) {
			return stub.ReleaseThenAcquire(ctx, &palisadev1.ReleaseThenAcquireRequest{Acquire: request, Release: release, ReleaseRequestId: releaseID}, copts...)
		})
	if err != nil {
		return Grant{}, 0, false, err
	}
	if response.GetGrant() == nil {
		return Grant{}, 0, false, protocolError("the lock service answered a release of lock %q then an acquire of lock %q with no grant; the lock may be held by this session: close the session", release, lock)
	}
	if grant, err = grantOf(response.GetGrant(), cred.ID, lock); err != nil {
		return Grant{}, 0, false, err
	}
	if response.ReleasedToken == nil {
		return grant, 0, false, nil
	}
	if response.GetReleasedToken() == 0 {
		return Grant{}, 0, false, protocolError("release of lock %q then acquire of lock %q reported released token 0", release, lock)
	}
	return grant, response.GetReleasedToken(), true, nil
}

// validateAcquire checks an acquire's lock name and options before anything is sent.
func validateAcquire(lock string, opts AcquireOptions) error {
	if err := validateLockName(lock); err != nil {
		return err
	}
	if err := validateValue(opts.Value); err != nil {
		return err
	}
	if opts.Wait < 0 || opts.Wait > WaitMax {
		return invalidArgument("wait %v is outside 0..=%v", opts.Wait, WaitMax)
	}
	if opts.Shared && opts.Permits != 0 {
		return invalidArgument("an acquire is shared or a permit of a semaphore, not both")
	}
	if opts.Permits > sequencer.PermitsMax {
		return invalidArgument("a semaphore has 1 to %d permits, not %d", sequencer.PermitsMax, opts.Permits)
	}
	return nil
}

// sendAcquire sends the acquire of lock that opts describe, with request id id, by send (which
// wraps it in the call's own request): every retry sends the same request, its wait fields set
// for the attempt. If ctx ends while the acquire may be waiting or granted, each lock of
// abandoned is released (withdrawing the wait, or freeing a late grant) before the error
// returns.
func sendAcquire[T any](ctx context.Context, c *Client, cred SessionCredential, lock string, opts AcquireOptions, id uint64, what string, abandoned []string,
	send func(ctx context.Context, stub palisadev1.LocksClient, request *palisadev1.AcquireRequest, copts ...grpc.CallOption) (T, error)) (T, error) {
	deadline := waitDeadline(ctx, opts.TryOnly, opts.Wait)
	response, _, err := call(ctx, c, what, c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, copts ...grpc.CallOption) (T, error) {
			request := &palisadev1.AcquireRequest{Session: cred.ID, Lock: lock, RequestId: id, SessionSecret: cred.Secret, Value: opts.Value, Shared: opts.Shared, Permits: opts.Permits}
			ctx, cancel := c.bindWait(ctx, opts.TryOnly, deadline, &request.WaitMs, &request.WaitForever)
			defer cancel()
			return send(ctx, stub, request, copts...)
		})
	if err != nil && ctx.Err() != nil {
		// The wait may go on (or have granted) at the service: withdraw it.
		c.releaseQuietly(ctx, cred, "withdrawing an abandoned acquire", abandoned...)
	}
	return response, err
}

// releaseQuietly releases each of locks for cred (a grant, or a wait), within a request's time
// even after ctx ended; a failure is only logged (as why, at debug level).
func (c *Client) releaseQuietly(ctx context.Context, cred SessionCredential, why string, locks ...string) {
	withdraw, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RequestTimeout)
	defer cancel()
	for _, lock := range locks {
		if _, _, err := c.Release(withdraw, cred, lock); err != nil {
			c.cfg.Logger.Debug(why+" failed", "lock", lock, "error", err)
		}
	}
}

// waitDeadline is when an acquire's wait ends (zero: never): after wait, and a little before
// ctx's deadline, so that the service's answer (wait_ended) arrives instead of a cancelled call
// of unknown outcome.
func waitDeadline(ctx context.Context, tryOnly bool, wait time.Duration) time.Time {
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	if d, ok := ctx.Deadline(); ok && !tryOnly && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d.Add(-min(time.Until(d)/10, time.Second))
	}
	return deadline
}

// bindWait sets one attempt's wait fields of an acquire (waitMs, waitForever) for deadline, and
// bounds the attempt's ctx to the wait and a request's time.
func (c *Client) bindWait(ctx context.Context, tryOnly bool, deadline time.Time, waitMs *uint64, waitForever *bool) (context.Context, context.CancelFunc) {
	switch {
	case tryOnly:
		return context.WithTimeout(ctx, c.cfg.RequestTimeout)
	case deadline.IsZero():
		// A wait forever has no deadline of its own: a dead connection is found by HTTP/2
		// keepalive, and a lost session by the session's keepalive.
		*waitForever = true
		return ctx, func() {}
	default:
		remaining := max(time.Until(deadline), 0)
		*waitMs = uint64(remaining.Milliseconds())
		return context.WithTimeout(ctx, remaining+c.cfg.RequestTimeout)
	}
}

// accessOf is how the wire says a grant holds its lock (nil: exclusive); false if it is both
// shared and a slot.
func accessOf(a *palisadev1.Access) (sequencer.Access, bool) {
	switch {
	case a == nil || (!a.GetShared() && a.Slot == nil):
		return sequencer.Access{}, true
	case a.Slot == nil:
		return sequencer.Access{Kind: sequencer.Shared}, true
	case !a.GetShared() && a.GetSlot() < sequencer.PermitsMax:
		return sequencer.Access{Kind: sequencer.Slot, Slot: a.GetSlot()}, true
	}
	return sequencer.Access{}, false
}

// checkGrant checks an acquire's answer against the request and its own sequencer, and returns
// how the grant holds the lock.
func checkGrant(r *palisadev1.AcquireResponse, session uint64, lock string) (sequencer.Access, error) {
	bad := func(format string, args ...any) error {
		return protocolError("the lock service answered the acquire with an invalid response (%s); the lock may be held by this session: close the session", fmt.Sprintf(format, args...))
	}
	if r.GetLock() != lock || r.GetSession() != session {
		return sequencer.Access{}, bad("asked for lock %q in session %d, granted lock %q in session %d", lock, session, r.GetLock(), r.GetSession())
	}
	if r.GetToken() == 0 {
		return sequencer.Access{}, bad("lock %q granted with token 0", lock)
	}
	parsed, err := sequencer.Parse(r.GetSequencer())
	if err != nil {
		return sequencer.Access{}, bad("grant of lock %q: %v", lock, err)
	}
	access, ok := accessOf(r.GetAccess())
	if !ok {
		return sequencer.Access{}, bad("grant of lock %q is both shared and a slot", lock)
	}
	if parsed.Lock != lock || parsed.Token != r.GetToken() || parsed.Session != session || parsed.Access != access {
		return sequencer.Access{}, bad("grant of lock %q with token %d in session %d (%v) came with a sequencer for lock %q, token %d, session %d (%v)",
			lock, r.GetToken(), session, access, parsed.Lock, parsed.Token, parsed.Session, parsed.Access)
	}
	return access, nil
}

// grantOf is the grant an acquire answered, checked as checkGrant does.
func grantOf(r *palisadev1.AcquireResponse, session uint64, lock string) (Grant, error) {
	access, err := checkGrant(r, session, lock)
	if err != nil {
		return Grant{}, err
	}
	return Grant{r.GetLock(), r.GetSession(), r.GetToken(), r.GetSequencer(), access}, nil
}

// Release gives up lock (or withdraws a wait); returns the token of the grant that ended, and
// false if a wait was withdrawn.
func (c *Client) Release(ctx context.Context, cred SessionCredential, lock string) (uint64, bool, error) {
	if err := validateLockName(lock); err != nil {
		return 0, false, err
	}
	request := &palisadev1.ReleaseRequest{Session: cred.ID, Lock: lock, RequestId: requestID(), SessionSecret: cred.Secret}
	response, _, err := call(ctx, c, fmt.Sprintf("release of lock %q by session %d", lock, cred.ID), c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.ReleaseResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.Release(ctx, request, opts...)
		})
	if err != nil {
		return 0, false, err
	}
	if response.Token == nil {
		return 0, false, nil
	}
	if response.GetToken() == 0 {
		return 0, false, protocolError("release of lock %q reported token 0", lock)
	}
	return response.GetToken(), true, nil
}

// Proclaim replaces the value of the session's grant token of lock ("" removes it): what a
// leader proclaims. Refused with ErrNotHolder unless that grant is the lock's current holding.
func (c *Client) Proclaim(ctx context.Context, cred SessionCredential, lock string, token uint64, value string) error {
	if err := validateLockName(lock); err != nil {
		return err
	}
	if err := validateValue(value); err != nil {
		return err
	}
	if token == 0 {
		return invalidArgument("a token is positive, not 0")
	}
	request := &palisadev1.ProclaimRequest{Session: cred.ID, Lock: lock, Token: token, Value: value, SessionSecret: cred.Secret}
	_, _, err := call(ctx, c, fmt.Sprintf("proclaim on lock %q by session %d", lock, cred.ID), c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.ProclaimResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.Proclaim(ctx, request, opts...)
		})
	return err
}

// Holder is the holder of a lock.
type Holder struct {
	Session uint64
	Token   uint64
	// LeaseRemaining is the lease left on the holding session when the service answered.
	LeaseRemaining time.Duration
	// Value is the grant's value ("" if none).
	Value string
	// Access is how the grant holds the lock: exclusive, shared (a reader of the phase whose
	// token this is) or a semaphore's slot (docs/locks.md).
	Access sequencer.Access
}

// LockStatus is the state of one lock.
type LockStatus struct {
	Lock string
	// Holder is nil when the lock is free.
	Holder *Holder
	// LastToken is the last token granted for the lock (0 if none since it was last forgotten).
	LastToken uint64
	// Waiters are the waiting sessions, first in line first.
	Waiters []uint64
	// LockDelayRemaining is the time left in lock-delay after a holder's session expired
	// (nil when none).
	LockDelayRemaining *time.Duration
	// Sharers are the readers of the current shared phase, or a semaphore's permit holders
	// (Holder is then nil), in session order.
	Sharers []Holder
	// Permits is a semaphore's number of permits; 0 for a lock.
	Permits uint32
}

func lockStatus(info *palisadev1.LockInfo) (LockStatus, error) {
	s := LockStatus{Lock: info.GetLock(), LastToken: info.GetLastToken(), Waiters: info.GetWaiters(), Permits: info.GetPermits()}
	if info.Permits != nil && (s.Permits == 0 || s.Permits > sequencer.PermitsMax) {
		return LockStatus{}, protocolError("lock %q is a semaphore of %d permits, outside 1 to %d", info.GetLock(), s.Permits, sequencer.PermitsMax)
	}
	holder := func(h *palisadev1.Holder) (Holder, error) {
		if h.GetToken() == 0 || h.GetToken() > info.GetLastToken() {
			return Holder{}, protocolError("lock %q is held with token %d but its last token is %d", info.GetLock(), h.GetToken(), info.GetLastToken())
		}
		access, ok := accessOf(h.GetAccess())
		if !ok || (access.Kind == sequencer.Slot) != (s.Permits > 0) || (access.Kind == sequencer.Slot && access.Slot >= s.Permits) {
			return Holder{}, protocolError("lock %q (permits %d) is held by session %d as %v", info.GetLock(), s.Permits, h.GetSession(), h.GetAccess())
		}
		return Holder{h.GetSession(), h.GetToken(), time.Duration(h.GetLeaseRemainingMs()) * time.Millisecond, h.GetValue(), access}, nil
	}
	if h := info.GetHolder(); h != nil {
		held, err := holder(h)
		if err != nil {
			return LockStatus{}, err
		}
		s.Holder = &held
	}
	for _, h := range info.GetSharers() {
		sharer, err := holder(h)
		if err != nil {
			return LockStatus{}, err
		}
		s.Sharers = append(s.Sharers, sharer)
	}
	if info.LockDelayRemainingMs != nil {
		d := time.Duration(info.GetLockDelayRemainingMs()) * time.Millisecond
		s.LockDelayRemaining = &d
	}
	return s, nil
}

// Status is the state of one lock (linearizable).
func (c *Client) Status(ctx context.Context, lock string) (LockStatus, error) {
	if err := validateLockName(lock); err != nil {
		return LockStatus{}, err
	}
	info, _, err := call(ctx, c, fmt.Sprintf("status of lock %q", lock), c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.LockInfo, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.Status(ctx, &palisadev1.StatusRequest{Lock: lock}, opts...)
		})
	if err != nil {
		return LockStatus{}, err
	}
	s, err := lockStatus(info)
	if err == nil && s.Lock != lock {
		err = protocolError("status of lock %q answered for lock %q", lock, s.Lock)
	}
	return s, err
}

// ListLocks is every lock whose name starts with prefix, in name order (follows pagination).
func (c *Client) ListLocks(ctx context.Context, prefix string) ([]LockStatus, error) {
	if len(prefix) > LockNameBytesMax {
		return nil, invalidArgument("a prefix is at most %d bytes", LockNameBytesMax)
	}
	var locks []LockStatus
	startAfter := ""
	for range listPagesMax {
		page, _, err := call(ctx, c, fmt.Sprintf("list of locks under %q", prefix), c.cfg.RetryBudget,
			func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.ListLocksResponse, error) {
				ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
				defer cancel()
				return stub.ListLocks(ctx, &palisadev1.ListLocksRequest{Prefix: prefix, StartAfter: startAfter}, opts...)
			})
		if err != nil {
			return nil, err
		}
		for _, info := range page.GetLocks() {
			s, err := lockStatus(info)
			if err != nil {
				return nil, err
			}
			inOrder := (len(locks) == 0 || locks[len(locks)-1].Lock < s.Lock) && (startAfter == "" || startAfter < s.Lock)
			if !strings.HasPrefix(s.Lock, prefix) || !inOrder {
				return nil, protocolError("lock list for prefix %q returned %q out of order or outside the prefix", prefix, s.Lock)
			}
			locks = append(locks, s)
		}
		next := page.GetNextStartAfter()
		if next == "" {
			return locks, nil
		}
		if next <= startAfter {
			return nil, protocolError("lock list did not advance past %q", startAfter)
		}
		startAfter = next
	}
	return nil, protocolError("lock list for prefix %q did not end after %d pages", prefix, listPagesMax)
}

// PublicKeys is every key resources must trust now (the signing key, and during a rotation the
// key on its way in or out): what to give sequencer.Verify and the fence helpers.
func (c *Client) PublicKeys(ctx context.Context) (sequencer.KeySet, error) {
	response, _, err := call(ctx, c, "reading the public keys", c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (*palisadev1.PublicKeyResponse, error) {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			defer cancel()
			return stub.PublicKey(ctx, &palisadev1.PublicKeyRequest{}, opts...)
		})
	if err != nil {
		return sequencer.KeySet{}, err
	}
	signing, err := sequencer.ParsePublicKey(response.GetPublicKey())
	if err != nil {
		return sequencer.KeySet{}, protocolError("the lock service published an invalid key: %v", err)
	}
	published, err := sequencer.NewKeySet(signing)
	if len(response.GetPublicKeys()) > 0 {
		published, err = sequencer.ParseKeySet(strings.Join(response.GetPublicKeys(), ","))
	}
	if err != nil {
		return sequencer.KeySet{}, protocolError("the lock service published an invalid key: %v", err)
	}
	if _, ok := published.Get(signing.KeyID()); !ok {
		return sequencer.KeySet{}, protocolError("the signing key %s is not among the published keys %s", signing, published)
	}
	return published, nil
}
