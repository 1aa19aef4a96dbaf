package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/faultproxy"
	"github.com/idemkit/idemkit/internal/promtest"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// shortRules writes a copy of the repository's alert rules in which every
// duration of a for:, a range selector or an offset is 60 times shorter (a minute
// becomes a second, an hour a minute, a day 24 seconds); the thresholds
// are unchanged.
func shortRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../deploy/prometheus/idemkit-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dur := regexp.MustCompile(`(\d+)([mh])`)
	shorten := func(s string) string {
		return dur.ReplaceAllStringFunc(s, func(d string) string {
			m := dur.FindStringSubmatch(d)
			if m[2] == "m" {
				return m[1] + "s"
			}
			return m[1] + "m"
		})
	}
	text := regexp.MustCompile(`\[\d+[mh]\]|offset \d+[mh]`).ReplaceAllStringFunc(string(b), shorten)
	text = regexp.MustCompile(`(?m)^(\s+for: )(\d+[mh])$`).ReplaceAllStringFunc(text, shorten)
	text = strings.ReplaceAll(text, "for: 24m", "for: 24s") // a day: 24s, not 24 minutes
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// alertWatch waits for alerts through a Prometheus server's API and
// collects, per rule, how long each took to fire and to resolve.
type alertWatch struct {
	prom *promtest.Server
	mu   sync.Mutex
	rows []string
}

// wait polls until an alert named name whose labels include match is
// firing (firing true) or neither pending nor firing (false), for at most
// d, and returns how long that took.
func (w *alertWatch) wait(t *testing.T, name string, match map[string]string, firing bool, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		alerts, err := w.prom.Alerts()
		if err != nil {
			t.Fatal(err)
		}
		state := ""
		for _, a := range alerts {
			if a.Labels["alertname"] != name {
				continue
			}
			ok := true
			for k, v := range match {
				ok = ok && a.Labels[k] == v
			}
			if ok && (state == "" || a.State == "firing") {
				state = a.State
			}
		}
		if firing && state == "firing" || !firing && state == "" {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s %v: still %q after %v, want firing=%v; series with those labels:\n%s", name, match, state, d, firing,
				w.dump(match))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dump lists the idemkit series that have the labels of match.
func (w *alertWatch) dump(match map[string]string) string {
	var sel []string
	for k, v := range match {
		sel = append(sel, fmt.Sprintf("%s=%q", k, v))
	}
	sel = append(sel, `__name__=~"idemkit_.*"`, `__name__!~".*_bucket"`)
	samples, err := w.prom.Query("{" + strings.Join(sel, ",") + "}")
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, s := range samples {
		fmt.Fprintf(&b, "  %v %s\n", s.Metric, s.Value)
	}
	return b.String()
}

// check waits for the alert to fire after induce, then to resolve after
// undo, and records the times.
func (w *alertWatch) check(t *testing.T, name string, match map[string]string, condition string, fired time.Duration, undo func()) {
	t.Helper()
	undo()
	resolved := w.wait(t, name, match, false, 3*time.Minute)
	w.record(name, condition, fired, resolved)
}

func (w *alertWatch) record(name, condition string, fired, resolved time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rows = append(w.rows, fmt.Sprintf("%-32s fired %6.1fs  resolved %6.1fs  %s", name,
		fired.Seconds(), resolved.Seconds(), condition))
}

// alertEnv is what the scenarios share: one schema, one Telemetry exported
// to Prometheus, its Monitors, and the server scraping them.
type alertEnv struct {
	*env
	tel    *idemotel.Telemetry
	watch  *alertWatch
	topics map[string]string // by scenario
}

// scenario returns an env of the shared schema with a topic and a group of
// its own.
func (a *alertEnv) scenario(t *testing.T, name string) *env {
	sc := *a.env
	sc.t = t
	sc.topic = a.topics[name]
	sc.group = testenv.Name(t, "g")
	sc.tel = a.tel
	return &sc
}

// runner makes a runner of cfg wired with the telemetry, observed, started.
func (a *alertEnv) runner(t *testing.T, cfg *consumer.Config) (stop func() error) {
	t.Helper()
	c, err := a.tel.Consumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(a.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Observe(r); err != nil {
		t.Fatal(err)
	}
	stopRun := run(t, r)
	return func() error {
		err := stopRun()
		_ = c.Close()
		return err
	}
}

// startMonitor runs a Monitor of schema until the returned function stops it.
func startMonitor(t *testing.T, tel *idemotel.Telemetry, pool *pgxpool.Pool, schema string, dead []string) (stop func()) {
	t.Helper()
	m, err := tel.Monitor(pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: schema},
		StuckInterval: 500 * time.Millisecond},
		Interval: 500 * time.Millisecond, Retention: time.Hour, DeadLetterTopics: dead})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Monitor.Run: %v", err)
			}
			_ = m.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestAlertsFireAndResolve runs the repository's alert rules (their for:
