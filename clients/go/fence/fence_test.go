// Tests of the fence helpers against the real PostgreSQL, MariaDB and Redis of
// PALISADE_TEST_POSTGRES, PALISADE_TEST_MYSQL and PALISADE_TEST_REDIS; a test whose variable is
// unset is skipped, saying so.
package fence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/fence/mysql"
	"example.invalid/palisade/clients/go/fence/postgres"
	fenceredis "example.invalid/palisade/clients/go/fence/redis"
	"example.invalid/palisade/clients/go/internal/testsign"
	"example.invalid/palisade/clients/go/sequencer"
)

func unique(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b)
}

func env(t *testing.T, name string) string {
	value := os.Getenv(name)
	if value == "" {
		t.Skipf("skipping: %s is not set", name)
	}
	return value
}

// sqlBackend is what the PostgreSQL and MySQL tests share.
type sqlBackend struct {
	db        *sql.DB
	claim     func(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string) error
	claimWith func(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string, intent fence.Intent) error
}

func postgresBackend(t *testing.T) sqlBackend {
	db, err := sql.Open("pgx", env(t, "PALISADE_TEST_POSTGRES"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := postgres.EnsureSchema(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return sqlBackend{db, func(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string) error {
		return postgres.Claim(ctx, tx, scope, q, expectLock)
	}, func(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string, intent fence.Intent) error {
		return postgres.ClaimWith(ctx, tx, scope, q, expectLock, intent)
	}}
}

func mysqlBackend(t *testing.T) sqlBackend {
	u, err := url.Parse(env(t, "PALISADE_TEST_MYSQL"))
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	dsn := u.User.Username() + ":" + password + "@tcp(" + u.Host + ")" + u.Path
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := mysql.EnsureSchema(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return sqlBackend{db, mysql.Claim, mysql.ClaimWith}
}

func TestSQLFences(t *testing.T) {
	for name, backend := range map[string]func(*testing.T) sqlBackend{"postgres": postgresBackend, "mysql": mysqlBackend} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			t.Run("an older or reissued token is refused once a newer one claimed", func(t *testing.T) { claimsAreOrdered(t, b) })
			t.Run("an older claimer waiting behind a newer one is refused when it commits", func(t *testing.T) { concurrentClaims(t, b) })
			t.Run("readers of a phase claim, never write, and are stale once a writer claimed", func(t *testing.T) { sharedPhase(t, b) })
			t.Run("each slot of a semaphore keeps a maximum of its own", func(t *testing.T) { slots(t, b) })
		})
	}
}

func claimOnce(t *testing.T, b sqlBackend, scope string, q sequencer.Verified) error {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.claim(ctx, tx, scope, q, ""); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func claimsAreOrdered(t *testing.T, b sqlBackend) {
	scope := unique(t)
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 5, 1)); err != nil {
		t.Fatal(err)
	}
	err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 4, 2))
	var ferr *fence.Error
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &ferr) || ferr.Accepted != 5 || ferr.HolderSession != 1 || !ferr.Rejection() {
		t.Fatalf("an older token: %v", err)
	}
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 5, 3)); !errors.Is(err, fence.ErrTokenReissued) {
		t.Fatalf("the accepted token from another session: %v", err)
	}
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/b", 9, 1)); !errors.Is(err, fence.ErrWrongLock) {
		t.Fatalf("another lock's sequencer: %v", err)
	}
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 5, 1)); err != nil {
		t.Fatalf("the same grant again: %v", err)
	}
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 6, 2)); err != nil {
		t.Fatalf("a newer token: %v", err)
	}
	if err := claimOnce(t, b, unique(t), testsign.Sign(t, "jobs/b", 1, 1)); err != nil {
		t.Fatalf("a first claim: %v", err)
	}
	ctx := context.Background()
	tx, _ := b.db.BeginTx(ctx, nil)
	defer tx.Rollback()
	if err := b.claim(ctx, tx, unique(t), testsign.Sign(t, "jobs/b", 1, 1), "jobs/c"); !errors.Is(err, fence.ErrWrongLock) {
		t.Fatalf("a first claim of a lock not expected: %v", err)
	}
}

