package pgproc

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// failingKill makes s's kills fail with EPERM until the returned func is
// called.
func failingKill(s *Server) (restore func()) {
	var mu sync.Mutex
	fail := true
	s.mu.Lock()
	s.kill = func(pid int, sig syscall.Signal) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return syscall.EPERM
		}
		return syscall.Kill(pid, sig)
	}
	s.mu.Unlock()
	return func() { mu.Lock(); fail = false; mu.Unlock() }
}

func (s *Server) postmasterPid(t *testing.T) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		t.Fatal("the server is no longer this Server's")
	}
	return s.cmd.Process.Pid
}

// TestKillFailureKeepsServer: a Kill whose signal fails returns an error
// naming the postmaster, and the server, still running, is still this
// Server's: the next Kill (or the cleanup's Stop) ends it. (A Kill that
// forgot the server first would make the next Kill do nothing, and the
// server would outlive the test.)
func TestKillFailureKeepsServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := Start(t)
	pid := s.postmasterPid(t)
	restore := failingKill(s)
	err := s.Kill()
	if err == nil || !strings.Contains(err.Error(), "postmaster "+strconv.Itoa(pid)) {
		t.Fatalf("Kill with failing signals: %v, want an error naming postmaster %d", err, pid)
	}
	if err := ping(ctx, s.URL()); err != nil {
		t.Fatalf("the server no longer answers after a Kill that failed: %v", err)
	}
	restore()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, s.URL()); err == nil {
		t.Fatalf("the server (postmaster %d) still answers after the second Kill", pid)
	}
}

// TestStopLastResortBounded: when a smart shutdown outlasts ctx (a client
// stays connected) and the kill that follows fails, Stop returns an error
// naming the postmaster instead of waiting for an exit that never comes,
// and the server is still this Server's to kill.
func TestStopLastResortBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := Start(t)
	pid := s.postmasterPid(t)
	conn, err := pgx.Connect(ctx, s.URL()) // keeps the smart shutdown waiting
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	restore := failingKill(s)

	done := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer scancel()
		done <- s.Stop(sctx, Smart)
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		// Unblock it (the postmaster's exit) so that the test can end.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-done
		t.Fatal("Stop still waited 30s after its kill failed")
	}
	if err == nil || !strings.Contains(err.Error(), "postmaster "+strconv.Itoa(pid)) {
		t.Fatalf("Stop whose kill fails: %v, want an error naming postmaster %d", err, pid)
	}
	restore()
	if s.postmasterPid(t) != pid {
		t.Fatal("another server?")
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if st, _, ok := procStat(pid); ok && st != 'Z' {
		t.Fatalf("postmaster %d still runs after Kill", pid)
	}
}
