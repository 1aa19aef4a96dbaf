package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// The messages internal/outage logs when an outage starts and ends.
const (
	outageStart = outage.StartMsg
	outageEnd   = outage.EndMsg
)

// waitFor polls cond every 20ms until it holds, or fails after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runAsync starts r and returns a channel that receives what Run returned;
// at cleanup it cancels Run (if it still runs) and waits for it.
func runAsync(t *testing.T, r interface{ Run(context.Context) error }) (done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ch <- r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return ch
}

// pgProxy forwards TCP connections to the test PostgreSQL server while it
// is up; down closes every connection and makes new ones fail at once, as a
// server that went away would. It stands for an outage without touching the
// shared server.
type pgProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]struct{}
}

func startProxy(t *testing.T, up bool) *pgProxy {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), up: up,
		conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.setUp(false)
		p.wg.Wait()
	})
	return p
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if !up {
			c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if !p.up {
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(s, c) })
		p.wg.Go(func() { pipe(c, s) })
	}
}

func (p *pgProxy) setUp(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for c := range p.conns {
			c.Close()
		}
	}
}

// pool returns a pool of the test server reached through the proxy.
func (p *pgProxy) pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	addr := p.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The relay's PostgreSQL connections are killed (pg_terminate_backend) again
// and again while it drains 5,000 messages: Run does not return, nothing is
// lost, per-key order holds, and each outage is logged when it starts and
// when it ends instead of every failed round.
func TestRelayRidesOutKilledConnections(t *testing.T) {
	t.Parallel()
	const total, keys = 5000, 50
	ctx := context.Background()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 3)
	appName := db.Schema + "_relay"
	pool := newPool(t, map[string]string{"application_name": appName})
	logs, logger := testenv.NewLogs(t)
	var published atomic.Int64
	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{
		Kafka: testenv.Kafka(t), BatchSize: 25, PollInterval: 50 * time.Millisecond,
		Logger: logger, Observers: []outbox.Observer{&testobs.Outbox{OnPublished: func(recs []outbox.Record) { published.Add(int64(len(recs))) }}},
	})
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]int{}
	var msgs []outbox.Message
	for i := range total {
		key := fmt.Sprintf("k%02d", i%keys)
		msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s/%d", key, want[key])})
		want[key]++
	}
	enqueue(t, db.Pool, store, msgs...)
	done := runAsync(t, relay)

	// Kill the relay's connections every 100ms until the backlog is empty.
	kills := 0
	for {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v during the outages", err)
		case <-time.After(100 * time.Millisecond):
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, appName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			kills++
		}
		st, err := store.Stats(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog == 0 {
			break
		}
		if kills > 600 {
			t.Fatalf("backlog still %+v after %d kills", st, kills)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v", err)
	default:
	}
	dups := checkKeyOrder(t, readAll(t, testenv.Brokers(t), topic), want)
	starts, ends := logs.Count(outageStart, "outbox relay: postgres"), logs.Count(outageEnd, "outbox relay: postgres")
	t.Logf("%d kills, %d outages logged (%d ends), %d duplicates, %d published", kills, starts, ends, dups, published.Load())
	switch {
	case kills < 5:
		t.Fatalf("only %d kills hit the relay: the drain was too fast to test anything", kills)
	case starts == 0 || starts > kills:
		t.Fatalf("%d outages logged for %d kills, want 1..%d", starts, kills, kills)
	case ends < starts-1 || ends > starts:
		t.Fatalf("%d outage ends logged for %d starts", ends, starts)
	case logs.Count("round failed; backing off", "") != 0:
		t.Fatalf("connection errors logged as failed rounds: %d", logs.Count("round failed; backing off", ""))
	}
}

