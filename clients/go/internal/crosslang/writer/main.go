// The Go writer of the cross-language test (crosslang_test.go): appends a line to one
// PostgreSQL row and one Redis list, each under its fence, with the grant in
// $PALISADE_SEQUENCER.
//
//	writer LINE   # env: PALISADE_SEQUENCER, PALISADE_PUBLIC_KEY, DATABASE_URL, REDIS_URL
//
// The same as palisade-fence's example crosslang_writer (Rust) and writer.py (Python). Exit
// status: 0 both written, 3 refused as stale (nothing written by this run), 1 anything else.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/fence/postgres"
	"example.invalid/palisade/clients/go/fence/redis"
	"example.invalid/palisade/clients/go/sequencer"
)

// scope is the fence scope, and the Redis key, every writer of the test shares.
const scope = "crosslang/report"

func main() {
	err := run()
	switch {
	case err == nil:
		fmt.Println("written")
	case errors.Is(err, fence.ErrStale):
		fmt.Fprintln(os.Stderr, "refused:", err)
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: writer LINE")
	}
	line := os.Args[1]
	ctx := context.Background()
	key, err := sequencer.ParsePublicKey(os.Getenv("PALISADE_PUBLIC_KEY"))
	if err != nil {
		return fmt.Errorf("PALISADE_PUBLIC_KEY: %w", err)
	}
	keys, err := sequencer.NewKeySet(key)
	if err != nil {
		return err
	}
	verified, err := fence.NewVerifier(keys).Verify(os.Getenv("PALISADE_SEQUENCER"))
	if err != nil {
		return err
	}

	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := postgres.Claim(ctx, tx, scope, verified, ""); err != nil {
		return err
	}
	body := line
	var stored string
	if err := tx.QueryRowContext(ctx, "SELECT body FROM crosslang WHERE name = 'report'").Scan(&stored); err == nil {
		body = stored + "\n" + line
	} else if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO crosslang (name, body) VALUES ('report', $1) "+
		"ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body", body); err != nil {
		return err
	}
	if err := postgres.Commit(tx); err != nil {
		return err
	}

	opts, err := goredis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := goredis.NewClient(opts)
	defer rdb.Close()
	_, err = redis.Fence{}.Write(ctx, rdb, scope, verified, redis.RPush(scope, []byte(line)))
	return err
}
