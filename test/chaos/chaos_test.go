package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/faultplan"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
	"github.com/idemkit/idemkit/test/internal/pgproc"
)

// EnvChaos, set to 1, runs TestChaosLong.
const EnvChaos = "IDEMKIT_CHAOS"

// TestChaos is the CI-sized run: 3,000 messages (and 300 duplicates) over 8
// seconds, 120 dead letters replayed over 12 seconds, one immediate
// PostgreSQL crash held until every part noticed it, one broker SIGKILL.
//
// The chaos tests are not parallel: each runs servers of its own and keeps
// two cores busy.
func TestChaos(t *testing.T) {
	run(t, scenario{
		distinct: 3000, duplicates: 300, keys: 100, produceFor: 8 * time.Second,
		deadLetters: 120, replayRate: 10,
		steps: []step{
			{at: 0.25, kind: pgHeld, mode: pgproc.Immediate},
			{at: 0.5, kind: kafkaKill},
		},
		budget: 3 * time.Minute,
	})
}

// TestChaosLong is the long run (IDEMKIT_CHAOS=1): 20,000 messages (10%
// duplicates) over 40 seconds, 500 dead letters replayed over 50 seconds, two
// immediate PostgreSQL restarts a few seconds apart (the second held until
// every part noticed it), a fast one, and two broker SIGKILLs.
func TestChaosLong(t *testing.T) {
	if os.Getenv(EnvChaos) != "1" {
		t.Skip("the long chaos run is opt-in: " + EnvChaos + "=1 go test -race -count=1 -timeout 10m -run TestChaosLong ./chaos/ " +
			"(in the test module); TestChaos is its CI-sized variant")
	}
	run(t, scenario{
		distinct: 18000, duplicates: 2000, keys: 200, produceFor: 40 * time.Second,
		deadLetters: 500, replayRate: 10,
		steps: []step{
			{at: 0.15, kind: pgRestart, mode: pgproc.Immediate},
			{at: 0.3, kind: pgHeld, mode: pgproc.Immediate},
			{at: 0.45, kind: kafkaKill},
			{at: 0.65, kind: pgRestart, mode: pgproc.Fast},
			{at: 0.8, kind: kafkaKill},
		},
		budget: 4 * time.Minute,
	})
}

// scenario is one chaos run.
type scenario struct {
	distinct, duplicates int           // messages produced: distinct IDs, and copies of earlier ones
	keys                 int           // message keys
	produceFor           time.Duration // production is spread over this long (outages add to it)
	deadLetters          int           // dead letters the reprocessor replays
	replayRate           float64       // dead letters per second
	steps                []step        // outages, in order
	budget               time.Duration // the whole test, servers included
}

type stepKind int

const (
	// pgRestart restarts PostgreSQL in the step's mode, as pg_ctl restart
	// -m does.
	pgRestart stepKind = iota + 1
	// pgHeld stops PostgreSQL in the step's mode and starts it again once
	// every running part logged an outage (at most outageNotice later).
	pgHeld
	// kafkaKill kills the broker with SIGKILL and starts it again once the
	// runners logged an outage (at most outageNotice later).
	kafkaKill
)

// step is one outage, started once the fraction at of the messages was sent.
type step struct {
	at   float64
	kind stepKind
	mode pgproc.Mode
}

const (
	// outageNotice bounds how long a held outage waits for the parts to
	// notice it.
	outageNotice = 30 * time.Second
	// minHold is the shortest held outage.
	minHold = 2 * time.Second
)

// Names of the parts under test, as their loggers name them.
const (
	reprocessor = "reprocessor"
	relay       = "relay"
)

var runners = []string{"runner-1", "runner-2", "runner-3"}

// exit is a part returning from Run.
type exit struct {
	name string
	err  error
	sum  dlq.Summary
}

// harness watches the parts while the test waits: a part that returns
// before the test cancels it fails the test at once, with its error. The
// reprocessor returns by itself when it has replayed the topic: that is
// recorded, not a failure, when it returns nil.
type harness struct {
	t        *testing.T
	deadline time.Time
	logs     partLogs
	exits    chan exit
	replayed *dlq.Summary // set when the reprocessor completed
	status   func() string
}

func (h *harness) check() {
	h.t.Helper()
	for {
		select {
		case e := <-h.exits:
			if e.name == reprocessor && e.err == nil {
				h.replayed = &e.sum
				h.t.Logf("reprocessor completed: %v", e.sum)
				continue
			}
			h.t.Fatalf("%s returned from Run before the test cancelled it: %v (its log records above have part=%s)",
				e.name, e.err, e.name)
		default:
			return
		}
	}
}

