package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/outbox"
)

// lockedBuffer is a bytes.Buffer safe for the relay's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStartWarningNamesItsComponentOnce: the relay's and the dispatcher's
// warning about the pool's session settings (the test server leaves them
// off) carries one component attribute, not the logger's and its own.
func TestStartWarningNamesItsComponentOnce(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	relay := newRelay(t, db, store, outbox.RelayConfig{Logger: log})
	dispatcher, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{Logger: log,
		Handlers: map[string]outbox.Handler{"h": outbox.HandlerFunc(func(context.Context, *outbox.Record) error { return nil })}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay)
	run(t, dispatcher)
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), "keeps a transaction") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no start warning in 30s:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "keeps a transaction") && strings.Count(line, "component=") != 1 {
			t.Errorf("a warning with %d component attributes: %s", strings.Count(line, "component="), line)
		}
	}
}