// and windows 60 times shorter, thresholds unchanged) in a real Prometheus
// server that scrapes a Telemetry exported with OpenTelemetry's Prometheus
// exporter, and, rule by rule, induces its condition against the real
// servers — a consumer stopped while messages pile up, a relay not running,
// a dead outbox key, a purge that never runs — then undoes it: each
// alert must fire, then resolve. It logs, per rule, the time to firing and
// to resolved.
func TestAlertsFireAndResolve(t *testing.T) {
	e := newEnv(t, 1)
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tel, err := idemotel.New(&idemotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	a := &alertEnv{env: e, tel: tel, topics: map[string]string{}}
	for _, name := range []string{"stopped", "blocked", "dead", "dlqmissing", "failing", "parked", "outbox", "old", "outage", "commits", "stuck"} {
		a.topics[name] = testenv.NewTopic(t, 1)
	}
	deadTopic := a.topics["dead"] + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, deadTopic, 1)
	stopMonitor := startMonitor(t, tel, e.db.Pool, e.db.Schema, []string{deadTopic})
	// The daily layout is the schema's: a second schema, a second Monitor.
	daily := testenv.NewDB(t, testenv.Migrate)
	stopDailyMonitor := startMonitor(t, tel, daily.Pool, daily.Schema, nil)

	a.watch = &alertWatch{prom: promtest.Start(t, []string{ln.Addr().String()}, shortRules(t))}
	// The scenarios run at once (not as parallel subtests, which -parallel
	// would queue on a machine of few cores): each has its own topic,
	// consumer group and alerts.
	t.Run("scenarios", func(t *testing.T) {
		scenarios := map[string]func(t *testing.T){
			"stopped consumer":           a.stoppedConsumer,
			"claims blocked":             a.claimsBlocked,
			"dead letters":               func(t *testing.T) { a.deadLetters(t, deadTopic) },
			"dead-letter writes failing": a.deadLetterWritesFailing,
			"messages failing":           a.messagesFailing,
			"parked too long":            a.parkedTooLong,
			"outbox":                     a.outbox,
			"stuck records":              a.stuckRecords,
			"retention":                  a.retention,
			"daily partitions":           func(t *testing.T) { a.dailyPartitions(t, daily) },
			"outage":                     a.outage,
			"http spikes":                a.httpSpikes,
			"offset commits failing":     a.offsetCommitsFailing,
			"stuck handler":              a.stuckHandler,
		}
		var wg sync.WaitGroup
		for name, f := range scenarios {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(name, f)
			}()
		}
		wg.Wait()
	})
	if t.Failed() {
		return
	}

	// No Monitor: the rules that read the tables are blind, and say so.
	stopMonitor()
	stopDailyMonitor()
	fired := a.watch.wait(t, "IdemkitMonitorDown", nil, true, time.Minute)
	startMonitor(t, tel, e.db.Pool, e.db.Schema, nil)
	a.watch.check(t, "IdemkitMonitorDown", nil, "every Monitor stopped; one started again", fired, func() {})

	slices.Sort(a.watch.rows)
	t.Logf("per rule (for: and windows 60× shorter; scrape and evaluation every 1s):\n%s", strings.Join(a.watch.rows, "\n"))
}

// stoppedConsumer: a consumer processed a message and stopped; 10,500
// messages then wait. The Monitor's lag holds with no runner: the
// partition does not advance, the consumer is down, its lag is high. A
// runner started again drains it.
func (a *alertEnv) stoppedConsumer(t *testing.T) {
	sc := a.scenario(t, "stopped")
	cfg := sc.config(nil)
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	sc.produce(msg("first", "k"))
	stop := a.runner(t, cfg)
	wait(t, oc.done, "the first message")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	msgs := make([]kafka.Message, 10500)
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("m-%d", i), fmt.Sprintf("k-%d", i%50))
	}
	sc.produce(msgs...)
	match := map[string]string{"consumer": sc.group}
	down := a.watch.wait(t, "IdemkitConsumerDown", match, true, 2*time.Minute)
	high := a.watch.wait(t, "IdemkitConsumerLagHigh", match, true, 2*time.Minute)
	var once sync.Once
	restart := func() { once.Do(func() { a.runner(t, sc.config(nil)) }) }
	a.watch.check(t, "IdemkitConsumerDown", match, "consumer stopped, 10,500 messages waiting; runner started again", down, restart)
	a.watch.check(t, "IdemkitConsumerLagHigh", match, "same (lag 10,500 > 10,000, not draining)", down+high, restart)
}

