package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// The relay child process is configured through these variables.
const (
	childEnv    = "IDEMKIT_OUTBOX_CHILD"  // set: run as the relay process
	childSchema = "IDEMKIT_OUTBOX_SCHEMA" // schema of the outbox
	childCrash  = "IDEMKIT_OUTBOX_CRASH"  // value of a message: SIGKILL after publishing it, before marking
	childBatch  = "IDEMKIT_OUTBOX_BATCH"  // relay batch size
)

// child runs a relay that kills itself right after Kafka acknowledged the
// batch holding the crash message, or exits 0 once the outbox is empty.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer pool.Close()
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: os.Getenv(childSchema)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	crash := os.Getenv(childCrash)
	batch, _ := strconv.Atoi(os.Getenv(childBatch))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{
		Kafka:     kafkaconn.Config{Brokers: strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")},
		BatchSize: batch, PollInterval: 50 * time.Millisecond,
		Observers: []outbox.Observer{&testobs.Outbox{
			OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
				for _, r := range recs {
					if crash != "" && string(r.Value) == crash {
						fmt.Printf("crash %s\n", r.ID)
						_ = os.Stdout.Sync()
						_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
						select {}
					}
				}
			},
			OnPublished: func(recs []outbox.Record) {
				for _, r := range recs {
					fmt.Printf("published %s\n", r.ID)
				}
				st, err := store.Stats(ctx, pool)
				if err == nil && st.Backlog == 0 {
					stop()
				}
			},
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := relay.Run(runCtx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "child: timed out")
		return 1
	}
	return 0
}

// startChild runs the test binary as the relay process; it returns its
// stdout lines and whether SIGKILL ended it.
func startChild(t *testing.T, env ...string) (lines []string, killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, childEnv+"=1",
		testenv.EnvDatabaseURL+"="+testenv.DatabaseURL(t),
		testenv.EnvKafkaBrokers+"="+strings.Join(testenv.Brokers(t), ","))...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	lines = strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return lines, true
		}
	}
	if err != nil {
		t.Fatalf("relay process: %v\nstderr:\n%s", err, stderr.String())
	}
	return lines, false
}

// TestCrashAfterPublishChain: consumer → outbox → relay → consumer. The
// upstream consumer's handler enqueues an event in its transaction; the
// relay is killed with SIGKILL after Kafka acknowledged a batch and before it
// was marked; a new relay publishes that batch again with the same IDs; the
// downstream consumer applies each event's effect exactly once.
func TestCrashAfterPublishChain(t *testing.T) {
	t.Parallel()
	const n = 10
	ctx := context.Background()
	db, store := newDB(t)
	in, out := testenv.NewTopic(t, 1), testenv.NewTopic(t, 1)
	dd, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	effects := db.Table("effects")

	var wg sync.WaitGroup
	runCtx, stopAll := context.WithCancel(ctx)
	t.Cleanup(func() { stopAll(); wg.Wait() })
	startConsumer := func(cfg consumer.Config) {
		cfg.Kafka, cfg.Store, cfg.SessionTimeout = testenv.Kafka(t), dd, 6*time.Second
		r, err := consumer.New(db.Pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := r.Run(runCtx); err != nil {
				t.Errorf("consumer on %s: %v", cfg.Topic, err)
			}
		})
	}
	// Upstream: an order service that records the order and its event.
	startConsumer(consumer.Config{Topic: in, GroupID: testenv.Name(t, "up"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := store.EnqueueTx(ctx, tx, outbox.Message{Topic: out, Key: m.Key, Value: m.Value})
			return err
		})})

	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: in, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, kafka.Message{Key: []byte("order"), Value: fmt.Appendf(nil, "m-%d", i),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: fmt.Appendf(nil, "in-%d", i)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "upstream enqueued every event", func() (bool, error) {
		b, err := backlog(db, store)()
		return b == n, err
	})

	// A relay that dies between publish and mark, in its second batch.
	lines, killed := startChild(t, childSchema+"="+db.Schema, childCrash+"=m-5", childBatch+"=4")
	if !killed {
		t.Fatalf("the relay was not killed at the crash point: %v", lines)
	}
	crashed := strings.TrimPrefix(lines[len(lines)-1], "crash ")
	if b, err := backlog(db, store)(); err != nil || b != n-4 {
		t.Fatalf("after the crash the backlog is %d (%v), want %d: the crashed batch is not marked", b, err, n-4)
	}
	// A new relay publishes the rest, the crashed batch again.
	lines, killed = startChild(t, childSchema+"="+db.Schema, childBatch+"=4")
	if killed {
		t.Fatal("the second relay was killed")
	}
	if !slices.Contains(lines, "published "+crashed) {
		t.Fatalf("the second relay did not republish %s: %v", crashed, lines)
	}

	got := readAll(t, testenv.Brokers(t), out)
	ids := map[string]int{}
	for _, m := range got {
		ids[header(m, outbox.HeaderID)]++
	}
	if len(got) != n+4 || len(ids) != n || ids[crashed] != 2 {
		t.Fatalf("%d messages, %d IDs, %s seen %d times; want %d messages (the crashed batch of 4 twice), %d IDs",
			len(got), len(ids), crashed, ids[crashed], n+4, n)
	}

	// Downstream: applies each event's effect once, deduplicating on the ID.
	var applied, duplicates atomic.Int64
	startConsumer(consumer.Config{Topic: out, GroupID: testenv.Name(t, "down"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id, runs) VALUES ($1, 1)
				ON CONFLICT (id) DO UPDATE SET runs = `+effects+`.runs + 1`, string(m.Value))
			return err
		}),
		Observers: []consumer.Observer{&testobs.Hooks{OnOutcome: func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
			switch o {
			case consumer.Applied:
				applied.Add(1)
			case consumer.Duplicate:
				duplicates.Add(1)
			}
		}}}})
	waitFor(t, time.Minute, "downstream consumed every message", func() (bool, error) {
		return applied.Load()+duplicates.Load() == int64(n+4), nil
	})
	if applied.Load() != n || duplicates.Load() != 4 {
		t.Fatalf("downstream: %d applied, %d duplicates; want %d and 4", applied.Load(), duplicates.Load(), n)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, runs FROM `+effects+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		ID   string
		Runs int
	}])
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != n {
		t.Fatalf("%d effects, want %d", len(runs), n)
	}
	for _, r := range runs {
		if r.Runs != 1 {
			t.Fatalf("effect %s ran %d times", r.ID, r.Runs)
		}
	}
}
