package idemotel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testobs"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// TestLogsCarryTheTrace: the runner's log line about a failing message
// carries the trace ID of the transaction that failed (the span of the
// producer's trace), through LogHandler.
func TestLogsCarryTheTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	m := msg("m1", "k")
	producerCtx, span := e.tp.Tracer("producer").Start(context.Background(), "send")
	e.tel.Inject(producerCtx, &m.Headers)
	span.End()
	e.produce(m)

	var logs lockedBuffer
	var calls atomic.Int32
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("flaky dependency")
		}
		return e.effect(ctx, tx, m)
	})
	cfg.Logger = slog.New(idemotel.LogHandler(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	if _, err := e.tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	select {
	case <-oc.done:
	case <-time.After(90 * time.Second):
		t.Fatal("m1 not applied")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := span.SpanContext().TraceID().String()
	found := false
	for _, l := range logs.lines() {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if rec["msg"] == "handler failed; retrying" {
			found = true
			if rec[idemotel.LogKeyTraceID] != want || rec[idemotel.LogKeySpanID] == nil || rec["message_id"] != "m1" {
				t.Fatalf("retry log %v: want trace_id %s, a span_id and message_id m1", rec, want)
			}
		}
	}
	if !found {
		t.Fatalf("no retry log line among %q", logs.lines())
	}
}
