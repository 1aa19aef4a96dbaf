package idemhttp_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/pgsession"
)

// TestWarnsOfUnboundedSessions: at its first request, the middleware says
// once that the pool's sessions keep an abandoned transaction open (the test
// server's defaults), naming the settings.
func TestWarnsOfUnboundedSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for range 3 {
		want(t, e.post(newKey(), "acct-1", payment), http.StatusCreated, false)
	}
	logs := e.logs.String()
	if n := strings.Count(logs, pgsession.WarnMsg); n != 1 || !strings.Contains(logs, "idle_in_transaction_session_timeout") {
		t.Fatalf("%d warnings about the pool's sessions, want 1 naming idle_in_transaction_session_timeout:\n%s", n, logs)
	}
}

// TestHandlerTransactionIsBounded: the transaction a handler runs in ends
// on the server once it sits idle past the lease and a margin (its client
// went away), in both ways of holding a key.
func TestHandlerTransactionIsBounded(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode func(*idemhttp.Config)) {
		e := newEnv(t, mode, func(c *idemhttp.Config) { c.Lease = 5 * time.Second })
		var (
			mu      sync.Mutex
			setting string
		)
		e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			tx, ok := idemhttp.Tx(r.Context())
			if !ok {
				t.Error("no transaction")
				return false
			}
			var s string
			if err := tx.QueryRow(r.Context(), "SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout')").Scan(&s); err != nil {
				t.Error(err)
			}
			mu.Lock()
			setting = s
			mu.Unlock()
			return false
		})
		want(t, e.post(newKey(), "acct-1", payment), http.StatusCreated, false)
		mu.Lock()
		defer mu.Unlock()
		if setting != "15s" {
			t.Fatalf("idle_in_transaction_session_timeout in the handler's transaction = %q, want 15s (Lease + margin)", setting)
		}
	})
}
