package cluster

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/faultplan"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

// belowMinISRHold is how long belowMinISR keeps the topic below
// min.insync.replicas while the relay tries to publish.
const belowMinISRHold = 5 * time.Second

// belowMinISR: a topic on two replicas loses one of them, so that
// its in-sync replicas (the leader alone) are fewer than
// min.insync.replicas (2). A write acknowledged by the leader alone
// (acks=1) still succeeds there — the control below shows it — but would be
// lost if the leader died next. The relay must not report such messages
// delivered nor mark them published: they stay in the outbox, failing with
// NotEnoughReplicas (never dead), until the replica is back; then every
// one of them is published, in order.
func belowMinISR(t *testing.T, c *kafkaproc.Cluster) {
	const before, during = 50, 50
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topic := testenv.Name(t, "narrow")
	if err := c.CreateTopic(ctx, topic, 1, 2); err != nil {
		t.Fatal(err)
	}
	st, err := c.Partition(ctx, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	follower := -1
	for _, id := range st.Replicas {
		if id != st.Leader {
			follower = id
		}
	}
	if st.Leader < 1 || follower < 1 || len(st.ISR) != 2 {
		t.Fatalf("%s/0 is %+v: want a leader and a second replica in sync", topic, st)
	}

	db := testenv.NewDB(t, testenv.Migrate)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	_, logger := testenv.NewLogs(t)
	var (
		mu        sync.Mutex
		delivered []string
		failures  []error
		dead      atomic.Int64
	)
	relay, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: c.Addrs()},
		MetadataTTL: time.Second, PollInterval: 100 * time.Millisecond, PublishTimeout: 3 * time.Second,
		Logger: logger, Observers: []outbox.Observer{&testobs.Outbox{
			OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
				mu.Lock()
				for _, r := range recs {
					delivered = append(delivered, r.ID)
				}
				mu.Unlock()
			},
			OnFailed: func(_ outbox.Record, err error) {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			},
			OnDead: func(outbox.Record, error) { dead.Add(1) },
		}}, Retry: retry.Policy{MaxInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	nDelivered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered)
	}
	enqueue := func(from, n int) []string {
		var msgs []outbox.Message
		for i := from; i < from+n; i++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
		}
		var ids []string
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			ids, err = store.EnqueueTx(ctx, tx, msgs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		end := time.Now().Add(within)
		for !cond() {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %s", what, within)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	ids := enqueue(0, before)
	waitFor("the first messages delivered", time.Minute, func() bool { return nDelivered() == before })

	// The follower goes; once the controller fenced it (broker session
	// timeout), the ISR is the leader alone.
	if err := c.Node(follower).Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitFor("the ISR shrunk to the leader", time.Minute, func() bool {
		st, err := c.Partition(ctx, topic, 0)
		return err == nil && slices.Equal(st.ISR, []int{st.Leader})
	})
	t.Logf("node %d (follower) killed; ISR of %s/0 is the leader %d alone after %s", follower, topic, st.Leader,
		time.Since(killed).Round(time.Millisecond))

	// The control: acks=1 is acknowledged by the leader alone.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	one := &kafka.Writer{Addr: kafka.TCP(c.Others(follower)...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireOne,
		MaxAttempts: 1, BatchTimeout: time.Millisecond}
	defer one.Close()
	if err := one.WriteMessages(ctx, kafka.Message{Key: []byte("control"), Value: []byte("acks=1")}); err != nil {
		t.Fatalf("control: a write with acks=1 below min.insync.replicas failed: %v; the test cannot tell acks=1 from acks=all", err)
	}
	all := &kafka.Writer{Addr: kafka.TCP(c.Others(follower)...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll,
		MaxAttempts: 1, BatchTimeout: time.Millisecond}
	defer all.Close()
	err = all.WriteMessages(ctx, kafka.Message{Key: []byte("control"), Value: []byte("acks=all")})
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != 1 || !errors.Is(werrs[0], kafka.NotEnoughReplicas) {
		t.Fatalf("control: a write with acks=all below min.insync.replicas returned %v, want NotEnoughReplicas", err)
	}

	d0 := nDelivered()
	ids = append(ids, enqueue(before, during)...)
	time.Sleep(belowMinISRHold)
	mu.Lock()
	nFail, lastFail := len(failures), error(nil)
	notEnough := 0
	for _, err := range failures {
		lastFail = err
		if errors.Is(err, kafka.NotEnoughReplicas) || errors.Is(err, kafka.NotEnoughReplicasAfterAppend) {
			notEnough++
		}
	}
	mu.Unlock()
	if d := nDelivered() - d0; d != 0 {
		t.Fatalf("below min.insync.replicas the relay reported %d messages delivered", d)
	}
	stats, err := store.Stats(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Backlog != during || stats.Dead != 0 || dead.Load() != 0 {
		t.Fatalf("below min.insync.replicas: outbox %+v, %d reported dead; want a backlog of %d and nothing dead", stats, dead.Load(), during)
	}
	if nFail == 0 || notEnough == 0 {
		t.Fatalf("%d failed attempts (%d NotEnoughReplicas; last: %v) in %s below min.insync.replicas: want attempts failing with NotEnoughReplicas",
			nFail, notEnough, lastFail, belowMinISRHold)
	}
	t.Logf("%s below min.insync.replicas: nothing reported delivered, %d failed attempts (%d NotEnoughReplicas), backlog %d",
		belowMinISRHold, nFail, notEnough, stats.Backlog)

	if err := c.Node(follower).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitISR(ctx, topic); err != nil {
		t.Fatal(err)
	}
	waitFor("every message delivered once the replica is back", time.Minute, func() bool { return nDelivered() >= before+during })
	// AfterPublish runs before the marks commit: wait for them.
	deliveredAt := time.Now()
	waitFor("the outbox drained", time.Minute, func() bool {
		stats, err = store.Stats(ctx, db.Pool)
		return err == nil && stats.Backlog == 0
	})
	drained := time.Now()
	if stats.Dead != 0 || dead.Load() != 0 {
		t.Fatalf("outbox %+v, %d reported dead: want nothing dead", stats, dead.Load())
	}
	// Every message in the topic, in order (the relay's duplicates aside).
	var got []string
	seen := map[string]bool{}
	for _, m := range testenv.ReadAll(t, c.Addrs(), topic) {
		id := faultplan.Header(m, outbox.HeaderID)
		if string(m.Key) == "control" || seen[id] {
			continue
		}
		seen[id] = true
		got = append(got, id)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("the topic holds %d outbox messages %v…, want the %d enqueued, in order", len(got), got[:min(5, len(got))], len(ids))
	}
	t.Logf("node %d back: the %d messages published in order (marked %s after the last was delivered)", follower, len(ids),
		drained.Sub(deliveredAt).Round(time.Millisecond))
}
