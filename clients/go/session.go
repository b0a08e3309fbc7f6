package palisade

import (
	"context"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"example.invalid/palisade/clients/go/keepalive"
	"example.invalid/palisade/clients/go/palisadev1"
)

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl      time.Duration
	interval time.Duration
}

// WithTTL sets the session's lease (1 s to 1 day; default 10 s).
func WithTTL(ttl time.Duration) SessionOption { return func(o *sessionOptions) { o.ttl = ttl } }

// WithKeepAliveInterval sets the time between pings (default a third of the TTL; at least 10 ms).
func WithKeepAliveInterval(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.interval = d }
}

// Session is a session whose lease is kept alive by a goroutine until Close. Done is closed when
// the session ends (lost, or closed); Err then says why. A session lost for want of a proven
// lease (LostLeaseUnproven) is not closed by the library: it is renewed best effort until its
// owner calls Close, so its locks are not handed on while the owner is still stopping.
type Session struct {
	client *Client
	cred   SessionCredential
	ttl    time.Duration

	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}

	mu            sync.Mutex
	ended         string // a Lost* reason once ended
	leaseDeadline time.Time
}

// NewSession opens a session and starts its keepalive.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.interval != 0 && (o.interval < 10*time.Millisecond || o.interval > 24*time.Hour) {
		return nil, invalidArgument("keepalive interval is 10ms..=24h, not %v", o.interval)
	}
	cred, granted, sentAt, err := c.openSession(ctx, o.ttl)
	if err != nil {
		return nil, err
	}
	interval := o.interval
	if interval == 0 {
		interval = granted / 3
	}
	s := &Session{
		client: c, cred: cred, ttl: granted,
		done: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
		leaseDeadline: sentAt.Add(time.Duration(keepalive.ProvenLease(granted.Milliseconds())) * time.Millisecond),
	}
	go s.run(sentAt, interval)
	return s, nil
}

// ID is the session's id.
func (s *Session) ID() uint64 { return s.cred.ID }

// Credential is the session's id and secret.
func (s *Session) Credential() SessionCredential { return s.cred }

// TTL is the lease the service granted.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session ends: from then on another holder may have its locks.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then a *SessionLostError saying why it ended.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended == "" {
		return nil
	}
	return &SessionLostError{Session: s.cred.ID, Reason: s.ended}
}

// LeaseRemaining is the lease this process can prove, or false once the session ended.
func (s *Session) LeaseRemaining() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != "" {
		return 0, false
	}
	return max(time.Until(s.leaseDeadline), 0), true
}

// Context is a child of parent cancelled when the session ends (the client-go
// OnStartedLeading idiom): work under a lock runs in it. context.Cause gives the
// *SessionLostError.
func (s *Session) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-s.done:
			cancel(s.Err())
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// end marks the session ended unless it already is; returns the earlier reason if there was one.
func (s *Session) end(reason string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != "" {
		return s.ended
	}
	s.ended = reason
	close(s.done)
	return ""
}

// Close ends the session: stops the keepalive, releases every lock, withdraws every wait. After
// a loss for want of a proven lease, this is what gives the locks up.
func (s *Session) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
	switch s.end(LostClosed) {
	case LostNotFound:
		return &Error{Class: ErrRefused, Kind: ErrSessionNotFound, Code: codes.NotFound,
			Message: fmt.Sprintf("session %d does not exist (it had already expired or been closed)", s.cred.ID)}
	case LostClosed:
		return nil
	}
	return s.client.CloseSession(ctx, s.cred)
}

// --- the keepalive driver: I/O around keepalive.Engine ---------------------------------------

// event is an engine event from the stream or Renew call numbered gen.
type event struct {
	gen uint64
	ev  keepalive.Event
}

// inFlight is the open stream or Renew call: pings go through send; cancel ends its goroutines.
type inFlight struct {
	send   chan struct{}
	cancel context.CancelFunc
	// endpoint is the generation of the endpoint a stream was opened at.
	endpoint uint64
}