// stuckHandler: a runner holds the partition, its handler blocked on the
// first message while two more wait; then it is released.
func (a *alertEnv) stuckHandler(t *testing.T) {
	sc := a.scenario(t, "stuck")
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	cfg := sc.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return sc.effect(ctx, tx, m)
	})
	cfg.HandlerTimeout = 5 * time.Minute
	a.runner(t, cfg)
	sc.produce(msg("a", "k"), msg("b", "k"), msg("c", "k"))
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitPartitionNotAdvancing", match, true, 2*time.Minute)
	a.watch.check(t, "IdemkitPartitionNotAdvancing", match, "a runner's handler blocked on the first of 3 messages; released", fired,
		func() { releaseOnce.Do(func() { close(release) }) })
}

// claimsBlocked: another session holds the claim of the message the
// consumer is about to apply, for 7 seconds.
func (a *alertEnv) claimsBlocked(t *testing.T) {
	ctx := context.Background()
	sc := a.scenario(t, "blocked")
	tx, err := sc.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := sc.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: sc.group, MessageID: "held", Topic: sc.topic}); err != nil {
		t.Fatal(err)
	}
	sc.produce(msg("held", "k"))
	a.runner(t, sc.config(nil))
	released := make(chan struct{})
	go func() {
		time.Sleep(7 * time.Second)
		_ = tx.Rollback(ctx)
		close(released)
	}()
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitClaimsBlocked", match, true, time.Minute)
	a.watch.check(t, "IdemkitClaimsBlocked", match, "a claim waited 7s for another session's lock", fired, func() { <-released })
}

