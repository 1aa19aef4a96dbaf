package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// logBuffer collects log lines from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// appPool is a pool of its own, recognisable in pg_stat_activity by its
// application_name, with at most maxConns connections.
func appPool(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := testenv.Name(t, "app")
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, app
}

// terminate ends every backend of app and waits until they are gone.
func (e *env) terminate(app string) {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE application_name = $1`, app); err != nil {
		e.t.Error(err)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE application_name = $1`, app).Scan(&n); err != nil {
			e.t.Error(err)
			return
		}
		if n == 0 {
			return
		}
	}
	e.t.Error("backends still there 10s after pg_terminate_backend")
}

// TestReprocessorRidesOutPostgresTermination: the reprocessor's connections
// are terminated twice in the middle of a replay, once between two dead
// letters and once inside a redrive's transaction. The reprocessor waits
// each outage out, logs it once, and replays every dead letter once: an
// outage is not a failure of the dead letter (no round is spent).
func TestReprocessorRidesOutPostgresTermination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	ids := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	e.produce(ids...)
	e.consume(len(ids), func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })

	pool, app := appPool(t, 1)
	var logs logBuffer
	killedInTx := false
	r := e.reprocessorOn(pool, dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "p3" && !killedInTx {
			killedInTx = true
			e.terminate(app) // the connection of this very transaction
		}
		return e.effect(ctx, tx, m)
	}, func(c *dlq.ReprocessorConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Retry = retry.Policy{MaxAttempts: 1} // an outage must not use up the handler's attempts
		c.Progress = func(it dlq.Item) {
			if it.DeadLetter != nil && it.DeadLetter.MessageID == "p1" {
				e.terminate(app) // the next statement finds its connection gone
			}
		}
	})
	sum, err := r.Run(ctx)
	if err != nil || sum.Records[dlq.Applied] != len(ids) {
		t.Fatalf("replay through two terminations: %v, %v; want all applied\n%s", sum, err, logs.String())
	}
	runs := e.runs()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Fatalf("%s ran %d times, want 1 (effects %v)", id, runs[id], runs)
		}
	}
	if dls := e.deadLetters(); len(dls) != len(ids) {
		t.Fatalf("%d dead letters, want %d: an outage must not send a letter around again", len(dls), len(ids))
	}
	if s, r := logs.count("server unreachable; waiting it out"), logs.count("server reachable again"); s != 2 || r != 2 ||
		logs.count("outage=") != 2 {
		t.Fatalf("logged %d outage starts and %d ends, want 2 of each with their duration:\n%s", s, r, logs.String())
	}
}

// checkOutage fails the test unless err is a *retry.OutageError of at least
// maxOutage that came within a reasonable time after start.
func checkOutage(t *testing.T, what string, err error, start time.Time, maxOutage time.Duration) {
	t.Helper()
	var oerr *retry.OutageError
	if !errors.Is(err, retry.ErrOutage) || !errors.As(err, &oerr) || oerr.Duration < maxOutage {
		t.Fatalf("%s: %v; want a *retry.OutageError of at least %v", what, err, maxOutage)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("%s: gave up after %v, MaxOutage is %v", what, took, maxOutage)
	}
}

// TestReprocessorMaxOutage: past MaxOutage without PostgreSQL, Run gives up
// with a *retry.OutageError.
func TestReprocessorMaxOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.produce("m")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	nowhere, err := pgxpool.New(ctx, "postgres://idemkit@127.0.0.1:1/idemkit?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer nowhere.Close()
	const maxOutage = 500 * time.Millisecond
	start := time.Now()
	_, err = e.reprocessorOn(nowhere, dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) {
		c.MaxOutage = maxOutage
	}).Run(ctx)
	checkOutage(t, "reprocessor without PostgreSQL", err, start, maxOutage)
}

// TestWriterMaxOutage: past MaxOutage without Kafka, OnFailure gives up with
// a *retry.OutageError.
func TestWriterMaxOutage(t *testing.T) {
	t.Parallel()
	const maxOutage = 500 * time.Millisecond
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), MaxOutage: maxOutage})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := time.Now()
	err = w.OnFailure(context.Background(), &consumer.Message{ID: "m", Message: kafka.Message{Topic: "orders"}},
		errors.New("bug"))
	checkOutage(t, "writer without Kafka", err, start, maxOutage)
}

// TestReprocessorReplacesReadOnlySession: the only connection of the
// reprocessor's pool was made read-only by other code sharing the pool (SET
// SESSION CHARACTERISTICS outlives a transaction). The replay's first
// write gets 25006; the reprocessor closes that connection (it neither
// gives it back nor waits on it as an outage until MaxOutage), and the
// replay goes through on a new one.
func TestReprocessorReplacesReadOnlySession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.produce("r1")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })

	pcfg := e.db.Pool.Config()
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`); err != nil {
		t.Fatal(err)
	}
	sum, err := e.reprocessorOn(pool, dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) {
		c.MaxOutage = 20 * time.Second
	}).Run(ctx)
	if err != nil || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("Run = %v, %v; want r1 applied", sum, err)
	}
	if runs := e.runs(); runs["r1"] != 1 {
		t.Fatalf("effects %v, want r1 once", runs)
	}
}
