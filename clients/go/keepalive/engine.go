// Package keepalive is a session's keepalive rules as a state machine without I/O: it takes
// timed events (start, tick, the stream opened, a ping's answer, a stream broken or refused, the session gone, a
// Renew call answered or failed) and returns the actions to take (open a stream, send a ping,
// close the stream, renew by one call until a time, cancel that call, pause until a time, the
// session is lost, stop). The session's goroutine in package palisade is its thin driver and
// holds no rules of its own.
//
// The same engine is written in Rust (crates/client) and Python (palisade._keepalive), and all
// of them pass the shared vectors in spec/keepalive/v2, whose README states every rule. Times
// are integer milliseconds on the client's monotonic clock, from an origin the driver chooses.
package keepalive

import "math"

// Lost reasons, as package palisade spells them.
const (
	LeaseUnproven = "lease_unproven"
	NotFound      = "not_found"
)

// Backoff constants, the same in every client.
const (
	BackoffInitialMs = 50
	BackoffMaxMs     = 1000
	RetriesAtOnceMax = 3
	IntervalMinMs    = 10
)

// ProvenLease is how much of a reported lease remainder the client counts on: less 20 ms for a
// late timer and 0.2 % (rounded up) for the two machines' clock rates differing.
func ProvenLease(remainingMs int64) int64 {
	return max(0, remainingMs-20-(2*remainingMs+999)/1000)
}

// splitMix64 is the jitter's generator: the same numbers in every client, so vectors fix them.
type splitMix64 struct{ state uint64 }

func (r *splitMix64) fraction() float64 {
	r.state += 0x9E3779B97F4A7C15
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) * math.Ldexp(1, -53)
}

// backoff is exponential backoff within a budget, with a few attempts at once, on the engine's
// clock.
type backoff struct {
	budgetMs   int64
	rng        *splitMix64
	step       int64
	giveUpAt   int64
	atOnceLeft int
}

func newBackoff(now, budgetMs int64, rng *splitMix64) *backoff {
	b := &backoff{budgetMs: budgetMs, rng: rng}
	b.reset(now)
	return b
}

func (b *backoff) reset(now int64) {
	b.step = BackoffInitialMs
	b.giveUpAt = now + b.budgetMs
	b.atOnceLeft = RetriesAtOnceMax
}

func (b *backoff) atOnce(now int64) bool {
	if b.atOnceLeft == 0 || now >= b.giveUpAt {
		return false
	}
	b.atOnceLeft--
	return true
}

// nextDelay is the next pause, or false once the budget is spent.
func (b *backoff) nextDelay(now int64) (int64, bool) {
	if now >= b.giveUpAt {
		return 0, false
	}
	step := b.step
	if b.rng != nil {
		step = int64(float64(step) * (0.5 + b.rng.fraction()/2))
	}
	delay := min(step, b.giveUpAt-now)
	b.step = min(b.step*2, BackoffMaxMs)
	b.atOnceLeft = RetriesAtOnceMax
	return delay, true
}

// EventType names an event.
type EventType string

// The events (see spec/keepalive/v2/README.md for when the driver feeds each).
const (
	Start         EventType = "start"
	Tick          EventType = "tick"
	StreamOpened  EventType = "stream_opened"
	Ack           EventType = "ack"
	StreamBroken  EventType = "stream_broken"
	StreamRefused EventType = "stream_refused"
	SessionGone   EventType = "session_gone"
	RenewAnswered EventType = "renew_answered"
	RenewFailed   EventType = "renew_failed"
)

// Event is one input: its type, and TTLRemainingMs for Ack and RenewAnswered, LeaderNamed for
// StreamBroken.
type Event struct {
	Type           EventType
	TTLRemainingMs int64
	LeaderNamed    bool
}

// ActionType names an action.
type ActionType string

// The actions (see spec/keepalive/v2/README.md for what the driver does with each).
const (
	OpenStream  ActionType = "open_stream"
	SendPing    ActionType = "send_ping"
	CloseStream ActionType = "close_stream"
	Renew       ActionType = "renew"
	CancelRenew ActionType = "cancel_renew"
	Pause       ActionType = "pause"
	Lost        ActionType = "lost"
	Stop        ActionType = "stop"
)

// Close reasons of CloseStream.
const (
	ReasonStuck            = "stuck"
	ReasonLeaseEnded       = "lease_ended"
	noUntil          int64 = -1
)

// Action is one output. Reason is set for CloseStream and Lost; Until for Pause and Renew, where
// HasUntil false means none (a Renew of a lost session has no end).
type Action struct {
	Type     ActionType
	Reason   string
	Until    int64
	HasUntil bool
}

type state int

const (
	idle state = iota
	streaming
	renewing
	waiting
	stopped
)

// Engine is one session's keepalive. Feed On events, perform what it returns, and feed a Tick by
// Wake at the latest. Not safe for concurrent use: its driver serializes events.
type Engine struct {
	ttlMs, intervalMs int64
	leaseDeadline     int64 // noUntil once lost
	rng               *splitMix64
	backoff           *backoff
	st                state
	sentAt            []int64
	nextPing          int64 // before the stream opened: when it is given up
	opened            bool  // the stream's headers came
	renewSent         int64
	until             int64
}

// New is the engine of a session granted ttlMs, pinged every intervalMs (0: ttlMs / 3; clamped
// to 10..=ttlMs), whose OpenSession was sent at openedAtMs. jitterSeed seeds the backoff's
// jitter (nil: none, every pause the whole step).
func New(ttlMs, intervalMs, openedAtMs int64, jitterSeed *uint64) *Engine {
	if intervalMs == 0 {
		intervalMs = ttlMs / 3
	}
	e := &Engine{
		ttlMs:         ttlMs,
		intervalMs:    min(max(intervalMs, IntervalMinMs), ttlMs),
		leaseDeadline: openedAtMs + ProvenLease(ttlMs),
	}
	if jitterSeed != nil {
		e.rng = &splitMix64{*jitterSeed}
	}
	e.backoff = newBackoff(openedAtMs, ttlMs, e.rng)
	return e
}

