// Package redis is a fence for Redis through go-redis: one Lua script checks the scope's
// accepted token and, if the sequencer is accepted, advances it and applies the caller's ops.
//
// The script (redis.lua) is the Rust adapter's crates/fence/src/redis.lua byte for byte,
// embedded from a copy that scripts/generate.sh makes and scripts/check-generated.sh checks (Go's
// embed cannot reach outside the module), with the same arguments; the fence hash of a scope is
// palisade:fence:<scope> with fields lock, token and session. A Rust, a Python and a Go writer
// fence the same keys.
//
// Claim first, then read, then write. A plain GET is not ordered; read through the fence: Read
// advances the scope's token and returns the keys' values in one script; Write applies ops in
// the same step as the check; WriteIf adds conditions checked before the ops (a compare-and-set,
// all or nothing). Redis 7.0 or later.
//
// Durability: Redis acknowledges once the script ran in memory and replicates asynchronously,
// so after a failover a superseded holder's old token can be accepted again. Use it where losing
// recent writes on a crash or failover is acceptable; use PostgreSQL where it is not.
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/sequencer"
)

//go:embed redis.lua
var scriptText string

var script = goredis.NewScript(scriptText)

// Limits.
const (
	// OpsMax is the most ops one fenced call may apply (and keys one Read returns).
	OpsMax = 64
	// ConditionsMax is the most conditions one WriteIf may check.
	ConditionsMax = 64
	// KeyPrefixDefault is the default prefix of the fence hashes.
	KeyPrefixDefault = "palisade:fence:"
	// ValueBytesMax is the longest key or value of one op.
	ValueBytesMax = 16 * 1024 * 1024
)

// Op is one op the script applies, in order, if the sequencer is accepted.
type Op struct {
	kind, key string
	value     []byte
}

// Set is SET key value; its reply is true.
func Set(key string, value []byte) Op { return Op{"set", key, value} }

// Delete is DEL key; its reply is true.
func Delete(key string) Op { return Op{"del", key, nil} }

// RPush is RPUSH key value; its reply is the list's length after the push.
func RPush(key string, value []byte) Op { return Op{"rpush", key, value} }

// IncrBy is INCRBY key delta on a 64-bit integer (absent counts as 0); its reply is the new
// value.
func IncrBy(key string, delta int64) Op {
	return Op{"incrby", key, []byte(strconv.FormatInt(delta, 10))}
}

// Get is GET key as the earlier ops left it; its reply is the value, or nil when missing.
func Get(key string) Op { return Op{"get", key, nil} }

// Condition is checked by WriteIf against the data before the ops.
type Condition struct {
	kind, key string
	value     []byte
}

// Equals holds when key holds exactly value.
func Equals(key string, value []byte) Condition { return Condition{"equals", key, value} }

// Absent holds when key does not exist.
func Absent(key string) Condition { return Condition{"absent", key, nil} }

// CompareFailed is WriteIf's answer when a condition did not hold: nothing was written and the
// token was not advanced.
type CompareFailed struct {
	Condition int
	// Current is the key's value now, if it holds a string.
	Current []byte
}

// Reply is one op's reply: Done for set and del, Value for get (nil when missing), Int for
// rpush and incrby.
type Reply struct {
	Done  bool
	Value []byte
	Int   int64
}

// Fence fences writes to a Redis database, per scope.
type Fence struct {
	// KeyPrefix of the fence hashes (default KeyPrefixDefault).
	KeyPrefix string
	// ExpectLock, if set, refuses other locks' sequencers even for the first claim.
	ExpectLock string
}

func (f Fence) prefix() string {
	if f.KeyPrefix == "" {
		return KeyPrefixDefault
	}
	return f.KeyPrefix
}

// FenceKey is the key of the hash holding scope's state.
func (f Fence) FenceKey(scope string) string { return f.prefix() + scope }

// Write applies ops if q is accepted for scope, advancing the scope's token in the same script;
// one reply per op. On any error nothing was written, except fence.ErrOutcomeUnknown.
func (f Fence) Write(ctx context.Context, c goredis.Scripter, scope string, q sequencer.Verified, ops ...Op) ([]Reply, error) {
	return f.write(ctx, c, scope, q, ops, fence.IntentWrite)
}

func (f Fence) write(ctx context.Context, c goredis.Scripter, scope string, q sequencer.Verified, ops []Op, intent fence.Intent) ([]Reply, error) {
	replies, failed, err := f.run(ctx, c, scope, q, nil, ops, intent)
	if err == nil && failed != nil {
		return nil, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the script reported condition %d failed, but the request had none", scope, failed.Condition)
	}
	return replies, err
}

// WriteIf is Write under conditions: the replies if every condition held, else a
// *CompareFailed (nothing written).
func (f Fence) WriteIf(ctx context.Context, c goredis.Scripter, scope string, q sequencer.Verified, conditions []Condition, ops ...Op) ([]Reply, *CompareFailed, error) {
	return f.run(ctx, c, scope, q, conditions, ops, fence.IntentWrite)
}

