package failover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/faultplan"
	"github.com/idemkit/idemkit/test/internal/pgproc"
)

// TestFailover: 3,000 messages (and 300 producer duplicates) over 100 keys
// and 6 partitions, produced over about 8 seconds, consumed by three runners
// of one group (one transaction per message; the default adaptive batches;
// a batch handler) whose handler applies an effect and enqueues an outbox
// message, published by two relays. Once 40% of the messages are sent and
// the runners are applying them, the primary is killed (SIGKILL) and the
// standby promoted; then the old primary is rebuilt as the new primary's
// synchronous standby, while the stream goes on.
//
// A fourth runner's pool names the standby alone, without
// target_session_attrs (a client whose DNS name or virtual IP already points
// at the standby): until the promotion its sessions are read-only and its
// claims are refused with SQLSTATE 25006; it must wait that out as an
// outage, and carry on on the same sessions once the standby is promoted.
//
// It is short enough to run in the suite; its budget leaves room for a
// loaded machine.
func TestFailover(t *testing.T) {
	run(t, scenario{distinct: 3000, duplicates: 300, keys: 100, partitions: 6,
		produceFor: 8 * time.Second, failoverAt: 0.4, standbyRunner: true, rebuild: true, budget: 3 * time.Minute})
}

// scenario is one failover run.
type scenario struct {
	distinct, duplicates int           // messages produced: distinct IDs, and copies of earlier ones
	keys, partitions     int           // message keys; partitions of the input topic
	produceFor           time.Duration // production is spread over this long
	failoverAt           float64       // the failover starts once this fraction was sent
	standbyRunner        bool          // add a runner whose pool names the standby alone
	rebuild              bool          // rebuild the old primary as a standby after the failover
	budget               time.Duration // the whole test
}

// schema holds idemkit's tables and the application's, in the pair's own
// database.
const schema = "failover"

// The parts under test, as their loggers name them.
var (
	runners = []string{"runner-1", "runner-2", "runner-3"}
	relays  = []string{"relay-1", "relay-2"}
)

// standbyRunner is the runner whose pool names the standby alone.
const standbyRunner = "runner-standby"