func claimWith(t *testing.T, b sqlBackend, scope string, q sequencer.Verified, intent fence.Intent) error {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.claimWith(ctx, tx, scope, q, "", intent); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func sharedPhase(t *testing.T, b sqlBackend) {
	scope := unique(t)
	read, write := fence.IntentRead, fence.IntentWrite
	for session := uint64(1); session <= 2; session++ {
		if err := claimWith(t, b, scope, testsign.Shared(t, "rw", 5, session), read); err != nil {
			t.Fatalf("reader %d of the phase: %v", session, err)
		}
	}
	if err := claimOnce(t, b, scope, testsign.Shared(t, "rw", 5, 1)); !errors.Is(err, fence.ErrSharedWrite) {
		t.Fatalf("a reader's Claim (a transaction that writes): %v", err)
	}
	if err := claimWith(t, b, scope, testsign.Sign(t, "rw", 5, 1), write); !errors.Is(err, fence.ErrTokenReissued) {
		t.Fatalf("the phase's token from an exclusive grant: %v", err)
	}
	if err := claimWith(t, b, scope, testsign.Sign(t, "rw", 6, 3), write); err != nil {
		t.Fatalf("the writer after the phase: %v", err)
	}
	if err := claimWith(t, b, scope, testsign.Shared(t, "rw", 5, 2), read); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a reader of the earlier phase after the writer: %v", err)
	}
	if err := claimWith(t, b, scope, testsign.Shared(t, "rw", 7, 4), read); err != nil {
		t.Fatalf("a reader of the next phase: %v", err)
	}
	if err := claimWith(t, b, scope, testsign.Sign(t, "rw", 6, 3), write); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the writer after the next phase: %v", err)
	}
}

func slots(t *testing.T, b sqlBackend) {
	scope0, scope1 := unique(t), unique(t)
	if err := claimOnce(t, b, scope0, testsign.Permit(t, "shards", 0, 9, 1)); err != nil {
		t.Fatalf("slot 0: %v", err)
	}
	if err := claimOnce(t, b, scope1, testsign.Permit(t, "shards", 1, 3, 2)); err != nil {
		t.Fatalf("slot 1, an older token on its own scope: %v", err)
	}
	err := claimOnce(t, b, scope0, testsign.Permit(t, "shards", 1, 10, 2))
	if !errors.Is(err, fence.ErrWrongLock) || !strings.Contains(err.Error(), "shards (slot 0)") {
		t.Fatalf("slot 1 on slot 0's scope: %v", err)
	}
	if err := claimOnce(t, b, scope0, testsign.Sign(t, "shards", 10, 2)); !errors.Is(err, fence.ErrWrongLock) {
		t.Fatalf("an exclusive grant of the lock on a slot's scope: %v", err)
	}
	if err := claimOnce(t, b, scope0, testsign.Permit(t, "shards", 0, 8, 3)); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("slot 0's superseded holder: %v", err)
	}
	if err := claimOnce(t, b, scope0, testsign.Permit(t, "shards", 0, 9, 1)); err != nil {
		t.Fatalf("slot 0's holder again: %v", err)
	}
	ctx := context.Background()
	tx, _ := b.db.BeginTx(ctx, nil)
	defer tx.Rollback()
	if err := b.claim(ctx, tx, unique(t), testsign.Permit(t, "shards", 1, 1, 1), "shards"+sequencer.SlotSeparator+"0"); !errors.Is(err, fence.ErrWrongLock) {
		t.Fatalf("a first claim of a slot not expected: %v", err)
	}
}

func concurrentClaims(t *testing.T, b sqlBackend) {
	scope := unique(t)
	ctx := context.Background()
	if err := claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 1, 1)); err != nil {
		t.Fatal(err)
	}
	newer, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.claim(ctx, newer, scope, testsign.Sign(t, "jobs/a", 10, 10), ""); err != nil {
		t.Fatal(err)
	}
	older := make(chan error, 1)
	go func() { older <- claimOnce(t, b, scope, testsign.Sign(t, "jobs/a", 9, 9)) }()
	select {
	case err := <-older:
		t.Fatalf("the older claim did not wait for the newer one's row: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := newer.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-older; !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the older claim after the newer committed: %v", err)
	}
}