// A relay started while PostgreSQL cannot be reached waits for it, logs the
// outage once, and delivers once it is back.
func TestRelayWaitsForPostgresAtStart(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	proxy := startProxy(t, false)
	logs, logger := testenv.NewLogs(t)
	pub := newPublished()
	relay, err := outbox.NewRelay(proxy.pool(t), store, &outbox.RelayConfig{
		Kafka: testenv.Kafka(t), PollInterval: 50 * time.Millisecond, Logger: logger,
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	done := runAsync(t, relay)
	const op = "outbox relay: postgres"
	waitFor(t, 10*time.Second, "outage logged", func() bool { return logs.Count(outageStart, op) > 0 })
	time.Sleep(time.Second) // a few more failed tries, still one log line
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while PostgreSQL was unreachable", err)
	default:
	}
	proxy.setUp(true)
	pub.wait(t, 30*time.Second, ids...)
	waitFor(t, 10*time.Second, "outage end logged", func() bool { return logs.Count(outageEnd, op) > 0 })
	if s, e := logs.Count(outageStart, op), logs.Count(outageEnd, op); s != 1 || e != 1 {
		t.Fatalf("outage logged %d times, its end %d times; want once each", s, e)
	}
}

// With MaxOutage, a relay and a dispatcher whose PostgreSQL goes away return
// a *retry.OutageError once it stayed away that long; a relay whose Kafka
// cannot be reached does too.
func TestMaxOutage(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	proxy := startProxy(t, true)
	pool := proxy.pool(t)
	const maxOutage = time.Second
	pub := newPublished()
	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{
		Kafka: testenv.Kafka(t), PollInterval: 50 * time.Millisecond, MaxOutage: maxOutage,
		Logger: testLogger(t), Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dispatcher, err := outbox.NewDispatcher(pool, store, &outbox.DispatcherConfig{
		Handlers:     map[string]outbox.Handler{"h": outbox.HandlerFunc(func(context.Context, *outbox.Record) error { return nil })},
		PollInterval: 50 * time.Millisecond, MaxOutage: maxOutage, Logger: testLogger(t),
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}},
	})
	if err != nil {
		t.Fatal(err)
	}
	relayDone, dispatcherDone := runAsync(t, relay), runAsync(t, dispatcher)
	ids := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Value: []byte("before")},
		outbox.Message{Handler: "h", Value: []byte("before")})
	pub.wait(t, 30*time.Second, ids...)

	proxy.setUp(false)
	start := time.Now()
	for name, done := range map[string]<-chan error{"relay": relayDone, "dispatcher": dispatcherDone} {
		select {
		case err := <-done:
			var oerr *retry.OutageError
			if !errors.Is(err, retry.ErrOutage) || !errors.As(err, &oerr) || oerr.Op != "outbox "+name+": postgres" {
				t.Fatalf("%s: Run returned %v, want a *retry.OutageError for postgres", name, err)
			}
			if el := time.Since(start); el < maxOutage {
				t.Fatalf("%s: Run returned after %v, before MaxOutage", name, el)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Run still running 30s after PostgreSQL went away", name)
		}
	}

	// Kafka: nothing listens on the broker address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadBroker := ln.Addr().String()
	ln.Close()
	kafkaRelay, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{
		Kafka: kafkaconn.Config{Brokers: []string{deadBroker}}, PollInterval: 50 * time.Millisecond, MaxOutage: maxOutage, PublishTimeout: time.Second, Logger: testLogger(t), Retry: retry.Policy{MaxInterval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Value: []byte("never")})
	select {
	case err := <-runAsync(t, kafkaRelay):
		var oerr *retry.OutageError
		if !errors.Is(err, retry.ErrOutage) || !errors.As(err, &oerr) || oerr.Op != "outbox relay: kafka" {
			t.Fatalf("Run returned %v, want a *retry.OutageError for kafka", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30s after Kafka could not be reached")
	}
	if _, err := outbox.NewRelay(db.Pool, store, &outbox.RelayConfig{Kafka: kafkaconn.Config{Brokers: []string{deadBroker}}, MaxOutage: -1}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("MaxOutage -1: %v, want ErrInvalidConfig", err)
	}
}
