package palisade

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

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
		leaseDeadline: sentAt.Add(keepalive.ProvenLease(granted)),
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

// event is an engine event from the stream or renewal numbered gen.
type event struct {
	gen uint64
	ev  keepalive.Event
}

// stream is one KeepAlive stream: pings go through send, its goroutines end with cancel.
type stream struct {
	gen    uint64
	send   chan struct{}
	cancel context.CancelFunc
}

func (s *Session) run(opened time.Time, interval time.Duration) {
	defer close(s.stopped)
	now := func() time.Duration { return time.Since(opened) }
	engine := keepalive.New(s.ttl, interval, 0, mathrand.Float64)
	events := make(chan event, 64)
	var gen uint64
	var cur *stream
	closeStream := func() {
		if cur != nil {
			cur.cancel()
			cur = nil
		}
	}
	defer closeStream()
	apply := func(actions []keepalive.Action) bool {
		for _, a := range actions {
			switch a.Kind {
			case keepalive.Open:
				closeStream()
				gen++
				cur = s.openStream(gen, events, now)
			case keepalive.Ping:
				if cur != nil {
					select {
					case cur.send <- struct{}{}:
					default: // the sender is blocked: the stream is stuck, which the engine sees
					}
				}
			case keepalive.Close:
				closeStream()
			case keepalive.Renew:
				closeStream()
				gen++
				go s.renewByCall(gen, a.Budget, events, now)
			case keepalive.Pause:
				closeStream()
			case keepalive.Lost:
				if s.end(a.Reason) == "" {
					s.client.cfg.Logger.Info("palisade session lost", "session", s.cred.ID, "reason", DescribeLost(a.Reason))
				}
				if a.Reason == keepalive.LostNotFound {
					return false
				}
			}
		}
		deadline, proving := engine.LeaseDeadline()
		if proving {
			s.mu.Lock()
			if t := opened.Add(deadline); t.After(s.leaseDeadline) {
				s.leaseDeadline = t
			}
			s.mu.Unlock()
		}
		return true
	}
	if !apply(engine.Start(now())) {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wake, ok := engine.Wake()
		if !ok {
			return
		}
		timer.Reset(max(wake-now(), 0))
		var actions []keepalive.Action
		select {
		case <-s.stop:
			return
		case <-s.client.closed:
			return
		case e := <-events:
			if e.gen != gen {
				continue // from a stream or renewal already given up
			}
			actions = engine.Step(e.ev)
		case <-timer.C:
			actions = engine.Step(keepalive.Event{Kind: keepalive.Tick, At: now()})
		}
		if !apply(actions) {
			return
		}
	}
}

// openStream opens a KeepAlive stream at the current endpoint, sends its first ping, and feeds
// its answers and its end to events.
func (s *Session) openStream(gen uint64, events chan<- event, now func() time.Duration) *stream {
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{gen: gen, send: make(chan struct{}, 4), cancel: cancel}
	st.send <- struct{}{} // the first ping goes out with the stream
	cur := s.client.endpoints.current()
	ping := &palisadev1.KeepAliveRequest{Session: s.cred.ID, SessionSecret: s.cred.Secret}
	report := func(err error) {
		f := classify(err, nil)
		if ctx.Err() != nil {
			return // closed by the driver
		}
		s.client.endpoints.afterFailure(cur.generation, f)
		ev := keepalive.Event{Kind: keepalive.StreamBroken, At: now(), LeaderHint: f.kind == failNotLeader}
		switch {
		case sessionGone(f):
			ev.Gone = true
		case f.code == codes.ResourceExhausted:
			ev.Kind = keepalive.StreamRefused
		}
		select {
		case events <- event{gen, ev}:
		case <-ctx.Done():
		}
	}
	go func() {
		call, err := cur.stub.KeepAlive(ctx)
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
		for {
			ack, err := call.Recv()
			if err != nil {
				report(err)
				return
			}
			if ack.GetSession() != s.cred.ID {
				continue
			}
			select {
			case events <- event{gen, keepalive.Event{Kind: keepalive.Ack, At: now(), Remaining: time.Duration(ack.GetTtlRemainingMs()) * time.Millisecond}}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return st
}

// renewByCall renews the session by one Renew call within budget (0: the client's).
func (s *Session) renewByCall(gen uint64, budget time.Duration, events chan<- event, now func() time.Duration) {
	ctx := context.Background()
	if budget == 0 {
		budget = s.client.cfg.RetryBudget
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	}
	remaining, err := s.client.renew(ctx, s.cred, budget)
	ev := keepalive.Event{Kind: keepalive.RenewAnswered, At: now(), Remaining: remaining}
	if err != nil {
		ev = keepalive.Event{Kind: keepalive.RenewFailed, At: now(), Gone: errors.Is(err, ErrSessionNotFound)}
	}
	select {
	case events <- event{gen, ev}:
	case <-s.stopped:
	}
}

func sessionGone(f *failure) bool {
	if f.kind == failCore && f.detail != nil {
		return f.detail.GetKind() == "session_not_found"
	}
	return f.code == codes.NotFound
}
