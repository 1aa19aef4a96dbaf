package consumer_test

import (
	"context"
	"errors"
	"fmt"
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

// TestRecreatedWhileRunning: the topic is deleted and created again
// while the runner runs, and the new topic receives more records than the
// old position. With RecreatedRestart every new record is applied once (none
// skipped, none taken for a duplicate); with RecreatedStop Run returns
// ErrTopicRecreated within a minute.
func TestRecreatedWhileRunning(t *testing.T) {
	t.Parallel()
	for _, policy := range []consumer.RecreatedPolicy{consumer.RecreatedRestart, consumer.RecreatedStop} {
		for _, md := range baseModes {
			t.Run(fmt.Sprint(policy)+"/"+md.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, 1)
				var old []kafka.Message
				for i := range 5 {
					old = append(old, msg("", "k", 1))
					_ = i
				}
				e.produce(old...)
				cfg := e.config(md, nil)
				cfg.MissingID = consumer.MissingIDUseCoordinates
				cfg.OnRecreated = policy
				cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
				var mu sync.Mutex
				applied := map[string]int{}
				testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
					mu.Lock()
					defer mu.Unlock()
					if o == consumer.Applied {
						applied[m.ID]++
					}
				}
				count := func() int { mu.Lock(); defer mu.Unlock(); return len(applied) }
				r, err := consumer.New(e.db.Pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errc := make(chan error, 1)
				go func() { errc <- r.Run(ctx) }()
				deadline := time.Now().Add(60 * time.Second)
				for count() < 5 {
					if time.Now().After(deadline) {
						t.Fatal("old messages not applied")
					}
					time.Sleep(20 * time.Millisecond)
				}
				e.recreateTopic(1)
				var fresh []kafka.Message
				for range 8 {
					fresh = append(fresh, msg("", "k", 1))
				}
				e.produce(fresh...)
				deadline = time.Now().Add(60 * time.Second)
				for {
					select {
					case err := <-errc:
						t.Logf("Run returned: %v; applied %v", err, applied)
						if policy == consumer.RecreatedStop && errors.Is(err, consumer.ErrTopicRecreated) {
							return
						}
						t.Fatalf("Run returned %v", err)
					default:
					}
					if policy == consumer.RecreatedRestart && count() == 13 {
						cancel()
						<-errc
						mu.Lock()
						defer mu.Unlock()
						for id, n := range applied {
							if n != 1 {
								t.Fatalf("%s applied %d times", id, n)
							}
						}
						return
					}
					if time.Now().After(deadline) {
						mu.Lock()
						t.Fatalf("60s after the recreation: applied %d IDs %v (want 13 with Restart, or Run to return ErrTopicRecreated with Stop)", len(applied), applied)
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
	}
}

// TestRecordsDeletedWhileRunning: records ahead of a running, lagging
// consumer are deleted (retention, kafka-delete-records). The runner reports
// the lost range through PositionObserver and goes on with the records
// that remain; it neither returns nor stalls.
func TestRecordsDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			big := make([]byte, 200<<10)
			for i := range 60 {
				m := msg(fmt.Sprintf("m%d", i), "k", 1)
				m.Value = big
				e.produce(m) // one record batch each
			}
			cfg := e.config(md, nil)
			cfg.Handler = consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
				time.Sleep(30 * time.Millisecond)
				return nil
			})
			cfg.MaxBufferedBytes = 1 // prefetch one message at a time
			var mu sync.Mutex
			applied := map[string]int{}
			var moved []*consumer.PositionError
			testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				mu.Lock()
				defer mu.Unlock()
				applied[m.ID]++
			}
			testobs.Of(cfg).OnPositionMoved = func(err *consumer.PositionError) {
				mu.Lock()
				defer mu.Unlock()
				moved = append(moved, err)
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				mu.Lock()
				n := len(applied)
				mu.Unlock()
				if n >= 5 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no progress")
				}
				time.Sleep(10 * time.Millisecond)
			}
			testenv.DeleteRecords(t, e.topic, 0, 40)
			deadline = time.Now().Add(60 * time.Second)
			for {
				select {
				case err := <-errc:
					t.Fatalf("Run returned: %v", err)
				default:
				}
				mu.Lock()
				last := applied["m59"]
				mu.Unlock()
				if last == 1 {
					break
				}
				if time.Now().After(deadline) {
					mu.Lock()
					t.Fatalf("m59 not applied 60s after the deletion; applied %d, moved %v", len(applied), moved)
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			<-errc
			mu.Lock()
			defer mu.Unlock()
			t.Logf("applied %d messages; position moves %v", len(applied), moved)
			if len(moved) == 0 {
				t.Fatalf("no PositionMoved report of the deleted range")
			}
		})
	}
}