// deadLettering runs a consumer of sc whose every message fails for good
// into a dead-letter writer wired with the telemetry, and produces one.
func (a *alertEnv) deadLettering(t *testing.T, sc *env) {
	t.Helper()
	cfg := sc.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return retry.Permanent(errors.New("rejected"))
	})
	c, err := a.tel.Consumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wcfg := &dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: sc.group}
	if err := c.DeadLetterWriter(wcfg); err != nil {
		t.Fatal(err)
	}
	w, err := dlq.NewWriter(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	cfg.OnFailure = c.DeadLetters(w)
	r, err := consumer.New(sc.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	sc.produce(msg("bad", "k"))
}

// deadLetters: a message fails for good and is dead-lettered; a replay
// applies it.
func (a *alertEnv) deadLetters(t *testing.T, deadTopic string) {
	sc := a.scenario(t, "dead")
	a.deadLettering(t, sc)
	match := map[string]string{"dlq_topic": deadTopic}
	fired := a.watch.wait(t, "IdemkitDeadLetters", match, true, time.Minute)
	unresolved := a.watch.wait(t, "IdemkitDeadLettersUnresolved", match, true, time.Minute)
	var once sync.Once
	replay := func() {
		once.Do(func() {
			rp, err := dlq.NewReprocessor(sc.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: deadTopic,
				Mode: dlq.Redrive, Handler: consumer.HandlerFunc(sc.effect), Tables: migrate.Tables{Schema: sc.db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			defer rp.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := rp.Run(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	a.watch.check(t, "IdemkitDeadLetters", match, "a message dead-lettered; replayed (Redrive)", fired, replay)
	a.watch.check(t, "IdemkitDeadLettersUnresolved", match, "same, unresolved for a (shortened) day", fired+unresolved, replay)
}

// deadLetterWritesFailing: the dead-letter topic does not exist until the
// alert fired.
func (a *alertEnv) deadLetterWritesFailing(t *testing.T) {
	sc := a.scenario(t, "dlqmissing")
	a.deadLettering(t, sc)
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitDeadLetterWriteFailing", match, true, time.Minute)
	a.watch.check(t, "IdemkitDeadLetterWriteFailing", match, "dead-letter topic missing; created", fired, func() {
		testenv.CreateTopic(t, sc.topic+dlq.TopicSuffixDefault, 1)
	})
}

// messagesFailing: a message fails for good into an OnFailure of the
// user's own (no dead letter).
func (a *alertEnv) messagesFailing(t *testing.T) {
	sc := a.scenario(t, "failing")
	cfg := sc.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return retry.Permanent(errors.New("rejected"))
	})
	cfg.OnFailure = func(context.Context, *consumer.Message, error) error { return nil }
	a.runner(t, cfg)
	sc.produce(msg("bad", "k"))
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitMessagesFailing", match, true, time.Minute)
	a.watch.check(t, "IdemkitMessagesFailing", match, "a message failed for good into OnFailure (no DLQ); window passes", fired, func() {})
}

// parkedTooLong: a NonBlocking consumer parks a failing message, parked
// (backdated) two hours ago; the handler is then fixed and the parked
// retry applies it.
func (a *alertEnv) parkedTooLong(t *testing.T) {
	ctx := context.Background()
	sc := a.scenario(t, "parked")
	var fixed atomic.Bool
	cfg := sc.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !fixed.Load() {
			return errors.New("down")
		}
		return sc.effect(ctx, tx, m)
	})
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry.MaxAttempts = 1
	cfg.ParkedRetry = retry.Policy{InitialInterval: time.Second, MaxInterval: time.Second}
	parked := make(chan struct{}, 1)
	testobs.Of(cfg).OnOutcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
		if o == consumer.Parked {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
	}
	a.runner(t, cfg)
	sc.produce(msg("p", "k"))
	wait(t, parked, "the message parked")
	if _, err := sc.db.Pool.Exec(ctx, `UPDATE `+sc.db.Table("idemkit_parked_messages")+
		` SET parked_at = now() - interval '2 hours' WHERE consumer = $1`, sc.group); err != nil {
		t.Fatal(err)
	}
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitParkedTooLong", match, true, time.Minute)
	a.watch.check(t, "IdemkitParkedTooLong", match, "a message parked 2h ago (backdated); handler fixed, parked retry applies it", fired,
		func() { fixed.Store(true) })
}

// outbox: a message waits 10 minutes (backdated) with no relay running;
// a relay starts and publishes it, but two messages of a key whose topic
// does not exist are dead; the topic is created and they are retried.
func (a *alertEnv) outbox(t *testing.T) {
	ctx := context.Background()
	sc := a.scenario(t, "outbox")
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: sc.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(msgs ...outbox.Message) []string {
		var ids []string
		if err := pgx.BeginFunc(ctx, sc.db.Pool, func(tx pgx.Tx) error {
			ids, err = store.EnqueueTx(ctx, tx, msgs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	enqueue(outbox.Message{Topic: sc.topic, Key: []byte("a"), Value: []byte("late")})
	if _, err := sc.db.Pool.Exec(ctx, `UPDATE `+sc.db.Table("idemkit_outbox")+` SET created_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	table := map[string]string{"table": sc.db.Schema + ".idemkit_outbox"}
	stale := a.watch.wait(t, "IdemkitOutboxStale", table, true, time.Minute)

	missing := testenv.Name(t, "missing")
	deadIDs := enqueue(outbox.Message{Topic: missing, Key: []byte("p"), Value: []byte("1")},
		outbox.Message{Topic: missing, Key: []byte("p"), Value: []byte("2")})
	rcfg := &outbox.RelayConfig{Kafka: testenv.Kafka(t), PollInterval: 100 * time.Millisecond, MetadataTTL: 200 * time.Millisecond,
		Retry: retry.Policy{MaxAttempts: 2, InitialInterval: 100 * time.Millisecond, MaxInterval: 100 * time.Millisecond}}
	if err := a.tel.Relay(store, rcfg); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(sc.db.Pool, store, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	a.watch.check(t, "IdemkitOutboxStale", table, "a message 10 min old (backdated), no relay; relay started", stale, func() {})

	dead := a.watch.wait(t, "IdemkitOutboxDead", table, true, time.Minute)
	a.watch.check(t, "IdemkitOutboxDead", table, "2 messages of a key to a missing topic dead; topic created, retried", dead, func() {
		testenv.CreateTopic(t, missing, 1)
		// The relay may see the new topic only at its next metadata
		// refresh, and give the messages up again meanwhile: retry, as an
		// operator would, until both are published (none dead, none
		// waiting: a retried message is not dead until the relay gives it
		// up again).
		for range 10 {
			if _, err := store.Retry(ctx, sc.db.Pool, deadIDs[0]); err != nil && !errors.Is(err, outbox.ErrNotFound) {
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				st, err := store.Stats(ctx, sc.db.Pool)
				if err != nil {
					t.Fatal(err)
				}
				if st.Dead == 0 && st.Backlog == 0 {
					return
				}
				if st.Dead > 0 && st.Backlog == 0 {
					break // given up again: retry
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		t.Fatal("the dead messages were not published after 10 retries")
	})
}

// stuckRecords: an idempotency record in flight past its lease; resolved.
func (a *alertEnv) stuckRecords(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	if _, err := a.db.Pool.Exec(ctx, `INSERT INTO `+a.db.Table("idempotency_records")+` (account, operation,
		idempotency_key, fingerprint, state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ('acct-1', 'POST /payments', 'k-stuck', '\x00', 'PROCESSING', 7, $1, $2, $2, $3)`,
		now.Add(-time.Minute), now.Add(-2*time.Minute), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	match := map[string]string{"table": a.db.Schema + ".idempotency_records"}
	fired := a.watch.wait(t, "IdemkitIdempotencyRecordsStuck", match, true, time.Minute)
	a.watch.check(t, "IdemkitIdempotencyRecordsStuck", match, "a record in flight past its lease; resolved (AllowRetry)", fired, func() {
		store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: a.db.Schema}})
		if err != nil {
			t.Fatal(err)
		}
		stuck, err := store.FindStuck(ctx, a.db.Pool, 0)
		if err != nil || len(stuck) != 1 {
			t.Fatalf("stuck = %v, %v", stuck, err)
		}
		if _, err := store.Resolve(ctx, a.db.Pool, stuck[0], idemhttp.AllowRetry); err != nil {
			t.Fatal(err)
		}
	})
}

// retention: a consumer's record is two hours old (backdated), the
// Monitor's retention one hour, and nothing purges; then a purge runs.
func (a *alertEnv) retention(t *testing.T) {
	ctx := context.Background()
	sc := a.scenario(t, "old")
	if err := pgx.BeginFunc(ctx, sc.db.Pool, func(tx pgx.Tx) error {
		if _, err := sc.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: sc.group, MessageID: "old", Topic: sc.topic}); err != nil {
			return err
		}
		return sc.store.SavePositionTx(ctx, tx, sc.group, sc.topic, 0, 0, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.db.Pool.Exec(ctx, `UPDATE `+sc.db.Table("processed_messages")+
		` SET processed_at = now() - interval '2 hours' WHERE consumer = $1`, sc.group); err != nil {
		t.Fatal(err)
	}
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitRetentionPurgeBehind", match, true, 2*time.Minute)
	a.watch.check(t, "IdemkitRetentionPurgeBehind", match, "a record 2h old, retention 1h, no purge; purged", fired, func() {
		if _, err := sc.store.PurgeConsumer(ctx, sc.db.Pool, sc.group, time.Hour, 0); err != nil {
			t.Fatal(err)
		}
	})
}

// dailyPartitions: with the daily layout, the partitions after today are
// dropped; partition maintenance creates them again.
func (a *alertEnv) dailyPartitions(t *testing.T, db *testenv.DB) {
	ctx := context.Background()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	// As if the layout had been switched on yesterday: days from today
	// on need a partition.
	testenv.BackdateDaily(t, db.Pool, db.Schema, 1)
	if _, err := store.MaintainPartitions(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	name := testenv.Name(t, "daily")
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return store.SavePositionTx(ctx, tx, name, a.topics["old"], 0, 0, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	parts, err := store.Partitions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	today := testenv.Today(t, db.Pool)
	for _, p := range parts {
		if p.Day.After(today) {
			if _, err := db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{db.Schema, p.Name}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
	}
	match := map[string]string{"schema": db.Schema}
	fired := a.watch.wait(t, "IdemkitDedupPartitionsRunningOut", match, true, 2*time.Minute)
	a.watch.check(t, "IdemkitDedupPartitionsRunningOut", match, "daily partitions after today dropped; maintenance", fired, func() {
		if _, err := store.MaintainPartitions(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
	})
}

// outage: the consumer's connections to PostgreSQL are reset, new ones
// too, until the alert fired.
func (a *alertEnv) outage(t *testing.T) {
	ctx := context.Background()
	sc := a.scenario(t, "outage")
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
	cfg := sc.config(nil)
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	c, err := a.tel.Consumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	sc.produce(msg("before", "k"))
	wait(t, oc.done, "a message before the outage")
	proxy.Set(faultproxy.Reset)
	sc.produce(msg("during", "k"))
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitOutage", match, true, time.Minute)
	_ = c
	a.watch.check(t, "IdemkitOutage", match, "the consumer's PostgreSQL connections reset; back", fired, func() { proxy.Set(faultproxy.Pass) })
}

// httpSpikes: clients reuse keys with another body, 10 a second; then
// clients retry a key whose request is in flight, 10 a second. Each stops
// once its alert fired.
func (a *alertEnv) httpSpikes(t *testing.T) {
	records, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: a.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	hcfg := &idemhttp.Config{Store: records, Account: func(*http.Request) (string, error) { return "acct-1", nil },
		FingerprintKeys: [][]byte{[]byte("idemotel tests: a fingerprint secret of 32 bytes or more")}}
	front, err := a.tel.HTTP(hcfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(a.db.Pool, hcfg)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	mux := http.NewServeMux()
	mux.Handle("POST /refunds", front(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))))
	mux.Handle("POST /captures", front(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusCreated)
	}))))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	post := func(path, key, body string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0 // the server closes at the end of the test
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// repeat calls f every 100ms until the returned function is called.
	repeat := func(f func(i int)) (stop func()) {
		done := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Millisecond):
				}
				f(i)
			}
		}()
		var once sync.Once
		return func() { once.Do(func() { close(done); <-stopped }) }
	}

	stopMismatch := repeat(func(i int) {
		key := fmt.Sprintf("refund-%d", i)
		post("/refunds", key, `{"amount":1}`)
		if code := post("/refunds", key, `{"amount":2}`); code != http.StatusUnprocessableEntity {
			t.Errorf("a key reused with another body: %d, want 422", code)
		}
	})
	defer stopMismatch()
	refunds := map[string]string{"operation": "POST /refunds"}
	fired := a.watch.wait(t, "IdemkitIdempotencyMismatchSpike", refunds, true, time.Minute)
	a.watch.check(t, "IdemkitIdempotencyMismatchSpike", refunds, "10 requests/s reuse a key with another body (422); stopped", fired, stopMismatch)

	held := make(chan int, 1)
	go func() { held <- post("/captures", "capture-1", `{"amount":1}`) }()
	stopConflict := repeat(func(int) { post("/captures", "capture-1", `{"amount":1}`) })
	defer stopConflict()
	captures := map[string]string{"operation": "POST /captures"}
	fired = a.watch.wait(t, "IdemkitIdempotencyConflictSpike", captures, true, time.Minute)
	a.watch.check(t, "IdemkitIdempotencyConflictSpike", captures, "10 requests/s retry a key in flight (409); stopped, first request done", fired, func() {
		stopConflict()
		releaseOnce.Do(func() { close(release) })
		if code := <-held; code != http.StatusCreated {
			t.Errorf("the request in flight: %d, want 201", code)
		}
	})
}

// offsetCommitsFailing: every connection of the consumer to Kafka goes
// through a proxy that makes the broker answer each offset commit with
// COORDINATOR_NOT_AVAILABLE, while fetches and heartbeats pass; then the
// answers pass again.
func (a *alertEnv) offsetCommitsFailing(t *testing.T) {
	sc := a.scenario(t, "commits")
	proxy, err := faultproxy.New(testenv.Brokers(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	var commits faultproxy.OffsetCommitErrors
	proxy.SetFilter(&commits)
	cfg := sc.config(nil)
	cfg.Kafka = kafkaconn.Config{Brokers: []string{proxy.Addr()},
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy.Addr()) // every broker address, through the proxy
		}}
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	commits.Set(int16(kafka.GroupCoordinatorNotAvailable))
	a.runner(t, cfg)
	sc.produce(msg("m", "k"))
	wait(t, oc.done, "the message applied")
	match := map[string]string{"consumer": sc.group}
	fired := a.watch.wait(t, "IdemkitOffsetCommitsFailing", match, true, 2*time.Minute)
	a.watch.check(t, "IdemkitOffsetCommitsFailing", match, "the broker answers every offset commit COORDINATOR_NOT_AVAILABLE; then accepts them",
		fired, func() { commits.Set(0) })
}
