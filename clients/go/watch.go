package palisade

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"example.invalid/palisade/clients/go/palisadev1"
)

// LockEvent is one change of a lock's holder, from Client.Watch.
type LockEvent struct {
	// Kind is "snapshot" (the state when the watch (re)opened), "granted", "released",
	// "expired", "value_set" (the holder proclaimed a new value), or "other" (a kind of a newer
	// service: KindNumber is its number).
	Kind string
	Lock string
	// Session and Token are the holder after a snapshot, a grant or a proclaim, or the former
	// holder after a release or an expiry; 0 if none.
	Session, Token uint64
	// Waiters is how many sessions wait for the lock.
	Waiters uint64
	// Value is the holding's value after a snapshot, a grant or a proclaim ("" if none).
	Value      string
	KindNumber int32
}

var eventKinds = map[palisadev1.WatchEvent_Kind]string{
	palisadev1.WatchEvent_KIND_SNAPSHOT:  "snapshot",
	palisadev1.WatchEvent_KIND_GRANTED:   "granted",
	palisadev1.WatchEvent_KIND_RELEASED:  "released",
	palisadev1.WatchEvent_KIND_EXPIRED:   "expired",
	palisadev1.WatchEvent_KIND_VALUE_SET: "value_set",
}

func lockEvent(lock string, e *palisadev1.WatchEvent) (LockEvent, error) {
	if e.GetLock() != lock {
		return LockEvent{}, protocolError("watch of lock %q sent an event for lock %q", lock, e.GetLock())
	}
	kind, ok := eventKinds[e.GetKind()]
	if !ok {
		kind = "other"
	}
	if (kind == "granted" || kind == "value_set") && (e.GetSession() == 0 || e.GetToken() == 0) {
		return LockEvent{}, protocolError("watch of lock %q sent a %s of session %d with token %d", lock, kind, e.GetSession(), e.GetToken())
	}
	return LockEvent{kind, e.GetLock(), e.GetSession(), e.GetToken(), e.GetWaiters(), e.GetValue(), int32(e.GetKind())}, nil
}

// Watcher follows one lock: Events delivers a "snapshot" of its state first, then one event per
// change. A stream that fails in a way a new one may get past (the member is not or no longer
// the leader, the connection broke) is reopened at the next endpoint, starting again with a
// snapshot. Events is closed when ctx ends or the watch cannot go on; Err then says why (nil
// after ctx ended).
type Watcher struct {
	events chan LockEvent
	err    error
}

// Events is the channel of events.
func (w *Watcher) Events() <-chan LockEvent { return w.events }

// Err is why the events ended, once Events is closed.
func (w *Watcher) Err() error { return w.err }

// Watch follows lock until ctx ends. The first stream is opened before it returns (retried
// within the retry budget).
func (c *Client) Watch(ctx context.Context, lock string) (*Watcher, error) {
	if err := validateLockName(lock); err != nil {
		return nil, err
	}
	stream, first, gen, err := c.openWatch(ctx, lock)
	if err != nil {
		return nil, err
	}
	w := &Watcher{events: make(chan LockEvent, 16)}
	go func() {
		defer close(w.events)
		pending := first
		for {
			if pending != nil {
				event, err := lockEvent(lock, pending)
				if err != nil {
					w.err = err
					return
				}
				select {
				case w.events <- event:
				case <-ctx.Done():
					return
				}
				pending = nil
			}
			next, err := stream.Recv()
			if err == nil {
				pending = next
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if err == io.EOF {
				w.err = protocolError("the watch of lock %q ended", lock)
				return
			}
			f := classify(err, stream.Trailer())
			if f.kind != failNotApplied && f.kind != failNotLeader && f.kind != failUnknown {
				w.err = f.asError(fmt.Sprintf("watch of lock %q", lock))
				return
			}
			c.cfg.Logger.Debug("watch failed; reopening", "lock", lock, "error", f.message)
			c.endpoints.afterFailure(gen, f)
			stream, pending, gen, err = c.openWatch(ctx, lock)
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				return
			}
		}
	}()
	return w, nil
}

// openWatch opens a watch stream, retried: the stream, its first event (its snapshot: an open
// counts once the member has answered) and the generation of the endpoint that sent it.
func (c *Client) openWatch(ctx context.Context, lock string) (palisadev1.Locks_WatchClient, *palisadev1.WatchEvent, uint64, error) {
	type opened struct {
		stream palisadev1.Locks_WatchClient
		first  *palisadev1.WatchEvent
	}
	o, gen, err := call(ctx, c, fmt.Sprintf("watch of lock %q", lock), c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, opts ...grpc.CallOption) (opened, error) {
			// No deadline: a watch lasts; a dead connection is found by HTTP/2 keepalive.
			stream, err := stub.Watch(ctx, &palisadev1.WatchRequest{Lock: lock}, opts...)
			if err != nil {
				return opened{}, err
			}
			first, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return opened{}, protocolError("watch of lock %q ended before its snapshot", lock)
			}
			return opened{stream, first}, err
		})
	return o.stream, o.first, gen, err
}
