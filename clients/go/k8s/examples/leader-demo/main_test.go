// Runs the demo as real processes against a real palisade serve and PostgreSQL: two candidates,
// kill -9 of the leader's process, the other leads with a higher epoch, and a late write with the
// dead leader's sequencer is refused by the fence. The processes are this test binary run as the
// demo (TestMain), which spares a second link of client-go.
package main

import (
	"bufio"
	"database/sql"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"example.invalid/palisade/clients/go/fence/postgres"
	"example.invalid/palisade/clients/go/internal/testserver"
)

// asDemo in the environment runs the test binary as the demo itself, with its arguments.
const asDemo = "LEADER_DEMO_AS_DEMO"

func TestMain(m *testing.M) {
	if os.Getenv(asDemo) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// candidate is one running demo process and the lines it has printed so far.
type candidate struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func start(t *testing.T, binary string, env []string, args ...string) *candidate {
	t.Helper()
	c := &candidate{cmd: exec.Command(binary, args...), added: make(chan struct{}, 1)}
	c.cmd.Env = env
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stderr = c.cmd.Stdout
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, scanner.Text())
			c.mu.Unlock()
			select {
			case c.added <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() {
			t.Logf("%s printed:\n%s", strings.Join(args, " "), c.output())
		}
	})
	return c
}

func (c *candidate) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// await is the submatches of the first line from index from on that matches pattern.
func (c *candidate) await(t *testing.T, pattern *regexp.Regexp, from int, within time.Duration) ([]string, int) {
	t.Helper()
	deadline := time.After(within)
	for {
		c.mu.Lock()
		for i := from; i < len(c.lines); i++ {
			if m := pattern.FindStringSubmatch(c.lines[i]); m != nil {
				c.mu.Unlock()
				return m, i
			}
		}
		c.mu.Unlock()
		select {
		case <-c.added:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no line matching %q within %v", pattern, within)
		}
	}
}

func (c *candidate) printed(pattern *regexp.Regexp) bool {
	return pattern.MatchString(c.output())
}

var (
	leading = regexp.MustCompile(`: leading with epoch (\d+) sequencer (\S+)$`)
	wrote   = regexp.MustCompile(`: wrote row (\d+) with epoch (\d+)$`)
)

func TestKillingTheLeaderHandsOverToAHigherEpochAndItsLateWriteIsRefused(t *testing.T) {
	dsn := os.Getenv("PALISADE_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("skipping: PALISADE_TEST_POSTGRES is not set")
	}
	server := testserver.Start(t)
	binary, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A fresh server's tokens start low again: forget what earlier runs left in the database.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, statement := range []string{"DROP TABLE IF EXISTS leader_demo", postgres.CreateTableSQL,
		"DELETE FROM palisade_fence WHERE scope = 'leader-demo'"} {
		if _, err := db.Exec(statement); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), asDemo+"=1", "PALISADE_ENDPOINT="+server.Endpoint, "DATABASE_URL="+dsn)

	a := start(t, binary, env, "-id", "pod-a", "-ttl", "2s", "-every", "100ms")
	led, _ := a.await(t, leading, 0, 15*time.Second)
	oldEpoch, oldSequencer := led[1], led[2]
	_, at := a.await(t, wrote, 0, 10*time.Second)
	b := start(t, binary, env, "-id", "pod-b", "-ttl", "2s", "-every", "100ms")
	b.await(t, regexp.MustCompile(`campaigning`), 0, 10*time.Second)
	a.await(t, wrote, at+5, 10*time.Second) // pod-a goes on writing while pod-b campaigns
	if b.printed(leading) {
		t.Fatal("pod-b leads while pod-a holds the lock")
	}

	if err := a.cmd.Process.Kill(); err != nil { // kill -9
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	led, _ = b.await(t, leading, 0, 15*time.Second)
	newEpoch, _ := strconv.ParseUint(led[1], 10, 64)
	if old, _ := strconv.ParseUint(oldEpoch, 10, 64); newEpoch <= old {
		t.Fatalf("the next leader's epoch %d is not above the dead leader's %d", newEpoch, old)
	}
	b.await(t, wrote, 0, 10*time.Second)

	late := exec.Command(binary, "-id", "pod-a", "-late-write", oldSequencer)
	late.Env = env
	out, err := late.CombinedOutput()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 3 {
		t.Fatalf("the late write with the dead leader's sequencer: %v\n%s", err, out)
	}
	if want := `refused: stale sequencer for lock "controllers/leader-demo"`; !strings.Contains(string(out), want) {
		t.Fatalf("the late write's output does not say %q:\n%s", want, out)
	}

	// The table: the dead leader's rows with its epoch, then the new leader's with the higher
	// one; the late write added nothing.
	rows, err := db.Query("SELECT epoch, holder FROM leader_demo ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	written := map[string]int{}
	for rows.Next() {
		var epoch string
		var holder string
		if err := rows.Scan(&epoch, &holder); err != nil {
			t.Fatal(err)
		}
		switch {
		case holder == "pod-a" && epoch == oldEpoch && written["pod-b"] == 0:
		case holder == "pod-b" && epoch == led[1]:
		default:
			t.Fatalf("after %v rows, one written by %s with epoch %s", written, holder, epoch)
		}
		written[holder]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("epochs %s then %s; rows written: %v", oldEpoch, led[1], written)
}