// IntervalMs is the time between pings.
func (e *Engine) IntervalMs() int64 { return e.intervalMs }

// LeaseDeadline is the proven lease deadline, and false once the session is lost.
func (e *Engine) LeaseDeadline() (int64, bool) {
	return e.leaseDeadline, e.leaseDeadline != noUntil
}

// Stopped reports whether the engine asks for nothing more.
func (e *Engine) Stopped() bool { return e.st == stopped }

// Wake is the latest time to feed a Tick, and false when none is needed (the engine waits for
// I/O, or has stopped).
func (e *Engine) Wake() (int64, bool) {
	var at int64
	has := false
	switch e.st {
	case streaming:
		at, has = e.nextPing, true
	case waiting:
		at, has = e.until, true
	case renewing:
	default:
		return 0, false
	}
	if e.leaseDeadline == noUntil {
		return at, has
	}
	if !has || e.leaseDeadline < at {
		return e.leaseDeadline, true
	}
	return at, true
}

// On takes in ev at now and returns what to do, in order.
func (e *Engine) On(ev Event, now int64) []Action {
	var out []Action
	if e.st == stopped {
		return out
	}
	if e.leaseDeadline != noUntil && now >= e.leaseDeadline {
		return e.lose(now, out)
	}
	switch ev.Type {
	case Start:
		if e.st == idle {
			out = e.open(now, out)
		}
	case StreamOpened:
		if e.st == streaming && !e.opened {
			e.nextPing, e.opened = now+e.intervalMs, true
		}
	case Tick:
		if e.st == streaming && !e.opened && now >= e.nextPing {
			// Never opened (a silent member, or a refusal still to come): renew as if refused.
			out = append(out, Action{Type: CloseStream, Reason: ReasonStuck})
			out = e.renew(now, out)
		} else if e.st == streaming && now >= e.nextPing {
			if len(e.sentAt) > 0 && now-e.sentAt[0] >= e.intervalMs {
				out = append(out, Action{Type: CloseStream, Reason: ReasonStuck})
				out = e.failed(now, false, out)
			} else {
				e.sentAt = append(e.sentAt, now)
				e.nextPing = now + e.intervalMs
				out = append(out, Action{Type: SendPing})
			}
		} else if e.st == waiting && now >= e.until {
			out = e.open(now, out)
		}
	case Ack:
		if e.st == streaming && len(e.sentAt) > 0 {
			e.proven(e.sentAt[0], ev.TTLRemainingMs)
			e.sentAt = e.sentAt[1:]
			e.backoff.reset(now)
		}
	case StreamBroken:
		if e.st == streaming {
			out = e.failed(now, ev.LeaderNamed, out)
		}
	case StreamRefused:
		if e.st == streaming {
			out = e.renew(now, out)
		}
	case SessionGone:
		if e.st == streaming || e.st == renewing {
			if e.leaseDeadline != noUntil {
				out = append(out, Action{Type: Lost, Reason: NotFound})
				e.leaseDeadline = noUntil
			}
			e.st = stopped
			out = append(out, Action{Type: Stop})
		}
	case RenewAnswered:
		if e.st == renewing {
			e.proven(e.renewSent, ev.TTLRemainingMs)
			e.backoff.reset(now)
			if until := e.renewSent + e.intervalMs; until > now {
				e.st = waiting
				e.until = until
				out = append(out, Action{Type: Pause, Until: until, HasUntil: true})
			} else {
				out = e.open(now, out)
			}
		}
	case RenewFailed:
		if e.st == renewing {
			out = e.pause(now, out)
		}
	}
	return out
}

func (e *Engine) open(now int64, out []Action) []Action {
	e.st = streaming
	e.sentAt = []int64{now}
	e.opened = false
	e.nextPing = now + e.intervalMs // no ping before it opens, but it must open by then
	return append(out, Action{Type: OpenStream})
}

func (e *Engine) renew(now int64, out []Action) []Action {
	e.st = renewing
	e.renewSent = now
	return append(out, Action{Type: Renew, Until: e.leaseDeadline, HasUntil: e.leaseDeadline != noUntil})
}

func (e *Engine) proven(sent, remainingMs int64) {
	proven := sent + ProvenLease(min(remainingMs, e.ttlMs))
	if e.leaseDeadline != noUntil && proven > e.leaseDeadline {
		e.leaseDeadline = proven
	}
}

func (e *Engine) failed(now int64, leaderNamed bool, out []Action) []Action {
	if leaderNamed && e.backoff.atOnce(now) {
		return e.open(now, out)
	}
	return e.pause(now, out)
}

func (e *Engine) pause(now int64, out []Action) []Action {
	delay, ok := e.backoff.nextDelay(now)
	if !ok {
		delay = BackoffMaxMs
	}
	if e.leaseDeadline == noUntil {
		delay = min(delay, e.intervalMs)
	}
	e.st = waiting
	e.until = now + delay
	return append(out, Action{Type: Pause, Until: e.until, HasUntil: true})
}

func (e *Engine) lose(now int64, out []Action) []Action {
	switch e.st {
	case streaming:
		out = append(out, Action{Type: CloseStream, Reason: ReasonLeaseEnded})
	case renewing:
		out = append(out, Action{Type: CancelRenew})
	}
	out = append(out, Action{Type: Lost, Reason: LeaseUnproven})
	e.leaseDeadline = noUntil
	e.backoff = newBackoff(now, e.ttlMs, e.rng)
	return e.open(now, out)
}
