package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
)

// TestLoneMessageOnIdlePartitionCommitsAtOnce: with nothing configured about
// batching, a message produced alone on an idle partition of a running
// consumer is committed in a transaction of its own, and its offset goes to
// Kafka, without waiting for a batch to fill or for more messages.
//
// The producer holds every next message back until the previous one has
// committed, so each commit happens while the message is the only one the
// partition has: a worker that waited for a batch to fill (or for a second
// message) never commits and the round times out. A worker that waits a
// fixed time for more (a linger) commits, but every lone message pays that
// wait: the fastest of several rounds, measured from before the produce to
// the AfterCommit hook, is at least the linger. Load on a shared machine
// slows some rounds, not all, so the fastest round stays far below
// lingerBound unless something waits in every round (run with BatchLinger
// 5s, the test fails with every round above 5s).
func TestLoneMessageOnIdlePartitionCommitsAtOnce(t *testing.T) {
	t.Parallel()
	const (
		rounds      = 5               // timed rounds, after one that warms connections up
		lingerBound = 1 * time.Second // the fastest round must be below it
	)
	e := newEnv(t, 1)
	cfg := e.config(modes[3], nil)
	if cfg.BatchSize != 0 || cfg.BatchLinger != 0 || cfg.BatchHandler != nil {
		t.Fatalf("the test needs the default mode: BatchSize %d, BatchLinger %s, batch handler %v",
			cfg.BatchSize, cfg.BatchLinger, cfg.BatchHandler != nil)
	}
	type commit struct {
		at      time.Time
		ids     []string
		offsets []int64
	}
	commits := make(chan commit, 64)
	testobs.Of(cfg).OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) {
		c := commit{at: time.Now()}
		for _, m := range msgs {
			c.ids = append(c.ids, m.ID)
			c.offsets = append(c.offsets, m.Offset)
		}
		select { // never block the runner
		case commits <- c:
		default:
			t.Error("more commits than messages produced")
		}
	}
	kafkaNext := make(chan int64, 64)
	testobs.Of(cfg).OnOffsetCommitted = func(_ string, _ int, next int64) {
		select {
		case kafkaNext <- next:
		default:
		}
	}
	assigned := make(chan struct{})
	var once sync.Once
	testobs.Of(cfg).OnAssigned = func(string, int, int64) { once.Do(func() { close(assigned) }) }
	stop := run(t, e.db.Pool, cfg)
	wait(t, assigned, "the partition's assignment")

	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx := context.Background()
	var took []time.Duration
	fastest := time.Duration(1<<63 - 1)
	for i := range rounds + 1 {
		id := fmt.Sprintf("lone-%d", i)
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := w.WriteMessages(pctx, msg(id, "k", 1))
		cancel()
		if err != nil {
			t.Fatalf("produce %s: %v", id, err)
		}
		var c commit
		select {
		case c = <-commits:
		case <-time.After(time.Minute):
			t.Fatalf("%s, alone on the partition, was not committed within a minute: the worker waits for more messages", id)
		}
		if len(c.ids) != 1 || c.ids[0] != id || c.offsets[0] != int64(i) {
			t.Fatalf("committed %v at offsets %v, want %s alone at offset %d", c.ids, c.offsets, id, i)
		}
		// The transaction is visible in PostgreSQL: effect, claim, position.
		if runs := e.runs(); runs[id] != 1 || len(runs) != i+1 {
			t.Fatalf("effects after %s committed: %v", id, runs)
		}
		if ok, err := e.store.Processed(ctx, e.db.Pool, e.group, id); err != nil || !ok {
			t.Fatalf("%s not recorded as processed (%v)", id, err)
		}
		if pos, err := e.store.Positions(ctx, e.db.Pool, e.group, e.topic); err != nil || pos[0] != int64(i+1) {
			t.Fatalf("position %v (%v) after %s committed, want %d", pos, err, id, i+1)
		}
		// Its offset reaches Kafka while nothing else comes either.
	kafka:
		for {
			select {
			case next := <-kafkaNext:
				if next == int64(i+1) {
					break kafka
				}
			case <-time.After(time.Minute):
				t.Fatalf("the offset after %s was not committed to Kafka within a minute", id)
			}
		}
		if i > 0 { // round 0 opened the connections
			d := c.at.Sub(start)
			took = append(took, d)
			fastest = min(fastest, d)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("produce to commit of a lone message, %d rounds: %v", rounds, took)
	if fastest >= lingerBound {
		t.Fatalf("every lone message took at least %v from produce to commit (rounds %v): something waits for more messages in every round", fastest, took)
	}
}