// wait polls cond until it holds, at most within (and never past the test's
// budget); it returns an error naming what did not happen.
func (h *harness) wait(what string, within time.Duration, cond func() (bool, error)) error {
	h.t.Helper()
	end := time.Now().Add(within)
	if h.deadline.Before(end) {
		end = h.deadline
	}
	start := time.Now()
	for {
		h.check()
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(end) {
			if err != nil {
				return fmt.Errorf("%s: not within %s (last error: %v); %s", what, time.Since(start).Round(time.Second), err, h.status())
			}
			return fmt.Errorf("%s: not within %s; %s", what, time.Since(start).Round(time.Second), h.status())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (h *harness) mustWait(what string, within time.Duration, cond func() (bool, error)) {
	h.t.Helper()
	if err := h.wait(what, within, cond); err != nil {
		h.t.Fatal(err)
	}
}

// partLogs keeps each part's log records. testenv.Logs passes them on to
// t.Log, where part=<name> says whose they are.
type partLogs map[string]*testenv.Logs

// newPartLogs returns the records and the logger of each part.
func newPartLogs(t *testing.T, names ...string) (partLogs, map[string]*slog.Logger) {
	logs, loggers := partLogs{}, map[string]*slog.Logger{}
	for _, name := range names {
		l, logger := testenv.NewLogs(t)
		logs[name], loggers[name] = l, logger.With("part", name)
	}
	return logs, loggers
}

// starts returns how many outages each of parts logged as started.
func (l partLogs) starts(parts []string) map[string]int {
	n := map[string]int{}
	for _, p := range parts {
		n[p] = l[p].Count(outage.StartMsg, "")
	}
	return n
}

// ends returns how many outages part logged as ended: the server answered
// again, or the loop that waited for it ended.
func (l partLogs) ends(part string) int {
	return l[part].Count(outage.EndMsg, "") + l[part].Count(outage.StoppedMsg, "")
}

// noticed returns which of parts logged an outage start since before was
// taken (with starts), or are in an outage (a runner merges the outages its
// loops meet into one: one that began earlier covers this one).
func (h *harness) noticed(parts []string, before map[string]int) (yes, no []string) {
	now := h.logs.starts(parts)
	for _, p := range parts {
		if now[p] > before[p] || now[p] > h.logs.ends(p) {
			yes = append(yes, p)
		} else {
			no = append(no, p)
		}
	}
	return yes, no
}

func run(t *testing.T, sc scenario) {
	began := time.Now()
	// The waits end at the budget; the servers' and the test's own calls
	// get a minute more, to report and clean up.
	deadline := began.Add(sc.budget)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(time.Minute))
	defer cancel()

	pg := pgproc.Start(t)
	broker := kafkaproc.Start(t)
	brokers := []string{broker.Addr}
	t.Logf("private servers up in %s: PostgreSQL %s, Kafka %s", time.Since(began).Round(time.Millisecond), pg.URL(), broker.Addr)

	const inTopic, outTopic = "chaos-in", "chaos-out"
	dlqTopic := inTopic + dlq.TopicSuffixDefault
	group := "chaos"
	createTopics(t, ctx, broker.Addr, map[string]int{inTopic: 6, outTopic: 3, dlqTopic: 1})

	all := append(slices.Clone(runners), relay, reprocessor)
	lg, loggers := newPartLogs(t, append(all, "seed")...)
	pools := map[string]*pgxpool.Pool{}
	for _, name := range append(slices.Clone(runners), relay, reprocessor, "test") {
		pools[name] = testenv.PartPool(t, ctx, pg.URL(), name, 8)
	}
	a, err := newApp(outTopic)
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(began.UnixNano())
	p := faultplan.New(sc.distinct, sc.duplicates, sc.keys, seed)
	t.Logf("plan seed %d: %d sends, %d distinct IDs over %d keys", seed, len(p.Sends), sc.distinct, sc.keys)
	keys := slices.Clone(p.Keys)
	want := make([]string, 0, sc.distinct+sc.deadLetters)
	for i := range sc.distinct {
		want = append(want, "m-"+strconv.Itoa(i))
	}
	for i := range sc.deadLetters {
		keys = append(keys, deadKey(i))
		want = append(want, "d-"+strconv.Itoa(i))
	}
	if err := a.setup(ctx, pools["test"], keys); err != nil {
		t.Fatalf("schema: %v", err)
	}
	dw, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Topic: dlqTopic, Group: group, Logger: loggers["seed"]})
	if err != nil {
		t.Fatal(err)
	}
	err = seedDeadLetters(ctx, dw, inTopic+"-retired", sc.deadLetters)
	if cerr := dw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("seed dead letters: %v", err)
	}

	// The parts under test: only the test cancels them (never a deadline,
	// which they would take for a cancellation). At cleanup (also after a
	// failure) they are cancelled and waited for before the servers go away.
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	exits := make(chan exit, len(runners)+2)
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
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		t.Fatal(err)
	}
	hooks := make([]struct{ started, ended atomic.Int64 }, len(runners))
	for i, name := range runners {
		cfg := &consumer.Config{Kafka: kafkaconn.Config{Brokers: brokers}, Topic: inTopic, GroupID: group, Store: store,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, Logger: loggers[name],
			Observers: []consumer.Observer{&testobs.Hooks{
				OnOutageStarted: func(string, error) { hooks[i].started.Add(1) },
				OnOutageEnded:   func(string, time.Duration) { hooks[i].ended.Add(1) },
			}}}
		switch i {
		case 0: // one transaction per message
			cfg.BatchSize, cfg.Handler = 1, a.handler(name)
		case 1: // up to 100 messages per transaction, one handler call each
			cfg.BatchSize, cfg.Handler = 100, a.handler(name)
		default: // up to 100 messages per transaction, one handler call for all
			cfg.BatchSize, cfg.BatchHandler = 100, a.batchHandler(name)
		}
		r, err := consumer.New(pools[name], cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { exits <- exit{name: name, err: r.Run(runCtx)} })
	}
	rl, err := outbox.NewRelay(pools[relay], a.outbox, &outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: brokers},
		PollInterval: 100 * time.Millisecond, PublishTimeout: 5 * time.Second,
		Logger: loggers[relay], Retry: retry.Policy{MaxInterval: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { exits <- exit{name: relay, err: rl.Run(runCtx)} })
	var replayedItems atomic.Int64
	rp, err := dlq.NewReprocessor(pools[reprocessor], &dlq.ReprocessorConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Topic: dlqTopic, Mode: dlq.Redrive,
		Handler: a.handler(reprocessor), Tables: migrate.Tables{Schema: schema},
		Rate: sc.replayRate, Logger: loggers[reprocessor],
		Progress: func(dlq.Item) { replayedItems.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Close() }) // after the deferred wait for the parts
	wg.Go(func() {
		sum, err := rp.Run(runCtx)
		exits <- exit{name: reprocessor, err: err, sum: sum}
	})

	t.Logf("%s: parts started, producing", time.Since(began).Round(time.Millisecond))
	var sent atomic.Int64
	produced := make(chan error, 1)
	wg.Go(func() { produced <- produce(runCtx, brokers, inTopic, p, sc.produceFor, &sent) })

	effects := func() (int64, error) {
		var n int64
		err := pools["test"].QueryRow(ctx, `SELECT count(*) FROM `+a.effects).Scan(&n)
		return n, err
	}
	h := &harness{t: t, deadline: deadline, logs: lg, exits: exits, status: func() string {
		n, err := effects()
		return fmt.Sprintf("%d of %d sends acknowledged, %d of %d effects (%v), %d of %d dead letters replayed",
			sent.Load(), len(p.Sends), n, len(want), err, replayedItems.Load(), sc.deadLetters)
	}}

	// The outages.
	h.mustWait("the reprocessor replaying", time.Minute, func() (bool, error) { return replayedItems.Load() > 0, nil })
	for i, s := range sc.steps {
		h.mustWait(fmt.Sprintf("%.0f%% of the messages sent", 100*s.at), 2*time.Minute, func() (bool, error) {
			return sent.Load() >= int64(s.at*float64(len(p.Sends))), nil
		})
		t0 := time.Now()
		before := h.logs.starts(all)
		switch s.kind {
		case pgRestart:
			if err := pg.Restart(ctx, s.mode); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			t.Logf("step %d at %s: PostgreSQL restarted (%s) in %s", i+1, t0.Sub(began).Round(time.Millisecond), s.mode,
				time.Since(t0).Round(time.Millisecond))
		case pgHeld:
			if err := pg.Stop(ctx, s.mode); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			parts := append(slices.Clone(runners), relay)
			if h.replayed == nil {
				parts = append(parts, reprocessor)
			} else {
				t.Errorf("step %d: the reprocessor completed before PostgreSQL went down: give it more dead letters", i+1)
			}
			err := h.wait("every part logging the PostgreSQL outage", outageNotice, func() (bool, error) {
				_, no := h.noticed(parts, before)
				return len(no) == 0 && time.Since(t0) >= minHold, nil
			})
			if _, no := h.noticed(parts, before); err != nil && len(no) > 0 {
				for _, name := range no {
					t.Errorf("step %d: %s logged no %q within %s of PostgreSQL stopping (its log records above have part=%s)",
						i+1, name, outage.StartMsg, outageNotice, name)
				}
			}
			if err := pg.Start(ctx); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			t.Logf("step %d at %s: PostgreSQL stopped (%s) for %s", i+1, t0.Sub(began).Round(time.Millisecond), s.mode,
				time.Since(t0).Round(time.Millisecond))
		case kafkaKill:
			if err := broker.Stop(syscall.SIGKILL); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			err := h.wait("the runners logging the Kafka outage", outageNotice, func() (bool, error) {
				_, no := h.noticed(runners, before)
				return len(no) == 0 && time.Since(t0) >= minHold, nil
			})
			if err != nil {
				t.Errorf("step %d: %v", i+1, err)
			}
			yes, _ := h.noticed(all, before)
			held := time.Since(t0)
			if err := broker.Start(ctx); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			t.Logf("step %d at %s: broker killed, restarted after %s, answering after %s; outage logged by %v", i+1,
				t0.Sub(began).Round(time.Millisecond), held.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), yes)
		}
	}

	// Everything done: the producer, the replay, the effects, the outbox.
	since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }
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
	h.mustWait("the reprocessor completing its replay", 2*time.Minute, func() (bool, error) { return h.replayed != nil, nil })
	if err := h.wait("every message applied", 2*time.Minute, func() (bool, error) {
		n, err := effects()
		return n >= int64(len(want)), err
	}); err != nil {
		checkEffects(t, ctx, pools["test"], a, want)
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
	applied := time.Since(began)

	// Only now may the runners and the relay return.
	h.check()
	stop()
	for range len(runners) + 1 {
		select {
		case e := <-exits:
			if e.err != nil {
				t.Errorf("%s: Run returned %v after the cancellation, want nil", e.name, e.err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("parts still running a minute after they were cancelled")
		}
	}

	checkEffects(t, ctx, pools["test"], a, want)
	checkPublished(t, brokers, outTopic, want)
	if s := h.replayed.Records; s[dlq.Applied]+s[dlq.AlreadyReplayed] != sc.deadLetters || len(s) > 2 {
		t.Errorf("replay summary %v: want %d dead letters applied (or found replayed after a lost commit answer), nothing else",
			s, sc.deadLetters)
	}
	// Every server is back and every part idle: each outage logged as
	// started has been logged as ended.
	starts := lg.starts(all)
	for _, name := range all {
		if starts[name] == 0 || starts[name] != lg.ends(name) {
			t.Errorf("%s logged %d outage starts (%q) and %d ends (%q or %q), want at least one, each with its end",
				name, starts[name], outage.StartMsg, lg.ends(name), outage.EndMsg, outage.StoppedMsg)
		}
	}
	t.Logf("outages logged: %v", starts)
	for i, name := range runners {
		if s, e := hooks[i].started.Load(), hooks[i].ended.Load(); s == 0 || s != e {
			t.Errorf("%s: OutageStarted ran %d times, OutageEnded %d times; want at least once, as often", name, s, e)
		}
	}
	if !t.Failed() {
		t.Logf("%d sends (%d distinct, %d dead letters) applied once each in %s; test took %s",
			len(p.Sends), sc.distinct, sc.deadLetters, applied.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	}
}

func createTopics(t *testing.T, ctx context.Context, addr string, topics map[string]int) {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 30 * time.Second}
	var cfgs []kafka.TopicConfig
	for name, n := range topics {
		cfgs = append(cfgs, kafka.TopicConfig{Topic: name, NumPartitions: n, ReplicationFactor: 1})
	}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range topics {
		if err := resp.Errors[name]; err != nil {
			t.Fatalf("create topic %s: %v", name, err)
		}
		if err := testenv.WaitTopic(ctx, client, name, n); err != nil {
			t.Fatal(err)
		}
	}
}