// Read is a fenced read: advances the scope's token and returns the values of keys (nil for a
// missing key) in one script. Once it returns, no older grant can write here. Any grant may
// read, a shared one (a reader of a read-write lock) included; Write and WriteIf refuse a
// shared grant (fence.ErrSharedWrite).
func (f Fence) Read(ctx context.Context, c goredis.Scripter, scope string, q sequencer.Verified, keys ...string) ([][]byte, error) {
	ops := make([]Op, len(keys))
	for i, key := range keys {
		ops[i] = Get(key)
	}
	replies, err := f.write(ctx, c, scope, q, ops, fence.IntentRead)
	if err != nil {
		return nil, err
	}
	values := make([][]byte, len(replies))
	for i, r := range replies {
		values[i] = r.Value
	}
	return values, nil
}

// State is the scope's state, or nil if no sequencer was accepted.
func (f Fence) State(ctx context.Context, c goredis.Cmdable, scope string) (*fence.State, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return nil, err
	}
	values, err := c.HMGet(ctx, f.FenceKey(scope), "lock", "token", "session").Result()
	if err != nil {
		return nil, &fence.Error{Kind: fence.ErrStorage, Cause: err, Message: "fence storage error: redis error: " + err.Error()}
	}
	if values[0] == nil && values[1] == nil && values[2] == nil {
		return nil, nil
	}
	lock, _ := values[0].(string)
	token, terr := canonical(scope, "token", values[1], fence.TokenMax, 1)
	session, serr := canonical(scope, "session", values[2], ^uint64(0), 0)
	if values[0] == nil || terr != nil || serr != nil {
		return nil, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the fence hash lacks its lock, token or session, or holds a non-canonical one", scope)
	}
	return &fence.State{Lock: lock, TokenMax: token, HolderSession: session}, nil
}

func (f Fence) run(ctx context.Context, c goredis.Scripter, scope string, q sequencer.Verified, conditions []Condition, ops []Op, intent fence.Intent) ([]Reply, *CompareFailed, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return nil, nil, err
	}
	if len(ops) > OpsMax {
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: %d redis ops in one fenced request, the limit is %d", len(ops), OpsMax)
	}
	if len(conditions) > ConditionsMax {
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: %d conditions in one fenced request, the limit is %d", len(conditions), ConditionsMax)
	}
	prefix := f.prefix()
	keys := []string{f.FenceKey(scope)}
	// The script's session argument is "s" for a shared grant: it stores holder 0 and may only read.
	session := strconv.FormatUint(q.Session(), 10)
	if q.Access().Kind == sequencer.Shared {
		session = "s"
	}
	args := []any{q.Binding(), strconv.FormatUint(q.Token(), 10), session, prefix, strconv.Itoa(len(conditions))}
	for _, cond := range conditions {
		keys = append(keys, cond.key)
		args = append(args, cond.kind, cond.value)
	}
	for _, op := range ops {
		keys = append(keys, op.key)
		args = append(args, op.kind, op.value)
	}
	for _, key := range keys[1:] {
		if strings.HasPrefix(key, prefix) {
			return nil, nil, reserved(key)
		}
	}
	for i := 5; i < len(args); i += 2 {
		if v, _ := args[i+1].([]byte); len(v) > ValueBytesMax {
			return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: a value of %d bytes, the limit is %d", len(v), ValueBytesMax)
		}
	}
	// The expected binding and a shared write need no stored state: refused before Redis (the
	// script refuses a shared grant's write too, for every client).
	if err := fence.Precheck(f.ExpectLock, q, intent); err != nil {
		return nil, nil, err
	}
	reply, err := script.Run(ctx, c, keys, args...).Slice()
	if err != nil {
		return nil, nil, scriptFailure(err)
	}
	return decode(scope, q, ops, reply)
}

