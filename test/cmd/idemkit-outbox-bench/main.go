// Command idemkit-outbox-bench measures the outbox relay against a plain
// "SELECT … FOR UPDATE SKIP LOCKED → produce → UPDATE" loop written here,
// on real servers, in one interleaved run (each scenario once per repeat,
// idemkit and the loop in turn; medians of -repeat runs):
//
//   - drain: a pre-filled outbox (-messages over -keys, enqueued in
//     transactions of -tx) drained by 1 and by 2 relays, in msgs/s;
//   - CPU: of the relay processes (each relay runs in a child process of its
//     own; /proc/<pid>/stat) and of PostgreSQL for them: the backends of the
//     relay's connections (found by application_name in pg_stat_activity,
//     /proc/<pid>/stat of each), not the whole server, which other clients
//     share; in CPU seconds per 10,000 messages;
//   - steady: -rate msgs/s for -duration (transactions every 10ms), one
//     relay: p50 and p99 of commit → Kafka acknowledgement, and CPU;
//   - order: the topic is read back after each drain; a per-key order
//     violation is a message whose first delivery comes after the first
//     delivery of a later message of its key.
//
// Usage:
//
//	source .dev/env   # or: eval "$(scripts/dev env)"
//	cd test && go run ./cmd/idemkit-outbox-bench
//
// It reads IDEMKIT_TEST_DATABASE_URL and IDEMKIT_TEST_KAFKA_BROKERS, works in
// schemas and topics of its own, removes them afterwards, and prints a
// Markdown table. PostgreSQL must run on this machine (its /proc is read).
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/internal/topicscan"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		err = child(os.Args[2:])
	} else {
		err = run()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-outbox-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	messages, keys, tx, batch, rate, partitions, repeat int
	duration, loopPoll, wakeDelay                       time.Duration
	only                                                string
}

const (
	implIdemkit = "idemkit"
	implLoop    = "loop"
)

