// Runs the example (which the README shows) against a real palisade serve and PostgreSQL.
package main

import (
	"bytes"
	"database/sql"
	"os"
	"os/exec"
	"strings"
	"testing"

	"example.invalid/palisade/clients/go/fence/postgres"
	"example.invalid/palisade/clients/go/internal/testserver"
)

func TestTheExampleRefusesTheLateWrite(t *testing.T) {
	dsn := os.Getenv("PALISADE_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("skipping: PALISADE_TEST_POSTGRES is not set")
	}
	server := testserver.Start(t)
	binary := t.TempDir() + "/example"
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// A fresh server's tokens start low again: forget what earlier runs left in the database.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, statement := range []string{"DROP TABLE IF EXISTS reports", postgres.CreateTableSQL,
		"DELETE FROM palisade_fence WHERE scope = 'reports/nightly'"} {
		if _, err := db.Exec(statement); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), "PALISADE_ENDPOINT="+server.Endpoint, "DATABASE_URL="+dsn)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the example failed: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "refused: stale sequencer for lock \"reports/nightly\"") {
		t.Fatalf("the example's output:\n%s", out.String())
	}
}
