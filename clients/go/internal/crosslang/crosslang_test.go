// Package crosslang holds the cross-language proof: a Rust writer (palisade-fence's example
// crosslang_writer), a Python writer (writer.py, the palisade package's fence helpers) and a Go
// writer (writer/, this module's fence helpers) append to the same PostgreSQL row and the same
// Redis list under one Palisade lock of a real `palisade serve`, each run by `palisade lock --
// CMD`, which hands it the grant in $PALISADE_SEQUENCER.
//
// The writers are found as: the Rust one at $PALISADE_CROSSLANG_RUST_WRITER, else beside
// $PALISADE_BIN (examples/crosslang_writer, as `cargo test --workspace` builds it); the Python
// one run by $PALISADE_CROSSLANG_PYTHON, else clients/python/.venv/bin/python (the Python
// client's run-tests.sh makes it); the Go one built here. A missing one skips the test, saying
// so, unless PALISADE_TEST_REQUIRE_SERVER is set: then it fails.
package crosslang

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	palisade "example.invalid/palisade/clients/go"
	"example.invalid/palisade/clients/go/fence/postgres"
	"example.invalid/palisade/clients/go/fence/redis"
	"example.invalid/palisade/clients/go/internal/testserver"
)

// scope is the fence scope and the Redis key of the writers; lock is the Palisade lock.
const (
	scope = "crosslang/report"
	lock  = "crosslang"
	// stepTimeout bounds every process and every wait for a line of output.
	stepTimeout = 60 * time.Second
)

type writer struct {
	language string
	argv     []string
}

// missing skips the test, or fails it when PALISADE_TEST_REQUIRE_SERVER is set.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	message := fmt.Sprintf(format, args...)
	if os.Getenv("PALISADE_TEST_REQUIRE_SERVER") != "" {
		t.Fatalf("%s (PALISADE_TEST_REQUIRE_SERVER is set)", message)
	}
	t.Skip("skipping: " + message)
}

func writers(t *testing.T, bin string) []writer {
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)

	rust := os.Getenv("PALISADE_CROSSLANG_RUST_WRITER")
	if rust == "" {
		rust = filepath.Join(filepath.Dir(bin), "examples", "crosslang_writer")
	}
	if _, err := os.Stat(rust); err != nil {
		missing(t, "no Rust writer at %s (cargo build -p palisade-fence --example crosslang_writer)", rust)
	}
	python := os.Getenv("PALISADE_CROSSLANG_PYTHON")
	if python == "" {
		python = filepath.Join(dir, "..", "..", "..", "python", ".venv", "bin", "python")
	}
	if out, err := exec.Command(python, "-c", "import palisade.fence.redis, psycopg, redis").CombinedOutput(); err != nil {
		missing(t, "no Python with the palisade package, psycopg and redis at %s (clients/python/run-tests.sh makes it): %v %s",
			python, err, out)
	}
	goWriter := filepath.Join(t.TempDir(), "writer")
	build := exec.Command("go", "build", "-o", goWriter, "./writer")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./writer: %v\n%s", err, out)
	}
	return []writer{
		{"rust", []string{rust}},
		{"python", []string{python, filepath.Join(dir, "writer.py")}},
		{"go", []string{goWriter}},
	}
}

