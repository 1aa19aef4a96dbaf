package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestListAndRetryParked: a key parked in NonBlocking mode with an hour
// before its next attempt is listed (head marked, the messages behind it
// counted); RetryParked of another key changes nothing; a rolled-back
// RetryParked changes nothing; RetryParked of the key makes its head due, and
// the running runner releases the key in offset order, each message once,
// without waiting the hour. Without RetryParked the key would stay parked
// for the hour and the test would time out.
//
// The runner's host clock may differ from the database's (and from the
// host running the CLI): in the "skewed clock" run the runner's own timers
// run ten minutes behind, and a head made due by RetryParked is released
// all the same (TestParkedDueOnDatabaseClock skews the database's clock
// instead).
func TestListAndRetryParked(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{0, -10 * time.Minute} {
		name := "same clock"
		if skew != 0 {
			name = "skewed clock"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testListAndRetryParked(t, skew)
		})
	}
}

func testListAndRetryParked(t *testing.T, skew time.Duration) {
	e := newEnv(t, 1)
	e.produce(msg("b1", "B", 1), msg("a1", "A", 1), msg("b2", "B", 1), msg("b3", "B", 1), msg("a2", "A", 1))
	var healed atomic.Bool
	cfg := e.config(baseModes[0], func(_ context.Context, m *consumer.Message) error {
		if m.ID == "b1" && !healed.Load() {
			return errors.New("dependency down")
		}
		return nil
	})
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry = retry.Policy{MaxAttempts: 1}
	cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 5}
	cfg.ParkedPoll = 20 * time.Millisecond
	var mu sync.Mutex
	applied := map[string]int{}
	flowed, released := make(chan struct{}), make(chan struct{})
	var flowOnce, releaseOnce sync.Once
	testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
		if o != consumer.Applied {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		applied[m.ID]++
		if applied["a2"] > 0 {
			flowOnce.Do(func() { close(flowed) })
		}
		if applied["b3"] > 0 {
			releaseOnce.Do(func() { close(released) })
		}
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	consumer.SetClock(r, func() time.Time { return time.Now().Add(skew) })
	stop := runRunner(t, r)
	wait(t, flowed, "key A to flow past parked key B")

	ctx := context.Background()
	q := consumer.ParkedQuery{Consumer: cfg.GroupID, Topic: e.topic}
	list, err := consumer.ListParked(ctx, e.db.Pool, e.store, q)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range list {
		ids = append(ids, p.MessageID)
	}
	if !slices.Equal(ids, []string{"b1", "b2", "b3"}) {
		t.Fatalf("parked %v, want [b1 b2 b3]", ids)
	}
	head := list[0]
	if !head.Head || head.Behind != 2 || head.Attempts != 1 || head.LastError != "dependency down" ||
		string(head.Key) != "B" || time.Until(head.NextAttempt) < 50*time.Minute || list[1].Head || list[1].Behind != 0 {
		t.Fatalf("head %+v, second %+v", head, list[1])
	}
	if lim, err := consumer.ListParked(ctx, e.db.Pool, e.store, consumer.ParkedQuery{Consumer: cfg.GroupID, Topic: e.topic,
		Limit: 1}); err != nil || len(lim) != 1 {
		t.Fatalf("Limit 1: %d messages, %v", len(lim), err)
	}

	// Another key, another partition: nothing selected.
	for _, other := range []consumer.ParkedQuery{
		{Consumer: cfg.GroupID, Topic: e.topic, Keys: [][]byte{[]byte("A")}},
		{Consumer: cfg.GroupID, Topic: e.topic, Partitions: []int{1}},
		{Consumer: "someone-else", Topic: e.topic},
	} {
		if got, err := consumer.RetryParked(ctx, e.db.Pool, e.store, other); err != nil || len(got) != 0 {
			t.Fatalf("RetryParked(%+v) = %v, %v; want nothing", other, got, err)
		}
	}
	healed.Store(true)
	// A dry run: the same statement, rolled back.
	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a failure below must not leave it open under the schema's drop
	got, err := consumer.RetryParked(ctx, tx, e.store, consumer.ParkedQuery{Consumer: cfg.GroupID, Topic: e.topic,
		Keys: [][]byte{[]byte("B")}})
	if err != nil || len(got) != 1 || got[0].MessageID != "b1" || got[0].Behind != 2 || !got[0].Before.Equal(head.NextAttempt) ||
		time.Until(got[0].NextAttempt) > time.Minute {
		t.Fatalf("RetryParked in a tx = %+v, %v", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := consumer.ListParked(ctx, e.db.Pool, e.store, q); err != nil || len(again) != 3 ||
		!again[0].NextAttempt.Equal(head.NextAttempt) {
		t.Fatalf("after the rollback: %+v, %v", again, err)
	}
	select {
	case <-released:
		t.Fatal("key B was released before RetryParked")
	case <-time.After(200 * time.Millisecond): // ten ParkedPolls
	}

	if _, err := consumer.RetryParked(ctx, e.db.Pool, e.store, q); err != nil {
		t.Fatal(err)
	}
	wait(t, released, "key B released after RetryParked")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	order := e.appliedOrder()
	var b []string
	for _, id := range order {
		if id[0] == 'b' {
			b = append(b, id)
		}
	}
	if !slices.Equal(b, []string{"b1", "b2", "b3"}) {
		t.Fatalf("key B applied in order %v, want [b1 b2 b3] (all: %v)", b, order)
	}
	for id, n := range e.runs() {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	if left, err := consumer.ListParked(ctx, e.db.Pool, e.store, q); err != nil || len(left) != 0 {
		t.Fatalf("still parked after the release: %+v, %v", left, err)
	}
}

// TestParkedNotMigrated: ListParked and RetryParked on a schema without
// idemkit's tables return an error matching ErrNotMigrated; bad queries are
// refused before any SQL.
func TestParkedNotMigrated(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q := consumer.ParkedQuery{Consumer: "c", Topic: "t"}
	if _, err := consumer.ListParked(ctx, db.Pool, store, q); !errors.Is(err, consumer.ErrNotMigrated) {
		t.Fatalf("ListParked: %v, want ErrNotMigrated", err)
	}
	if _, err := consumer.RetryParked(ctx, db.Pool, store, q); !errors.Is(err, consumer.ErrNotMigrated) {
		t.Fatalf("RetryParked: %v, want ErrNotMigrated", err)
	}
	for _, bad := range []consumer.ParkedQuery{{Topic: "t"}, {Consumer: "c"}, {Consumer: "c", Topic: "t", Partitions: []int{-1}},
		{Consumer: "c", Topic: "t", Limit: -1}} {
		if _, err := consumer.ListParked(ctx, db.Pool, store, bad); err == nil || errors.Is(err, consumer.ErrNotMigrated) {
			t.Errorf("ListParked(%+v): %v, want an input error", bad, err)
		}
	}
}

// TestParkedDueOnDatabaseClock: the database's clock is ten minutes ahead of
// the runner's host (now() shadowed by a function of the test's schema,
// first on the pool's search_path). A parked head made due by RetryParked
// (due at the database's now()) is released at once: the runner decides
// what is due on the database's clock, as RetryParked does. A release that
// compared the due time with the host's clock would wait the skew out.
func TestParkedDueOnDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 1)
	if _, err := e.db.Pool.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{e.db.Schema, "now"}.Sanitize()+
		`() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() + interval '10 minutes' $$`); err != nil {
		t.Fatal(err)
	}
	pcfg := e.db.Pool.Config()
	pcfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{e.db.Schema}.Sanitize() + ", pg_catalog"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ahead bool
	if err := pool.QueryRow(ctx, `SELECT now() > pg_catalog.now() + interval '5 minutes'`).Scan(&ahead); err != nil || !ahead {
		t.Fatalf("test setup: now() is not shadowed (%v)", err)
	}

	e.produce(msg("b1", "B", 1))
	var healed atomic.Bool
	cfg := e.config(baseModes[0], func(_ context.Context, m *consumer.Message) error {
		if !healed.Load() {
			return errors.New("dependency down")
		}
		return nil
	})
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry = retry.Policy{MaxAttempts: 1}
	cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 5}
	cfg.ParkedPoll = 20 * time.Millisecond
	applied := make(chan struct{})
	var once sync.Once
	testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
		if m.ID == "b1" && o == consumer.Applied {
			once.Do(func() { close(applied) })
		}
	}
	stop := run(t, pool, cfg)
	q := consumer.ParkedQuery{Consumer: cfg.GroupID, Topic: e.topic}
	for deadline := time.Now().Add(time.Minute); ; {
		list, err := consumer.ListParked(ctx, pool, e.store, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 1 {
			if list[0].Due {
				t.Fatalf("a head parked for an hour is due: %+v", list[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b1 not parked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	healed.Store(true)
	got, err := consumer.RetryParked(ctx, pool, e.store, q)
	if err != nil || len(got) != 1 || !got[0].Due {
		t.Fatalf("RetryParked = %+v, %v; want b1, due", got, err)
	}
	select {
	case <-applied:
	case <-time.After(15 * time.Second):
		t.Fatal("b1 not released 15s after RetryParked: the runner went by its host's clock")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
