package main

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

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
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

// A chosen token shorter than 32 characters, holding whitespace, or one
// character repeated is refused with a usage error that says why: the
// console would start guessable.
func TestChosenTokenMustBeStrong(t *testing.T) {
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

// The server cuts off a client that sends a request's headers and then
// trickles (or never sends) its body, and a keep-alive connection left
// idle: whoever reaches the port cannot hold connections and goroutines
// open. Waits up to 65s (the server's bounds are 30s); skipped with
// -short.
func TestSlowClientsAreCutOff(t *testing.T) {
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