// TestStaleWritersOfEveryLanguageAreRefused: each writer writes once; then, for each language,
// a `palisade lock` holding the lock for that language's writer is frozen (SIGSTOP) past its
// one-second lease, the next language's writer takes the lock and writes, the frozen holder's
// writer writes with its old grant and is refused, and the holder is continued (SIGCONT). The
// row and the list end as exactly the acknowledged writes, in order.
func TestStaleWritersOfEveryLanguageAreRefused(t *testing.T) {
	dsn, redisURL := os.Getenv("PALISADE_TEST_POSTGRES"), os.Getenv("PALISADE_TEST_REDIS")
	if dsn == "" || redisURL == "" {
		t.Skip("skipping: PALISADE_TEST_POSTGRES and PALISADE_TEST_REDIS are both needed")
	}
	bin := testserver.Binary(t)
	all := writers(t, bin)
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*stepTimeout)
	defer cancel()

	client, err := palisade.New(ctx, palisade.Config{Endpoints: []string{server.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	keys, err := client.PublicKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	publicKey := keys.Keys()[len(keys.Keys())-1].String()

	// A fresh server's tokens start low again: forget what earlier runs left.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, statement := range []string{postgres.CreateTableSQL,
		"CREATE TABLE IF NOT EXISTS crosslang (name text PRIMARY KEY, body text NOT NULL)",
		"DELETE FROM crosslang", "DELETE FROM palisade_fence WHERE scope = '" + scope + "'"} {
		if _, err := db.ExecContext(ctx, statement); err != nil {
			t.Fatal(err)
		}
	}
	options, err := goredis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(options)
	defer rdb.Close()
	if err := rdb.Del(ctx, scope, redis.Fence{}.FenceKey(scope)).Err(); err != nil {
		t.Fatal(err)
	}

	env := append(os.Environ(), "PALISADE_ENDPOINT="+server.Endpoint, "PALISADE_PUBLIC_KEY="+publicKey,
		"DATABASE_URL="+dsn, "REDIS_URL="+redisURL)
	var acknowledged []string
	// write runs w under `palisade lock` until it exits; it must be acknowledged.
	write := func(w writer, line string) {
		t.Helper()
		args := append([]string{"lock", lock, "--ttl", "5s", "--wait", "30s", "--"}, w.argv...)
		cmd := exec.CommandContext(ctx, bin, append(args, line)...)
		cmd.Env = env
		cmd.WaitDelay = stepTimeout
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the %s writer under palisade lock: %v\n%s", w.language, err, out)
		}
		acknowledged = append(acknowledged, line)
	}
	for _, w := range all {
		write(w, w.language+" writes")
	}
	for i, stale := range all {
		newer := all[(i+1)%len(all)]
		frozen := startFrozen(t, ctx, bin, env, stale)
		write(newer, fmt.Sprintf("%s writes while the %s holder is frozen", newer.language, stale.language))
		status, stderr := frozen.writeLate(t)
		if status != "3" || !strings.Contains(stderr, "stale") {
			t.Fatalf("the frozen %s writer's late write: exit %s, want 3 (refused as stale)\n%s", stale.language, status, stderr)
		}
	}

	var body string
	if err := db.QueryRowContext(ctx, "SELECT body FROM crosslang WHERE name = 'report'").Scan(&body); err != nil {
		t.Fatal(err)
	}
	if rows := strings.Split(body, "\n"); !slices.Equal(rows, acknowledged) {
		t.Errorf("the PostgreSQL row: %q, want the acknowledged writes %q", rows, acknowledged)
	}
	list, err := rdb.LRange(ctx, scope, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(list, acknowledged) {
		t.Errorf("the Redis list: %q, want the acknowledged writes %q", list, acknowledged)
	}
}

// frozenHolder is a `palisade lock` (one-second lease) stopped with SIGSTOP while its command,
// a shell in front of a writer, waits for a line on stdin before it runs the writer.
type frozenHolder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
}

// startFrozen starts the holder, waits for its grant, and freezes it.
func startFrozen(t *testing.T, ctx context.Context, bin string, env []string, w writer) *frozenHolder {
	t.Helper()
	script := `echo "granted $PALISADE_TOKEN"; read go; "$@"; echo "exit $?"`
	args := append([]string{"lock", lock, "--ttl", "1s", "--wait", "30s", "--", "sh", "-c", script, "sh"}, w.argv...)
	cmd := exec.CommandContext(ctx, bin, append(args, w.language+" writes late")...)
	cmd.Env = env
	cmd.WaitDelay = stepTimeout
	h := &frozenHolder{cmd: cmd, lines: make(chan string, 16), stderr: &lockedBuffer{}}
	cmd.Stderr = h.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			h.lines <- scanner.Text()
		}
		close(h.lines)
	}()
	if line := h.next(t, "granted "); line == "" {
		t.Fatalf("the %s holder got no grant\n%s", w.language, h.stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return h
}

// next is the next line of output starting with prefix, skipping others; "" if the output ends
// or stepTimeout passes first.
func (h *frozenHolder) next(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(stepTimeout)
	for range 1000 {
		select {
		case line, ok := <-h.lines:
			if !ok {
				return ""
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			return ""
		}
	}
	return ""
}

// writeLate lets the writer write with its old grant while `palisade lock` is still frozen (so
// that it cannot stop the writer first), then continues the holder and waits for it to exit.
// It returns the writer's exit status and the holder's stderr (the writer's included).
func (h *frozenHolder) writeLate(t *testing.T) (string, string) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	status := strings.TrimPrefix(h.next(t, "exit "), "exit ")
	if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	_ = h.stdin.Close()
	_ = h.cmd.Wait() // lost its lock (76) or passes the writer's status on: either is fine here
	return status, h.stderr.String()
}

// lockedBuffer is a bytes.Buffer written by exec's copying goroutine and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
