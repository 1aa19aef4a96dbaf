package main

// Security review of the standalone console (branch console-review): each
// test is an attack that succeeds on the code as merged, so each FAILS
// until its finding is fixed (go test -run TestReviewAttack).

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

// startConsole runs the command on a loopback port with token (empty: it
// draws one) and returns its address and a stop function.
func startConsole(t *testing.T, token string) (string, func() error) {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		return testenv.Migrate(ctx, pool, schema)
	})
	t.Setenv("IDEMKIT_CONSOLE_TOKEN", token)
	t.Setenv("IDEMKIT_DATABASE_URL", testenv.DatabaseURL(t))
	t.Setenv("IDEMKIT_KAFKA_BROKERS", strings.Join(testenv.Brokers(t), ","))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var out syncBuffer
	go func() { done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-schema", db.Schema}, &out, ready) }()
	select {
	case addr := <-ready:
		return addr, func() error { cancel(); return <-done }
	case err := <-done:
		cancel()
		return "", func() error { return err }
	}
}

// TestReviewAttackWeakTokenAccepted — LOW. The command refuses a token
// shorter than 16 characters but takes any 16: sixteen times the same
// letter, or sixteen spaces (which, being invalid in a cookie, also makes
// the sign-in page fail while Bearer works). TokenAuth itself (public API)
// takes any non-empty token, even one character.
// Fix: require some entropy (e.g. at least 16 distinct-ish characters or
// 128 bits when base64/hex), trim and refuse whitespace and characters
// invalid in a cookie value; document the same for TokenAuth.
func TestReviewAttackWeakTokenAccepted(t *testing.T) {
	for _, weak := range []string{"aaaaaaaaaaaaaaaa", "                ", "1111111111111111", strings.Repeat("a", 40),
		strings.Repeat(" ", 40), "correct horse battery staple, twice over", "0123456789abcdef0123456789abcde"} {
		addr, stop := startConsole(t, weak)
		err := stop()
		var usage *usageError
		if addr != "" || !errors.As(err, &usage) || !strings.Contains(err.Error(), "IDEMKIT_CONSOLE_TOKEN must") {
			t.Errorf("IDEMKIT_CONSOLE_TOKEN=%q: served on %q (stop: %v), want a usage error", weak, addr, err)
		}
	}
	if err := checkToken("0123456789abcdef0123456789abcdef"); err != nil {
		t.Errorf("a token of 32 characters: %v", err)
	}
}

// TestReviewAttackSlowClientsHoldConnections — MEDIUM (unauthenticated
// DoS when listening beyond loopback). The server sets ReadHeaderTimeout
// only (main.go: http.Server{ReadHeaderTimeout: 10s}): no ReadTimeout, no
// IdleTimeout, no WriteTimeout. POST /login reads its body before any
// authentication, with no deadline: a client that sends the headers and
// then trickles (or never sends) the body holds a connection and a
// goroutine forever; a keep-alive connection left idle is never closed
// either. A few thousand such sockets from anyone who can reach the port
// exhaust the process's file descriptors, and the console with them.
// Fix: ReadTimeout (30 s: forms are small), IdleTimeout (60 s),
// MaxHeaderBytes (64 KiB); WriteTimeout above the replay bound, or
// http.TimeoutHandler around the non-action pages.
// This test waits 65 s; skipped with -short.
func TestReviewAttackSlowClientsHoldConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 65s")
	}
	addr, stop := startConsole(t, "")
	if addr == "" {
		t.Fatalf("run: %v", stop())
	}
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	const budget = 65 * time.Second
	closedWithin := func(conn net.Conn, first string) (bool, time.Duration) {
		_ = conn.SetReadDeadline(time.Now().Add(budget))
		start := time.Now()
		r := bufio.NewReader(conn)
		if first != "" { // read the response to the complete request first
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return true, time.Since(start)
				}
				if line == "\r\n" {
					break
				}
			}
		}
		_, err := io.Copy(io.Discard, r)
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		return !timedOut, time.Since(start)
	}
	cases := map[string]string{
		// Headers of a sign-in whose body never comes.
		"slow body of POST /login": "POST /login HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
			"Content-Length: 4096\r\n\r\ntok",
		// A complete request, then a keep-alive connection left idle.
		"idle keep-alive": "GET /login HTTP/1.1\r\nHost: " + addr + "\r\n\r\n",
	}
	var wg sync.WaitGroup
	for name, req := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, req); err != nil {
				t.Error(err)
				return
			}
			first := ""
			if strings.HasPrefix(req, "GET") {
				first = "response"
			}
			if closed, took := closedWithin(conn, first); !closed {
				t.Errorf("%s: the server still holds the connection after %s", name, took.Round(time.Second))
			}
		}()
	}
	wg.Wait()
}