func text(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

func canonical(scope, field string, raw any, maximum, minimum uint64) (uint64, error) {
	s, _ := text(raw)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != s || n < minimum || n > maximum {
		return 0, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the stored %s %q is not a canonical decimal in range", scope, field, s)
	}
	return n, nil
}

func reserved(key string) error {
	return fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: key %q is under the fence key prefix, which holds the fences of every scope; nothing was written", key)
}

func unexpected(detail string) error {
	return fence.Errorf(fence.ErrOutcomeUnknown, "outcome unknown: unexpected reply from the fence script: %s", detail)
}

func decode(scope string, q sequencer.Verified, ops []Op, reply []any) ([]Reply, *CompareFailed, error) {
	if len(reply) == 0 {
		return nil, nil, unexpected("an empty reply")
	}
	field := func(i int) string {
		if i >= len(reply) {
			return ""
		}
		s, _ := text(reply[i])
		return s
	}
	index := func(i int) int {
		n, _ := strconv.Atoi(field(i))
		return n
	}
	switch field(0) {
	case "ok":
		pairs := reply[1:]
		if len(pairs) != 2*len(ops) {
			return nil, nil, unexpected(fmt.Sprintf("%d replies for %d ops", len(pairs)/2, len(ops)))
		}
		replies := make([]Reply, len(ops))
		for i := range ops {
			kind, _ := text(pairs[2*i])
			value := pairs[2*i+1]
			switch kind {
			case "done":
				replies[i].Done = true
			case "value":
				if s, ok := text(value); ok {
					replies[i].Value = []byte(s)
				}
			case "int":
				if n, ok := value.(int64); ok {
					replies[i].Int = n
					break
				}
				s, _ := text(value)
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return nil, nil, unexpected(fmt.Sprintf("op reply %v is not an integer", value))
				}
				replies[i].Int = n
			default:
				return nil, nil, unexpected(fmt.Sprintf("op reply %q %v", kind, value))
			}
		}
		return replies, nil, nil
	case "stale":
		accepted, err := canonical(scope, "token", reply[1], fence.TokenMax, 1)
		if err != nil {
			return nil, nil, err
		}
		holder, err := canonical(scope, "session", reply[2], ^uint64(0), 0)
		if err != nil {
			return nil, nil, err
		}
		if accepted <= q.Token() {
			return nil, nil, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: redis called the stored token %d newer than token %d", scope, accepted, q.Token())
		}
		return nil, nil, fence.Stale(q.Binding(), q.Token(), accepted, holder)
	case "token_reissued":
		accepted, err := canonical(scope, "token", reply[1], fence.TokenMax, 1)
		if err != nil {
			return nil, nil, err
		}
		first, err := canonical(scope, "session", reply[2], ^uint64(0), 0)
		if err != nil {
			return nil, nil, err
		}
		if accepted != q.Token() || first == fence.StoredHolder(q) {
			return nil, nil, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: redis called token %d of session %d a re-issue of token %d of session %d", scope, q.Token(), q.Session(), accepted, first)
		}
		return nil, nil, fence.TokenReissued(q.Binding(), accepted, first, q.Session())
	case "wrong_lock":
		return nil, nil, fence.WrongLock(field(1), q.Binding())
	case "shared_write":
		if q.Access().Kind != sequencer.Shared {
			return nil, nil, unexpected(fmt.Sprintf("redis called a write of a %s grant a shared write", q.Access()))
		}
		return nil, nil, fence.SharedWrite(q)
	case "corrupt":
		return nil, nil, fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: %s", scope, field(1))
	case "compare_failed":
		failed := &CompareFailed{Condition: index(1)}
		if s, ok := text(reply[min(2, len(reply)-1)]); ok && len(reply) > 2 {
			failed.Current = []byte(s)
		}
		return nil, failed, nil
	case "reserved_key":
		return nil, nil, reserved(field(1))
	case "wrong_type":
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: op %d needs key %q to hold a %s or not exist, but it holds a %s (after the ops before it); nothing was written", index(1), field(2), field(4), field(3))
	case "not_integer":
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: op %d increments key %q, which does not hold a 64-bit integer (after the ops before it); nothing was written", index(1), field(2))
	case "overflow":
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: op %d would take key %q beyond the 64-bit integer range; nothing was written", index(1), field(2))
	case "invalid":
		return nil, nil, fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: %s", field(1))
	}
	return nil, nil, unexpected(fmt.Sprintf("%v", reply))
}

// refusedCodes are errors Redis answers with instead of running a script.
var refusedCodes = map[string]bool{"NOSCRIPT": true, "LOADING": true, "TRYAGAIN": true, "CLUSTERDOWN": true, "MASTERDOWN": true, "READONLY": true,
	"CROSSSLOT": true, "MOVED": true, "ASK": true, "NOPERM": true, "BUSY": true, "OOM": true, "NOAUTH": true, "WRONGPASS": true, "MISCONF": true, "NOREPLICAS": true}

func scriptFailure(err error) error {
	message := err.Error()
	var redisErr goredis.Error
	refused := false
	if errors.As(err, &redisErr) {
		refused = refusedCodes[strings.SplitN(message, " ", 2)[0]]
	}
	lowered := strings.ToLower(message)
	if strings.Contains(lowered, "connection refused") || strings.Contains(lowered, "dial tcp") {
		refused = true
	}
	if refused {
		return &fence.Error{Kind: fence.ErrStorage, Cause: err, Message: "fence storage error: redis error: " + message}
	}
	return &fence.Error{Kind: fence.ErrOutcomeUnknown, Cause: err, Message: "outcome unknown: redis error after the fence script was sent: " + message +
		"; the write may or may not have been applied, read it back under a claim before retrying"}
}
