// Package testserver starts real `palisade serve` processes for the Go client's tests, as
// clients/python/tests/conftest.py does for the Python client's.
//
// The binary is $PALISADE_BIN. Without it a test that needs a server is skipped with a line
// saying so, unless $PALISADE_TEST_REQUIRE_SERVER is set (run-tests.sh and .ci/run set both),
// which makes the missing binary a failure.
package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"example.invalid/palisade/clients/go/palisadev1"
)

// StartTimeout is how long a server gets to start answering.
const StartTimeout = 20 * time.Second

// Server is one `palisade serve` on a free loopback port with its own data directory.
type Server struct {
	Endpoint string
	Dir      string
	cmd      *exec.Cmd
	logPath  string
}

// Binary is the palisade binary, or skips (fails with PALISADE_TEST_REQUIRE_SERVER) the test.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("PALISADE_BIN")
	if bin == "" {
		if os.Getenv("PALISADE_TEST_REQUIRE_SERVER") != "" {
			t.Fatal("PALISADE_BIN is not set, and PALISADE_TEST_REQUIRE_SERVER requires a server")
		}
		t.Skip("skipping: set PALISADE_BIN to a palisade binary to run the tests against a real server")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("PALISADE_BIN=%s: %v", bin, err)
	}
	return bin
}

// FreePort is a loopback port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs `palisade serve --data-dir DIR --listen 127.0.0.1:PORT extra...`, waits until it
// answers (unless the extra arguments turn on TLS or tokens: then the caller checks), and stops
// it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	s := &Server{Endpoint: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), Dir: dir, logPath: filepath.Join(dir, "serve.log")}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--data-dir", filepath.Join(dir, "data"), "--listen", s.Endpoint}, extra...)
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.Env = withoutAuthToken(os.Environ())
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Kill()
		_ = logFile.Close()
		if t.Failed() {
			t.Logf("palisade serve log:\n%s", s.Log())
		}
	})
	if !strings.Contains(strings.Join(extra, " "), "--tls-cert") && !strings.Contains(strings.Join(extra, " "), "--tokens") {
		s.waitReady(t)
	} else {
		s.waitListening(t)
	}
	return s
}

func withoutAuthToken(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PALISADE_AUTH_TOKEN=") {
			out = append(out, kv)
		}
	}
	return out
}

func (s *Server) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(StartTimeout)
	conn, err := grpc.NewClient("passthrough:///"+s.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stub := palisadev1.NewLocksClient(conn)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := stub.PublicKey(ctx, &palisadev1.PublicKeyRequest{})
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("palisade serve did not answer within %v:\n%s", StartTimeout, s.Log())
}

func (s *Server) waitListening(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(StartTimeout)
	for time.Now().Before(deadline) {
		if conn, err := net.DialTimeout("tcp", s.Endpoint, 200*time.Millisecond); err == nil {
			_ = conn.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("palisade serve did not listen within %v:\n%s", StartTimeout, s.Log())
}

// Kill stops the server at once (SIGKILL).
func (s *Server) Kill() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Log is the end of the server's log.
func (s *Server) Log() string {
	data, _ := os.ReadFile(s.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// Run runs the palisade binary with args and returns its standard output.
func Run(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Env = withoutAuthToken(os.Environ())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("palisade %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
