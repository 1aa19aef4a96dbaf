package fault

// Network faults between the outbox relay and its servers, played by a
// loopback fault proxy (internal/faultproxy): a stranded PostgreSQL
// connection (silent for good, its FIN and RST lost: a NAT or firewall that
// forgot the flow) in the middle of a round's transaction, and a stranded or
// blackholed Kafka connection in the middle of a produce. Each test prints
// the time from the fault to the relay publishing again.

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/faultproxy"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// newFaultProxy starts a fault proxy to target, closed at cleanup.
func newFaultProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// relayFixture is an outbox table with n messages enqueued over keys, and a
// topic to publish them to.
type relayFixture struct {
	db    *testenv.DB
	store *outbox.Store
	topic string
	ids   []string
}

func newRelayFixture(t *testing.T, n, keys int) *relayFixture {
	t.Helper()
	f := &relayFixture{db: testenv.NewDB(t, testenv.Migrate), topic: testenv.NewTopic(t, 3)}
	var err error
	if f.store, err = outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: f.db.Schema}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < n; i += 100 {
		var msgs []outbox.Message
		for j := i; j < min(i+100, n); j++ {
			key := fmt.Sprintf("k%02d", j%keys)
			msgs = append(msgs, outbox.Message{Topic: f.topic, Key: []byte(key), Value: []byte(fmt.Sprint(j))})
		}
		err := pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			ids, err := f.store.EnqueueTx(ctx, tx, msgs...)
			f.ids = append(f.ids, ids...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// progress follows a relay's publications and the time it resumed after a
// fault.
type progress struct {
	mu        sync.Mutex
	published int
	faultAt   time.Time
	resumedIn time.Duration
	changed   chan struct{}
	// acked: the relay resumed when Kafka acknowledged records after the
	// fault (AfterPublish), not when their marks committed (Published).
	acked bool
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (p *progress) hook(recs []outbox.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published += len(recs)
	if !p.acked && !p.faultAt.IsZero() && p.resumedIn == 0 {
		p.resumedIn = time.Since(p.faultAt)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// ackedAfterFault is AfterPublish's part when acked: records published
// after the fault mark the resumption.
func (p *progress) ackedAfterFault() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.acked && !p.faultAt.IsZero() && p.resumedIn == 0 {
		p.resumedIn = time.Since(p.faultAt)
	}
}

// fault notes that the fault happened now.
func (p *progress) fault() {
	p.mu.Lock()
	p.faultAt = time.Now()
	p.mu.Unlock()
}

// wait waits, at most d, until at least n were published and, when
// resumed, the relay published after the fault.
func (p *progress) wait(t *testing.T, d time.Duration, n int, resumed bool, what string) {
	t.Helper()
	timeout := time.After(d)
	for {
		p.mu.Lock()
		ok := p.published >= n && (!resumed || p.resumedIn > 0)
		c, got := p.changed, p.published
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c:
		case <-timeout:
			t.Fatalf("%s: %d of %d published after %v", what, got, n, d)
		}
	}
}

// check reads the topic and fails unless every enqueued message is there;
// it returns how many were published more than once (with the same ID).
func (f *relayFixture) check(t *testing.T) (dups int) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range testenv.ReadAll(t, testenv.Brokers(t), f.topic) {
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderID {
				seen[string(h.Value)]++
			}
		}
	}
	for _, id := range f.ids {
		switch n := seen[id]; {
		case n == 0:
			t.Fatalf("message %s never reached Kafka", id)
		case n > 1:
			dups += n - 1
		}
		delete(seen, id)
	}
	if len(seen) != 0 {
		t.Fatalf("%d messages in Kafka that were never enqueued", len(seen))
	}
	st, err := f.store.Stats(context.Background(), f.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 0 || st.Dead != 0 {
		t.Fatalf("outbox after the run: backlog %d, dead %d", st.Backlog, st.Dead)
	}
	return dups
}

// TestRelayPostgresStranded: the relay's PostgreSQL connections are
// stranded in the middle of a round's transaction (after a publish, before
// its marks commit). The relay gives up on the silent connection, the
// server ends the abandoned transaction (idle_in_transaction_session_timeout,
// set by the relay) and so frees its shards, and the relay publishes again
// on a new connection: nothing is lost, and the rows whose marks the
// abandoned transaction held are published again with the same IDs.
func TestRelayPostgresStranded(t *testing.T) {
	t.Parallel()
	const n, keys = 3000, 20
	f := newRelayFixture(t, n, keys)
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	u.Host = proxy.Addr()
	ctx := context.Background()
	pool := testenv.PartPool(t, ctx, u.String(), "relay-pg-strand", 4)

	prog := newProgress()
	var stranded atomic.Bool
	logs, log := testenv.NewLogs(t)
	relay, err := outbox.NewRelay(pool, f.store, &outbox.RelayConfig{
		Kafka: testenv.Kafka(t), BatchSize: 50, PollInterval: 50 * time.Millisecond, PublishTimeout: 2 * time.Second,
		Logger: log,
		Observers: []outbox.Observer{&testobs.Outbox{
			OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
				prog.mu.Lock()
				past := prog.published >= n/4
				prog.mu.Unlock()
				if past && !stranded.Swap(true) {
					c := proxy.Strand()
					prog.fault()
					t.Logf("stranded %d PostgreSQL connections after %d published, mid-round", c, n/4)
				}
			},
			OnPublished: prog.hook,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	prog.wait(t, 3*time.Minute, n/4, true, "publishing again after the strand")
	prog.mu.Lock()
	resumed := prog.resumedIn
	prog.mu.Unlock()
	prog.wait(t, 3*time.Minute, n, false, "publishing everything")
	stop()
	if err := <-done; err != nil {
		t.Errorf("relay: %v", err)
	}
	done <- nil
	dups := f.check(t)
	var orphans int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
		WHERE application_name = 'relay-pg-strand' AND state LIKE 'idle in transaction%'`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	t.Logf("strand to publishing again: %v; %d messages, %d published twice (same IDs), %d sessions still idle in transaction, %d outage warnings",
		resumed.Round(time.Millisecond), n, dups, orphans, logs.Count("server unreachable; waiting it out", ""))
}

// isProduceRequest reports whether chunk starts a Kafka Produce request:
// a 4-byte size, then API key 0.
func isProduceRequest(chunk []byte) bool {
	return len(chunk) >= 6 && binary.BigEndian.Uint32(chunk) > 0 && binary.BigEndian.Uint16(chunk[4:]) == 0
}

// TestRelayKafkaStrandedAndBlackholed: the relay's broker connection is
// stranded in the middle of a produce, and later blackholed for a while.
// Each produce on a silent connection is abandoned at PublishTimeout and
// done again on a new connection: nothing is lost.
func TestRelayKafkaStrandedAndBlackholed(t *testing.T) {
	t.Parallel()
	const n, keys = 2000, 20
	f := newRelayFixture(t, n, keys)
	brokers := testenv.Brokers(t)
	proxy := newFaultProxy(t, brokers[0])
	// Every broker connection, to whatever address the cluster
	// advertises, goes through the proxy (one broker).
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, proxy.Addr())
	}
	prog := newProgress()
	prog.acked = true
	failed := make(chan struct{}, 1)
	var stranded, failedAfterStrand atomic.Bool
	_, log := testenv.NewLogs(t)
	relay, err := outbox.NewRelay(f.db.Pool, f.store, &outbox.RelayConfig{
		Kafka:     kafkaconn.Config{Brokers: []string{proxy.Addr()}, Dial: dial, DialTimeout: 2 * time.Second},
		BatchSize: 50, PollInterval: 50 * time.Millisecond, PublishTimeout: 2 * time.Second,
		Logger: log,
		Observers: []outbox.Observer{&testobs.Outbox{
			OnAfterPublish: func(_ context.Context, recs []outbox.Record) {
				prog.ackedAfterFault()
				prog.mu.Lock()
				past := prog.published >= n/4
				prog.mu.Unlock()
				if past && !stranded.Swap(true) {
					// Strand the connection that carries the next
					// produce, whichever one the client picks.
					proxy.StrandOn(func(chunk []byte) bool {
						if !isProduceRequest(chunk) {
							return false
						}
						prog.fault()
						return true
					})
					t.Logf("stranding the connection of the next produce, after %d published", n/4)
				}
			},
			OnPublished: prog.hook,
			OnFailed: func(_ outbox.Record, err error) {
				if stranded.Load() && !failedAfterStrand.Swap(true) {
					t.Logf("a produce on a stranded connection failed: %v", err)
				}
				select {
				case failed <- struct{}{}:
				default:
				}
			},
		}}, Retry: retry.Policy{MaxInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
		done <- nil
	}()
	prog.wait(t, 2*time.Minute, n/4, true, "publishing again after the strand")
	prog.mu.Lock()
	strandResumed := prog.resumedIn
	prog.mu.Unlock()
	if !failedAfterStrand.Load() {
		t.Fatal("no produce failed after the strand: the stranded connections were not used")
	}

	// A blackhole: every byte lost both ways until a produce failed.
	prog.wait(t, 2*time.Minute, n/2, false, "publishing before the blackhole")
	select {
	case <-failed:
	default:
	}
	proxy.Set(faultproxy.Blackhole)
	start := time.Now()
	<-failed
	proxy.Set(faultproxy.Pass)
	held := time.Since(start)
	prog.mu.Lock()
	prog.faultAt, prog.resumedIn = time.Now(), 0
	prog.mu.Unlock()
	prog.wait(t, 2*time.Minute, n/2, true, "publishing again after the blackhole")
	prog.mu.Lock()
	blackholeResumed := prog.resumedIn
	prog.mu.Unlock()
	prog.wait(t, 2*time.Minute, n, false, "publishing everything")
	dups := f.check(t)
	t.Logf("Kafka strand to publishing again: %v; blackhole held %v until a produce failed, then publishing again %v after it ended; %d messages, %d published twice (same IDs)",
		strandResumed.Round(time.Millisecond), held.Round(time.Millisecond), blackholeResumed.Round(time.Millisecond), n, dups)
}

// TestRelayPostgresFaults: the relay's PostgreSQL connections are reset in
// the middle of a round, blackholed until the relay says it waits for the
// server, or slowed down by 100ms each way for a while; in each case it
// publishes everything, and prints how long it took to publish again.
func TestRelayPostgresFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faultproxy.Mode{faultproxy.Reset, faultproxy.Blackhole, faultproxy.Latency} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			const n, keys = 1000, 20
			f := newRelayFixture(t, n, keys)
			u, err := url.Parse(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy := newFaultProxy(t, u.Host)
			proxy.SetLatency(100 * time.Millisecond)
			u.Host = proxy.Addr()
			ctx := context.Background()
			pool := testenv.PartPool(t, ctx, u.String(), "relay-pg-"+fault.String(), 4)
			prog := newProgress()
			var hit atomic.Bool
			faulted := make(chan struct{})
			waiting := make(chan struct{})
			var waitingOnce sync.Once
			logs, log := testenv.NewLogs(t)
			log = slog.New(onMessage{Handler: log.Handler(), msg: "server unreachable; waiting it out", once: &waitingOnce, ch: waiting})
			relay, err := outbox.NewRelay(pool, f.store, &outbox.RelayConfig{
				Kafka: testenv.Kafka(t), BatchSize: 50, PollInterval: 50 * time.Millisecond, PublishTimeout: 2 * time.Second,
				Logger: log,
				Observers: []outbox.Observer{&testobs.Outbox{
					OnAfterPublish: func(context.Context, []outbox.Record) {
						prog.mu.Lock()
						past := prog.published >= n/4
						prog.mu.Unlock()
						if past && !hit.Swap(true) {
							proxy.Set(fault) // mid-round
							prog.fault()
							close(faulted)
						}
					},
					OnPublished: prog.hook,
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- relay.Run(runCtx) }()
			defer func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("relay: %v", err)
				}
			}()
			<-faulted
			var held time.Duration
			switch fault {
			case faultproxy.Reset:
				proxy.Set(faultproxy.Pass) // the open connections were reset; new ones pass
			case faultproxy.Blackhole:
				start := time.Now()
				select {
				case <-waiting:
				case <-time.After(2 * time.Minute):
					t.Fatal("the relay did not notice the blackhole within 2 minutes")
				}
				held = time.Since(start)
				prog.mu.Lock()
				prog.faultAt, prog.resumedIn = time.Now(), 0
				prog.mu.Unlock()
				proxy.Set(faultproxy.Pass)
			case faultproxy.Latency:
				prog.wait(t, 2*time.Minute, n/2, false, "publishing with latency")
				proxy.Set(faultproxy.Pass)
			}
			prog.wait(t, 2*time.Minute, n/4, true, "publishing again after the fault")
			prog.mu.Lock()
			resumed := prog.resumedIn
			prog.mu.Unlock()
			prog.wait(t, 2*time.Minute, n, false, "publishing everything")
			dups := f.check(t)
			t.Logf("%s: noticed after %v; publishing again %v after the fault (or its end); %d messages, %d published twice (same IDs), %d outage warnings",
				fault, held.Round(time.Millisecond), resumed.Round(time.Millisecond), n, dups, logs.Count("server unreachable; waiting it out", ""))
		})
	}
}

// TestConsumerKafkaStranded: every broker connection of a consumer
// (group coordinator, fetches) is stranded while it waits for messages.
// Its requests on the silent connections are abandoned at their timeouts
// and sent again on new ones: the messages produced after the strand are
// applied, each once. It prints the time from the strand to the first of
// them applied.
func TestConsumerKafkaStranded(t *testing.T) {
	t.Parallel()
	const half = 500
	f := newKafkaFaultConsumer(t, 3, func(cfg *consumer.Config) {
		cfg.Kafka.DialTimeout, cfg.SessionTimeout = 2*time.Second, 6*time.Second
	})
	f.produce("early-", half)
	f.waitApplied(half, "before the strand")
	f.mark()
	c := f.proxy.Strand()
	f.produce("late-", half) // straight to the broker
	f.waitLate("the strand")
	f.waitApplied(2*half, "after the strand")
	f.check(2 * half)
	t.Logf("stranded %d broker connections; the first message produced after the strand applied %v after it; %d messages, each applied once",
		c, f.firstLate().Round(time.Millisecond), 2*half)
}

// kafkaFaultConsumer is a consumer whose broker connections all go through
// a fault proxy, applying the effects of the messages of its topic; it
// measures when the first "late-" message (produced after a fault) is
// applied.
type kafkaFaultConsumer struct {
	t     *testing.T
	db    *testenv.DB
	topic string
	table string
	proxy *faultproxy.Proxy
	mu    sync.Mutex
	since time.Time // the fault (or its end): see mark
	first time.Duration
	late  chan struct{} // closed when the first late message is applied
}

// newKafkaFaultConsumer starts a consumer (default settings but for what
// tune changes) on a new topic of partitions partitions, stopped at cleanup.
func newKafkaFaultConsumer(t *testing.T, partitions int, tune func(*consumer.Config)) *kafkaFaultConsumer {
	t.Helper()
	f := &kafkaFaultConsumer{t: t, db: newDB(t), topic: testenv.NewTopic(t, partitions), late: make(chan struct{})}
	f.table = f.db.Table("effects")
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: f.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	f.proxy = newFaultProxy(t, testenv.Brokers(t)[0])
	f.proxy.SetLatency(100 * time.Millisecond)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, f.proxy.Addr())
	}
	_, logger := testenv.NewLogs(t)
	cfg := consumer.Config{
		Kafka: kafkaconn.Config{Brokers: []string{f.proxy.Addr()}, Dial: dial},
		Topic: f.topic, GroupID: testenv.Name(t, "g"), Store: store, Logger: logger,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if strings.HasPrefix(m.ID, "late-") {
				f.mu.Lock()
				if f.first == 0 {
					f.first = time.Since(f.since)
					close(f.late)
				}
				f.mu.Unlock()
			}
			return applyEffect(ctx, tx, f.table, m)
		}),
	}
	if tune != nil {
		tune(&cfg)
	}
	r, err := consumer.New(f.db.Pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	return f
}

func (f *kafkaFaultConsumer) produce(prefix string, n int) { produce(f.t, f.topic, prefix, 0, n, 30) }

// mark sets the time firstLate counts from: the fault, or its end.
func (f *kafkaFaultConsumer) mark() {
	f.mu.Lock()
	f.since = time.Now()
	f.mu.Unlock()
}

func (f *kafkaFaultConsumer) firstLate() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first
}

// waitLate waits until the first late message is applied.
func (f *kafkaFaultConsumer) waitLate(what string) {
	f.t.Helper()
	select {
	case <-f.late:
	case <-time.After(3 * time.Minute):
		f.t.Fatalf("no message produced after %s was applied within 3 minutes", what)
	}
}

// waitApplied waits until n messages are applied.
func (f *kafkaFaultConsumer) waitApplied(n int, what string) {
	f.t.Helper()
	waitApplied(f.t, f.db, f.table, n, 3*time.Minute, what)
}

// check says that n messages were applied, each once, in order per key.
func (f *kafkaFaultConsumer) check(n int) {
	f.t.Helper()
	checkAppliedOnce(f.t, f.db, n)
}

// waitApplied waits, at most within, until table holds n rows (n messages
// applied).
func waitApplied(t *testing.T, db *testenv.DB, table string, n int, within time.Duration, what string) {
	t.Helper()
	count := func() int {
		var c int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	deadline := time.Now().Add(within)
	for count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d applied after %v; where idemkit's goroutines are:\n%s", what, count(), n, within,
				idemkitStacks())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// idemkitStacks returns the stacks of the goroutines that run idemkit's
// code (at most 256 KiB of them): what a stalled test shows of where its
// consumer waits.
func idemkitStacks() string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out strings.Builder
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/idemkit/idemkit/") && !strings.Contains(g, "idemkitStacks") &&
			out.Len()+len(g) < 256<<10 {
			out.WriteString(g)
			out.WriteString("\n\n")
		}
	}
	return out.String()
}

// checkAppliedOnce says that n messages were applied, each once, in order
// per key.
func checkAppliedOnce(t *testing.T, db *testenv.DB, n int) {
	t.Helper()
	runs := effectRuns(t, db)
	for id, c := range runs {
		if c != 1 {
			t.Fatalf("%s applied %d times", id, c)
		}
	}
	if len(runs) != n {
		t.Fatalf("%d messages applied, want %d", len(runs), n)
	}
	checkOrder(t, db)
}

// TestConsumerPostgresStranded: the consumer's PostgreSQL connections are
// stranded (silent for good, no FIN or RST) while a transaction waits for
// its COMMIT's answer. The runner gives the commit up and runs the
// transaction again on a new connection; the stranded session, idle in its
// transaction on the server, ends itself after HandlerTimeout plus 10s and
// releases its claim, which the new transaction then takes: the partition
// moves again within that bound, nothing is lost or applied twice, and no
// session is left idle in transaction.
func TestConsumerPostgresStranded(t *testing.T) {
	t.Parallel()
	const n, partitions = 600, 3
	db := newDB(t)
	topic := testenv.NewTopic(t, partitions)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	table := db.Table("effects")
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	u.Host = proxy.Addr()
	ctx := context.Background()
	pool := testenv.PartPool(t, ctx, u.String(), "consumer-pg-strand", 8)
	_, logger := testenv.NewLogs(t)
	var (
		mu         sync.Mutex
		applied    int
		strandAt   time.Time
		strandedID string // the message whose COMMIT went out stranded
		resumedIn  time.Duration
		stranded   = make(chan struct{})
		resumed    = make(chan struct{})
		strandOnce sync.Once
	)
	cfg := consumer.Config{
		Kafka: testenv.Kafka(t), Topic: topic, GroupID: testenv.Name(t, "g"), Store: store, Logger: logger,
		BatchSize: 1, HandlerTimeout: 2 * time.Second,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if err := applyEffect(ctx, tx, table, m); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			applied++
			if applied == n/4 {
				// This transaction's COMMIT goes out on a stranded connection.
				strandOnce.Do(func() {
					strandAt, strandedID = time.Now(), m.ID
					t.Logf("stranded %d PostgreSQL connections before a COMMIT", proxy.Strand())
					close(stranded)
				})
			}
			return nil
		}),
	}
	testobs.Of(&cfg).OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-stranded:
		default:
			return
		}
		for _, m := range msgs {
			if m.ID == strandedID && resumedIn == 0 {
				resumedIn = time.Since(strandAt)
				close(resumed)
			}
		}
	}
	r, err := consumer.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
		done <- nil
	}()
	produce(t, topic, "m-", 0, n, 50)
	select {
	case <-resumed:
	case <-time.After(3 * time.Minute):
		t.Fatal("the stranded transaction's message was not committed within 3 minutes")
	}
	waitApplied(t, db, table, n, 3*time.Minute, "after the strand")
	checkAppliedOnce(t, db, n)
	var orphans int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
		WHERE application_name = 'consumer-pg-strand' AND state LIKE 'idle in transaction%'`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Fatalf("%d sessions still idle in transaction", orphans)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("strand to its message committed on a new connection: %v (HandlerTimeout 2s: the bound is 12s); %d messages, each applied once, in order",
		resumedIn.Round(time.Millisecond), n)
}

// TestConsumerPostgresFaults: with default settings, the consumer's
// PostgreSQL connections are reset before a COMMIT, blackholed there until
// the runner says it waits for the server, or slowed down by 100ms each
// way for a while; in each case every message is applied once, in order,
// and the test prints how long the partition took to move again.
func TestConsumerPostgresFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faultproxy.Mode{faultproxy.Reset, faultproxy.Blackhole, faultproxy.Latency} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			const n, partitions = 400, 3
			db := newDB(t)
			topic := testenv.NewTopic(t, partitions)
			store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			table := db.Table("effects")
			u, err := url.Parse(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy := newFaultProxy(t, u.Host)
			proxy.SetLatency(100 * time.Millisecond)
			u.Host = proxy.Addr()
			ctx := context.Background()
			pool := testenv.PartPool(t, ctx, u.String(), "consumer-pg-"+fault.String(), 8)
			waiting := make(chan struct{})
			var waitingOnce sync.Once
			logs, log := testenv.NewLogs(t)
			log = slog.New(onMessage{Handler: log.Handler(), msg: "server unreachable; waiting it out", once: &waitingOnce, ch: waiting})
			var (
				mu        sync.Mutex
				applied   int
				faultAt   time.Time
				faultedID string
				resumedIn time.Duration
				faulted   = make(chan struct{})
				resumed   = make(chan struct{})
			)
			cfg := consumer.Config{
				Kafka: testenv.Kafka(t), Topic: topic, GroupID: testenv.Name(t, "g"), Store: store, Logger: log,
				Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := applyEffect(ctx, tx, table, m); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					if applied++; applied == n/4 && faultedID == "" {
						faultAt, faultedID = time.Now(), m.ID
						proxy.Set(fault) // this transaction's COMMIT meets the fault
						close(faulted)
					}
					return nil
				}),
			}
			testobs.Of(&cfg).OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) {
				mu.Lock()
				defer mu.Unlock()
				for _, m := range msgs {
					if faultedID != "" && m.ID == faultedID && resumedIn == 0 {
						resumedIn = time.Since(faultAt)
						close(resumed)
					}
				}
			}
			r, err := consumer.New(pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(runCtx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("consumer: %v", err)
				}
			}()
			produce(t, topic, "m-", 0, n, 20)
			<-faulted
			var held time.Duration
			switch fault {
			case faultproxy.Reset:
				proxy.Set(faultproxy.Pass) // the open connections were reset; new ones pass
			case faultproxy.Blackhole:
				start := time.Now()
				select {
				case <-waiting:
				case <-time.After(2 * time.Minute):
					t.Fatal("the consumer did not notice the blackhole within 2 minutes")
				}
				held = time.Since(start)
				proxy.Set(faultproxy.Pass)
			case faultproxy.Latency:
				select {
				case <-resumed:
				case <-time.After(2 * time.Minute):
					t.Fatal("no commit with latency within 2 minutes")
				}
				proxy.Set(faultproxy.Pass)
			}
			select {
			case <-resumed:
			case <-time.After(2 * time.Minute):
				t.Fatal("the faulted transaction's message was not committed within 2 minutes")
			}
			waitApplied(t, db, table, n, 2*time.Minute, "after the fault")
			checkAppliedOnce(t, db, n)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%s: noticed after %v; its message committed %v after the fault; %d messages, each applied once, in order; %d outage warnings",
				fault, held.Round(time.Millisecond), resumedIn.Round(time.Millisecond), n, logs.Count("server unreachable; waiting it out", ""))
		})
	}
}

