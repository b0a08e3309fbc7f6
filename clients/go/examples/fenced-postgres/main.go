// Takes a lock, appends a line to a PostgreSQL row fenced by the Go fence helper, and is refused
// when it writes again with its old grant after a newer holder wrote. Needs a running
// `palisade serve` (PALISADE_ENDPOINT, default 127.0.0.1:7457) and DATABASE_URL.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/fence/postgres"
)

func main() {
	ctx := context.Background()
	endpoints := strings.Split(cmp(os.Getenv("PALISADE_ENDPOINT"), "127.0.0.1:7457"), ",")
	client, err := palisade.New(ctx, palisade.Config{Endpoints: endpoints})
	check(err)
	defer client.Close()
	keys, err := client.PublicKeys(ctx) // what `palisade pubkey` prints, fetched once
	check(err)
	verifier := fence.NewVerifier(keys)
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	check(err)
	check(postgres.EnsureSchema(ctx, db))
	_, err = db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS reports (name text PRIMARY KEY, body text NOT NULL)")
	check(err)

	// Claim first (refused if a newer grant claimed), then read, then write: one transaction.
	appendLine := func(presented, line string) error {
		verified, err := verifier.Verify(presented)
		if err != nil {
			return err
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := postgres.Claim(ctx, tx, "reports/nightly", verified, ""); err != nil {
			return err
		}
		var body string
		if err := tx.QueryRowContext(ctx, "SELECT body FROM reports WHERE name = 'nightly'").Scan(&body); err == nil {
			line = body + "\n" + line
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO reports (name, body) VALUES ('nightly', $1) "+
			"ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body", line); err != nil {
			return err
		}
		return postgres.Commit(tx)
	}

	hold := func(write func(m *palisade.Mutex) error) {
		session, err := client.NewSession(ctx)
		check(err)
		defer session.Close(ctx)
		m := session.Mutex("reports/nightly")
		check(m.Lock(ctx))
		defer m.Unlock(ctx)
		check(write(m))
	}
	var old string
	hold(func(m *palisade.Mutex) error {
		old = m.Sequencer() // kept past the release, as a paused holder would
		return appendLine(m.Sequencer(), fmt.Sprintf("written with token %d", m.Token()))
	})
	hold(func(m *palisade.Mutex) error {
		return appendLine(m.Sequencer(), fmt.Sprintf("written with token %d", m.Token()))
	})
	if err := appendLine(old, "a late write with the old grant"); errors.Is(err, fence.ErrStale) {
		fmt.Println("refused:", err)
	} else {
		log.Fatalf("the late write was not refused: %v", err)
	}
}

func cmp(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
