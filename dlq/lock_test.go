package dlq_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/faultproxy"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestOneReplayPerTopic: while a replay of a dead-letter topic runs (held
// in its handler), another replay of it is refused with ErrReplayRunning
// and changes nothing; a dry run of it still runs; once the first ended,
// the second runs and finds its letter replayed.
func TestOneReplayPerTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.oneDeadLetter("pay-1")
	started, release := make(chan struct{}), make(chan struct{})
	first := e.reprocessor(dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(started)
		<-release
		return e.effect(ctx, tx, m)
	}, nil)
	ran := make(chan error, 1)
	go func() { _, err := first.Run(ctx); ran <- err }()
	<-started

	second := e.reprocessor(dlq.Republish, nil, nil)
	sum, err := second.Run(ctx)
	if !errors.Is(err, dlq.ErrReplayRunning) || sum.Records[dlq.Republished] != 0 {
		t.Fatalf("a replay beside another: %+v, %v; want ErrReplayRunning and nothing done", sum, err)
	}
	dry := e.reprocessor(dlq.Republish, nil, func(c *dlq.ReprocessorConfig) { c.DryRun = true })
	if sum, err := dry.Run(ctx); err != nil || sum.Records[dlq.WouldReplay] != 1 {
		t.Fatalf("a dry run beside a replay: %+v, %v; want 1 would-replay", sum, err)
	}
	close(release)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if sum, err := second.Run(ctx); err != nil || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("the replay after the first: %+v, %v; want 1 already replayed", sum, err)
	}
}

// lockKey is the advisory lock key of the replays of topic in schema, as
// the Reprocessor computes it.
func lockKey(schema, topic string) int64 {
	h := sha256.Sum256([]byte("idemkit-dlq-replay\x00" + pgx.Identifier{schema, migrate.DLQReplaysDefault}.Sanitize() + "\x00" + topic))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// endLockSession ends the session holding the advisory lock key and waits
// until it is gone (the lock free).
func endLockSession(t *testing.T, pool *pgxpool.Pool, key int64) {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid, 30000)) FROM pg_locks
		WHERE locktype = 'advisory' AND classid::int8 = $1 AND objid::int8 = $2 AND objsubid = 1 AND granted`,
		int64(uint32(uint64(key)>>32)), int64(uint32(key))).Scan(&n); err != nil || n != 1 {
		t.Fatalf("end the lock's session: %d ended, %v", n, err)
	}
}

// lockGatedPool is a pool whose replay-lock sessions after the first wait
// for gate to close before they connect.
func lockGatedPool(t *testing.T, gate <-chan struct{}) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var locks atomic.Int32
	cfg.BeforeConnect = func(ctx context.Context, c *pgx.ConnConfig) error {
		if strings.Contains(c.RuntimeParams["application_name"], "idemkit dlq replay lock") && locks.Add(1) > 1 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestReplayTakesItsLockAgain: the session holding a replay's lock is
// ended on the server (a restart, a failover, an administrator) while the
// replay is in its handler: the replay takes the lock again on a new
// session and goes on; its letter is applied once.
func TestReplayTakesItsLockAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.oneDeadLetter("pay-1")
	logs, logger := testenv.NewLogs(t)
	started, release := make(chan struct{}), make(chan struct{})
	first := e.reprocessor(dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(started)
		<-release
		return e.effect(ctx, tx, m)
	}, func(c *dlq.ReprocessorConfig) { c.Logger = logger })
	ran := make(chan error, 1)
	go func() { _, err := first.Run(ctx); ran <- err }()
	<-started
	endLockSession(t, e.db.Pool, lockKey(e.db.Schema, e.dlq))
	for logs.Count("dlq: the topic's replay lock is held again", "") == 0 {
		select {
		case err := <-ran:
			t.Fatalf("the replay ended before it took its lock again: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(release)
	if err := <-ran; err != nil {
		t.Fatalf("the replay that took its lock again: %v", err)
	}
	if runs := e.runs(); runs["pay-1"] != 1 {
		t.Fatalf("effects %v, want pay-1 once", runs)
	}
}

// TestReplayStopsWhenItsLockIsTaken: the session holding a replay's lock
// is ended while the replay is in its handler, and another session takes
// the lock before the replay can take it again: the replay stops with
// ErrReplayLockLost instead of going on beside the other; its letter is
// not applied, and a replay run once the lock is free applies it once.
func TestReplayStopsWhenItsLockIsTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.oneDeadLetter("pay-1")
	gate := make(chan struct{})
	started := make(chan struct{})
	first := e.reprocessorOn(lockGatedPool(t, gate), dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(started)
		<-ctx.Done() // held until the run is stopped
		return ctx.Err()
	}, nil)
	ran := make(chan error, 1)
	go func() { _, err := first.Run(ctx); ran <- err }()
	<-started
	key := lockKey(e.db.Schema, e.dlq)
	endLockSession(t, e.db.Pool, key)
	other, err := e.db.Pool.Acquire(ctx) // another replay, as far as the lock goes
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	var ok bool
	if err := other.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil || !ok {
		t.Fatalf("take the lock the replay lost: %v, %v", ok, err)
	}
	close(gate) // the replay may now try to take it again
	select {
	case err := <-ran:
		if !errors.Is(err, dlq.ErrReplayLockLost) {
			t.Fatalf("the replay whose lock was taken: %v, want ErrReplayLockLost", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the replay whose lock was taken goes on")
	}
	if runs := e.runs(); len(runs) != 0 {
		t.Fatalf("effects %v after a replay stopped in its handler", runs)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if sum, err := e.reprocessor(dlq.Redrive, e.effect, nil).Run(ctx); err != nil || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("the replay run again: %+v, %v", sum, err)
	}
	if runs := e.runs(); runs["pay-1"] != 1 {
		t.Fatalf("effects %v, want pay-1 once", runs)
	}
}

// TestVanishedReplayFreesTheLock: the host of a replay vanishes (its
// connections stranded: nothing reaches the server again); the server
// ends the session holding the topic's lock on its own, so a later replay
// is not refused for good.
func TestVanishedReplayFreesTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.oneDeadLetter("pay-1")
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	started := make(chan struct{})
	first := e.reprocessorOn(pool, dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}, func(c *dlq.ReprocessorConfig) { c.HandlerTimeout, c.MaxOutage = 2*time.Second, 3*time.Second })
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { _, err := first.Run(rctx); ran <- err }()
	<-started
	proxy.Set(faultproxy.Strand) // the replay's host is gone
	cancel()
	<-ran
	// The server ends the silent session within its idle_session_timeout
	// (or its TCP keepalives); until then the lock is held.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := e.reprocessor(dlq.Redrive, e.effect, nil).Run(ctx)
		if !errors.Is(err, dlq.ErrReplayRunning) {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the replay's host vanished, a replay is still refused: %v", err)
		}
		time.Sleep(time.Second)
	}
	if runs := e.runs(); runs["pay-1"] != 1 {
		t.Fatalf("effects %v, want pay-1 once", runs)
	}
}

// oneDeadLetter writes a dead letter of id to e's dead-letter topic, as the
// consumer's Writer does.
func (e *env) oneDeadLetter(id string) {
	e.t.Helper()
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(e.t), Group: e.group, Logger: e.logger})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Close()
	e.deadLetter(w, id, 0)
}