// TestConsumerKafkaFaults: with default settings, every broker connection
// of a consumer is reset, blackholed for 15s, or slowed down by 100ms each
// way for a while, in the middle of consuming; in each case every message
// is applied once, in order, and the test prints how long after the fault
// (or its end) the first message produced after it was applied.
func TestConsumerKafkaFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faultproxy.Mode{faultproxy.Reset, faultproxy.Blackhole, faultproxy.Latency} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			const half = 300
			f := newKafkaFaultConsumer(t, 3, nil)
			f.produce("early-", half)
			f.waitApplied(half, "before the fault")
			f.mark()
			f.proxy.Set(fault)
			f.produce("late-", half) // straight to the broker
			switch fault {
			case faultproxy.Reset:
				f.proxy.Set(faultproxy.Pass) // the open connections were reset; new ones pass
			case faultproxy.Blackhole:
				time.Sleep(15 * time.Second) // the fault's length: what it lasts, not a wait for a result
				f.mark()
				f.proxy.Set(faultproxy.Pass)
			case faultproxy.Latency:
				f.waitLate("the fault, with latency")
				f.proxy.Set(faultproxy.Pass)
			}
			f.waitLate("the fault")
			f.waitApplied(2*half, "after the fault")
			f.check(2 * half)
			t.Logf("%s: the first message produced after the fault applied %v after it (blackhole: after its end); %d messages, each applied once, in order",
				fault, f.firstLate().Round(time.Millisecond), 2*half)
		})
	}
}
