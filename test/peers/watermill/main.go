// Command watermill is the Watermill peer of idemkit-bench: the
// same effect as the benchmark's consumer scenarios — claim the message ID in
// the dedup table and upsert one balance, in one PostgreSQL transaction per
// message — written the way a Watermill user would: a message.Router with one
// consumer handler, fed by watermill-kafka's Subscriber (IBM/sarama) in a
// consumer group, the handler running its own pgx transaction and the router
// acking the message once the handler returned, after the commit.
//
// It lives in its own module so that neither idemkit nor its test module
// depends on Watermill or sarama. idemkit-bench builds it and runs it as one
// of its child processes: the spec comes as JSON in IDEMKIT_BENCH_CHILD, the
// result goes to stdout as "result {json}", with the same fields as the
// bench's own children; for a steady-rate run it prints "ready" once the
// group has every partition assigned and reads "expect N" from stdin.
//
// Settings (what a reasonable user sets, everything else as it comes):
//   - sarama: watermill-kafka's DefaultSaramaSubscriberConfig, with
//     Version = sarama.V3_6_0_0 (the newest sarama v1.43 knows; Kafka 4
//     refuses the protocol versions of the default V1_0_0_0) and
//     Consumer.Offsets.Initial = OffsetOldest (read the backlog a new group
//     finds). Offsets are marked on ack and auto-committed every second
//     (sarama's default), and committed once more when the group closes.
//   - router: default RouterConfig, the Recoverer middleware, one
//     AddConsumerHandler; the router runs each delivered message in its own
//     goroutine and the subscriber delivers one message per partition at a
//     time (the next only after the ack), so at most one transaction per
//     partition is open, as with idemkit.
//   - pgx: a pool of one connection per partition, like idemkit's runs.
//   - SQL: INSERT … ON CONFLICT DO NOTHING into the dedup table (a
//     duplicate commits nothing and is acked), then the same upsert as
//     the bench's per-message handler.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The protocol shared with idemkit-bench (test/cmd/idemkit-bench/child.go).
const (
	childEnv         = "IDEMKIT_BENCH_CHILD"
	idHeader         = "message-id"
	producedAtHeader = "produced-at"
)

// spec is the part of the bench's childSpec this peer reads.
type spec struct {
	Scenario    string        `json:"scenario"`
	DatabaseURL string        `json:"database_url"`
	Brokers     []string      `json:"brokers"`
	Schema      string        `json:"schema"`
	Topic       string        `json:"topic"`
	Group       string        `json:"group"`
	Messages    int           `json:"messages"` // < 0: steady run, the target comes on stdin
	Partitions  int           `json:"partitions"`
	KafkaPID    int           `json:"kafka_pid"`
	Timeout     time.Duration `json:"timeout"`
}

