// Command idemkit-http-bench measures the idemhttp middleware under
// concurrent load on a real HTTP listener (127.0.0.1) and a real PostgreSQL,
// against a bare handler and against a one-transaction design (the record
// and the handler's writes in one transaction).
//
// Every scenario's handler inserts one payment row. Scenarios:
//
//	bare        the handler in its own transaction, no idempotency
//	first       the middleware, every request with a fresh key
//	replay      the middleware, every client repeating its own completed key
//	onetx       the one-transaction design, by hand: in one transaction
//	            INSERT … ON CONFLICT DO NOTHING the record, insert the
//	            payment, UPDATE the record to COMPLETED, commit (BEGIN is
//	            pipelined with the first INSERT, the UPDATE with the COMMIT);
//	            a duplicate waits on the unique index, then replays
//	hot-onetx   hot keys on the one-transaction design: waves of 16 fresh
//	            keys, the clients spread over them, a wave ends when every
//	            client has its key's answer
//	hot-409     the same waves on the middleware; a client answered 409
//	            retries at once
//	hot-wait    the same waves on the middleware with Config.Wait
//	redis-first the middleware with its records in Redis (module redis,
//	            -redis URL), every request with a fresh key; the payment in
//	            a transaction of the handler's own
//	redis-replay the same, every client repeating its own completed key
//
// The redis-* scenarios run when -redis names a server (default
// $IDEMKIT_TEST_REDIS_URL); their ratios are to first and replay.
//
// One run interleaves them: for each round, for each concurrency level,
// every scenario in a rotated order, each on emptied tables. It reports,
// per level, the medians over the rounds of: operations per second (a
// request, or for hot-* a key), p50 and p99 latency (of a request, or from a
// key's first attempt to its answer), WAL bytes per operation
// (pg_current_wal_lsn), PostgreSQL CPU per operation (from /proc: the pool's
// backends plus the WAL writer, checkpointer and background writer; the
// server must run on this machine), and the medians of the per-round ratios
// to the one-transaction design (and of first and replay to bare). WAL and
// CPU are server-wide counters: run it on a server nobody else uses for
// clean figures.
//
//	go run ./cmd/idemkit-http-bench -levels 1,16,64,256 -rounds 3 -duration 4s
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemredis"
	"github.com/idemkit/idemkit/migrate"
)

type options struct {
	database  string
	levels    []int
	rounds    int
	duration  time.Duration
	warmup    time.Duration
	poolSize  int
	wait      time.Duration
	scenarios []string
	jsonOut   string
	keep      bool
	redisURL  string
}