func run(t *testing.T, sc scenario) {
	began := time.Now()
	deadline := began.Add(sc.budget)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(time.Minute))
	defer cancel()
	since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }

	pair := pgproc.StartPair(t, nil)
	url := pair.URL()
	t.Logf("%s: primary and synchronous standby up: %s", since(), url)
	brokers := testenv.Brokers(t)
	inTopic := testenv.NewTopic(t, sc.partitions)
	outTopic := testenv.NewTopic(t, 3)
	group := testenv.Name(t, "failover")

	runners := slices.Clone(runners)
	if sc.standbyRunner {
		runners = append(runners, standbyRunner)
	}
	parts := append(slices.Clone(runners), relays...)
	logs := map[string]*testenv.Logs{}
	pools := map[string]*pgxpool.Pool{}
	for _, name := range append(slices.Clone(parts), "test") {
		u := url
		if name == standbyRunner {
			u = pair.Standby().URL()
		}
		pools[name] = testenv.PartPool(t, ctx, u, name, 8)
	}
	a, err := newApp(outTopic)
	if err != nil {
		t.Fatal(err)
	}
	p := faultplan.New(sc.distinct, sc.duplicates, sc.keys, uint64(began.UnixNano()))
	if err := a.setup(ctx, pools["test"], p.Keys); err != nil {
		t.Fatalf("schema: %v", err)
	}
	if sc.standbyRunner {
		// A synchronous standby has the setup's WAL on disk, not yet
		// necessarily replayed: the runner that reads the standby starts
		// once it shows what the primary wrote.
		var lsn string
		if err := pools["test"].QueryRow(ctx, `SELECT pg_catalog.pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			var replayed bool
			if err := pools[standbyRunner].QueryRow(ctx,
				`SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&replayed); err != nil {
				t.Fatal(err)
			}
			if replayed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the standby did not replay the setup (primary at %s) within a minute", lsn)
			}
		}
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		t.Fatal(err)
	}

	// The parts: only the test cancels them; at cleanup (also after a
	// failure) they are cancelled and waited for before the pools close.
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	exits := make(chan exit, len(parts))
	defer func() {
		stop()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Errorf("parts still running a minute after they were cancelled")
		}
	}()
	hooks := make([]struct {
		started, ended atomic.Int64
		first          atomic.Value // the error that started the first outage
	}, len(runners))
	for i, name := range runners {
		l, logger := testenv.NewLogs(t)
		logs[name] = l
		cfg := &consumer.Config{Kafka: kafkaconn.Config{Brokers: brokers}, Topic: inTopic, GroupID: group,
			Store: store, SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second,
			Logger: logger.With("part", name),
			Observers: []consumer.Observer{&testobs.Hooks{
				OnOutageStarted: func(_ string, err error) {
					if hooks[i].started.Add(1) == 1 {
						hooks[i].first.Store(err)
					}
				},
				OnOutageEnded: func(string, time.Duration) { hooks[i].ended.Add(1) },
			}}}
		switch i {
		case 0, 3: // one transaction per message
			cfg.BatchSize, cfg.Handler = 1, a.handler(name)
		case 1: // the default: adaptive batches of what is fetched, one handler call per message
			cfg.Handler = a.handler(name)
		default: // up to 100 messages per transaction, one handler call for all
			cfg.BatchSize, cfg.BatchHandler = 100, a.batchHandler(name)
		}
		r, err := consumer.New(pools[name], cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { exits <- exit{name: name, err: r.Run(runCtx)} })
	}
	for _, name := range relays {
		l, logger := testenv.NewLogs(t)
		logs[name] = l
		rl, err := outbox.NewRelay(pools[name], a.outbox, &outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: brokers},
			PollInterval: 100 * time.Millisecond, PublishTimeout: 5 * time.Second,
			Logger: logger.With("part", name), Retry: retry.Policy{MaxInterval: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { exits <- exit{name: name, err: rl.Run(runCtx)} })
	}

	var sent atomic.Int64
	produced := make(chan error, 1)
	wg.Go(func() { produced <- produce(runCtx, brokers, inTopic, p, sc.produceFor, &sent) })
	t.Logf("%s: parts started, producing %d messages (%d distinct, seed in the plan)", since(), len(p.Sends), sc.distinct)

	effects := func() (int64, error) {
		var n int64
		err := pools["test"].QueryRow(ctx, `SELECT count(*) FROM `+a.effects).Scan(&n)
		return n, err
	}
	h := &harness{t: t, deadline: deadline, exits: exits}

	// Mid-stream: enough sent, and the runners applying.
	h.mustWait("the failover point", 2*time.Minute, func() (bool, error) {
		n, err := effects()
		return sent.Load() >= int64(sc.failoverAt*float64(len(p.Sends))) && n >= int64(sc.distinct/10), err
	})
	// What the old primary acknowledged: it must all be on the standby.
	rows, err := pools["test"].Query(ctx, `SELECT id FROM `+a.effects)
	if err != nil {
		t.Fatal(err)
	}
	acked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// No server takes writes for half a second, five polls of the relays:
	// a standby promoted at once could be reached by the next poll of each
	// relay idle meanwhile, and neither relay would meet the failover.
	if err := pair.FailoverAfter(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(t0)
	// The test's pool meets the failover too: its connections to the old
	// primary fail once each (the wait tries again).
	var onStandby int
	h.mustWait("the test's pool reaching the promoted standby", time.Minute, func() (bool, error) {
		err := pools["test"].QueryRow(ctx, `SELECT count(*) FROM `+a.effects+` WHERE id = ANY($1)`, acked).Scan(&onStandby)
		return err == nil, err
	})
	if onStandby != len(acked) {
		t.Fatalf("%d of the %d effects the old primary acknowledged are on the promoted standby", onStandby, len(acked))
	}
	h.mustWait("an effect applied on the promoted standby", time.Minute, func() (bool, error) {
		n, err := effects()
		return n > int64(len(acked)), err
	})
	t.Logf("%s: primary killed with %d effects acknowledged (all on the standby); standby promoted in %s; "+
		"effects applied again %s after the kill", since(), len(acked), promoted.Round(time.Millisecond),
		time.Since(t0).Round(time.Millisecond))
	if sc.rebuild {
		t1 := time.Now()
		if err := pair.Rebuild(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: old primary rebuilt as the synchronous standby in %s", since(), time.Since(t1).Round(time.Millisecond))
	}

	// Everything done: the producer, the effects, the outbox.
	h.mustWait("the producer sending every message", 2*time.Minute, func() (bool, error) {
		select {
		case err := <-produced:
			if err != nil {
				t.Fatal(err)
			}
			return true, nil
		default:
			return false, nil
		}
	})
	t.Logf("%s: every message sent", since())
	if err := h.wait("every message applied", 2*time.Minute, func() (bool, error) {
		n, err := effects()
		return n >= int64(sc.distinct), err
	}); err != nil {
		checkEffects(t, ctx, pools["test"], a, p.IDs())
		t.Fatal(err)
	}
	t.Logf("%s: every message applied", since())
	h.mustWait("the outbox drained", 2*time.Minute, func() (bool, error) {
		st, err := a.outbox.Stats(ctx, pools["test"])
		if err == nil && st.Dead > 0 {
			t.Fatalf("%d outbox messages dead", st.Dead)
		}
		return err == nil && st.Backlog == 0, err
	})
	t.Logf("%s: outbox drained", since())
	// Every runner met the failover (each claims all along), logged it,
	// and logged its end: the server answered again, or (a rebalance ended
	// the partition's loop during the outage) the loop stopped waiting; at
	// least one outage of each runner ended with the server answering. A
	// relay idle between two polls may not meet it at all (its next poll
	// connects to the promoted standby): every outage a relay logged
	// ended, and at least one relay logged one.
	ended := func(name string) (starts, answered, stopped int, ok bool) {
		l := logs[name]
		starts, answered, stopped = l.Count(outage.StartMsg, ""), l.Count(outage.EndMsg, ""), l.Count(outage.StoppedMsg, "")
		ok = starts == answered+stopped && (starts > 0 && answered > 0 || slices.Contains(relays, name))
		return starts, answered, stopped, ok
	}
	relayMet := func() bool {
		for _, name := range relays {
			if s, a, _, ok := ended(name); ok && s > 0 && a > 0 {
				return true
			}
		}
		return false
	}
	err = h.wait("every part logging the outage's start and end", 30*time.Second, func() (bool, error) {
		for _, name := range parts {
			if _, _, _, ok := ended(name); !ok {
				return false, nil
			}
		}
		return relayMet(), nil
	})
	for _, name := range parts {
		if s, a, st, ok := ended(name); err != nil && !ok {
			t.Errorf("%s logged %d outage starts (%q) and %d ends (%q) + %d (%q); want each with its end (and, for a runner, at least one)",
				name, s, outage.StartMsg, a, outage.EndMsg, st, outage.StoppedMsg)
		}
	}
	if err != nil && !relayMet() {
		t.Errorf("no relay logged the outage and its end")
	}
	for i, name := range runners {
		if s, e := hooks[i].started.Load(), hooks[i].ended.Load(); s == 0 || s != e {
			t.Errorf("%s: OutageStarted ran %d times, OutageEnded %d times; want at least once, as often", name, s, e)
		}
		if name == standbyRunner {
			var pgErr *pgconn.PgError
			if err, _ := hooks[i].first.Load().(error); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
				t.Errorf("%s: its first outage began with %v, want SQLSTATE 25006 from the standby", name, err)
			}
		}
	}

	// The pools dropped their connections to the dead primary: every
	// connection left is on the promoted one (the old primary's port now
	// has a standby, which read-write connections must avoid).
	primaryPort := uint16(pair.Primary().Port())
	for _, name := range append(slices.Clone(parts), "test") {
		for _, c := range pools[name].AcquireAllIdle(ctx) {
			var port uint16
			var inRecovery bool
			err := c.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('port')::int`).Scan(&inRecovery, &port)
			c.Release()
			if err != nil || inRecovery || port != primaryPort {
				t.Errorf("%s: a pooled connection on port %d (in recovery: %v, %v); want the promoted primary's %d",
					name, port, inRecovery, err, primaryPort)
			}
		}
	}

	// Only now may the parts return.
	h.check()
	stop()
	for range parts {
		select {
		case e := <-exits:
			if e.err != nil {
				t.Errorf("%s: Run returned %v after the cancellation, want nil", e.name, e.err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("parts still running a minute after they were cancelled")
		}
	}
	checkEffects(t, ctx, pools["test"], a, p.IDs())
	checkPublished(t, brokers, outTopic, p.IDs())
	if !t.Failed() {
		t.Logf("%d sends (%d distinct) applied once each across the failover; test took %s", len(p.Sends), sc.distinct, since())
	}
}

// exit is a part returning from Run.
type exit struct {
	name string
	err  error
}

// harness watches the parts while the test waits: one that returns before
// the test cancels it fails the test at once, with its error.
type harness struct {
	t        *testing.T
	deadline time.Time
	exits    chan exit
}

func (h *harness) check() {
	h.t.Helper()
	select {
	case e := <-h.exits:
		h.t.Fatalf("%s returned from Run before the test cancelled it: %v (its log records above have part=%s)", e.name, e.err, e.name)
	default:
	}
}

// wait polls cond until it holds, at most within (and never past the
// test's budget); it returns an error naming what did not happen.
func (h *harness) wait(what string, within time.Duration, cond func() (bool, error)) error {
	h.t.Helper()
	end := time.Now().Add(within)
	if h.deadline.Before(end) {
		end = h.deadline
	}
	var last error
	for {
		h.check()
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s: not within %s (last error: %v)", what, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) mustWait(what string, within time.Duration, cond func() (bool, error)) {
	h.t.Helper()
	if err := h.wait(what, within, cond); err != nil {
		h.t.Fatal(err)
	}
}

// app is the application: its handler applies an effect per message (and
// counts how often an ID's effect ran), checks that each key's messages
// arrive in sequence, and enqueues one outbox message per effect, all in the
// handler's transaction.
type app struct {
	outTopic string
	outbox   *outbox.Store
	effects  string // quoted tables
	keySeq   string
	breaks   string
}

func newApp(outTopic string) (*app, error) {
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return nil, err
	}
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &app{outTopic: outTopic, outbox: store, effects: t("effects"), keySeq: t("key_seq"), breaks: t("order_breaks")}, nil
}

func (a *app) setup(ctx context.Context, pool *pgxpool.Pool, keys []string) error {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE `+a.effects+` (
			id      text   PRIMARY KEY,
			key     text   NOT NULL,
			seq     int    NOT NULL,
			via     text   NOT NULL,
			runs    int    NOT NULL,
			applied bigserial);
		CREATE TABLE `+a.keySeq+` (key text PRIMARY KEY, seq int NOT NULL);
		CREATE TABLE `+a.breaks+` (id text NOT NULL, key text NOT NULL, seq int NOT NULL, last int NOT NULL, via text NOT NULL)`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+a.keySeq+` (key, seq) SELECT unnest($1::text[]), -1`, keys)
	return err
}

// apply is the handler's work for one message; via names the runner.
func (a *app) apply(ctx context.Context, tx pgx.Tx, m *consumer.Message, via string) error {
	seq, err := strconv.Atoi(faultplan.Header(m.Message, faultplan.SeqHeader))
	if err != nil {
		return retry.Permanent(fmt.Errorf("message %s: bad %s header: %w", m.ID, faultplan.SeqHeader, err))
	}
	key := string(m.Key)
	if _, err := tx.Exec(ctx, `INSERT INTO `+a.effects+` (id, key, seq, via, runs) VALUES ($1, $2, $3, $4, 1)
		ON CONFLICT (id) DO UPDATE SET runs = `+a.effects+`.runs + 1`, m.ID, key, seq, via); err != nil {
		return fmt.Errorf("effect of %s: %w", m.ID, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE `+a.keySeq+` SET seq = $2 WHERE key = $1 AND seq = $2 - 1`, key, seq)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO `+a.breaks+` (id, key, seq, last, via)
			SELECT $1, key, $3, seq, $4 FROM `+a.keySeq+` WHERE key = $2`, m.ID, key, seq, via); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+a.keySeq+` SET seq = $2 WHERE key = $1`, key, seq); err != nil {
			return err
		}
	}
	_, err = a.outbox.EnqueueTx(ctx, tx, outbox.Message{Topic: a.outTopic, Key: m.Key, Value: []byte(m.ID),
		Headers: []kafka.Header{{Key: faultplan.SeqHeader, Value: []byte(strconv.Itoa(seq))}}})
	return err
}