func redisClient(t *testing.T) *goredis.Client {
	options, err := goredis.ParseURL(env(t, "PALISADE_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(options)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestRedisFence(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	scope, key := unique(t), unique(t)+":value"
	f := fenceredis.Fence{}
	replies, err := f.Write(ctx, c, scope, testsign.Sign(t, "jobs/r", 7, 1), fenceredis.Set(key, []byte("seven")), fenceredis.IncrBy(key+":n", 2), fenceredis.Get(key))
	if err != nil {
		t.Fatal(err)
	}
	if !replies[0].Done || replies[1].Int != 2 || string(replies[2].Value) != "seven" {
		t.Fatalf("replies: %+v", replies)
	}
	_, err = f.Write(ctx, c, scope, testsign.Sign(t, "jobs/r", 6, 2), fenceredis.Set(key, []byte("six")))
	var ferr *fence.Error
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &ferr) || ferr.Accepted != 7 {
		t.Fatalf("an older writer: %v", err)
	}
	if value, _ := c.Get(ctx, key).Result(); value != "seven" {
		t.Fatalf("the stale write was applied: %q", value)
	}
	if _, err := f.Write(ctx, c, scope, testsign.Sign(t, "jobs/r", 7, 3), fenceredis.Set(key, []byte("x"))); !errors.Is(err, fence.ErrTokenReissued) {
		t.Fatalf("a reissued token: %v", err)
	}
	if _, err := f.Write(ctx, c, scope, testsign.Sign(t, "jobs/r", 8, 1), fenceredis.Set(f.FenceKey("other"), nil)); !errors.Is(err, fence.ErrInvalidRequest) {
		t.Fatalf("a write to a fence hash: %v", err)
	}
	_, failed, err := f.WriteIf(ctx, c, scope, testsign.Sign(t, "jobs/r", 8, 1), []fenceredis.Condition{fenceredis.Equals(key, []byte("eight"))}, fenceredis.Set(key, []byte("nine")))
	if err != nil || failed == nil || failed.Condition != 0 || string(failed.Current) != "seven" {
		t.Fatalf("a failed condition: %+v %v", failed, err)
	}
	values, err := f.Read(ctx, c, scope, testsign.Sign(t, "jobs/r", 8, 1), key, key+":missing")
	if err != nil || string(values[0]) != "seven" || values[1] != nil {
		t.Fatalf("a fenced read: %q %v", values, err)
	}
	state, err := f.State(ctx, c, scope)
	if err != nil || state == nil || state.TokenMax != 8 || state.Lock != "jobs/r" || state.HolderSession != 1 {
		t.Fatalf("state: %+v %v", state, err)
	}
}

func TestTheVerifierRefusesWhatIsMissingMalformedOrForged(t *testing.T) {
	v := fence.NewVerifier(testsign.Keys(t))
	good := testsign.Sign(t, "a", 1, 1)
	if got, err := v.Verify(" " + good.Text() + "\n"); err != nil || got.Token() != 1 {
		t.Fatal(got, err)
	}
	for presented, kind := range map[string]error{"": fence.ErrMissing, "pal2.x": fence.ErrMalformed, good.Text()[:len(good.Text())-2] + "AA": fence.ErrForged} {
		if _, err := v.Verify(presented); !errors.Is(err, kind) {
			t.Errorf("%q: %v, want %v", presented, err, kind)
		}
	}
	if _, err := fence.Check(nil, "", sequencer.Verified{}, fence.IntentRead); !errors.Is(err, fence.ErrMissing) {
		t.Errorf("the zero Verified: %v", err)
	}
}

// The rule with intent, pure: the shared phase's holder 0, a reader's write, slot bindings.
func TestTheRuleWithIntent(t *testing.T) {
	read, write := fence.IntentRead, fence.IntentWrite
	phase, err := fence.Check(nil, "", testsign.Shared(t, "rw", 5, 1), read)
	if err != nil || phase != (fence.State{Lock: "rw", TokenMax: 5, HolderSession: 0}) {
		t.Fatalf("a reader's first claim: %+v %v", phase, err)
	}
	if next, err := fence.Check(&phase, "", testsign.Shared(t, "rw", 5, 2), read); err != nil || next != phase {
		t.Fatalf("another reader of the phase: %+v %v", next, err)
	}
	for _, accepted := range []*fence.State{nil, &phase} {
		_, err := fence.Check(accepted, "", testsign.Shared(t, "rw", 5, 1), write)
		var ferr *fence.Error
		if !errors.Is(err, fence.ErrSharedWrite) || !errors.As(err, &ferr) || !ferr.Rejection() || !strings.Contains(err.Error(), "acquire the lock exclusive") {
			t.Fatalf("a reader's write on %+v: %v", accepted, err)
		}
	}
	if _, err := fence.Check(&phase, "", testsign.Sign(t, "rw", 5, 1), write); !errors.Is(err, fence.ErrTokenReissued) || !strings.Contains(err.Error(), "the readers of a shared phase") {
		t.Fatalf("the phase's token, exclusive: %v", err)
	}
	writer, err := fence.Check(&phase, "", testsign.Sign(t, "rw", 6, 3), write)
	if err != nil || writer != (fence.State{Lock: "rw", TokenMax: 6, HolderSession: 3}) {
		t.Fatalf("the writer after the phase: %+v %v", writer, err)
	}
	if _, err := fence.Check(&writer, "", testsign.Shared(t, "rw", 5, 2), read); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a reader of the earlier phase: %v", err)
	}
	if _, err := fence.Check(&writer, "", testsign.Shared(t, "rw", 6, 2), read); !errors.Is(err, fence.ErrTokenReissued) {
		t.Fatalf("the writer's token, shared: %v", err)
	}
	if _, err := fence.Check(&phase, "", testsign.Shared(t, "rw", 4, 2), read); !errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "set by a shared phase's readers") {
		t.Fatalf("an older reader: %v", err)
	}
	slot, err := fence.Check(nil, "shards\x1f2", testsign.Permit(t, "shards", 2, 4, 1), write)
	if err != nil || slot != (fence.State{Lock: "shards\x1f2", TokenMax: 4, HolderSession: 1}) {
		t.Fatalf("a permit's first write: %+v %v", slot, err)
	}
	for _, other := range []sequencer.Verified{testsign.Permit(t, "shards", 1, 9, 1), testsign.Sign(t, "shards", 9, 1), testsign.Shared(t, "shards", 9, 1)} {
		if _, err := fence.Check(&slot, "", other, read); !errors.Is(err, fence.ErrWrongLock) || !strings.Contains(err.Error(), `"shards (slot 2)"`) {
			t.Fatalf("%v on slot 2's scope: %v", other.Access(), err)
		}
	}
	if _, err := fence.Check(nil, "shards", testsign.Permit(t, "shards", 2, 4, 1), read); !errors.Is(err, fence.ErrWrongLock) {
		t.Fatalf("a permit where the lock is expected: %v", err)
	}
}