// result matches the bench's childResult.
type result struct {
	Done       int64         `json:"done"`
	Duplicates int64         `json:"duplicates"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Txs        int64         `json:"txs"`
	Segments   segments      `json:"segments"`
	CPU        cpuUsage      `json:"cpu"`
	Latency    *latencyStats `json:"latency,omitempty"`
	// FetchLatency is produce→handler entry.
	FetchLatency *latencyStats `json:"fetch_latency,omitempty"`
	LastEffect   time.Time     `json:"last_effect"`
}

type segments struct {
	Wait   time.Duration `json:"wait_ns"`
	Claim  time.Duration `json:"begin_claim_ns"`
	Handle time.Duration `json:"handler_ns"`
	Commit time.Duration `json:"commit_ns"`
}

type latencyStats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func main() {
	raw := os.Getenv(childEnv)
	if raw == "" {
		fmt.Fprintf(os.Stderr, "watermill peer: run by idemkit-bench (%s is not set)\n", childEnv)
		os.Exit(2)
	}
	var s spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "watermill peer: bad spec:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeoutCause(ctx, s.Timeout,
		fmt.Errorf("scenario %s took longer than -timeout %s", s.Scenario, s.Timeout))
	defer cancel()
	res, err := run(ctx, &s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "watermill peer %s: %v\n", s.Scenario, err)
		os.Exit(1)
	}
	b, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, "watermill peer:", err)
		os.Exit(1)
	}
	fmt.Printf("result %s\n", b)
}

// partClock times one partition's transactions; the subscriber hands a
// partition's messages to the router one at a time, so they never overlap.
type partClock struct {
	mu       sync.Mutex
	lastDone time.Time
	seg      segments
	txs      int64
}

func run(ctx context.Context, s *spec) (*result, error) {
	pool, backends, err := openPool(ctx, s)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	claimSQL := `INSERT INTO ` + pgx.Identifier{s.Schema, "processed_messages"}.Sanitize() +
		` (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT DO NOTHING`
	upsertSQL := `INSERT INTO ` + pgx.Identifier{s.Schema, "accounts"}.Sanitize() +
		` AS a (id, balance, updated) VALUES ($1, $2, 1)
	ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1`

	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr,
		&slog.HandlerOptions{Level: slog.LevelWarn})))
	scfg := wkafka.DefaultSaramaSubscriberConfig()
	scfg.Version = sarama.V3_6_0_0
	scfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               s.Brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: scfg,
		ConsumerGroup:         s.Group,
	}, logger)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(middleware.Recoverer)

	meter := &cpuMeter{backends: backends, kafkaPID: s.KafkaPID}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var (
		target         atomic.Int64
		done, dups     atomic.Int64
		mu             sync.Mutex // guards start, end, finished, samples
		start, end     time.Time
		finished       bool
		samples        []time.Duration
		fetchSamples   []time.Duration
		clocks         = make([]partClock, s.Partitions)
		stdinClosed    = make(chan struct{})
		steady         = s.Messages < 0
		lastEffectTime time.Time
	)
	target.Store(int64(s.Messages))
	finish := func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			finished, end = true, lastEffectTime
			meter.end()
			// The router closes when its context ends. Not at once: the
			// handler that reached the target has yet to return, and the
			// subscriber to see its ack and mark the offset (a context ended
			// before that drops the ack); the measured interval has ended.
			time.AfterFunc(250*time.Millisecond, stopRun)
		}
	}
	reached := func(n int64) {
		if t := target.Load(); t >= 0 && n >= t {
			finish()
		}
	}

	router.AddConsumerHandler("idemkit-bench", s.Topic, sub, func(msg *message.Message) error {
		t0 := time.Now()
		mu.Lock()
		if start.IsZero() {
			start = t0
			meter.begin()
		}
		mu.Unlock()
		ctx := msg.Context()
		partition, _ := wkafka.MessagePartitionFromCtx(ctx)
		offset, _ := wkafka.MessagePartitionOffsetFromCtx(ctx)
		key, _ := wkafka.MessageKeyFromCtx(ctx)
		id := msg.Metadata.Get(idHeader)
		if id == "" {
			return fmt.Errorf("message at %d/%d: no %s header", partition, offset, idHeader)
		}
		amount, err := strconv.ParseInt(string(msg.Payload), 10, 64)
		if err != nil {
			return fmt.Errorf("message %s: amount: %w", id, err)
		}

		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		tag, err := tx.Exec(ctx, claimSQL, s.Group, id, s.Topic, partition, offset)
		if err != nil {
			return err
		}
		t1 := time.Now()
		dup := tag.RowsAffected() == 0
		if !dup {
			if _, err := tx.Exec(ctx, upsertSQL, string(key), amount); err != nil {
				return err
			}
		}
		t2 := time.Now()
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		t3 := time.Now()

		if int(partition) < len(clocks) {
			c := &clocks[partition]
			c.mu.Lock()
			if !c.lastDone.IsZero() {
				c.seg.Wait += t0.Sub(c.lastDone)
			}
			c.seg.Claim += t1.Sub(t0)
			c.seg.Handle += t2.Sub(t1)
			c.seg.Commit += t3.Sub(t2)
			c.lastDone = t3
			c.txs++
			c.mu.Unlock()
		}
		mu.Lock()
		if t3.After(lastEffectTime) {
			lastEffectTime = t3
		}
		if v := msg.Metadata.Get(producedAtHeader); steady && v != "" {
			if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
				samples = append(samples, t3.Sub(time.Unix(0, ns)))
				fetchSamples = append(fetchSamples, t0.Sub(time.Unix(0, ns)))
			}
		}
		mu.Unlock()
		if dup {
			dups.Add(1)
		}
		reached(done.Add(1))
		return nil // the router acks: sarama marks the offset
	})

	if steady {
		target.Store(-1)
		go func() {
			defer close(stdinClosed)
			if err := waitAssigned(runCtx, s); err != nil {
				if runCtx.Err() == nil {
					fmt.Fprintln(os.Stderr, "watermill peer: waiting for the assignment:", err)
					stopRun()
				}
				return
			}
			fmt.Println("ready")
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "expect "); ok {
					if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
						target.Store(n)
						reached(done.Load())
					}
				}
			}
		}()
	} else {
		close(stdinClosed)
	}

	runErr := router.Run(runCtx)
	mu.Lock()
	ok, first, last := finished, start, end
	lat, fetchLat := slices.Clone(samples), slices.Clone(fetchSamples)
	mu.Unlock()
	if runErr != nil && !ok {
		return nil, fmt.Errorf("router: %w", runErr)
	}
	if !ok {
		return nil, fmt.Errorf("stopped after %d of %d messages: %w", done.Load(), target.Load(), context.Cause(ctx))
	}
	<-stdinClosed
	res := &result{Done: done.Load(), Duplicates: dups.Load(), Elapsed: last.Sub(first), CPU: meter.result(),
		LastEffect: last}
	for i := range clocks {
		c := &clocks[i]
		c.mu.Lock()
		res.Segments.Wait += c.seg.Wait
		res.Segments.Claim += c.seg.Claim
		res.Segments.Handle += c.seg.Handle
		res.Segments.Commit += c.seg.Commit
		res.Txs += c.txs
		c.mu.Unlock()
	}
	res.Latency, res.FetchLatency = stats(lat), stats(fetchLat)
	return res, nil
}

func stats(s []time.Duration) *latencyStats {
	if len(s) == 0 {
		return nil
	}
	slices.Sort(s)
	return &latencyStats{N: len(s), P50: percentile(s, 0.50), P99: percentile(s, 0.99), Max: s[len(s)-1]}
}

// percentile returns the nearest-rank q-quantile of sorted s.
func percentile(s []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// openPool opens one connection per partition and connects them all now, so
// that connecting is outside the measured interval; it returns their backend
// PIDs.
func openPool(ctx context.Context, s *spec) (*pgxpool.Pool, []int, error) {
	cfg, err := pgxpool.ParseConfig(s.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = int32(s.Partitions)
	cfg.MinConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	conns := make([]*pgxpool.Conn, 0, s.Partitions)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	pids := make([]int, 0, s.Partitions)
	for range s.Partitions {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("backend pid: %w", err)
		}
		pids = append(pids, pid)
	}
	return pool, pids, nil
}

// waitAssigned polls the group until it is stable with every partition of
// the topic assigned (Watermill has no assignment callback).
func waitAssigned(ctx context.Context, s *spec) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	admin, err := sarama.NewClusterAdmin(s.Brokers, cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		groups, err := admin.DescribeConsumerGroups([]string{s.Group})
		if err == nil && len(groups) == 1 && groups[0].State == "Stable" {
			assigned := 0
			for _, m := range groups[0].Members {
				a, err := m.GetMemberAssignment()
				if err == nil && a != nil {
					assigned += len(a.Topics[s.Topic])
				}
			}
			if assigned == s.Partitions {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-tick.C:
		}
	}
}
