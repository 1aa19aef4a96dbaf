package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// producedAtHeader carries the produce time (Unix nanoseconds) of a message of
// the steady-rate phase.
const producedAtHeader = "produced-at"

// childSpec is what a child process runs; the parent passes it as JSON in
// childEnv.
type childSpec struct {
	Scenario    string        `json:"scenario"`
	DatabaseURL string        `json:"database_url"`
	Brokers     []string      `json:"brokers"`
	Schema      string        `json:"schema"`
	Topic       string        `json:"topic"` // Kafka topic, or the topic recorded by PostgreSQL alone
	Group       string        `json:"group"` // consumer group, also the dedup consumer name
	Messages    int           `json:"messages"`
	Partitions  int           `json:"partitions"`
	Batch       int           `json:"batch"`
	Accounts    int           `json:"accounts"`
	KafkaPID    int           `json:"kafka_pid"`
	Timeout     time.Duration `json:"timeout"`
	CPUProfile  string        `json:"cpu_profile,omitempty"` // file to write a CPU profile to
	Pool        int           `json:"pool,omitempty"`        // connections; 0: one per partition
}

// childResult is what a child reports on its last stdout line, after
// "result ". Elapsed runs from the first fetched message (the start, for
// PostgreSQL alone) to the commit of the last effect.
type childResult struct {
	Done       int64         `json:"done"`
	Duplicates int64         `json:"duplicates"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Txs        int64         `json:"txs"`
	Segments   segments      `json:"segments"`
	CPU        cpuUsage      `json:"cpu"`
	Latency    *latencyStats `json:"latency,omitempty"`
	// FetchLatency is produce→fetch (the runner's IDFunc; the peer's handler
	// entry): with Latency, it tells Kafka's share of the tail from the rest.
	FetchLatency *latencyStats `json:"fetch_latency,omitempty"`
	LastEffect   time.Time     `json:"last_effect"`
}

// latencyStats summarize produce-to-commit latencies.
type latencyStats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func childMain(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-bench child: bad spec:", err)
		return 2
	}
	sc := findScenario(spec.Scenario)
	if sc == nil {
		fmt.Fprintf(os.Stderr, "idemkit-bench child: unknown scenario %q\n", spec.Scenario)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeoutCause(ctx, spec.Timeout,
		fmt.Errorf("scenario %s took longer than -timeout %s", sc.name, spec.Timeout))
	defer cancel()

	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "idemkit-bench child:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "idemkit-bench child:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	var (
		res *childResult
		err error
	)
	switch sc.kind {
	case kindConsumer, kindSteady, kindPeer, kindScale:
		if sc.peer {
			fmt.Fprintf(os.Stderr, "idemkit-bench child: %s runs the Watermill peer's binary\n", sc.name)
			return 2
		}
		res, err = runConsumerChild(ctx, &spec, sc)
	case kindPG:
		res, err = runPGChild(ctx, &spec, sc)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "idemkit-bench child %s: %v\n", sc.name, err)
		return 1
	}
	b, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "idemkit-bench child %s: %v\n", sc.name, err)
		return 1
	}
	fmt.Printf("result %s\n", b)
	return 0
}

// openPool opens a pool of one connection per partition, connects them all
// now (so that no scenario pays for connecting inside its measured interval)
// and returns their backend PIDs.
func openPool(ctx context.Context, spec *childSpec) (*pgxpool.Pool, []int, error) {
	cfg, err := pgxpool.ParseConfig(spec.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = int32(cmp.Or(spec.Pool, spec.Partitions))
	cfg.MinConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	conns := make([]*pgxpool.Conn, 0, cfg.MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	pids := make([]int, 0, cfg.MaxConns)
	for range cfg.MaxConns {
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

// interval is the measured interval of a consumer child: from the first
// fetched message to the commit that completed the target.
type interval struct {
	mu       sync.Mutex
	start    time.Time
	end      time.Time
	finished bool
}

// runConsumerChild runs idemkit's runner over spec.Topic until spec.Messages
// messages have an outcome. For the steady phase (spec.Messages < 0) it
// prints "ready" once every partition is assigned and learns the target from
// a line "expect N" on stdin.
func runConsumerChild(ctx context.Context, spec *childSpec, sc *scenario) (*childResult, error) {
	pool, backends, err := openPool(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: spec.Schema}})
	if err != nil {
		return nil, err
	}
	table := pgx.Identifier{spec.Schema, "accounts"}.Sanitize()
	clock := newWorkerClock(spec.Partitions)
	meter := &cpuMeter{backends: backends, kafkaPID: spec.KafkaPID}
	steady := sc.kind == kindSteady
	// A scaling process handles its share of the group's messages: it runs
	// until the parent, which counts the claims, closes its stdin.
	scale := sc.kind == kindScale

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var (
		target      atomic.Int64 // outcomes to wait for; -1 while unknown
		done, dups  atomic.Int64
		assigned    atomic.Int64
		span        interval
		latencies   latencyRecorder
		fetchLat    latencyRecorder
		stdinClosed = make(chan struct{})
	)
	target.Store(int64(spec.Messages))
	finish := func() {
		span.mu.Lock()
		defer span.mu.Unlock()
		if !span.finished {
			span.finished, span.end = true, time.Now()
			meter.end()
			stopRun()
		}
	}
	reached := func(n int64) {
		if t := target.Load(); t >= 0 && n >= t {
			finish()
		}
	}
	if steady || scale {
		target.Store(-1)
		go func() { // ends when the parent closes stdin
			defer close(stdinClosed)
			if scale {
				defer finish()
			}
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "expect "); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err == nil && n >= 0 {
						target.Store(n)
						reached(done.Load())
					}
				}
			}
		}()
	} else {
		close(stdinClosed)
	}

	cfg := &consumer.Config{
		Kafka:   kafkaconn.Config{Brokers: spec.Brokers},
		Topic:   spec.Topic,
		GroupID: spec.Group,
		Store:   store,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		// IDFunc reads the message-id header as IDHeader would; the runner
		// calls it when a message is fetched (on the prefetch goroutine),
		// which starts the measured interval.
		IDFunc: func(m *kafka.Message) (string, error) {
			span.mu.Lock()
			if span.start.IsZero() {
				span.start = time.Now()
				meter.begin()
			}
			span.mu.Unlock()
			if steady {
				fetchLat.addOne(time.Now(), m.Headers)
			}
			for _, h := range m.Headers {
				if h.Key == consumer.IDHeaderDefault {
					return string(h.Value), nil
				}
			}
			return "", errors.New("no message-id header")
		},
	}
	h := testobs.Of(cfg)
	h.OnTxStart = func(ctx context.Context, msgs []*consumer.Message, _ int) context.Context {
		clock.txStarted(msgs[0].Partition, time.Now())
		return ctx
	}
	h.OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) {
		now := time.Now()
		clock.afterCommit(msgs[0].Partition, len(msgs), now)
		if steady {
			latencies.add(now, msgs)
		}
	}
	h.OnOutcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
		if o == consumer.Duplicate {
			dups.Add(1)
		}
		n := done.Add(1)
		if heapProfile != "" && n == int64(spec.Messages)/2 {
			writeHeapProfile(heapProfile)
		}
		reached(n)
	}
	h.OnAssigned = func(string, int, int64) {
		if assigned.Add(1) == int64(spec.Partitions) && steady {
			fmt.Println("ready")
		}
	}
	cfg.MaxBufferedBytes = maxBuffered // 0: the default
	switch {
	case sc.batched:
		cfg.BatchSize = spec.Batch
	case !sc.defaults:
		cfg.BatchSize = 1 // one transaction per message
	}
	if sc.batchHandler {
		cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			clock.handlerStarted(msgs[0].Partition, time.Now())
			effects := make([]effect, len(msgs))
			for i, m := range msgs {
				e, err := messageEffect(m)
				if err != nil {
					return err
				}
				effects[i] = e
			}
			err := upsertSet(ctx, tx, table, effects)
			clock.beforeCommit(msgs[0].Partition, time.Now())
			return err
		})
	} else {
		cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			clock.handlerStarted(m.Partition, time.Now())
			e, err := messageEffect(m)
			if err != nil {
				return err
			}
			err = upsertOne(ctx, tx, table, e)
			clock.beforeCommit(m.Partition, time.Now()) // the batch's last call is the one before its commit
			return err
		})
	}
	r, err := consumer.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	if scale {
		fmt.Println("ready")
	}
	runErr := r.Run(runCtx)
	span.mu.Lock()
	finished, start, end := span.finished, span.start, span.end
	span.mu.Unlock()
	if runErr != nil {
		return nil, fmt.Errorf("run: %w", runErr)
	}
	if !finished {
		return nil, fmt.Errorf("stopped after %d of %d messages: %w", done.Load(), target.Load(), context.Cause(ctx))
	}
	<-stdinClosed
	seg, txs, _ := clock.sum()
	return &childResult{
		Done:         done.Load(),
		Duplicates:   dups.Load(),
		Elapsed:      end.Sub(start),
		Txs:          txs,
		Segments:     seg,
		CPU:          meter.result(),
		Latency:      latencies.stats(),
		FetchLatency: fetchLat.stats(),
		LastEffect:   end,
	}, nil
}

// heapProfile, from $IDEMKIT_BENCH_HEAPPROFILE, is a file a consumer child
// writes its heap profile to when half its messages are done.
var heapProfile = os.Getenv("IDEMKIT_BENCH_HEAPPROFILE")

// maxBuffered, from $IDEMKIT_BENCH_MAXBUFFERED (bytes), sets the consumer's
// MaxBufferedBytes instead of its default: for A/B runs of the default.
var maxBuffered, _ = strconv.ParseInt(os.Getenv("IDEMKIT_BENCH_MAXBUFFERED"), 10, 64)

func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-bench child: heap profile:", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-bench child: heap profile:", err)
	}
}

// messageEffect decodes a message: key = account, value = amount.
func messageEffect(m *consumer.Message) (effect, error) {
	amount, err := strconv.ParseInt(string(m.Value), 10, 64)
	if err != nil {
		return effect{}, fmt.Errorf("message %s: amount: %w", m.ID, err)
	}
	return effect{account: string(m.Key), amount: amount}, nil
}

// latencyRecorder keeps the produce-to-commit latency of every message.
type latencyRecorder struct {
	mu      sync.Mutex
	samples []time.Duration
}

func (l *latencyRecorder) add(now time.Time, msgs []*consumer.Message) {
	for _, m := range msgs {
		l.addOne(now, m.Headers)
	}
}

func (l *latencyRecorder) addOne(now time.Time, headers []kafka.Header) {
	for _, h := range headers {
		if h.Key != producedAtHeader {
			continue
		}
		if ns, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
			l.mu.Lock()
			l.samples = append(l.samples, now.Sub(time.Unix(0, ns)))
			l.mu.Unlock()
		}
	}
}

func (l *latencyRecorder) stats() *latencyStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) == 0 {
		return nil
	}
	s := slices.Clone(l.samples)
	slices.Sort(s)
	return &latencyStats{N: len(s), P50: percentile(s, 0.50), P99: percentile(s, 0.99), Max: s[len(s)-1]}
}

// percentile returns the nearest-rank q-quantile of sorted s.
func percentile(s []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// pgMessage is a synthesized message for PostgreSQL alone.
type pgMessage struct {
	id     string
	offset int64
	effect effect
}

// runPGChild runs the consumer's SQL on PostgreSQL alone: the same messages
// (IDs, accounts, partitions) as the backlog, one worker per partition, the
// same claim statements (dedup.Store), the same upserts and the same batching.
func runPGChild(ctx context.Context, spec *childSpec, sc *scenario) (*childResult, error) {
	pool, backends, err := openPool(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: spec.Schema}})
	if err != nil {
		return nil, err
	}
	table := pgx.Identifier{spec.Schema, "accounts"}.Sanitize()
	minimalClaim := `INSERT INTO ` + pgx.Identifier{spec.Schema, "processed_messages"}.Sanitize() +
		` (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT DO NOTHING`
	parts := make([][]pgMessage, spec.Partitions)
	for i := range spec.Messages {
		a := accountOf(i, spec.Accounts)
		p := a % spec.Partitions
		parts[p] = append(parts[p], pgMessage{id: "m-" + strconv.Itoa(i), offset: int64(len(parts[p])),
			effect: effect{account: accountKey(a), amount: amountOf(i)}})
	}
	size := spec.Batch
	if sc.pg == pgPerMessage || sc.pg == pgMinimal {
		size = 1
	}
	clock := newWorkerClock(spec.Partitions)
	meter := &cpuMeter{backends: backends, kafkaPID: spec.KafkaPID}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errs := make([]error, spec.Partitions)
	start := time.Now()
	meter.begin()
	var wg sync.WaitGroup
	for p, msgs := range parts {
		w := &pgWorker{pool: pool, store: store, claims: dedupq.Of(store), table: table, minimalClaim: minimalClaim, mode: sc.pg, consumer: spec.Group,
			topic: spec.Topic, partition: p, clock: clock}
		wg.Go(func() {
			if err := w.run(ctx, msgs, size); err != nil {
				errs[p] = fmt.Errorf("partition %d: %w", p, err)
				cancel(err)
			}
		})
	}
	wg.Wait()
	end := time.Now()
	meter.end()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	seg, txs, msgs := clock.sum()
	return &childResult{Done: msgs, Elapsed: end.Sub(start), Txs: txs, Segments: seg,
		CPU: meter.result(), LastEffect: end}, nil
}

type pgWorker struct {
	pool         *pgxpool.Pool
	store        *dedup.Store
	claims       dedupq.Queuer // store's, as the runner queues them
	table        string
	minimalClaim string // the Watermill peer's claim: no position
	mode         pgMode
	consumer     string
	topic        string
	partition    int
	clock        *workerClock
}

func (w *pgWorker) run(ctx context.Context, msgs []pgMessage, size int) error {
	for len(msgs) > 0 {
		n := min(size, len(msgs))
		if err := w.tx(ctx, msgs[:n]); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// pgClaims are the outcomes of the claims of one transaction.
type pgClaims struct {
	dups       []bool
	one, moved bool
}

// queueClaims queues the claims of msgs the way the runner does.
func (w *pgWorker) queueClaims(b *pgx.Batch, msgs []pgMessage) (*pgClaims, error) {
	res := &pgClaims{}
	if w.mode == pgPerMessage {
		m := msgs[0]
		return res, w.claims.QueueClaimMove(b, dedupq.Claim{Consumer: w.consumer, MessageID: m.id,
			Topic: w.topic, Partition: w.partition, Offset: m.offset}, &res.one, &res.moved)
	}
	claims := make([]dedupq.Claim, len(msgs))
	for i, m := range msgs {
		claims[i] = dedupq.Claim{Consumer: w.consumer, MessageID: m.id, Topic: w.topic,
			Partition: w.partition, Offset: m.offset}
	}
	return res, w.claims.QueueClaimBatch(b, claims, &res.dups)
}

// tx runs one transaction the way the runner does for this mode: BEGIN and
// the claims in one round trip (pgx Batch.BeginTx), the writes, COMMIT.
// The Watermill peer's SQL (pgMinimal) runs as the peer sends it: BEGIN
// alone, COMMIT alone.
func (w *pgWorker) tx(ctx context.Context, msgs []pgMessage) (err error) {
	t0 := time.Now()
	var tx pgx.Tx
	if w.mode == pgMinimal {
		if tx, err = w.pool.Begin(ctx); err != nil {
			return err
		}
	}
	var conn *pgxpool.Conn
	defer func() {
		if err != nil && tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
		if conn != nil {
			conn.Release()
		}
	}()
	switch w.mode {
	case pgMinimal:
		m := msgs[0]
		tag, err := tx.Exec(ctx, w.minimalClaim, w.consumer, m.id, w.topic, w.partition, m.offset)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("message %s claimed twice", m.id)
		}
	default:
		if conn, err = w.pool.Acquire(ctx); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.Queue(pgsession.SetLocal(consumer.HandlerTimeoutDefault)) // the runner's bound of its transactions
		res, err := w.queueClaims(b, msgs)
		if err != nil {
			return err
		}
		br := conn.SendBatch(ctx, b)
		tx = br.Tx()
		if err = br.Close(); err != nil {
			return err
		}
		dups := res.dups
		if w.mode == pgPerMessage {
			dups = []bool{res.one}
			if !res.moved { // the partition's first write, as the runner does it
				m := msgs[0]
				if err = w.store.SavePositionTx(ctx, tx, w.consumer, w.topic, w.partition, m.offset+1, time.Time{}, 0); err != nil {
					return err
				}
			}
		}
		if i := slices.Index(dups, true); i >= 0 {
			return fmt.Errorf("message %s claimed twice", msgs[i].id)
		}
	}
	t1 := time.Now()
	switch w.mode {
	case pgPerMessage, pgMinimal, pgBatchedEach:
		for _, m := range msgs {
			if err := upsertOne(ctx, tx, w.table, m.effect); err != nil {
				return err
			}
		}
	case pgBatchedSavepoint:
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, `SAVEPOINT message`); err != nil {
				return err
			}
			if err := upsertOne(ctx, tx, w.table, m.effect); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `RELEASE SAVEPOINT message`); err != nil {
				return err
			}
		}
	case pgBatchedSavepointMerged:
		// The least a savepoint per message can cost: one round trip (no
		// arguments: pgx sends it with the simple protocol, both statements
		// at once); COMMIT releases the last one.
		for i, m := range msgs {
			sql := `RELEASE SAVEPOINT message; SAVEPOINT message`
			if i == 0 {
				sql = `SAVEPOINT message`
			}
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
			if err := upsertOne(ctx, tx, w.table, m.effect); err != nil {
				return err
			}
		}
	case pgBatchedSet:
		effects := make([]effect, len(msgs))
		for i, m := range msgs {
			effects[i] = m.effect
		}
		if err := upsertSet(ctx, tx, w.table, effects); err != nil {
			return err
		}
	}
	t2 := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	t3 := time.Now()
	w.clock.record(w.partition, len(msgs), segments{Claim: t1.Sub(t0), Handle: t2.Sub(t1), Commit: t3.Sub(t2)})
	return nil
}