func TestRedisFenceReadersAndSlots(t *testing.T) {
	c := redisClient(t)
	ctx := context.Background()
	scope, slotScope, key := unique(t), unique(t), unique(t)+":value"
	f := fenceredis.Fence{}
	if _, err := f.Write(ctx, c, scope, testsign.Sign(t, "rw", 4, 9), fenceredis.Set(key, []byte("v4"))); err != nil {
		t.Fatal(err)
	}
	for session := uint64(1); session <= 2; session++ {
		if values, err := f.Read(ctx, c, scope, testsign.Shared(t, "rw", 5, session), key); err != nil || string(values[0]) != "v4" {
			t.Fatalf("reader %d: %q %v", session, values, err)
		}
	}
	if state, err := f.State(ctx, c, scope); err != nil || *state != (fence.State{Lock: "rw", TokenMax: 5, HolderSession: 0}) {
		t.Fatalf("the phase's state: %+v %v", state, err)
	}
	reader := testsign.Shared(t, "rw", 5, 1)
	if _, err := f.Write(ctx, c, scope, reader, fenceredis.Set(key, []byte("a reader's write"))); !errors.Is(err, fence.ErrSharedWrite) {
		t.Fatalf("a reader's write: %v", err)
	}
	if _, _, err := f.WriteIf(ctx, c, scope, reader, []fenceredis.Condition{fenceredis.Absent(key)}, fenceredis.Get(key)); !errors.Is(err, fence.ErrSharedWrite) {
		t.Fatalf("a reader's compare-and-set: %v", err)
	}
	if _, err := f.Write(ctx, c, scope, testsign.Sign(t, "rw", 5, 1), fenceredis.Set(key, []byte("x"))); !errors.Is(err, fence.ErrTokenReissued) {
		t.Fatalf("the phase's token, exclusive: %v", err)
	}
	if _, err := f.Write(ctx, c, scope, testsign.Sign(t, "rw", 6, 3), fenceredis.Set(key, []byte("v6"))); err != nil {
		t.Fatalf("the writer after the phase: %v", err)
	}
	if _, err := f.Read(ctx, c, scope, testsign.Shared(t, "rw", 5, 2), key); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a reader of the earlier phase: %v", err)
	}
	if _, err := f.Write(ctx, c, slotScope, testsign.Permit(t, "shards", 3, 2, 1), fenceredis.Get(key)); err != nil {
		t.Fatalf("a permit: %v", err)
	}
	if state, err := f.State(ctx, c, slotScope); err != nil || *state != (fence.State{Lock: "shards\x1f3", TokenMax: 2, HolderSession: 1}) {
		t.Fatalf("the slot's state: %+v %v", state, err)
	}
	if _, err := f.Write(ctx, c, slotScope, testsign.Permit(t, "shards", 4, 9, 1), fenceredis.Get(key)); !errors.Is(err, fence.ErrWrongLock) || !strings.Contains(err.Error(), "shards (slot 3)") {
		t.Fatalf("another slot's permit: %v", err)
	}
	c.Del(ctx, key, f.FenceKey(scope), f.FenceKey(slotScope))
}

