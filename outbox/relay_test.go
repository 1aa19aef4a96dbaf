package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

func TestHeaderIDIsTheConsumersDefault(t *testing.T) {
	t.Parallel()
	if outbox.HeaderID != consumer.IDHeaderDefault {
		t.Fatalf("HeaderID %q != consumer.IDHeaderDefault %q", outbox.HeaderID, consumer.IDHeaderDefault)
	}
}

// Test 1: a rolled-back business transaction publishes nothing; a committed
// one publishes its messages once, with key, value, headers and the ID header.
func TestRollbackPublishesNothingCommitPublishesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 3)
	pub := newPublished()
	newRelayRun := newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}})
	run(t, newRelayRun)

	// Rolled back: the business write and the outbox rows go together.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack, err := store.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Key: []byte("order-1"), Value: []byte("rolled back")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	ids := enqueue(t, db.Pool, store,
		outbox.Message{Topic: topic, Key: []byte("order-1"), Value: []byte("created"),
			Headers: []kafka.Header{{Key: "type", Value: []byte("OrderCreated")}}},
		outbox.Message{Topic: topic, Key: []byte("order-1"), Value: []byte("paid")},
		outbox.Message{Topic: topic, Value: []byte("no key")},
	)
	if len(ids) != 3 || ids[0] == ids[1] || len(ids[0]) != 36 {
		t.Fatalf("ids = %q, want 3 distinct UUIDs", ids)
	}
	pub.wait(t, 30*time.Second, ids...)
	waitBacklog(t, db, store, 10*time.Second)

	msgs := readAll(t, testenv.Brokers(t), topic)
	if len(msgs) != 3 {
		t.Fatalf("%d messages in Kafka, want 3: %v", len(msgs), msgs)
	}
	byID := map[string]kafka.Message{}
	for _, m := range msgs {
		byID[header(m, outbox.HeaderID)] = m
	}
	if _, ok := byID[rolledBack[0]]; ok {
		t.Fatal("the rolled-back message was published")
	}
	m0, m1, m2 := byID[ids[0]], byID[ids[1]], byID[ids[2]]
	if string(m0.Value) != "created" || string(m0.Key) != "order-1" || header(m0, "type") != "OrderCreated" {
		t.Fatalf("first message = key %q value %q headers %v", m0.Key, m0.Value, m0.Headers)
	}
	if string(m1.Value) != "paid" || m1.Partition != m0.Partition || m1.Offset <= m0.Offset {
		t.Fatalf("second message %q at %d/%d, want after the first at %d/%d", m1.Value, m1.Partition, m1.Offset,
			m0.Partition, m0.Offset)
	}
	if string(m2.Value) != "no key" || m2.Key != nil {
		t.Fatalf("third message = key %q value %q", m2.Key, m2.Value)
	}
	for _, id := range ids {
		if n := pub.count(id); n != 1 {
			t.Fatalf("%s published %d times, want 1", id, n)
		}
	}
	var pending, done int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL),
		count(*) FILTER (WHERE published_at IS NOT NULL) FROM `+store.Table()).Scan(&pending, &done); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || done != 3 {
		t.Fatalf("table has %d pending and %d published rows, want 0 and 3", pending, done)
	}
}

func TestEnqueueValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	for _, tc := range []struct {
		name string
		msg  outbox.Message
	}{
		{"no topic", outbox.Message{Value: []byte("x")}},
		{"bad topic", outbox.Message{Topic: "a b"}},
		{"long topic", outbox.Message{Topic: strings.Repeat("t", 250)}},
		{"id header", outbox.Message{Topic: "t", Headers: []kafka.Header{{Key: "Message-ID", Value: []byte("mine")}}}},
		{"empty header key", outbox.Message{Topic: "t", Headers: []kafka.Header{{Value: []byte("v")}}}},
		{"handler with NUL", outbox.Message{Handler: "a\x00"}},
	} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(ctx, tx, outbox.Message{Topic: "ok"}, tc.msg)
			return err
		})
		var me *outbox.MessageError
		if !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.Index != 1 {
			t.Errorf("%s: err = %v, want a *MessageError for index 1", tc.name, err)
		}
	}
	if _, err := store.EnqueueTx(ctx, nil, outbox.Message{Topic: "t"}); err == nil {
		t.Error("EnqueueTx with a nil tx succeeded")
	}
	ids := enqueue(t, db.Pool, store)
	if len(ids) != 0 {
		t.Errorf("no messages: ids = %v", ids)
	}
	st, err := store.Stats(ctx, db.Pool)
	if err != nil || st.Backlog != 0 {
		t.Fatalf("stats = %+v, %v; want an empty outbox", st, err)
	}
	if _, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Outbox: strings.Repeat("x", 64)}}); err == nil {
		t.Error("New with a 64-byte table name succeeded")
	}
	if _, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("NewRelay without brokers: %v, want ErrInvalidConfig", err)
	}
}

func TestNotMigrated(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, db, store, outbox.RelayConfig{DisableListen: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrNotMigrated) {
		t.Fatalf("Run on an unmigrated schema: %v, want ErrNotMigrated", err)
	}
}

// Rows of a transaction that commits late are never skipped, whatever the
// relay published in the meantime; same-key messages of transactions that do
// not overlap keep commit order.
func TestLateCommitIsNotSkipped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	pub := newPublished()
	run(t, newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))

	slow, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	slowIDs, err := store.EnqueueTx(ctx, slow, outbox.Message{Topic: topic, Key: []byte("a"), Value: []byte("slow")})
	if err != nil {
		t.Fatal(err)
	}
	// Later rows (higher seq), other keys and the same key, commit first.
	fast := enqueue(t, db.Pool, store,
		outbox.Message{Topic: topic, Key: []byte("b"), Value: []byte("b/0")},
		outbox.Message{Topic: topic, Key: []byte("a"), Value: []byte("fast")})
	pub.wait(t, 30*time.Second, fast...)
	more := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Key: []byte("b"), Value: []byte("b/1")})
	pub.wait(t, 30*time.Second, more...)

	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pub.wait(t, 30*time.Second, slowIDs...)
	after := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Key: []byte("a"), Value: []byte("after")})
	pub.wait(t, 30*time.Second, after...)

	var values []string
	for _, m := range readAll(t, testenv.Brokers(t), topic) {
		values = append(values, string(m.Value))
	}
	want := "b/0 fast b/1 slow after"
	if got := strings.Join(values, " "); got != want {
		t.Fatalf("Kafka holds %q, want %q", got, want)
	}
}

// A message with NotBefore waits for its time, and so do the later messages
// of its key; other keys do not wait.
func TestNotBefore(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	pub := newPublished()
	run(t, newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))

	var dbNow time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ids := enqueue(t, db.Pool, store,
		outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("delayed"), NotBefore: dbNow.Add(1500 * time.Millisecond)},
		outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("behind")},
		outbox.Message{Topic: topic, Key: []byte("other"), Value: []byte("now")})
	pub.wait(t, 10*time.Second, ids[2])
	if pub.count(ids[0]) != 0 || pub.count(ids[1]) != 0 {
		t.Fatal("a delayed message, or the one behind it, was published before its time")
	}
	pub.wait(t, 10*time.Second, ids[0], ids[1])
	if el := time.Since(start); el < time.Second {
		t.Fatalf("delayed message published after %v, want about 1.5s", el)
	}
	var values []string
	for _, m := range readAll(t, testenv.Brokers(t), topic) {
		values = append(values, string(m.Value))
	}
	if got := strings.Join(values, " "); got != "now delayed behind" {
		t.Fatalf("Kafka holds %q", got)
	}
}

// Test 3: three relays at once, 50,000 messages over 1,000 keys enqueued
// while they run: none lost, per-key order kept.
func TestThreeRelaysKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	const total, keys, writers, perTx = 50000, 1000, 4, 500
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 6)
	var published atomic.Int64
	var mu sync.Mutex
	byRelay := map[int]int{}
	for i := range 3 {
		r := newRelay(t, db, store, outbox.RelayConfig{BatchSize: 1000, Observers: []outbox.Observer{&testobs.Outbox{
			OnPublished: func(recs []outbox.Record) {
				published.Add(int64(len(recs)))
				mu.Lock()
				byRelay[i] += len(recs)
				mu.Unlock()
			},
		}}})
		run(t, r)
	}

	// Each writer owns the keys k with k % writers == w and enqueues them in
	// order, transaction after transaction: per key, commit order is the
	// order of the values.
	want := map[string]int{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			next := map[int]int{}
			var batch []outbox.Message
			for i := range total {
				k := i % keys
				if k%writers != w {
					continue
				}
				key := fmt.Sprintf("key-%04d", k)
				batch = append(batch, outbox.Message{Topic: topic, Key: []byte(key),
					Value: fmt.Appendf(nil, "%s/%d", key, next[k])})
				next[k]++
				if len(batch) == perTx {
					enqueue(t, db.Pool, store, batch...)
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				enqueue(t, db.Pool, store, batch...)
			}
			mu.Lock()
			for k, n := range next {
				want[fmt.Sprintf("key-%04d", k)] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	waitBacklog(t, db, store, 90*time.Second)
	if got := published.Load(); got < total {
		t.Fatalf("relays report %d published, want at least %d", got, total)
	}
	msgs := readAll(t, testenv.Brokers(t), topic)
	dups := checkKeyOrder(t, msgs, want)
	t.Logf("%d messages in Kafka (%d duplicates); published per relay: %v", len(msgs), dups, byRelay)
	if len(byRelay) < 2 {
		t.Errorf("only %d relay(s) published anything: %v", len(byRelay), byRelay)
	}
}

// Test 5: a poison message is dead after Retry.MaxAttempts attempts, the
// messages behind it on its key are dead too, blocked by it, other keys
// flow; Retry publishes them once the cause is fixed, in order.
func TestPoisonIsDeadAndRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	good := testenv.NewTopic(t, 2)
	missing := testenv.Name(t, "missing") // not created yet
	pub := newPublished()
	var dead atomic.Int64
	deadHook := make(chan outbox.Record, 10)
	// Metadata cached for less than the retry schedule: once the topic is
	// created, the retried message sees it.
	run(t, newRelay(t, db, store, outbox.RelayConfig{MaxBatchBytes: 64 << 10, MetadataTTL: 50 * time.Millisecond,
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook, OnDead: func(r outbox.Record, err error) {
			dead.Add(1)
			deadHook <- r
		}}}, Retry: retry.Policy{InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxAttempts: 3}}))

	poison := enqueue(t, db.Pool, store,
		outbox.Message{Topic: missing, Key: []byte("p"), Value: []byte("p/0")},
		outbox.Message{Topic: missing, Key: []byte("p"), Value: []byte("p/1")},
		outbox.Message{Topic: good, Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 100<<10)},
		outbox.Message{Topic: good, Key: []byte("big"), Value: []byte("big/1")},
	)
	var goodIDs []string
	for i := range 20 {
		goodIDs = append(goodIDs, enqueue(t, db.Pool, store,
			outbox.Message{Topic: good, Key: fmt.Appendf(nil, "g%d", i%4), Value: []byte("ok")})...)
	}
	pub.wait(t, 30*time.Second, goodIDs...)
	for range 2 {
		select {
		case <-deadHook:
		case <-time.After(30 * time.Second):
			t.Fatal("poison messages did not die within 30s")
		}
	}
	// More messages for a dead key are dead behind it.
	late := enqueue(t, db.Pool, store, outbox.Message{Topic: missing, Key: []byte("p"), Value: []byte("p/2")})

	var list []outbox.DeadMessage
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		list, err = store.Dead(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := map[string]outbox.DeadMessage{}
	for _, p := range list {
		got[p.ID] = p
	}
	if len(list) != 5 {
		t.Fatalf("dead = %+v, want 5 messages", list)
	}
	if p := got[poison[0]]; p.Attempts != 3 || p.BlockedBy != "" || !strings.Contains(p.Error, "Unknown Topic") || p.Topic != missing {
		t.Fatalf("dead poison = %+v, want 3 attempts and an unknown-topic error", p)
	}
	if p := got[poison[1]]; p.BlockedBy != poison[0] {
		t.Fatalf("message behind the poison = %+v, want BlockedBy %s", p, poison[0])
	}
	if p := got[late[0]]; p.BlockedBy != poison[0] {
		t.Fatalf("late message of the dead key = %+v, want BlockedBy %s", p, poison[0])
	}
	if p := got[poison[2]]; p.Attempts != 1 || !strings.Contains(p.Error, "larger than MaxBatchBytes") {
		t.Fatalf("oversized message = %+v, want dead after one attempt", p)
	}
	if p := got[poison[3]]; p.BlockedBy != poison[2] {
		t.Fatalf("message behind the oversized one = %+v", p)
	}
	if n := dead.Load(); n != 2 {
		t.Fatalf("Dead hook ran %d times, want 2 (blocked messages do not count)", n)
	}
	st, err := store.Stats(ctx, db.Pool)
	if err != nil || st.Dead != 5 || st.Held != 3 || st.Backlog != 0 {
		t.Fatalf("stats = %+v, %v; want 5 dead (3 held behind the 2 that failed), no backlog", st, err)
	}

	// Fix the cause, then retry by command.
	testenv.CreateTopic(t, missing, 1)
	n, err := store.Retry(ctx, db.Pool, poison[0])
	if err != nil || n != 3 {
		t.Fatalf("Retry = %d, %v; want 3 requeued", n, err)
	}
	pub.wait(t, 30*time.Second, poison[0], poison[1], late[0])
	var values []string
	for _, m := range readAll(t, testenv.Brokers(t), missing) {
		values = append(values, string(m.Value))
	}
	if got := strings.Join(values, " "); got != "p/0 p/1 p/2" {
		t.Fatalf("after Retry, Kafka holds %q", got)
	}
	if _, err := store.Retry(ctx, db.Pool, poison[0]); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("second Retry: %v, want ErrNotFound", err)
	}
	if _, err := store.Retry(ctx, db.Pool, "not-a-uuid"); err == nil {
		t.Fatal("Retry with a malformed ID succeeded")
	}
	list, err = store.Dead(ctx, db.Pool)
	if err != nil || len(list) != 2 {
		t.Fatalf("dead after retry = %+v, %v; want the two oversized-key messages", list, err)
	}
}

func TestCleanupAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	stats := make(chan outbox.Stats, 100)
	ids := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Value: []byte("1")},
		outbox.Message{Topic: topic, Value: []byte("2")})
	if _, err := db.Pool.Exec(ctx, `UPDATE `+store.Table()+` SET created_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	st, err := store.Stats(ctx, db.Pool)
	if err != nil || st.Backlog != 2 || st.OldestAge < 59*time.Minute || st.OldestAge > 61*time.Minute {
		t.Fatalf("stats = %+v, %v; want backlog 2, oldest about 1h", st, err)
	}
	pub := newPublished()
	run(t, newRelay(t, db, store, outbox.RelayConfig{Retention: 50 * time.Millisecond, CleanupInterval: 100 * time.Millisecond,
		CleanupBatch: 1, StatsInterval: 50 * time.Millisecond,
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook, OnStats: func(s outbox.Stats) {
			select {
			case stats <- s:
			default:
			}
		}}}}))
	pub.wait(t, 30*time.Second, ids...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+store.Table()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d published rows left after retention", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case s := <-stats:
		_ = s
	case <-time.After(5 * time.Second):
		t.Fatal("Stats hook never ran")
	}
	n, err := store.Cleanup(ctx, db.Pool, 0, 0)
	if err != nil || n != 0 {
		t.Fatalf("Cleanup on an empty table = %d, %v", n, err)
	}
}

