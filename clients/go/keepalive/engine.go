// Package keepalive is the session keepalive as a pure state machine, without I/O: it takes
// events (a tick, a ping's answer, a stream refused or broken, a renewal answered or failed),
// each with the time it happened, and returns the actions to take (open a stream, ping, renew
// by one call within a budget, pause until a time, the session is lost for a reason). The
// session's goroutine in package palisade is its thin driver.
//
// The rules are the Rust client's Pinger and the Python client's: a ping every interval (a
// third of the TTL by default); the lease is proven until a ping's send time plus the remainder
// the service reported, less a margin; a stream whose oldest ping has gone unanswered for a
// whole interval is stuck and reopened elsewhere; when the service has no keepalive stream to
// spare (RESOURCE_EXHAUSTED) the session is renewed by one Renew call per interval, within what
// is left of the proven lease, and a stream tried again after it; a stream that broke is
// reopened at once after a leader hint (at most three times in a row), else after a pause of 50
// ms doubling to 1 s, jittered. When the lease can no longer be proven the session is lost
// (LostLeaseUnproven), but renewed best effort until its owner closes it, so its locks are not
// handed on while the owner is still stopping; when the service says the session is gone it is
// lost for good (LostNotFound).
//
// Times are durations since an origin the driver chooses (its start), so that a test can feed
// any sequence of events without a clock.
package keepalive

import "time"

// Reasons a session is lost.
const (
	LostNotFound      = "not_found"
	LostLeaseUnproven = "lease_unproven"
)

// Backoff and retry constants (the same in every client).
const (
	BackoffInitial   = 50 * time.Millisecond
	BackoffMax       = time.Second
	RetriesAtOnceMax = 3
)

// EventKind names an event.
type EventKind string

// The events.
const (
	// Tick: time passed (the driver calls at Engine.Wake, or at any time).
	Tick EventKind = "tick"
	// Ack: the current stream answered its oldest unanswered ping; Remaining is the lease the
	// service reported.
	Ack EventKind = "ack"
	// StreamRefused: the service has no keepalive stream to spare (RESOURCE_EXHAUSTED).
	StreamRefused EventKind = "stream_refused"
	// StreamBroken: the stream failed or ended; LeaderHint says the failure named a leader to
	// go to (the driver has already switched endpoints); Gone says the service no longer knows
	// the session.
	StreamBroken EventKind = "stream_broken"
	// RenewAnswered: the Renew call the engine asked for answered with Remaining.
	RenewAnswered EventKind = "renew_answered"
	// RenewFailed: that Renew call failed; Gone as for StreamBroken.
	RenewFailed EventKind = "renew_failed"
)

// Event is one input of the engine.
type Event struct {
	Kind       EventKind
	At         time.Duration
	Remaining  time.Duration
	LeaderHint bool
	Gone       bool
}

// ActionKind names an action.
type ActionKind string

// The actions.
const (
	// Open: open a new keepalive stream, its first ping sent with it (close the old one, if any).
	Open ActionKind = "open"
	// Ping: send a ping on the current stream.
	Ping ActionKind = "ping"
	// Close: close the current stream (it is stuck or being replaced by a pause).
	Close ActionKind = "close"
	// Renew: renew the session by one Renew call, given up after Budget (0: no budget, the
	// client's own retry budget).
	Renew ActionKind = "renew"
	// Pause: open nothing until Until.
	Pause ActionKind = "pause"
	// Lost: the session is lost for Reason. After LostLeaseUnproven the engine goes on renewing;
	// after LostNotFound it asks for nothing more.
	Lost ActionKind = "lost"
)

// Action is one output of the engine.
type Action struct {
	Kind   ActionKind
	Budget time.Duration
	Until  time.Duration
	Reason string
}

type state int

const (
	streaming state = iota
	renewing
	afterRenew
	pausing
	ended
)

// Engine is one session's keepalive. Not safe for concurrent use: its driver serializes events.
type Engine struct {
	ttl, interval time.Duration
	jitter        func() float64

	proving       bool
	leaseDeadline time.Duration
	st            state
	sent          []time.Duration // send times of the current stream's unanswered pings
	nextPing      time.Duration
	renewSentAt   time.Duration
	wakeAt        time.Duration

	delay      time.Duration
	atOnceLeft int
}

// New is the engine of a session whose granted TTL is ttl, pinged every interval, opened by a
// request sent at opened (the lease is proven from then). jitter returns a number in [0, 1) that
// spreads pauses (math/rand in the driver, a constant in tests); nil means 0.5.
func New(ttl, interval, opened time.Duration, jitter func() float64) *Engine {
	if jitter == nil {
		jitter = func() float64 { return 0.5 }
	}
	interval = min(max(interval, 10*time.Millisecond), ttl)
	return &Engine{
		ttl: ttl, interval: interval, jitter: jitter, proving: true,
		leaseDeadline: opened + ProvenLease(ttl),
		delay:         BackoffInitial, atOnceLeft: RetriesAtOnceMax,
	}
}

// ProvenLease is how much of a lease the server reported the client counts on: less a margin for
// a late timer (20 ms) and the two machines' clock rates differing (0.2 %).
func ProvenLease(remaining time.Duration) time.Duration {
	return max(0, remaining-(20*time.Millisecond+remaining/500))
}

