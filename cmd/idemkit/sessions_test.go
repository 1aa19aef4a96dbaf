package main

import (
	"context"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

// TestCommandSessionsAreBounded: the sessions of a command end a
// transaction left idle by a vanished client and probe a silent peer.
func TestCommandSessionsAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := connectDB(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, want := range map[string]string{"idle_in_transaction_session_timeout": "20s",
		"tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"} {
		var got string
		if err := pool.QueryRow(ctx, "SELECT pg_catalog.current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