// The relay re-reads a key's rows after taking its lock and relies on that
// statement seeing what the key's previous holder committed: READ
// COMMITTED. Relays whose database defaults to REPEATABLE READ would read
// the rows in the snapshot of the scan, taken before the lock, and publish
// again what another relay had just published. Three relays on such a pool,
// 20,000 messages over 500 keys: no duplicate, per-key order kept.
func TestRelayIgnoresRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	const total, keys, writers, perTx = 20000, 500, 4, 200
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 6)
	rrPool := repeatableReadPool(t, db.Schema)
	var published atomic.Int64
	for range 3 {
		r, err := outbox.NewRelay(rrPool, store, &outbox.RelayConfig{
			Kafka: testenv.Kafka(t), BatchSize: 100, PollInterval: 20 * time.Millisecond,
			Logger:    testLogger(t),
			Observers: []outbox.Observer{&testobs.Outbox{OnPublished: func(recs []outbox.Record) { published.Add(int64(len(recs))) }}},
		})
		if err != nil {
			t.Fatal(err)
		}
		run(t, r)
	}
	want := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			next := map[int]int{}
			var batch []outbox.Message
			for i := range total {
				k := i % keys
				if k%writers != w {
					continue
				}
				key := fmt.Sprintf("key-%03d", k)
				batch = append(batch, outbox.Message{Topic: topic, Key: []byte(key),
					Value: fmt.Appendf(nil, "%s/%d", key, next[k])})
				next[k]++
				if len(batch) == perTx {
					enqueue(t, db.Pool, store, batch...)
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				enqueue(t, db.Pool, store, batch...)
			}
			mu.Lock()
			for k, n := range next {
				want[fmt.Sprintf("key-%03d", k)] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	waitBacklog(t, db, store, 90*time.Second)
	msgs := readAll(t, testenv.Brokers(t), topic)
	if dups := checkKeyOrder(t, msgs, want); dups != 0 || published.Load() != total {
		t.Fatalf("%d messages in Kafka for %d enqueued: %d duplicates; relays report %d published",
			len(msgs), total, dups, published.Load())
	}
}

// Store.Retry waits for a relay that holds one of the keys, then requeues
// the messages and those dead behind them, including the ones that relay
// marked dead while Retry waited: it must read them in a snapshot taken after
// the wait, so it runs in READ COMMITTED whatever the database's default.
func TestRetryIgnoresRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	rrPool := repeatableReadPool(t, db.Schema)
	ids := enqueue(t, db.Pool, store,
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("poison")},
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("behind")})
	if _, err := db.Pool.Exec(ctx, `UPDATE `+store.Table()+` SET dead_at = now(), attempts = 3,
		last_error = 'rejected' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}

	// A relay holds the key and marks the second message dead behind the first.
	relay, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Rollback(ctx)
	if _, err := relay.Exec(ctx, `SELECT pg_advisory_xact_lock(lock_key) FROM `+store.Table()+` WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Exec(ctx, `UPDATE `+store.Table()+` SET dead_at = now(), blocked_by = $1,
		last_error = 'blocked' WHERE id = $2`, ids[0], ids[1]); err != nil {
		t.Fatal(err)
	}

	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := store.Retry(ctx, rrPool, ids[0])
		done <- result{n, err}
	}()
	// Wait until Retry waits for the key's lock, then let the relay commit.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_locks l
			JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`, db.Schema).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Retry never waited for the relay's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := relay.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.n != 2 {
		t.Fatalf("Retry = %d, %v; want 2 (the message and the one the relay marked dead behind it)", res.n, res.err)
	}
	dead, err := store.Dead(ctx, db.Pool)
	if err != nil || len(dead) != 0 {
		t.Fatalf("still dead after Retry: %+v, %v", dead, err)
	}
}

// TestRelayConfigValidate: Validate refuses what NewRelay refuses, before
// anything connects, and accepts a complete configuration.
func TestRelayConfigValidate(t *testing.T) {
	t.Parallel()
	ok := outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate of a complete config: %v", err)
	}
	for name, mutate := range map[string]func(*outbox.RelayConfig){
		"no brokers":      func(c *outbox.RelayConfig) { c.Kafka.Brokers = nil },
		"small batch":     func(c *outbox.RelayConfig) { c.MaxBatchBytes = 10 },
		"bad retry":       func(c *outbox.RelayConfig) { c.Retry.Multiplier = 0.5 },
		"negative outage": func(c *outbox.RelayConfig) { c.MaxOutage = -time.Second },
		"bad observer":    func(c *outbox.RelayConfig) { c.Observers = []outbox.Observer{42} },
	} {
		c := ok
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// Relays and dispatchers run with the others of a service under
// idemkit.RunAll.
var (
	_ idemkit.Runner = (*outbox.Relay)(nil)
	_ idemkit.Runner = (*outbox.Dispatcher)(nil)
)