func (a *app) handler(via string) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return a.apply(ctx, tx, m, via) }
}

func (a *app) batchHandler(via string) consumer.BatchHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if err := a.apply(ctx, tx, m, via); err != nil {
				return err
			}
		}
		return nil
	}
}

// produce sends the plan in batches of 50 spread over d, each acknowledged
// by the broker (acks=all) before the next; sent counts the messages
// acknowledged.
func produce(ctx context.Context, brokers []string, topic string, p *faultplan.Plan, d time.Duration, sent *atomic.Int64) error {
	tr := &kafka.Transport{DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, Transport: tr,
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000, WriteTimeout: 10 * time.Second}
	defer w.Close()
	const batch = 50
	tick := time.NewTicker(max(d*batch/time.Duration(len(p.Sends)), time.Millisecond))
	defer tick.Stop()
	for from := 0; from < len(p.Sends); from += batch {
		msgs := p.Sends[from:min(from+batch, len(p.Sends))]
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("produce: %d of %d sent: %w", from, len(p.Sends), err)
		}
		sent.Store(int64(from + len(msgs)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// checkEffects fails the test unless every wanted ID has exactly one effect
// (its effect ran once), nothing else has one, and no key's messages were
// applied out of sequence.
func checkEffects(t *testing.T, ctx context.Context, pool *pgxpool.Pool, a *app, want []string) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id, runs FROM `+a.effects)
	if err != nil {
		t.Fatal(err)
	}
	type effect struct {
		ID   string
		Runs int
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	if err != nil {
		t.Fatal(err)
	}
	runs := make(map[string]int, len(got))
	var twice, extra []string
	wanted := make(map[string]bool, len(want))
	for _, id := range want {
		wanted[id] = true
	}
	for _, e := range got {
		runs[e.ID] = e.Runs
		if e.Runs != 1 && len(twice) < 20 {
			twice = append(twice, fmt.Sprintf("%s ran %d times", e.ID, e.Runs))
		}
		if !wanted[e.ID] && len(extra) < 20 {
			extra = append(extra, e.ID)
		}
	}
	var lost []string
	for _, id := range want {
		if runs[id] == 0 && len(lost) < 20 {
			lost = append(lost, id)
		}
	}
	if len(twice) > 0 {
		t.Errorf("effects applied more than once (first 20): %v", twice)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d messages have an effect; no effect for (first 20): %v", len(got), len(want), lost)
	}
	if len(extra) > 0 {
		t.Errorf("effects of IDs never sent (first 20): %v", extra)
	}
	rows, err = pool.Query(ctx, `SELECT id, key, seq, last, via FROM `+a.breaks+` ORDER BY key, seq LIMIT 20`)
	if err != nil {
		t.Fatal(err)
	}
	type orderBreak struct {
		ID, Key   string
		Seq, Last int
		Via       string
	}
	breaks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[orderBreak])
	if err != nil {
		t.Fatal(err)
	}
	if len(breaks) > 0 {
		t.Errorf("messages applied out of their key's sequence (message, key, its seq, the key's last applied seq, runner): %+v", breaks)
	}
}

// checkPublished reads topic and fails the test unless every wanted ID was
// published and, within each key, the first copies came in sequence
// (duplicates are allowed: a relay publishes at least once).
func checkPublished(t *testing.T, brokers []string, topic string, want []string) {
	t.Helper()
	msgs := testenv.ReadAll(t, brokers, topic)
	got := map[string]bool{}
	next := map[string]int{}
	dups := 0
	var breaks, lost []string
	for _, m := range msgs {
		id := string(m.Value)
		if got[id] {
			dups++
			continue
		}
		got[id] = true
		key := string(m.Key)
		if seq, _ := strconv.Atoi(faultplan.Header(m, faultplan.SeqHeader)); seq != next[key] && len(breaks) < 20 {
			breaks = append(breaks, fmt.Sprintf("%s: %s has seq %d, want %d", key, id, seq, next[key]))
		}
		next[key]++
	}
	for _, id := range want {
		if !got[id] && len(lost) < 20 {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d outbox messages in %s; not published (first 20): %v", len(got), len(want), topic, lost)
	}
	if len(breaks) > 0 {
		t.Errorf("outbox messages published out of their key's order: %v", breaks)
	}
	t.Logf("outbox topic: %d messages, %d distinct, %d duplicates", len(msgs), len(got), dups)
}
