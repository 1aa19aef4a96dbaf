package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// The dispatcher runs the registered handler for each message once it
// committed, hands it the stable ID, retries failures, gives up permanent ones,
// keeps order per key, and never touches Kafka messages.
func TestDispatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	var (
		mu       sync.Mutex
		calls    []string // "key:value" in call order
		attempts = map[string]int{}
	)
	email := outbox.HandlerFunc(func(ctx context.Context, rec *outbox.Record) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[rec.ID]++
		if rec.Attempt != attempts[rec.ID] {
			return fmt.Errorf("attempt %d, want %d", rec.Attempt, attempts[rec.ID])
		}
		switch string(rec.Value) {
		case "flaky":
			if rec.Attempt == 1 {
				return errors.New("provider timeout")
			}
		case "invalid":
			return retry.Permanent(errors.New("address rejected"))
		case "panic":
			panic("boom")
		}
		calls = append(calls, string(rec.Key)+":"+string(rec.Value))
		return nil
	})
	pub := newPublished()
	d, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{
		Handlers:     map[string]outbox.Handler{"email": email},
		PollInterval: 50 * time.Millisecond, Logger: testLogger(t), Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}, Retry: retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	ids := enqueue(t, db.Pool, store,
		outbox.Message{Handler: "email", Key: []byte("a"), Value: []byte("flaky")},
		outbox.Message{Handler: "email", Key: []byte("a"), Value: []byte("second")},
		outbox.Message{Handler: "email", Key: []byte("b"), Value: []byte("invalid")},
		outbox.Message{Handler: "email", Key: []byte("c"), Value: []byte("panic")},
		outbox.Message{Handler: "sms", Key: []byte("d"), Value: []byte("no such handler here")},
		outbox.Message{Topic: "kafka-only", Value: []byte("for the relay")},
	)
	pub.wait(t, 20*time.Second, ids[0], ids[1])
	deadline := time.Now().Add(20 * time.Second)
	var dead []outbox.DeadMessage
	for time.Now().Before(deadline) {
		if dead, err = store.Dead(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
		if len(dead) == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(dead) != 2 || dead[0].ID != ids[2] || dead[1].ID != ids[3] {
		t.Fatalf("dead = %+v, want the invalid (permanent) and the panicking message", dead)
	}
	if dead[0].Attempts != 1 || !strings.Contains(dead[0].Error, "address rejected") {
		t.Fatalf("permanent failure listed as %+v, want after 1 attempt", dead[0])
	}
	if dead[1].Attempts != 2 || !strings.Contains(dead[1].Error, "panicked: boom") {
		t.Fatalf("panicking handler listed as %+v, want after 2 attempts", dead[1])
	}
	mu.Lock()
	got := strings.Join(calls, " ")
	mu.Unlock()
	if got != "a:flaky a:second" {
		t.Fatalf("handled %q, want the flaky message (retried) before the second of its key", got)
	}
	st, err := store.Stats(ctx, db.Pool)
	if err != nil || st.Backlog != 2 {
		t.Fatalf("stats = %+v, %v; want the sms and the Kafka message still pending", st, err)
	}
	if _, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("NewDispatcher without handlers: %v", err)
	}
}

// A dispatcher scans its handlers one after the other, starting with the
// next one each round: a handler's backlog delays another handler's message
// by a round at most, however much older the backlog is.
func TestDispatcherHandlersTakeTurns(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	const batch = 10
	var bulk atomic.Int64
	urgentAfter := make(chan int64, 1)
	d, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{
		Handlers: map[string]outbox.Handler{
			"bulk": outbox.HandlerFunc(func(context.Context, *outbox.Record) error { bulk.Add(1); return nil }),
			"urgent": outbox.HandlerFunc(func(context.Context, *outbox.Record) error {
				select {
				case urgentAfter <- bulk.Load():
				default:
				}
				return nil
			}),
		},
		BatchSize: batch, PollInterval: 50 * time.Millisecond, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 1000 {
		msgs = append(msgs, outbox.Message{Handler: "bulk", Key: fmt.Appendf(nil, "b%d", i)})
	}
	enqueue(t, db.Pool, store, msgs...)
	enqueue(t, db.Pool, store, outbox.Message{Handler: "urgent", Key: []byte("u")})
	run(t, d)
	select {
	case n := <-urgentAfter:
		if n > 2*batch {
			t.Fatalf("urgent message handled after %d bulk messages, want at most %d (two rounds)", n, 2*batch)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("urgent message not handled")
	}
}

// TestDispatcherReplacesReadOnlySession: every connection of the
// dispatcher's pool was made read-only by other code sharing the pool (SET
// SESSION CHARACTERISTICS outlives a transaction). A round's writes get
// 25006; the dispatcher closes that connection instead of giving it back,
// and the next round runs on a new one. Before, the rounds waited on the
// same read-only session as an outage for ever (found by review).
func TestDispatcherReplacesReadOnlySession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	pcfg := db.Pool.Config()
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var conns []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	pub := newPublished()
	d, err := outbox.NewDispatcher(pool, store, &outbox.DispatcherConfig{
		Handlers:     map[string]outbox.Handler{"email": outbox.HandlerFunc(func(context.Context, *outbox.Record) error { return nil })},
		PollInterval: 50 * time.Millisecond, Logger: testLogger(t), Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}},
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	ids := enqueue(t, db.Pool, store, outbox.Message{Handler: "email", Key: []byte("a"), Value: []byte("hello")})
	pub.wait(t, 15*time.Second, ids[0])
}