func run() error {
	var o options
	flag.IntVar(&o.messages, "messages", 50000, "messages per drain run")
	flag.IntVar(&o.keys, "keys", 1000, "distinct keys")
	flag.IntVar(&o.tx, "tx", 100, "messages per enqueuing transaction in the drain runs")
	flag.IntVar(&o.batch, "batch", 1000, "batch size of both relays")
	flag.IntVar(&o.rate, "rate", 1000, "messages per second in the steady run")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the topic")
	flag.IntVar(&o.repeat, "repeat", 3, "runs of each scenario (the table shows medians)")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of the steady run")
	flag.DurationVar(&o.loopPoll, "loop-poll", 100*time.Millisecond, "the SKIP LOCKED loop's poll interval when it finds nothing")
	flag.DurationVar(&o.wakeDelay, "wake-delay", 0, "the idemkit relay's WakeDelay (0: its default)")
	flag.StringVar(&o.only, "only", "", "run only this implementation (idemkit or loop)")
	flag.Parse()

	url := os.Getenv(testenv.EnvDatabaseURL)
	brokers := strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")
	if url == "" || brokers[0] == "" {
		return errors.New(testenv.Instruction)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bench{o: o, url: url, brokers: brokers, pool: pool,
		client: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}}

	impls := []string{implIdemkit, implLoop}
	if o.only != "" {
		impls = []string{o.only}
	}
	type scenario struct {
		impl   string
		relays int
		steady bool
	}
	var scenarios []scenario
	for _, relays := range []int{1, 2} {
		for _, impl := range impls {
			scenarios = append(scenarios, scenario{impl, relays, false})
		}
	}
	for _, impl := range impls {
		scenarios = append(scenarios, scenario{impl, 1, true})
	}
	results := map[string][]result{}
	key := func(s scenario) string { return fmt.Sprintf("%s/%d/%v", s.impl, s.relays, s.steady) }
	for rep := range o.repeat {
		for _, s := range scenarios {
			var r result
			var err error
			if s.steady {
				r, err = b.steady(ctx, s.impl)
			} else {
				r, err = b.drain(ctx, s.impl, s.relays)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", key(s), err)
			}
			fmt.Fprintf(os.Stderr, "run %d %-8s relays=%d steady=%-5v %s\n", rep+1, s.impl, s.relays, s.steady, r)
			results[key(s)] = append(results[key(s)], r)
		}
	}

	med := func(impl string, relays int, steady bool, f func(result) float64) float64 {
		rs := results[key(scenario{impl, relays, steady})]
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	rate := func(r result) float64 { return r.rate }
	pgPer := func(r result) float64 { return r.pgCPU / float64(r.n) * 1e4 }
	relayPer := func(r result) float64 { return r.relayCPU / float64(r.n) * 1e4 }
	bothPer := func(r result) float64 { return (r.pgCPU + r.relayCPU) / float64(r.n) * 1e4 }
	p50 := func(r result) float64 { return ms(r.p50) }
	p99 := func(r result) float64 { return ms(r.p99) }
	row := func(name string, cell func(impl string) string) {
		fmt.Printf("| %s |", name)
		for _, impl := range impls {
			fmt.Printf(" %s |", cell(impl))
		}
		fmt.Println()
	}
	num := func(relays int, steady bool, f func(result) float64, format string) func(string) string {
		return func(impl string) string { return fmt.Sprintf(format, med(impl, relays, steady, f)) }
	}
	fmt.Printf("\n%d messages over %d keys enqueued in transactions of %d, batch %d, %d partitions; steady: %d msgs/s for %v; medians of %d interleaved runs.\n\n",
		o.messages, o.keys, o.tx, o.batch, o.partitions, o.rate, o.duration, o.repeat)
	fmt.Print("| |")
	for _, impl := range impls {
		fmt.Printf(" %s |", map[string]string{implIdemkit: "idemkit relay", implLoop: "`FOR UPDATE SKIP LOCKED` loop"}[impl])
	}
	fmt.Print("\n|---|")
	for range impls {
		fmt.Print("---:|")
	}
	fmt.Println()
	row("drain, 1 relay, msgs/s", num(1, false, rate, "%.0f"))
	row("drain, 2 relays, msgs/s", num(2, false, rate, "%.0f"))
	row("relay CPU s per 10k msgs (drain, 1 relay)", num(1, false, relayPer, "%.3f"))
	row("PostgreSQL CPU s per 10k msgs (drain, 1 relay; relay's backends)", num(1, false, pgPer, "%.3f"))
	row("PostgreSQL CPU s per 10k msgs (drain, 2 relays; relays' backends)", num(2, false, pgPer, "%.3f"))
	row(fmt.Sprintf("p50 / p99 commit → ack at %d msgs/s, ms", o.rate), func(impl string) string {
		return fmt.Sprintf("%.1f / %.1f", med(impl, 1, true, p50), med(impl, 1, true, p99))
	})
	row(fmt.Sprintf("relay CPU s per 10k msgs at %d msgs/s", o.rate), num(1, true, relayPer, "%.3f"))
	row(fmt.Sprintf("PostgreSQL CPU s per 10k msgs at %d msgs/s (relay's backends)", o.rate), num(1, true, pgPer, "%.3f"))
	row(fmt.Sprintf("relay + PostgreSQL CPU s per 10k msgs at %d msgs/s", o.rate), num(1, true, bothPer, "%.3f"))
	row("per-key order violations, 2 relays (min–max per run)", func(impl string) string {
		rs := results[key(scenario{impl, 2, false})]
		lo, hi := -1, 0
		for _, r := range rs {
			if lo < 0 || r.violations < lo {
				lo = r.violations
			}
			hi = max(hi, r.violations)
		}
		if lo == hi {
			return strconv.Itoa(lo)
		}
		return fmt.Sprintf("%d–%d", lo, hi)
	})
	row("duplicates delivered, all drains", func(impl string) string {
		n := 0
		for _, relays := range []int{1, 2} {
			for _, r := range results[key(scenario{impl, relays, false})] {
				n += r.duplicates
			}
		}
		return strconv.Itoa(n)
	})

	if len(impls) == 2 {
		i, l := implIdemkit, implLoop
		check := func(name string, ok bool, detail string) {
			verdict := "met"
			if !ok {
				verdict = "NOT met"
			}
			fmt.Printf("- %s: %s (%s)\n", name, verdict, detail)
		}
		fmt.Println()
		for _, relays := range []int{1, 2} {
			a, c := med(i, relays, false, rate), med(l, relays, false, rate)
			check(fmt.Sprintf("drain with %d relay(s) at least the loop's", relays), a >= c, fmt.Sprintf("%.0f vs %.0f msgs/s", a, c))
			a, c = med(i, relays, false, pgPer), med(l, relays, false, pgPer)
			check(fmt.Sprintf("PostgreSQL CPU per message, drain with %d relay(s), at most 1.5× the loop's", relays), a <= 1.5*c,
				fmt.Sprintf("%.2f×", a/c))
		}
		a, c := med(i, 1, true, bothPer), med(l, 1, true, bothPer)
		check(fmt.Sprintf("relay + PostgreSQL CPU per message at %d msgs/s at most 2× the loop's", o.rate), a <= 2*c, fmt.Sprintf("%.2f×", a/c))
		p := med(i, 1, true, p99)
		check(fmt.Sprintf("p99 at %d msgs/s under 25 ms", o.rate), p < 25, fmt.Sprintf("%.1f ms", p))
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type result struct {
	n                      int
	rate                   float64 // drain
	relayCPU, pgCPU        float64 // seconds
	p50, p99               time.Duration
	violations, duplicates int
}

func (r result) String() string {
	return fmt.Sprintf("n=%d rate=%.0f relayCPU=%.3fs pgCPU=%.3fs p50=%.1fms p99=%.1fms violations=%d duplicates=%d",
		r.n, r.rate, r.relayCPU, r.pgCPU, ms(r.p50), ms(r.p99), r.violations, r.duplicates)
}

type bench struct {
	o       options
	url     string
	brokers []string
	pool    *pgxpool.Pool
	client  *kafka.Client
}

// setup makes a migrated schema and a topic; cleanup removes both. The
// loop gets the index a hand-rolled loop would have: its pending rows in
// enqueue order.
func (b *bench) setup(ctx context.Context, impl string) (store *outbox.Store, schema, topic string, cleanup func(), err error) {
	suffix := strings.ToLower(rand.Text()[:10])
	schema, topic = "bench_"+suffix, "idemkit_bench_"+suffix
	m, err := migrate.New(b.pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return nil, "", "", nil, err
	}
	cleanup = func() {
		c := context.WithoutCancel(ctx)
		_, _ = b.client.DeleteTopics(c, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		_, _ = b.pool.Exec(c, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	fail := func(err error) (*outbox.Store, string, string, func(), error) {
		cleanup()
		return nil, "", "", nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return fail(err)
	}
	store, err = outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return fail(err)
	}
	if impl == implLoop {
		if _, err := b.pool.Exec(ctx, "CREATE INDEX loop_pending_idx ON "+store.Table()+" (seq) WHERE published_at IS NULL"); err != nil {
			return fail(err)
		}
	}
	resp, err := b.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: b.o.partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = testenv.WaitTopic(wctx, b.client, topic, b.o.partitions)
		cancel()
	}
	if err != nil {
		return fail(err)
	}
	return store, schema, topic, cleanup, nil
}

// relayProc is a relay running in a child process.
type relayProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	app   string
	wait  chan error
}

// startRelays starts n child relays and waits until each is connected.
func (b *bench) startRelays(ctx context.Context, impl, schema, topic string, n int, acks string) ([]*relayProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var procs []*relayProc
	for i := range n {
		app := fmt.Sprintf("outbox-bench-%s-%d", strings.TrimPrefix(schema, "bench_"), i)
		cmd := exec.CommandContext(ctx, self, "relay", "-impl", impl, "-schema", schema, "-topic", topic,
			"-batch", strconv.Itoa(b.o.batch), "-app", app, "-acks", acks,
			"-poll", b.o.loopPoll.String(), "-wake-delay", b.o.wakeDelay.String())
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return procs, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return procs, err
		}
		if err := cmd.Start(); err != nil {
			return procs, err
		}
		p := &relayProc{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20), app: app, wait: make(chan error, 1)}
		procs = append(procs, p)
		line, err := p.out.ReadString('\n')
		if err != nil || line != "ready\n" {
			return procs, fmt.Errorf("relay child: %q, %v", line, err)
		}
	}
	return procs, nil
}

// stopRelays closes the children's stdin (they stop) and waits for them.
func stopRelays(procs []*relayProc) error {
	var errs []error
	for _, p := range procs {
		_ = p.stdin.Close()
	}
	for _, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cpu is a CPU reading of the children and of their backends.
type cpu struct {
	relay    float64
	backends map[int]float64
}

func (b *bench) readCPU(ctx context.Context, procs []*relayProc) (cpu, error) {
	c := cpu{backends: map[int]float64{}}
	apps := make([]string, len(procs))
	for i, p := range procs {
		v, err := procCPU(p.cmd.Process.Pid)
		if err != nil {
			return c, err
		}
		c.relay += v
		apps[i] = p.app
	}
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1)`, apps)
	if err != nil {
		return c, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return c, err
	}
	for _, pid := range pids {
		if v, err := procCPU(int(pid)); err == nil {
			c.backends[int(pid)] = v
		}
	}
	return c, nil
}

// debugBackends prints, with BENCH_DEBUG set, each backend's CPU between
// two readings and its last statement.
func (b *bench) debugBackends(ctx context.Context, c0, c1 cpu) {
	if os.Getenv("BENCH_DEBUG") == "" {
		return
	}
	rows, err := b.pool.Query(ctx, `SELECT pid, left(regexp_replace(query, '\s+', ' ', 'g'), 80) FROM pg_stat_activity
WHERE application_name LIKE 'outbox-bench-%'`)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int32
		var q string
		_ = rows.Scan(&pid, &q)
		fmt.Fprintf(os.Stderr, "  backend %d: %.3fs  %s\n", pid, c1.backends[int(pid)]-c0.backends[int(pid)], q)
	}
}

// used is the CPU spent between two readings: backends that appeared
// meanwhile count from zero.
func used(a, z cpu) (relay, pg float64) {
	for pid, v := range z.backends {
		pg += v - a.backends[pid]
	}
	return z.relay - a.relay, pg
}

// procCPU is a process's user + system CPU time in seconds.
func procCPU(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}

func (b *bench) pending(ctx context.Context, store *outbox.Store) (int, error) {
	var n int
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+store.Table()+` WHERE published_at IS NULL`).Scan(&n)
	return n, err
}

func (b *bench) drain(ctx context.Context, impl string, relays int) (result, error) {
	var r result
	store, schema, topic, cleanup, err := b.setup(ctx, impl)
	if err != nil {
		return r, err
	}
	defer cleanup()
	o := b.o
	for i := 0; i < o.messages; i += o.tx {
		msgs := make([]outbox.Message, 0, o.tx)
		for j := i; j < min(i+o.tx, o.messages); j++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", j%o.keys),
				Value: fmt.Appendf(nil, `{"n":%d,"payload":"%s"}`, j, strings.Repeat("x", 100))})
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(ctx, tx, msgs...)
			return err
		}); err != nil {
			return r, err
		}
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+store.Table()); err != nil {
		return r, err
	}
	procs, err := b.startRelays(ctx, impl, schema, topic, relays, "count")
	defer func() { _ = stopRelays(procs) }()
	if err != nil {
		return r, err
	}
	// The children report "C <n>" after each acknowledged batch.
	counts := make(chan int, 1024)
	for _, p := range procs {
		go func() {
			for {
				line, err := p.out.ReadString('\n')
				if err != nil {
					return
				}
				if n, ok := strings.CutPrefix(strings.TrimSpace(line), "C "); ok {
					v, _ := strconv.Atoi(n)
					counts <- v
				}
			}
		}()
	}
	c0, err := b.readCPU(ctx, procs)
	if err != nil {
		return r, err
	}
	start := time.Now()
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return r, err
		}
	}
	timeout := time.After(5 * time.Minute)
	for acked := 0; acked < o.messages; {
		select {
		case n := <-counts:
			acked += n
		case <-timeout:
			return r, fmt.Errorf("%d of %d messages acknowledged after 5 minutes", acked, o.messages)
		}
	}
	elapsed := time.Since(start)
	c1, err := b.readCPU(ctx, procs)
	if err != nil {
		return r, err
	}
	b.debugBackends(ctx, c0, c1)
	// Every row marked (the last marks may still have been in flight).
	for {
		n, err := b.pending(ctx, store)
		if err != nil {
			return r, err
		}
		if n == 0 {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return r, fmt.Errorf("%d messages still pending after 5 minutes", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stopRelays(procs); err != nil {
		return r, err
	}
	procs = nil
	r.n, r.rate = o.messages, float64(o.messages)/elapsed.Seconds()
	r.relayCPU, r.pgCPU = used(c0, c1)
	r.violations, r.duplicates, err = b.order(ctx, topic)
	return r, err
}

// order reads the topic back and counts per-key order violations among
// first deliveries, and duplicates (by the stable ID).
func (b *bench) order(ctx context.Context, topic string) (violations, duplicates int, err error) {
	seen := map[string]bool{}
	last := map[string]int{}
	// Partition by partition in offset order: a key lives in one partition.
	err = topicscan.Scan(ctx, &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: 10 * time.Second}, topic, func(m kafka.Message) error {
		var id string
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderID {
				id = string(h.Value)
			}
		}
		if seen[id] {
			duplicates++
			return nil
		}
		seen[id] = true
		var n int
		if _, err := fmt.Sscanf(string(m.Value), `{"n":%d,`, &n); err != nil {
			return fmt.Errorf("value %q: %w", m.Value, err)
		}
		if l, ok := last[string(m.Key)]; ok && n < l {
			violations++
			return nil
		}
		last[string(m.Key)] = n
		return nil
	})
	return violations, duplicates, err
}

func (b *bench) steady(ctx context.Context, impl string) (result, error) {
	var r result
	store, schema, topic, cleanup, err := b.setup(ctx, impl)
	if err != nil {
		return r, err
	}
	defer cleanup()
	o := b.o
	procs, err := b.startRelays(ctx, impl, schema, topic, 1, "ids")
	defer func() { _ = stopRelays(procs) }()
	if err != nil {
		return r, err
	}
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		acked     = map[string]time.Time{}
		readErr   = make(chan error, 1)
	)
	go func() {
		// Lines "A <unix nanoseconds> <id> <id> …" from the child.
		for {
			line, err := procs[0].out.ReadString('\n')
			if err != nil {
				readErr <- err
				return
			}
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "A" {
				continue
			}
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			at := time.Unix(0, ns)
			mu.Lock()
			for _, id := range f[2:] {
				if _, ok := acked[id]; !ok {
					acked[id] = at
				}
			}
			mu.Unlock()
		}
	}()
	c0, err := b.readCPU(ctx, procs)
	if err != nil {
		return r, err
	}
	if _, err := io.WriteString(procs[0].stdin, "go\n"); err != nil {
		return r, err
	}
	// rate/100 messages every 10ms, on a fixed schedule.
	const tick = 10 * time.Millisecond
	per := max(o.rate/100, 1)
	next := time.Now()
	end := next.Add(o.duration)
	i := 0
	for next.Before(end) {
		time.Sleep(time.Until(next))
		next = next.Add(tick)
		msgs := make([]outbox.Message, per)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%o.keys), Value: fmt.Appendf(nil, `{"n":%d,"payload":"x"}`, i)}
			i++
		}
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return r, err
		}
		ids, err := store.EnqueueTx(ctx, tx, msgs...)
		if err != nil {
			_ = tx.Rollback(ctx)
			return r, err
		}
		// The clock starts just before COMMIT, before the relay can see
		// the rows.
		now := time.Now()
		mu.Lock()
		for _, id := range ids {
			committed[id] = now
		}
		mu.Unlock()
		if err := tx.Commit(ctx); err != nil {
			return r, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := b.pending(ctx, store)
		if err != nil {
			return r, err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("%d messages not published 30s after the run", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c1, err := b.readCPU(ctx, procs)
	if err != nil {
		return r, err
	}
	b.debugBackends(ctx, c0, c1)
	if err := stopRelays(procs); err != nil {
		return r, err
	}
	procs = nil
	<-readErr // EOF once the child exited
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for id, t := range committed {
		a, ok := acked[id]
		if !ok {
			return r, fmt.Errorf("message %s published but its acknowledgement was not reported", id)
		}
		lat = append(lat, a.Sub(t))
	}
	slices.Sort(lat)
	r.n = len(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	r.relayCPU, r.pgCPU = used(c0, c1)
	return r, nil
}

// child runs one relay, idemkit's or the loop, in this process: it connects,
// prints "ready", starts on a "go" line and stops when stdin closes. With
// -acks ids it prints "A <unix nanoseconds> <id>…" after each acknowledged
// batch, with -acks count "C <messages>".
func child(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	impl := fs.String("impl", implIdemkit, "idemkit or loop")
	schema := fs.String("schema", "", "schema of the outbox")
	_ = fs.String("topic", "", "topic (the rows carry theirs)")
	batch := fs.Int("batch", 1000, "batch size")
	app := fs.String("app", "", "application_name of the connections")
	acks := fs.String("acks", "", `report acknowledgements on stdout: "ids" or "count"`)
	poll := fs.Duration("poll", 100*time.Millisecond, "the loop's poll interval")
	wakeDelay := fs.Duration("wake-delay", 0, "the relay's WakeDelay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = *app
	cfg.MinConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	for pool.Stat().TotalConns() < cfg.MinConns {
		time.Sleep(time.Millisecond)
	}
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: *schema}})
	if err != nil {
		return err
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	var outMu sync.Mutex
	report := func(ids []string) {
		outMu.Lock()
		defer outMu.Unlock()
		switch *acks {
		case "ids":
			fmt.Fprintf(out, "A %d %s\n", time.Now().UnixNano(), strings.Join(ids, " "))
		case "count":
			fmt.Fprintf(out, "C %d\n", len(ids))
		default:
			return
		}
		_ = out.Flush()
	}
	fmt.Println("ready")
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return nil // the parent gave up
	}
	go func() {
		_, _ = io.Copy(io.Discard, in) // EOF: stop
		cancel()
	}()
	brokers := strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	if *impl == implLoop {
		return loop(ctx, pool, store.Table(), brokers, tr, *batch, *poll, report)
	}
	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: brokers}, BatchSize: *batch, WakeDelay: *wakeDelay,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Observers: []outbox.Observer{&testobs.Outbox{OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
			ids := make([]string, len(recs))
			for i, r := range recs {
				ids[i] = r.ID
			}
			report(ids)
		}}}})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// loop is the hand-rolled relay users write: claim a batch with FOR UPDATE
// SKIP LOCKED, produce it, mark it, commit; poll when there is nothing. It
// keeps no per-key order with several relays.
func loop(ctx context.Context, pool *pgxpool.Pool, table string, brokers []string, tr *kafka.Transport,
	batch int, poll time.Duration, report func([]string)) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchSize: batch, BatchBytes: 1 << 20, BatchTimeout: time.Millisecond, Transport: tr}
	defer w.Close()
	claim := `SELECT seq, id::text, topic, msg_key, value FROM ` + table + `
WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`
	mark := `UPDATE ` + table + ` SET published_at = now() WHERE seq = ANY($1)`
	for ctx.Err() == nil {
		n, err := func() (int, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			rows, err := tx.Query(ctx, claim, batch)
			if err != nil {
				return 0, err
			}
			var (
				seqs []int64
				ids  []string
				msgs []kafka.Message
				seq  int64
				id   string
				t    string
				k, v []byte
			)
			if _, err := pgx.ForEachRow(rows, []any{&seq, &id, &t, &k, &v}, func() error {
				seqs, ids = append(seqs, seq), append(ids, id)
				msgs = append(msgs, kafka.Message{Topic: t, Key: slices.Clone(k), Value: slices.Clone(v),
					Headers: []kafka.Header{{Key: outbox.HeaderID, Value: []byte(id)}}})
				return nil
			}); err != nil {
				return 0, err
			}
			if len(msgs) == 0 {
				return 0, tx.Commit(ctx)
			}
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				return 0, err
			}
			report(ids)
			if _, err := tx.Exec(ctx, mark, seqs); err != nil {
				return 0, err
			}
			return len(msgs), tx.Commit(ctx)
		}()
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "loop:", err)
		}
		if n == 0 || err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(poll):
			}
		}
	}
	return nil
}