var allScenarios = []string{"bare", "first", "replay", "onetx", "hot-onetx", "hot-409", "hot-wait",
	"redis-first", "redis-replay"}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-http-bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("idemkit-http-bench", flag.ContinueOnError)
	o := &options{}
	fs.StringVar(&o.database, "database", os.Getenv("IDEMKIT_TEST_DATABASE_URL"), "PostgreSQL URL (default $IDEMKIT_TEST_DATABASE_URL)")
	levels := fs.String("levels", "1,16,64,256", "concurrency levels (closed-loop clients)")
	fs.IntVar(&o.rounds, "rounds", 3, "interleaved rounds")
	fs.DurationVar(&o.duration, "duration", 4*time.Second, "measured time per scenario, level and round")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured time before each measurement")
	fs.IntVar(&o.poolSize, "pool", 32, "connections in the server's pool")
	fs.DurationVar(&o.wait, "wait", 5*time.Second, "idemhttp Config.Wait of hot-wait")
	fs.StringVar(&o.redisURL, "redis", os.Getenv("IDEMKIT_TEST_REDIS_URL"), "Redis URL of the redis-* scenarios (default $IDEMKIT_TEST_REDIS_URL)")
	sc := fs.String("scenarios", "", "scenarios to run (default all; the redis-* ones only with -redis)")
	fs.StringVar(&o.jsonOut, "json", "", "also write every measurement to this file")
	fs.BoolVar(&o.keep, "keep", false, "keep the benchmark's schema")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.database == "" {
		return nil, errors.New("no database: set IDEMKIT_TEST_DATABASE_URL or -database (scripts/bench-http starts one)")
	}
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-levels: %q is not a positive number", f)
		}
		o.levels = append(o.levels, n)
	}
	if *sc == "" {
		for _, s := range allScenarios {
			if o.redisURL != "" || !strings.HasPrefix(s, "redis-") {
				o.scenarios = append(o.scenarios, s)
			}
		}
	}
	for _, s := range strings.Split(*sc, ",") {
		s = strings.TrimSpace(s)
		if *sc == "" {
			break
		}
		if !slices.Contains(allScenarios, s) {
			return nil, fmt.Errorf("-scenarios: unknown %q (known: %s)", s, strings.Join(allScenarios, ","))
		}
		if strings.HasPrefix(s, "redis-") && o.redisURL == "" {
			return nil, fmt.Errorf("-scenarios: %s needs -redis (or $IDEMKIT_TEST_REDIS_URL)", s)
		}
		o.scenarios = append(o.scenarios, s)
	}
	if o.rounds < 1 || o.duration <= 0 || o.warmup < 0 || o.poolSize < 1 || o.wait <= 0 {
		return nil, errors.New("-rounds, -duration, -pool and -wait must be positive, -warmup not negative")
	}
	return o, nil
}

// measurement is one scenario at one level in one round.
type measurement struct {
	Scenario    string  `json:"scenario"`
	Level       int     `json:"level"`
	Round       int     `json:"round"`
	Ops         int64   `json:"ops"`
	Requests    int64   `json:"requests"`
	Errors      int64   `json:"errors"`
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_per_s"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	WALPerOp    float64 `json:"wal_bytes_per_op"`
	CPUPerOpUS  float64 `json:"db_cpu_us_per_op"`
	AuxPerOpUS  float64 `json:"db_aux_cpu_us_per_op"`
	CPUMeasured bool    `json:"db_cpu_measured"`
}

