// Tests of the fence helpers against the real PostgreSQL, MariaDB and Redis of
// PALISADE_TEST_POSTGRES, PALISADE_TEST_MYSQL and PALISADE_TEST_REDIS; a test whose variable is
// unset is skipped, saying so.
package fence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
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
	db    *sql.DB
	claim func(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string) error
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
	return sqlBackend{db, mysql.Claim}
}

func TestSQLFences(t *testing.T) {
	for name, backend := range map[string]func(*testing.T) sqlBackend{"postgres": postgresBackend, "mysql": mysqlBackend} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			t.Run("an older or reissued token is refused once a newer one claimed", func(t *testing.T) { claimsAreOrdered(t, b) })
			t.Run("an older claimer waiting behind a newer one is refused when it commits", func(t *testing.T) { concurrentClaims(t, b) })
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

func TestRedisFence(t *testing.T) {
	options, err := goredis.ParseURL(env(t, "PALISADE_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(options)
	defer c.Close()
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
	if _, err := fence.Check(nil, "", sequencer.Verified{}); !errors.Is(err, fence.ErrMissing) {
		t.Errorf("the zero Verified: %v", err)
	}
}
