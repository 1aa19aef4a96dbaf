package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

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