func run(ctx context.Context, o *options) error {
	b, err := newBench(ctx, o)
	if err != nil {
		return err
	}
	defer b.close(o.keep)
	fmt.Printf("idemkit-http-bench: schema %s, pool %d, levels %v, %d rounds of %v (+%v warm-up), postgres CPU from /proc: %v\n",
		b.schema, o.poolSize, o.levels, o.rounds, o.duration, o.warmup, b.cpuOK)
	var all []measurement
	for round := 1; round <= o.rounds; round++ {
		for li, level := range o.levels {
			order := slices.Clone(o.scenarios)
			rot := (round + li) % len(order) // rotate, so that no scenario always runs first
			order = append(order[rot:], order[:rot]...)
			for _, sc := range order {
				m, err := b.measure(ctx, sc, level, round)
				if err != nil {
					return fmt.Errorf("%s at %d, round %d: %w", sc, level, round, err)
				}
				fmt.Fprintf(os.Stderr, "round %d c=%-3d %-9s %8.0f op/s p50 %6.2fms p99 %7.2fms WAL %6.0f B/op CPU %6.0f µs/op (aux %4.0f) (%d requests, %d errors)\n",
					round, level, sc, m.OpsPerSec, m.P50ms, m.P99ms, m.WALPerOp, m.CPUPerOpUS, m.AuxPerOpUS, m.Requests, m.Errors)
				all = append(all, m)
			}
		}
	}
	report(os.Stdout, o, all)
	if err := b.printHOT(ctx, os.Stdout); err != nil {
		return err
	}
	if o.jsonOut != "" {
		data, err := json.MarshalIndent(all, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonOut, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// bench is the server under test: a pool, the handlers, an HTTP listener.
type bench struct {
	o       *options
	pool    *pgxpool.Pool
	probe   *pgx.Conn // WAL position and backend PIDs, outside the pool
	schema  string
	srv     *http.Server
	srvDone chan error
	url     string
	client  *http.Client
	cpuOK   bool

	payments, records, onetx string // quoted tables
	redis                    *redis.Client
	redisPrefix              string
}

func newBench(ctx context.Context, o *options) (_ *bench, err error) {
	b := &bench{o: o, schema: "http_bench_" + strings.ToLower(rand.Text()[:10])}
	cfg, err := pgxpool.ParseConfig(o.database)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns, cfg.MinConns = int32(o.poolSize), int32(o.poolSize)
	if b.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.close(o.keep)
		}
	}()
	if b.probe, err = pgx.Connect(ctx, o.database); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{b.schema}.Sanitize()); err != nil {
		return nil, err
	}
	m, err := migrate.New(b.pool, &migrate.Config{Tables: migrate.Tables{Schema: b.schema}})
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return nil, err
	}
	b.payments = pgx.Identifier{b.schema, "payments"}.Sanitize()
	b.records = pgx.Identifier{b.schema, migrate.IdempotencyRecordsDefault}.Sanitize()
	b.onetx = pgx.Identifier{b.schema, "onetx_records"}.Sanitize()
	// The handlers' payments table, and the one-transaction design's record table.
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+b.payments+` (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		account  text   NOT NULL,
		order_id text   NOT NULL,
		amount   bigint NOT NULL);
	CREATE TABLE `+b.onetx+` (
		account_id      text        NOT NULL,
		operation       text        NOT NULL,
		idempotency_key text        NOT NULL,
		request_hash    text        NOT NULL,
		status          text        NOT NULL,
		resource_id     bigint,
		response_body   jsonb,
		created_at      timestamptz NOT NULL,
		expires_at      timestamptz NOT NULL,
		PRIMARY KEY (account_id, operation, idempotency_key))`); err != nil {
		return nil, err
	}

	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: b.schema}})
	if err != nil {
		return nil, err
	}
	mwCfg := idemhttp.Config{
		Store:           store,
		FingerprintKeys: [][]byte{[]byte("idemkit-http-bench: a fingerprint secret of 32 bytes or more")},
		Account:         func(*http.Request) (string, error) { return "acct-1", nil },
		Logger:          slog.New(slog.DiscardHandler),
	}
	mw, err := idemhttp.New(b.pool, &mwCfg)
	if err != nil {
		return nil, err
	}
	mwCfg.Wait = o.wait
	mwWait, err := idemhttp.New(b.pool, &mwCfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /bare", b.bare)
	mux.Handle("POST /mw", mw.Handler(http.HandlerFunc(b.inTx)))
	mux.Handle("POST /mw-wait", mwWait.Handler(http.HandlerFunc(b.inTx)))
	mux.HandleFunc("POST /onetx", b.oneTx)
	if o.redisURL != "" {
		ropts, err := redis.ParseURL(o.redisURL)
		if err != nil {
			return nil, fmt.Errorf("-redis: %w", err)
		}
		ropts.PoolSize = o.poolSize
		b.redis = redis.NewClient(ropts)
		b.redisPrefix = "idemkit-bench:" + b.schema + ":"
		rs, err := idemredis.New(b.redis, &idemredis.Config{Prefix: b.redisPrefix})
		if err != nil {
			return nil, err
		}
		rcfg := mwCfg
		rcfg.Store = nil
		rcfg.Wait = 0
		mwRedis, err := idemhttp.NewWithBackend(rs, &rcfg)
		if err != nil {
			return nil, err
		}
		mux.Handle("POST /mw-redis", mwRedis.Handler(http.HandlerFunc(b.ownTx)))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b.url = "http://" + ln.Addr().String()
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	b.srvDone = make(chan error, 1)
	go func() { b.srvDone <- b.srv.Serve(ln) }()
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}}
	_, b.cpuOK = b.dbCPU(ctx)
	return b, nil
}

