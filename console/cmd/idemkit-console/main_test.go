package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// syncBuffer is a bytes.Buffer safe for the server goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServesWithItsTokenOnLoopback(t *testing.T) {
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		return testenv.Migrate(ctx, pool, schema)
	})
	t.Setenv("IDEMKIT_CONSOLE_TOKEN", "")
	t.Setenv("IDEMKIT_DATABASE_URL", testenv.DatabaseURL(t))
	t.Setenv("IDEMKIT_KAFKA_BROKERS", strings.Join(testenv.Brokers(t), ","))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-schema", db.Schema}, &out, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	_, token, ok := strings.Cut(out.String(), "token (shown once; set IDEMKIT_CONSOLE_TOKEN to choose it): ")
	token = strings.TrimSpace(token)
	if !ok || len(token) < 16 || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("printed %q on %s", out.String(), addr)
	}
	get := func(auth string) int {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/?format=json", nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := get(""); got != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", got)
	}
	if got := get(token); got != http.StatusOK {
		t.Fatalf("with the token: %d", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stop: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestUsageErrors(t *testing.T) {
	t.Setenv("IDEMKIT_DATABASE_URL", "")
	t.Setenv("IDEMKIT_KAFKA_BROKERS", "")
	for _, args := range [][]string{
		{"-nope"},
		{"extra"},
		{"-database", "postgres://x"},
		{"-database", "postgres://x", "-brokers", "b:9092", "-kafka-sasl", "md5", "-kafka-user", "u"},
		{"-database", "postgres://x", "-brokers", "b:9092", "-kafka-user", "u"},
	} {
		var usage *usageError
		if err := run(context.Background(), args, &bytes.Buffer{}, nil); !errors.As(err, &usage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
