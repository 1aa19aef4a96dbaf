package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

// TestBrokerStoppedRelayRecovers: the relay's broker is killed for about 10
// seconds in the middle of a steady stream; the relay recovers by itself,
// nothing is lost or dead, per-key order holds, and the outage is logged
// once when it starts and once when it ends, not at every failed round. A second relay, with a MaxOutage
// of 2s, returns a *retry.OutageError during the outage. The broker is a
// private one: the shared broker of the other tests is never stopped.
func TestBrokerStoppedRelayRecovers(t *testing.T) {
	t.Parallel()
	const keys = 20
	ctx := context.Background()
	broker := kafkaproc.Start(t)
	brokers := []string{broker.Addr}
	topic := testenv.Name(t, "idemkit")
	client := &kafka.Client{Addr: kafka.TCP(broker.Addr), Timeout: 30 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 3, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := testenv.WaitTopic(wctx, client, topic, 3); err != nil {
		t.Fatal(err)
	}

	db, store := newDB(t)
	logs, logger := testenv.NewLogs(t)
	var published, failedAttempts atomic.Int64
	relay, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{
		Kafka: kafkaconn.Config{Brokers: brokers, DialTimeout: 2 * time.Second}, MetadataTTL: time.Second, PollInterval: 100 * time.Millisecond,
		PublishTimeout: 3 * time.Second,
		Logger:         logger,
		Observers: []outbox.Observer{&testobs.Outbox{
			OnPublished: func(recs []outbox.Record) { published.Add(int64(len(recs))) },
			OnFailed:    func(outbox.Record, error) { failedAttempts.Add(1) },
		}}, Retry: retry.Policy{MaxInterval: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Errorf("relay: %v", err)
		}
	})

	// A steady producer: 10 messages over the keys every 20ms, each key's
	// values numbered in commit order.
	var (
		wg       sync.WaitGroup
		produced atomic.Int64
		want     = map[string]int{}
		stopProd = make(chan struct{})
	)
	wg.Go(func() {
		next := make([]int, keys)
		i := 0
		for {
			select {
			case <-stopProd:
				for k, n := range next {
					want[fmt.Sprintf("k%02d", k)] = n
				}
				return
			case <-time.After(20 * time.Millisecond):
			}
			var msgs []outbox.Message
			for range 10 {
				k := i % keys
				i++
				key := fmt.Sprintf("k%02d", k)
				msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s/%d", key, next[k])})
				next[k]++
			}
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := store.EnqueueTx(ctx, tx, msgs...)
				return err
			})
			if err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			produced.Add(int64(len(msgs)))
		}
	})
	stopProducer := sync.OnceFunc(func() { close(stopProd); wg.Wait() })
	t.Cleanup(stopProducer)

	waitFor(t, time.Minute, "relay publishing", func() (bool, error) { return published.Load() >= 200, nil })
	if err := broker.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	atStop := published.Load()
	stopped := time.Now()

	// Meanwhile, a relay that may wait 2s at most gives up.
	db2, store2 := newDB(t)
	bounded, err := outbox.NewRelay(db2.Pool, store2, &outbox.RelayConfig{
		Kafka: kafkaconn.Config{Brokers: brokers, DialTimeout: 2 * time.Second}, MetadataTTL: time.Second, PollInterval: 100 * time.Millisecond, MaxOutage: 2 * time.Second,
		PublishTimeout: time.Second, Logger: slog.New(slog.DiscardHandler), Retry: retry.Policy{MaxInterval: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db2.Pool, func(tx pgx.Tx) error {
		_, err := store2.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Key: []byte("bounded"), Value: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	boundedCtx, stopBounded := context.WithTimeout(ctx, 8*time.Second)
	err = bounded.Run(boundedCtx)
	stopBounded()
	var oerr *retry.OutageError
	if !errors.Is(err, retry.ErrOutage) || !errors.As(err, &oerr) || oerr.Op != "outbox relay: kafka" {
		t.Fatalf("relay with MaxOutage 2s: Run returned %v after %v, want a *retry.OutageError for kafka",
			err, time.Since(stopped).Round(time.Millisecond))
	}
	t.Logf("relay with MaxOutage 2s returned after %v: %v", time.Since(stopped).Round(time.Millisecond), err)

	time.Sleep(10*time.Second - time.Since(stopped)) // the rest of the outage
	producedDuringOutage := produced.Load()
	if err := broker.Start(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker back after 10s; published %d before the stop, %d produced so far, %d failed attempts",
		atStop, producedDuringOutage, failedAttempts.Load())
	waitFor(t, time.Minute, "relay publishing again", func() (bool, error) {
		return published.Load() >= producedDuringOutage, nil
	})
	stopProducer()
	waitFor(t, time.Minute, "backlog drained", func() (bool, error) {
		b, err := backlog(db, store)()
		return b == 0, err
	})

	msgs := readAll(t, brokers, topic)
	next := map[string]int{}
	seen := map[string]bool{}
	dups := 0
	for _, m := range msgs {
		id := header(m, outbox.HeaderID)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		key := string(m.Key)
		if v := fmt.Sprintf("%s/%d", key, next[key]); string(m.Value) != v {
			t.Fatalf("key %s: got %q, want %q", key, m.Value, v)
		}
		next[key]++
	}
	total := 0
	for k, n := range want {
		if next[k] != n {
			t.Fatalf("key %s: %d in Kafka, want %d", k, next[k], n)
		}
		total += n
	}
	if int64(total) != produced.Load() || failedAttempts.Load() == 0 {
		t.Fatalf("%d in Kafka of %d produced; %d failed attempts (want some: the broker was down)",
			total, produced.Load(), failedAttempts.Load())
	}
	t.Logf("%d messages, %d duplicates, none lost, order kept", total, dups)

	const op = "outbox relay: kafka"
	waitFor(t, 10*time.Second, "outage end logged", func() (bool, error) { return logs.Count(outageEnd, op) > 0, nil })
	// A round that straddles the kill (or the restart) may fail only in
	// part, and is logged as such; every round in between is the outage.
	if s, e, f := logs.Count(outageStart, op), logs.Count(outageEnd, op), logs.Count("delivery failed", ""); s != 1 || e != 1 || f > 2 {
		t.Fatalf("outage logged %d times, its end %d times, %d failed deliveries logged; want 1, 1, at most 2", s, e, f)
	}
}

// The messages internal/outage logs when an outage starts and ends.
const (
	outageStart = outage.StartMsg
	outageEnd   = outage.EndMsg
)