func (b *bench) close(keep bool) {
	ctx := context.Background()
	if b.srv != nil {
		_ = b.srv.Shutdown(ctx)
		<-b.srvDone
		b.client.CloseIdleConnections()
	}
	if b.pool != nil {
		if !keep {
			_, _ = b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{b.schema}.Sanitize()+" CASCADE")
		}
		b.pool.Close()
	}
	if b.redis != nil {
		iter := b.redis.Scan(ctx, 0, b.redisPrefix+"*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 1000 {
				_ = b.redis.Unlink(ctx, batch...).Err()
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			_ = b.redis.Unlink(ctx, batch...).Err()
		}
		_ = b.redis.Close()
	}
	if b.probe != nil {
		_ = b.probe.Close(ctx)
	}
}

// The payment every handler writes, and the response it answers.
const payment = `{"orderId":"order-842","amount":10000,"currency":"BRL"}`

func writePayment(w http.ResponseWriter, id int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%d,"orderId":"order-842","amount":10000}`, id)
}

func (b *bench) insertPayment(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `INSERT INTO `+b.payments+` (account, order_id, amount) VALUES ($1, $2, $3) RETURNING id`,
		"acct-1", "order-842", 10000).Scan(&id)
	return id, err
}

// bare is the handler without idempotency: its own transaction.
func (b *bench) bare(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	var id int64
	err := pgx.BeginFunc(r.Context(), b.pool, func(tx pgx.Tx) (err error) {
		id, err = b.insertPayment(r.Context(), tx)
		return err
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writePayment(w, id)
}

// inTx is the handler behind the middleware: the payment in its transaction.
func (b *bench) inTx(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	tx, ok := idemhttp.Tx(r.Context())
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	id, err := b.insertPayment(r.Context(), tx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writePayment(w, id)
}

// ownTx is the handler behind the Redis middleware: no transaction comes
// with the request, the payment is inserted in one of its own.
func (b *bench) ownTx(w http.ResponseWriter, r *http.Request) {
	if _, ok := idemhttp.Tx(r.Context()); ok {
		http.Error(w, "unexpected transaction", http.StatusInternalServerError)
		return
	}
	b.bare(w, r)
}

// oneTx is the one-transaction design (record and payment in one
// transaction), written by hand as tightly as pgx allows: three round trips and one connection for a
// first request.
func (b *bench) oneTx(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get(idemhttp.HeaderKey)
	body, err := io.ReadAll(r.Body)
	if err != nil || key == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	hash := fmt.Sprintf("%x", sum)
	const op = "POST /onetx"
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer conn.Release()
	fail := func(err error) {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
	now := time.Now()
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(`INSERT INTO `+b.onetx+` (account_id, operation, idempotency_key, request_hash, status, created_at, expires_at)
		VALUES ($1, $2, $3, $4, 'PROCESSING', $5, $6) ON CONFLICT DO NOTHING RETURNING true`,
		"acct-1", op, key, hash, now, now.Add(24*time.Hour))
	br := conn.SendBatch(ctx, batch)
	_, err = br.Exec()
	var inserted bool
	if err == nil {
		err = br.QueryRow().Scan(&inserted)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fail(err)
		return
	}
	if !inserted { // the first committed meanwhile (this statement waited for it): replay
		var (
			gotHash, status string
			resp            []byte
		)
		batch = &pgx.Batch{}
		batch.Queue(`SELECT request_hash, status, response_body FROM `+b.onetx+`
			WHERE account_id = $1 AND operation = $2 AND idempotency_key = $3`, "acct-1", op, key)
		batch.Queue("COMMIT")
		br := conn.SendBatch(ctx, batch)
		err := br.QueryRow().Scan(&gotHash, &status, &resp)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		switch {
		case err != nil:
			fail(err)
		case gotHash != hash:
			http.Error(w, "key reused", http.StatusUnprocessableEntity)
		case status != "COMPLETED":
			http.Error(w, "in flight", http.StatusConflict)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(resp)
		}
		return
	}
	id, err := b.insertPayment(ctx, conn)
	if err != nil {
		fail(err)
		return
	}
	resp := fmt.Appendf(nil, `{"id":%d,"orderId":"order-842","amount":10000}`, id)
	batch = &pgx.Batch{}
	batch.Queue(`UPDATE `+b.onetx+` SET status = 'COMPLETED', resource_id = $4, response_body = $5
		WHERE account_id = $1 AND operation = $2 AND idempotency_key = $3`, "acct-1", op, key, id, resp)
	batch.Queue("COMMIT")
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		fail(err)
		return
	}
	writePayment(w, id)
}

// post sends one request and reads the whole answer.
func (b *bench) post(ctx context.Context, path, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+path, strings.NewReader(payment))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// window counts what completes inside the measured interval.
type window struct {
	open, closed atomic.Bool
	ops, reqs    atomic.Int64
	errs         atomic.Int64
	mu           sync.Mutex
	lat          []time.Duration
}

func (w *window) done(start time.Time, reqs int64) {
	if !w.open.Load() || w.closed.Load() {
		return
	}
	d := time.Since(start)
	w.ops.Add(1)
	w.reqs.Add(reqs)
	w.mu.Lock()
	w.lat = append(w.lat, d)
	w.mu.Unlock()
}

func (b *bench) measure(ctx context.Context, sc string, level, round int) (measurement, error) {
	if _, err := b.pool.Exec(ctx, "TRUNCATE "+b.payments+", "+b.records+", "+b.onetx); err != nil {
		return measurement{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		win   window
		wg    sync.WaitGroup
		fatal atomic.Pointer[error]
	)
	stopWith := func(err error) {
		if fatal.CompareAndSwap(nil, &err) {
			cancel()
		}
	}
	prefix := fmt.Sprintf("%s-%d-%d-%s-", sc, level, round, rand.Text()[:8])
	switch sc {
	case "bare", "first", "onetx", "replay", "redis-first", "redis-replay":
		path := map[string]string{"bare": "/bare", "first": "/mw", "replay": "/mw", "onetx": "/onetx",
			"redis-first": "/mw-redis", "redis-replay": "/mw-redis"}[sc]
		for c := range level {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					key := ""
					switch sc {
					case "first", "onetx", "redis-first":
						key = prefix + strconv.Itoa(c) + "-" + strconv.Itoa(i)
					case "replay", "redis-replay":
						key = prefix + strconv.Itoa(c)
					}
					start := time.Now()
					status, err := b.post(ctx, path, key)
					if ctx.Err() != nil {
						return
					}
					if err != nil {
						stopWith(err)
						return
					}
					if status != http.StatusCreated {
						win.errs.Add(1)
						continue
					}
					win.done(start, 1)
				}
			})
		}
	default: // hot-*: waves of 16 fresh keys
		path := map[string]string{"hot-onetx": "/onetx", "hot-409": "/mw", "hot-wait": "/mw-wait"}[sc]
		const keys = 16
		var (
			mu    sync.Mutex
			cond  = sync.NewCond(&mu)
			wave  int
			ended int
		)
		context.AfterFunc(ctx, func() {
			mu.Lock()
			cond.Broadcast()
			mu.Unlock()
		})
		for c := range level {
			wg.Go(func() {
				for w := 0; ctx.Err() == nil; w++ {
					// Client c asks for keys c, c+level, … of the wave, so that
					// every key of it has a client and each has level/16.
					for k := c % keys; k < keys; k += level {
						key := prefix + strconv.Itoa(w) + "-" + strconv.Itoa(k)
						start := time.Now()
						var reqs int64
						for ctx.Err() == nil {
							status, err := b.post(ctx, path, key)
							reqs++
							if ctx.Err() != nil {
								return
							}
							if err != nil {
								stopWith(err)
								return
							}
							if status == http.StatusConflict {
								continue // retry at once
							}
							if status != http.StatusCreated {
								win.errs.Add(1)
							}
							// one operation per key: the client that asked first counts it
							if c < keys {
								win.done(start, reqs)
							} else {
								win.reqs.Add(reqs)
							}
							break
						}
					}
					// Wave barrier.
					mu.Lock()
					ended++
					if ended == level {
						ended = 0
						wave++
						cond.Broadcast()
					} else {
						for mine := wave; wave == mine && ctx.Err() == nil; {
							cond.Wait()
						}
					}
					mu.Unlock()
				}
			})
		}
	}

	timer := time.NewTimer(b.o.warmup)
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	pids, err := b.backends(ctx)
	if err != nil {
		cancel()
		wg.Wait()
		return measurement{}, err
	}
	wal0, err := b.walLSN(ctx)
	if err != nil {
		cancel()
		wg.Wait()
		return measurement{}, err
	}
	cpu0, _ := b.cpuOf(pids)
	aux0, _ := b.cpuOf(pids[b.o.poolSize:])
	start := time.Now()
	win.open.Store(true)
	timer.Reset(b.o.duration)
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	win.closed.Store(true)
	elapsed := time.Since(start)
	cpu1, cpuOK := b.cpuOf(pids)
	aux1, _ := b.cpuOf(pids[b.o.poolSize:])
	wal1, err := b.walLSN(context.WithoutCancel(ctx))
	cancel()
	wg.Wait()
	if e := fatal.Load(); e != nil && !errors.Is(*e, context.Canceled) {
		return measurement{}, *e
	}
	if err != nil {
		return measurement{}, err
	}
	m := measurement{Scenario: sc, Level: level, Round: round, Ops: win.ops.Load(), Requests: win.reqs.Load(),
		Errors: win.errs.Load(), Seconds: elapsed.Seconds(), CPUMeasured: cpuOK}
	if m.Ops > 0 {
		m.OpsPerSec = float64(m.Ops) / elapsed.Seconds()
		m.WALPerOp = float64(wal1-wal0) / float64(m.Ops)
		m.CPUPerOpUS = float64((cpu1 - cpu0).Microseconds()) / float64(m.Ops)
		m.AuxPerOpUS = float64((aux1 - aux0).Microseconds()) / float64(m.Ops)
		slices.Sort(win.lat)
		m.P50ms = ms(win.lat[len(win.lat)/2])
		m.P99ms = ms(win.lat[len(win.lat)*99/100])
	}
	return m, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) walLSN(ctx context.Context) (int64, error) {
	var lsn int64
	err := b.probe.QueryRow(ctx, `SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}