// Every case of the shared rule vectors (spec/fence/v1), which the Rust crate and the Python
// fence run too, through the pure Check.
func TestEveryFenceRuleVector(t *testing.T) {
	type stateJSON struct {
		Lock          string `json:"lock"`
		TokenMax      uint64 `json:"token_max"`
		HolderSession uint64 `json:"holder_session"`
	}
	type ruleCase struct {
		Description     string     `json:"description"`
		Accepted        *stateJSON `json:"accepted"`
		ExpectedBinding *string    `json:"expected_binding"`
		Presented       struct {
			Access  string `json:"access"`
			Slot    uint32 `json:"slot"`
			Lock    string `json:"lock"`
			Token   uint64 `json:"token"`
			Session uint64 `json:"session"`
		} `json:"presented"`
		Intent string `json:"intent"`
		Expect struct {
			Result string     `json:"result"`
			State  *stateJSON `json:"state"`
			Kind   string     `json:"kind"`
		} `json:"expect"`
	}
	paths, err := filepath.Glob("../../../spec/fence/v1/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rule vectors: %v", err)
	}
	total := 0
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var file struct {
			Cases []ruleCase `json:"cases"`
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, c := range file.Cases {
			total++
			t.Run(filepath.Base(path)+"/"+c.Description, func(t *testing.T) {
				access, known := map[string]sequencer.Access{
					"exclusive": {Kind: sequencer.Exclusive},
					"shared":    {Kind: sequencer.Shared},
					"slot":      {Kind: sequencer.Slot, Slot: c.Presented.Slot},
				}[c.Presented.Access]
				intent, knownIntent := map[string]fence.Intent{"read": fence.IntentRead, "write": fence.IntentWrite}[c.Intent]
				if !known || !knownIntent {
					t.Fatalf("unknown access %q or intent %q", c.Presented.Access, c.Intent)
				}
				q := testsign.SignAccess(t, c.Presented.Lock, access, c.Presented.Token, c.Presented.Session)
				var accepted *fence.State
				if c.Accepted != nil {
					accepted = &fence.State{Lock: c.Accepted.Lock, TokenMax: c.Accepted.TokenMax, HolderSession: c.Accepted.HolderSession}
				}
				expected := ""
				if c.ExpectedBinding != nil {
					expected = *c.ExpectedBinding
				}
				next, err := fence.Check(accepted, expected, q, intent)
				switch c.Expect.Result {
				case "accepted":
					want := c.Expect.State
					if err != nil || want == nil || next != (fence.State{Lock: want.Lock, TokenMax: want.TokenMax, HolderSession: want.HolderSession}) {
						t.Fatalf("got %+v %v, want %+v", next, err, want)
					}
				case "refused":
					var ferr *fence.Error
					if !errors.As(err, &ferr) || ferr.Kind.Error() != c.Expect.Kind || !ferr.Rejection() {
						t.Fatalf("got %+v %v, want a refusal %s", next, err, c.Expect.Kind)
					}
				default:
					t.Fatalf("unknown result %q", c.Expect.Result)
				}
			})
		}
	}
	if total < 40 {
		t.Fatalf("only %d rule vectors", total)
	}
}
