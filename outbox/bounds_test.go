package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/outbox"
)

// TestDispatcherRoundStartsNoHandlerAfterItsTime: once a round's handlers
// have run for HandlerTimeout, the round starts no more of them (its
// transaction would sit idle, holding its keys, for as long as the whole
// batch takes): the rest goes to the next round, with no attempt counted.
func TestDispatcherRoundStartsNoHandlerAfterItsTime(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	var (
		mu     sync.Mutex
		rounds [][]string // the values each round handled, from Published
	)
	slow := outbox.HandlerFunc(func(ctx context.Context, rec *outbox.Record) error {
		if string(rec.Value) == "slow" {
			<-ctx.Done() // uses its whole HandlerTimeout, then succeeds
		}
		if rec.Attempt != 1 {
			t.Errorf("%s: attempt %d, want 1 (a message left for the next round is no failure)", rec.Value, rec.Attempt)
		}
		return nil
	})
	done := make(chan struct{})
	var once sync.Once
	d, err := outbox.NewDispatcher(db.Pool, store, &outbox.DispatcherConfig{
		Handlers: map[string]outbox.Handler{"h": slow}, HandlerTimeout: 200 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Logger: testLogger(t),
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: func(recs []outbox.Record) {
			mu.Lock()
			defer mu.Unlock()
			var vals []string
			for _, r := range recs {
				vals = append(vals, string(r.Value))
			}
			rounds = append(rounds, vals)
			if countVals(rounds) >= 3 {
				once.Do(func() { close(done) })
			}
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, store,
		outbox.Message{Handler: "h", Key: []byte("a"), Value: []byte("slow")},
		outbox.Message{Handler: "h", Key: []byte("b"), Value: []byte("b1")},
		outbox.Message{Handler: "h", Key: []byte("b"), Value: []byte("b2")})
	run(t, d)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("not every message was handled within a minute")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rounds[0]) != 1 || rounds[0][0] != "slow" {
		t.Fatalf("rounds %q: the first round handled more than the message that used up its time", rounds)
	}
}

func countVals(rounds [][]string) int {
	n := 0
	for _, r := range rounds {
		n += len(r)
	}
	return n
}

// TestRunWarnsOfUnboundedSessions: a relay and a dispatcher on a pool whose
// sessions keep an abandoned transaction open (the test server's defaults)
// say so once, naming the settings.
func TestRunWarnsOfUnboundedSessions(t *testing.T) {
	t.Parallel()
	_, store := newDB(t)
	pool := newPool(t, map[string]string{"idle_in_transaction_session_timeout": "0", "tcp_keepalives_idle": "0"})
	logs, log := testenv.NewLogs(t)
	r, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{Kafka: testenv.Kafka(t), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d, err := outbox.NewDispatcher(pool, store, &outbox.DispatcherConfig{Logger: log,
		Handlers: map[string]outbox.Handler{"h": outbox.HandlerFunc(func(context.Context, *outbox.Record) error { return nil })}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	run(t, d)
	deadline := time.Now().Add(30 * time.Second)
	for logs.CountFunc(pgsession.WarnMsg, func(rec map[string]any) bool {
		return rec["settings"] == "idle_in_transaction_session_timeout,tcp_keepalives_idle"
	}) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no warning from the relay and the dispatcher within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
