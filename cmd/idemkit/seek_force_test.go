package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
)

// TestSeekForceWhileRunning: `consumer seek -to-earliest -force` while
// a consumer works through a backlog exits 0 and says the partitions moved;
// the consumer's next assignment must then start at the log start. The
// removed member's worker keeps committing until its generation ends (and
// its transaction blocked on the seek's row lock commits right after it);
// those position writes must not undo the rewind in silence.
func TestSeekForceWhileRunning(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	e := newSeekEnv(t, bin, 1)
	recs := make([]kafka.Record, 300)
	for i := range recs {
		recs[i] = kafka.Record{Time: e.base.Add(time.Duration(i) * time.Second), Value: kafka.NewBytes([]byte("x"))}
	}
	testenv.Produce(t, e.topic, 0, recs...)
	var (
		mu       sync.Mutex
		assigns  []int64
		handled  int
		progress = make(chan struct{})
		once     sync.Once
	)
	r, err := consumer.New(e.db.Pool, &consumer.Config{
		Kafka: testenv.Kafka(t), Topic: e.topic, GroupID: e.group, Store: e.store,
		MissingID: consumer.MissingIDUseCoordinates, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *consumer.Message) error {
			time.Sleep(20 * time.Millisecond)
			return nil
		}),
		Observers: []consumer.Observer{&testobs.Hooks{
			OnAssigned: func(_ string, _ int, start int64) {
				mu.Lock()
				defer mu.Unlock()
				assigns = append(assigns, start)
			},
			OnOutcome: func(context.Context, *consumer.Message, consumer.Outcome) {
				mu.Lock()
				defer mu.Unlock()
				if handled++; handled == 30 {
					once.Do(func() { close(progress) })
				}
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	select {
	case <-progress:
	case <-time.After(time.Minute):
		t.Fatal("no progress")
	}
	out := e.seek("-to-earliest", "-force")
	t.Logf("seek said:\n%s", out)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		a := append([]int64(nil), assigns...)
		mu.Unlock()
		if len(a) >= 2 {
			t.Logf("assignments started at %v; positions now %v", a, e.next())
			if a[len(a)-1] != 0 {
				t.Fatalf("after seek -to-earliest -force (exit 0), the consumer's next assignment started at %d, not 0: the rewind was undone", a[len(a)-1])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new assignment 30s after the seek (assignments %v)", a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