// Start opens the first stream at now.
func (e *Engine) Start(now time.Duration) []Action {
	return e.open(now, nil)
}

// LeaseDeadline is when the proven lease ends, and whether it is still being proven (false once
// the session was lost).
func (e *Engine) LeaseDeadline() (time.Duration, bool) { return e.leaseDeadline, e.proving }

// Wake is when the driver must tick next (if no other event comes first), and false once the
// engine asks for nothing more.
func (e *Engine) Wake() (time.Duration, bool) {
	if e.st == ended {
		return 0, false
	}
	wake := e.wakeAt
	if e.proving && e.leaseDeadline < wake {
		wake = e.leaseDeadline
	}
	return wake, true
}

// Interval is the time between pings.
func (e *Engine) Interval() time.Duration { return e.interval }

// Step feeds one event and returns the actions it calls for, in order.
func (e *Engine) Step(ev Event) []Action {
	if e.st == ended {
		return nil
	}
	var out []Action
	now := ev.At
	switch ev.Kind {
	case Ack:
		if e.st == streaming && len(e.sent) > 0 {
			e.prove(e.sent[0], ev.Remaining)
			e.sent = e.sent[1:]
			e.resetBackoff()
		}
	case StreamBroken, StreamRefused:
		if e.st != streaming {
			break
		}
		e.sent = nil
		switch {
		case ev.Gone:
			return e.lose(LostNotFound)
		case ev.Kind == StreamRefused:
			// No keepalive stream to spare: renew by one call, within what is left of the lease.
			e.st = renewing
			e.renewSentAt = now
			budget := time.Duration(0)
			if e.proving {
				budget = max(e.leaseDeadline-now, 0)
			}
			e.wakeAt = e.leaseDeadline
			if !e.proving {
				e.wakeAt = now + e.interval
			}
			out = append(out, Action{Kind: Renew, Budget: budget})
		case ev.LeaderHint && e.atOnceLeft > 0:
			e.atOnceLeft--
			return e.open(now, nil)
		default:
			out = e.pause(now, out)
		}
	case RenewAnswered:
		if e.st != renewing {
			break
		}
		e.prove(e.renewSentAt, ev.Remaining)
		e.resetBackoff()
		e.st = afterRenew
		e.wakeAt = e.renewSentAt + e.interval
	case RenewFailed:
		if e.st != renewing {
			break
		}
		if ev.Gone {
			return e.lose(LostNotFound)
		}
		out = e.pause(now, out)
	}
	return e.tick(now, out)
}

// tick does what time calls for at now: a lost lease, a ping, a stuck stream, a pause's end.
func (e *Engine) tick(now time.Duration, out []Action) []Action {
	if e.proving && now >= e.leaseDeadline {
		e.proving = false
		out = append(out, Action{Kind: Lost, Reason: LostLeaseUnproven})
		if e.st == renewing {
			e.wakeAt = e.renewSentAt + e.interval
		}
		if e.st == pausing {
			e.wakeAt = min(e.wakeAt, now+e.interval)
		}
	}
	switch e.st {
	case streaming:
		if now >= e.nextPing {
			// A renewal takes one commit; one unanswered for a whole interval will not be
			// answered in time, wherever it is stuck.
			if len(e.sent) > 0 && now-e.sent[0] >= e.interval {
				e.sent = nil
				out = append(out, Action{Kind: Close})
				return e.pause(now, out)
			}
			e.sent = append(e.sent, now)
			e.nextPing = now + e.interval
			e.wakeAt = e.nextPing
			out = append(out, Action{Kind: Ping})
		}
	case afterRenew, pausing:
		if now >= e.wakeAt {
			return e.open(now, out)
		}
	case renewing:
		// The Renew call's answer or failure moves on; its budget ends with the lease.
	}
	return out
}

func (e *Engine) open(now time.Duration, out []Action) []Action {
	e.st = streaming
	e.sent = []time.Duration{now}
	e.nextPing = now + e.interval
	e.wakeAt = e.nextPing
	return append(out, Action{Kind: Open})
}

func (e *Engine) pause(now time.Duration, out []Action) []Action {
	delay := time.Duration(float64(e.delay) * (0.5 + e.jitter()/2))
	e.delay = min(e.delay*2, BackoffMax)
	e.atOnceLeft = RetriesAtOnceMax
	if !e.proving {
		delay = min(delay, e.interval)
	}
	e.st = pausing
	e.wakeAt = now + delay
	return append(out, Action{Kind: Pause, Until: e.wakeAt})
}

func (e *Engine) prove(sentAt, remaining time.Duration) {
	proven := sentAt + ProvenLease(min(remaining, e.ttl))
	if e.proving && proven > e.leaseDeadline {
		e.leaseDeadline = proven
	}
}

func (e *Engine) resetBackoff() {
	e.delay = BackoffInitial
	e.atOnceLeft = RetriesAtOnceMax
}

func (e *Engine) lose(reason string) []Action {
	e.st = ended
	e.proving = false
	return []Action{{Kind: Lost, Reason: reason}}
}