// backends returns the PIDs whose CPU counts: every backend of the pool
// (all its connections are held at once to ask), and the server's WAL
// writer, checkpointer and background writer.
func (b *bench) backends(ctx context.Context) ([]int, error) {
	conns := make([]*pgxpool.Conn, 0, b.o.poolSize)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var pids []int
	for range b.o.poolSize {
		c, err := b.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	rows, err := b.probe.Query(ctx, `SELECT pid FROM pg_catalog.pg_stat_activity
		WHERE backend_type IN ('walwriter', 'checkpointer', 'background writer')`)
	if err != nil {
		return nil, err
	}
	aux, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	return append(pids, aux...), nil
}

// cpuOf sums the user and system CPU time of pids from /proc; ok is false
// when one cannot be read (the server runs elsewhere).
func (b *bench) cpuOf(pids []int) (time.Duration, bool) {
	var total time.Duration
	ok := len(pids) > 0
	for _, pid := range pids {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			ok = false
			continue
		}
		// The command may hold spaces and parentheses: fields start after the last ')'.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			ok = false
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 13 {
			ok = false
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	}
	return total, ok
}

func (b *bench) dbCPU(ctx context.Context) (time.Duration, bool) {
	pids, err := b.backends(ctx)
	if err != nil {
		return 0, false
	}
	return b.cpuOf(pids)
}

// printHOT reports how many of the records' updates were HOT, since the
// start (PostgreSQL's statistics, flushed within a second or so).
func (b *bench) printHOT(ctx context.Context, w io.Writer) error {
	time.Sleep(1500 * time.Millisecond)
	rows, err := b.probe.Query(ctx, `SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables
		WHERE schemaname = $1 AND relname IN ('idempotency_records', 'onetx_records') ORDER BY relname`, b.schema)
	if err != nil {
		return err
	}
	var name string
	var upd, hot int64
	_, err = pgx.ForEachRow(rows, []any{&name, &upd, &hot}, func() error {
		pct := 0.0
		if upd > 0 {
			pct = 100 * float64(hot) / float64(upd)
		}
		fmt.Fprintf(w, "HOT updates of %s: %d of %d (%.1f%%)\n", name, hot, upd, pct)
		return nil
	})
	return err
}

// report prints, per level, the medians over rounds and the medians of the
// per-round ratios.
func report(out io.Writer, o *options, all []measurement) {
	get := func(sc string, level, round int) (measurement, bool) {
		for _, m := range all {
			if m.Scenario == sc && m.Level == level && m.Round == round {
				return m, true
			}
		}
		return measurement{}, false
	}
	median := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	ratio := func(sc, base string, level int, f func(measurement) float64) string {
		var r []float64
		for round := 1; round <= o.rounds; round++ {
			a, ok1 := get(sc, level, round)
			b, ok2 := get(base, level, round)
			if ok1 && ok2 && f(b) > 0 {
				r = append(r, f(a)/f(b))
			}
		}
		if len(r) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", median(r))
	}
	baseOf := map[string]string{"first": "onetx", "replay": "onetx", "bare": "onetx", "hot-409": "hot-onetx", "hot-wait": "hot-onetx",
		"redis-first": "first", "redis-replay": "replay"}
	ops := func(m measurement) float64 { return m.OpsPerSec }
	wal := func(m measurement) float64 { return m.WALPerOp }
	cpu := func(m measurement) float64 { return m.CPUPerOpUS }
	for _, level := range o.levels {
		fmt.Fprintf(out, "\nconcurrency %d (medians of %d rounds; ratios are medians of per-round ratios; hot-* count keys)\n", level, o.rounds)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "scenario\top/s\tp50 ms\tp99 ms\tWAL B/op\tdb CPU µs/op\top/s vs base\tWAL vs base\tCPU vs base\tbase\top/s vs bare\t")
		for _, sc := range o.scenarios {
			var v [5][]float64
			for round := 1; round <= o.rounds; round++ {
				if m, ok := get(sc, level, round); ok {
					v[0], v[1], v[2] = append(v[0], m.OpsPerSec), append(v[1], m.P50ms), append(v[2], m.P99ms)
					v[3], v[4] = append(v[3], m.WALPerOp), append(v[4], m.CPUPerOpUS)
				}
			}
			base := baseOf[sc]
			rb, rw, rc, vsBare := "-", "-", "-", "-"
			if base != "" && slices.Contains(o.scenarios, base) {
				rb, rw, rc = ratio(sc, base, level, ops), ratio(sc, base, level, wal), ratio(sc, base, level, cpu)
			}
			if (sc == "first" || sc == "replay" || sc == "onetx") && slices.Contains(o.scenarios, "bare") {
				vsBare = ratio(sc, "bare", level, ops)
			}
			if base == "" {
				base = "-"
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", sc, median(v[0]), median(v[1]),
				median(v[2]), median(v[3]), median(v[4]), rb, rw, rc, base, vsBare)
		}
		_ = tw.Flush()
	}
}
