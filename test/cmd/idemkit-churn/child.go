package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// childSpec is what a child process runs; the parent passes it as JSON in
// childEnv.
type childSpec struct {
	Name        string        `json:"name"` // for the logs: slot and incarnation
	DatabaseURL string        `json:"database_url"`
	Brokers     []string      `json:"brokers"`
	Schema      string        `json:"schema"`
	Topic       string        `json:"topic"`
	Group       string        `json:"group"`
	Batch       int           `json:"batch"`
	Session     time.Duration `json:"session_ns"`
	Heartbeat   time.Duration `json:"heartbeat_ns"`
	Rebalance   time.Duration `json:"rebalance_ns"`
	StopDelay   time.Duration `json:"stop_delay_ns"`
}

// handlerWork is how long a message takes when -stop-delay is set.
const handlerWork = 10 * time.Millisecond

// effectsDDL is the business table: one row per message ID, how often its
// effect ran, and when it was applied.
const effectsDDL = `CREATE TABLE %s (
	id         text        PRIMARY KEY,
	part       int         NOT NULL,
	off        bigint      NOT NULL,
	runs       int         NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

// childMain runs one consumer instance until SIGTERM (or SIGKILL). It prints
// "assigned PARTITION UNIXNANO" when the runner starts a partition and
// "duplicate" for every redelivered message the dedup store stopped.
func childMain(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-churn child: bad spec:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With("child", spec.Name)
	if err := runChild(ctx, &spec, log); err != nil {
		log.Error("instance failed", "err", err)
		return 1
	}
	return 0
}

func runChild(ctx context.Context, spec *childSpec, log *slog.Logger) error {
	cfg, err := pgxpool.ParseConfig(spec.DatabaseURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: spec.Schema}})
	if err != nil {
		return err
	}
	table := pgx.Identifier{spec.Schema, "effects"}.Sanitize()
	var out sync.Mutex // one line per write: the parent reads whole lines
	say := func(format string, args ...any) {
		out.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
		out.Unlock()
	}
	ccfg := &consumer.Config{
		Kafka:             kafkaconn.Config{Brokers: spec.Brokers},
		Topic:             spec.Topic,
		GroupID:           spec.Group,
		Store:             store,
		BatchSize:         spec.Batch,
		SessionTimeout:    spec.Session,
		HeartbeatInterval: spec.Heartbeat,
		RebalanceTimeout:  spec.Rebalance,
		Logger:            log,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if spec.StopDelay > 0 {
				// Work that notices a cancellation only StopDelay later,
				// like a call that does not take ctx.
				t := time.NewTimer(handlerWork)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					time.Sleep(spec.StopDelay)
					return ctx.Err()
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, part, off, runs) VALUES ($1, $2, $3, 1)
				ON CONFLICT (id) DO UPDATE SET runs = `+table+`.runs + 1`, m.ID, m.Partition, m.Offset)
			return err
		}),
	}
	h := testobs.Of(ccfg)
	h.OnAssigned = func(_ string, partition int, _ int64) {
		say("assigned %d %d", partition, time.Now().UnixNano())
	}
	h.OnOutcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
		if o == consumer.Duplicate {
			say("duplicate")
		}
	}
	r, err := consumer.New(pool, ccfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
