// Multi-locks (docs/locks.md § Multi-locks): Session.AcquireAll takes up to MultiLockMax locks,
// each in its own mode, all at once or none, and hands back one Mutex per lock, each held and
// released on its own. Client.AcquireAll is the same call on a session credential.

package palisade

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"example.invalid/palisade/clients/go/palisadev1"
	"example.invalid/palisade/clients/go/sequencer"
)

// MultiLockMax is how many locks one multi-lock takes at most (the service's limit).
const MultiLockMax = 32

// LockPart is one lock of a multi-lock: its name and mode (exclusive, Shared, or one permit of
// a semaphore of Permits permits). A multi-lock's grants carry no value.
type LockPart struct {
	Name string
	// Shared takes the lock as a reader; not with Permits.
	Shared bool
	// Permits takes one permit of the semaphore of this many permits; 0 for a lock.
	Permits uint32
}

// MultiAcquireOptions say how a multi-lock waits: as AcquireOptions' TryOnly and Wait, for the
// group as a whole.
type MultiAcquireOptions struct {
	TryOnly bool
	Wait    time.Duration
}

// AcquireAll takes every lock of parts, all at once or none (ErrBusy names one that is not
// free when opts.TryOnly), and returns one Mutex per part in the order given, each held with
// its own token, sequencer and access and released on its own (Unlock). While the group waits
// the session holds none of them, and no lock order is needed: two groups of the same locks in
// any order both complete. If ctx ends while the group may be waiting, the wait is withdrawn
// before AcquireAll returns.
func (s *Session) AcquireAll(ctx context.Context, parts []LockPart, opts MultiAcquireOptions) ([]*Mutex, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	grants, err := s.client.AcquireAll(ctx, s.cred, parts, opts)
	if err != nil {
		return nil, err
	}
	mutexes := make([]*Mutex, len(grants))
	for i, g := range grants {
		mutexes[i] = &Mutex{session: s, name: g.Lock, shared: parts[i].Shared, permits: parts[i].Permits, grant: &g}
	}
	// Grants that arrive after the session ended are no grants: the service may have freed them.
	return mutexes, s.Err()
}

// validateParts checks the number of a multi-lock's parts and each part, naming the first bad one.
func validateParts(parts []LockPart) error {
	if len(parts) == 0 || len(parts) > MultiLockMax {
		return invalidArgument("a multi-lock takes 1 to %d locks, not %d", MultiLockMax, len(parts))
	}
	// A name given twice is left to the service, whose refusal (multi_lock_repeated) names it.
	for i, p := range parts {
		if err := validateLockName(p.Name); err != nil {
			return invalidArgument("part %d of the multi-lock: %v", i, err)
		}
		if p.Shared && p.Permits != 0 {
			return invalidArgument("part %d of the multi-lock (lock %q) is shared or a permit of a semaphore, not both", i, p.Name)
		}
		if p.Permits > sequencer.PermitsMax {
			return invalidArgument("part %d of the multi-lock (lock %q): a semaphore has 1 to %d permits, not %d", i, p.Name, sequencer.PermitsMax, p.Permits)
		}
	}
	return nil
}

// AcquireAll takes every lock of parts for the session cred, all at once or none, waiting as
// opts says; the grants come in the order of parts. Every retry reuses one random request id,
// so a retry cannot grant twice. If ctx ends while the group may be waiting or granted, the
// wait is withdrawn (or the grants released) before the error returns.
func (c *Client) AcquireAll(ctx context.Context, cred SessionCredential, parts []LockPart, opts MultiAcquireOptions) ([]Grant, error) {
	if err := validateParts(parts); err != nil {
		return nil, err
	}
	if opts.Wait < 0 || opts.Wait > WaitMax {
		return nil, invalidArgument("wait %v is outside 0..=%v", opts.Wait, WaitMax)
	}
	wire := make([]*palisadev1.AcquirePart, len(parts))
	for i, p := range parts {
		wire[i] = &palisadev1.AcquirePart{Lock: p.Name, Shared: p.Shared, Permits: p.Permits}
	}
	id := requestID()
	deadline := waitDeadline(ctx, opts.TryOnly, opts.Wait)
	what := fmt.Sprintf("multi-lock of %d locks (lock %q first) in session %d", len(parts), parts[0].Name, cred.ID)
	response, _, err := call(ctx, c, what, c.cfg.RetryBudget,
		func(ctx context.Context, stub palisadev1.LocksClient, copts ...grpc.CallOption) (*palisadev1.AcquireAllResponse, error) {
			request := &palisadev1.AcquireAllRequest{Session: cred.ID, RequestId: id, SessionSecret: cred.Secret, Parts: wire}
			ctx, cancel := c.bindWait(ctx, opts.TryOnly, deadline, &request.WaitMs, &request.WaitForever)
			defer cancel()
			return stub.AcquireAll(ctx, request, copts...)
		})
	if err != nil {
		if ctx.Err() != nil {
			// The group may wait (or hold everything) at the service: releasing one name withdraws
			// the wait, and releasing each frees what a late grant gave.
			withdraw, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RequestTimeout)
			for _, p := range parts {
				if _, _, rerr := c.Release(withdraw, cred, p.Name); rerr != nil {
					c.cfg.Logger.Debug("withdrawing an abandoned multi-lock failed", "lock", p.Name, "error", rerr)
				}
			}
			cancel()
		}
		return nil, err
	}
	if response.GetSession() != cred.ID || len(response.GetGrants()) != len(parts) {
		return nil, protocolError("the lock service answered the multi-lock with %d grants in session %d, not %d in session %d; the locks may be held by this session: close the session",
			len(response.GetGrants()), response.GetSession(), len(parts), cred.ID)
	}
	grants := make([]Grant, len(parts))
	for i, r := range response.GetGrants() {
		access, err := checkGrant(r, cred.ID, parts[i].Name)
		if err != nil {
			return nil, err
		}
		grants[i] = Grant{r.GetLock(), r.GetSession(), r.GetToken(), r.GetSequencer(), access}
	}
	return grants, nil
}