func (s *Session) run(opened time.Time, interval time.Duration) {
	defer close(s.stopped)
	now := func() int64 { return time.Since(opened).Milliseconds() }
	seed := mathrand.Uint64() >> 12 // below 2^53, as the vectors' seeds
	engine := keepalive.New(s.ttl.Milliseconds(), interval.Milliseconds(), 0, &seed)
	events := make(chan event, 64)
	var gen uint64
	var cur *inFlight
	end := func() {
		if cur != nil {
			cur.cancel()
			cur = nil
		}
		gen++ // whatever it still reports is dropped
	}
	defer end()
	apply := func(actions []keepalive.Action) bool {
		for _, a := range actions {
			switch a.Type {
			case keepalive.OpenStream:
				end()
				cur = s.openStream(gen, events)
			case keepalive.SendPing:
				if cur != nil {
					select {
					case cur.send <- struct{}{}:
					default: // the sender is blocked: the stream is stuck, which the engine sees
					}
				}
			case keepalive.CloseStream:
				if a.Reason == keepalive.ReasonStuck && cur != nil {
					s.client.endpoints.afterFailure(cur.endpoint, &failure{kind: failUnknown, message: "the keepalive stream is stuck"})
				}
				end()
			case keepalive.Renew:
				end()
				cur = s.renewByCall(gen, a, opened, events)
			case keepalive.CancelRenew, keepalive.Pause:
				end()
			case keepalive.Lost:
				if s.end(a.Reason) == "" {
					s.client.cfg.Logger.Info("palisade session lost", "session", s.cred.ID, "reason", DescribeLost(a.Reason))
				}
			case keepalive.Stop:
				return false
			}
		}
		if deadline, proving := engine.LeaseDeadline(); proving {
			s.mu.Lock()
			if t := opened.Add(time.Duration(deadline) * time.Millisecond); t.After(s.leaseDeadline) {
				s.leaseDeadline = t
			}
			s.mu.Unlock()
		}
		return true
	}
	if !apply(engine.On(keepalive.Event{Type: keepalive.Start}, now())) {
		return
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wakeC <-chan time.Time
		if wake, ok := engine.Wake(); ok {
			timer.Reset(time.Duration(max(wake-now(), 0)) * time.Millisecond)
			wakeC = timer.C
		}
		var actions []keepalive.Action
		select {
		case <-s.stop:
			return
		case <-s.client.closed:
			return
		case e := <-events:
			if e.gen != gen {
				continue // from a stream or call already given up
			}
			actions = engine.On(e.ev, now())
		case <-wakeC:
			actions = engine.On(keepalive.Event{Type: keepalive.Tick}, now())
		}
		timer.Stop()
		if !apply(actions) {
			return
		}
	}
}

// openStream opens a KeepAlive stream at the current endpoint, sends its first ping, and feeds
// its answers and its end to events.
func (s *Session) openStream(gen uint64, events chan<- event) *inFlight {
	ctx, cancel := context.WithCancel(context.Background())
	cur := s.client.endpoints.current()
	st := &inFlight{send: make(chan struct{}, 4), cancel: cancel, endpoint: cur.generation}
	st.send <- struct{}{} // the first ping goes out with the stream
	ping := &palisadev1.KeepAliveRequest{Session: s.cred.ID, SessionSecret: s.cred.Secret}
	deliver := func(ev keepalive.Event) bool {
		select {
		case events <- event{gen, ev}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	var trailer metadata.MD
	report := func(err error) {
		if ctx.Err() != nil {
			return // closed by the driver
		}
		f := classify(err, trailer)
		s.client.endpoints.afterFailure(cur.generation, f)
		switch {
		case sessionGone(f):
			deliver(keepalive.Event{Type: keepalive.SessionGone})
		case f.code == codes.ResourceExhausted:
			deliver(keepalive.Event{Type: keepalive.StreamRefused})
		default:
			deliver(keepalive.Event{Type: keepalive.StreamBroken, LeaderNamed: f.kind == failNotLeader})
		}
	}
	go func() {
		call, err := cur.stub.KeepAlive(ctx, grpc.Trailer(&trailer))
		if err != nil {
			report(err)
			return
		}
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-st.send:
					if call.Send(ping) != nil {
						return // the receiver sees the stream's end
					}
				}
			}
		}()
		// The headers came (or a refusal with them): the next ping is due an interval from now.
		// A stream that fails first is reported by Recv below.
		if _, err := call.Header(); err == nil {
			if !deliver(keepalive.Event{Type: keepalive.StreamOpened}) {
				return
			}
		}
		for {
			ack, err := call.Recv()
			if err == io.EOF {
				err = status.Error(codes.Unavailable, "the keepalive stream ended")
			}
			if err != nil {
				report(err)
				return
			}
			if ack.GetSession() != s.cred.ID {
				continue
			}
			if !deliver(keepalive.Event{Type: keepalive.Ack, TTLRemainingMs: int64(ack.GetTtlRemainingMs())}) {
				return
			}
		}
	}()
	return st
}

// renewByCall renews the session by one Renew call, given up at the action's until (none: the
// client's retry budget).
func (s *Session) renewByCall(gen uint64, a keepalive.Action, opened time.Time, events chan<- event) *inFlight {
	ctx, cancel := context.WithCancel(context.Background())
	budget := s.client.cfg.RetryBudget
	if a.HasUntil {
		ctx, cancel = context.WithDeadline(context.Background(), opened.Add(time.Duration(a.Until)*time.Millisecond))
		budget = time.Until(opened.Add(time.Duration(a.Until) * time.Millisecond))
	}
	go func() {
		remaining, err := s.client.renew(ctx, s.cred, max(budget, 0))
		ev := keepalive.Event{Type: keepalive.RenewAnswered, TTLRemainingMs: remaining.Milliseconds()}
		switch {
		case errors.Is(err, ErrSessionNotFound):
			ev = keepalive.Event{Type: keepalive.SessionGone}
		case err != nil:
			ev = keepalive.Event{Type: keepalive.RenewFailed}
		}
		select {
		case events <- event{gen, ev}:
		case <-ctx.Done():
		case <-s.stopped:
		}
	}()
	return &inFlight{send: make(chan struct{}), cancel: cancel}
}

func sessionGone(f *failure) bool {
	if f.kind == failCore && f.detail != nil {
		return f.detail.GetKind() == "session_not_found"
	}
	return f.code == codes.NotFound
}
