package pgproc

// Tests of scripts/dev on ports another program holds: it refuses to start
// there, naming the variable that moves it, and never uses or stops a
// server it did not start.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// devRun runs scripts/dev with args on the folder dev and the extra
// environment env.
func devRun(t *testing.T, ctx context.Context, dev string, env []string, args ...string) (string, error) {
	t.Helper()
	path, err := filepath.Abs("../../../scripts/dev")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{path}, args...)...)
	cmd.Env = append(append(os.Environ(), "IDEMKIT_DEV_DIR="+dev), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A PostgreSQL port that another program listens on: start fails at once,
// saying which variable moves it.
func TestDevStartRefusesATakenPostgresPort(t *testing.T) {
	t.Parallel()
	if _, err := Bin(); err != nil {
		t.Fatal(err)
	}
	cred, err := owner()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := makeDir(cred)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := devRun(t, ctx, filepath.Join(dir, "dev"), []string{"IDEMKIT_PG_PORT=" + strconv.Itoa(port)}, "start")
	want := fmt.Sprintf("port %d is taken by another program (set IDEMKIT_PG_PORT)", port)
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("scripts/dev start: %v, want a failure saying %q\n%s", err, want, out)
	}
}

// A Redis of someone else's on the Redis port: `scripts/dev redis` refuses
// it (it does not take it for its own), and `scripts/dev stop` leaves it
// running.
func TestDevLeavesAForeignRedisAlone(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: scripts/dev start installs it")
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	foreign := exec.CommandContext(ctx, "redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = foreign.Process.Kill()
		_ = foreign.Wait()
	})
	ping := func() bool {
		out, err := exec.CommandContext(ctx, "redis-cli", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "ping").Output()
		return err == nil && strings.TrimSpace(string(out)) == "PONG"
	}
	for !ping() {
		select {
		case <-ctx.Done():
			t.Fatal("the foreign Redis does not answer")
		case <-time.After(20 * time.Millisecond):
		}
	}
	dev := filepath.Join(t.TempDir(), "dev")
	env := []string{"IDEMKIT_REDIS_PORT=" + strconv.Itoa(port)}
	out, err := devRun(t, ctx, dev, env, "redis")
	want := fmt.Sprintf("port %d is taken by another program (set IDEMKIT_REDIS_PORT)", port)
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("scripts/dev redis: %v, want a failure saying %q\n%s", err, want, out)
	}
	if out, err := devRun(t, ctx, dev, env, "stop"); err != nil {
		t.Fatalf("scripts/dev stop: %v\n%s", err, out)
	}
	if !ping() {
		t.Fatal("scripts/dev stop stopped a Redis it did not start")
	}
}
