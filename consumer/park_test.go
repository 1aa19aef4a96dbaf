package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestParkedReleaseOutageIsNotAVerdict: a parked message whose
// release loses its PostgreSQL connection in the handler (a PostgreSQL
// restart, pg_terminate_backend) is not charged an attempt, and never goes
// to OnFailure for it. The in-place path turns such an error into an outage
// (connectionLost); the release path (parker.releaseKey) wraps every handler
// error in handlerError and charges it.
func TestParkedReleaseOutageIsNotAVerdict(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("p1", "A", 1), msg("q1", "B", 1))
			var mu sync.Mutex
			calls := 0
			cfg := e.config(md, nil)
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "p1" {
					mu.Lock()
					calls++
					n := calls
					mu.Unlock()
					switch n {
					case 1: // in place: a transient failure parks it
						return errors.New("dependency down")
					case 2: // its release: PostgreSQL drops the connection under the handler
						_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
						return err
					}
				}
				return e.effect(ctx, tx, m)
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
			cfg.ParkedPoll = 50 * time.Millisecond
			dead := make(chan string, 4)
			cfg.OnFailure = func(_ context.Context, m *consumer.Message, err error) error {
				t.Logf("OnFailure(%s): %v", m.ID, err)
				dead <- m.ID
				return nil
			}
			applied := make(chan struct{})
			var once sync.Once
			testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				if m.ID == "p1" && (o == consumer.Applied || o == consumer.Failed) {
					once.Do(func() { close(applied) })
				}
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, applied, "p1 applied or dead-lettered")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			select {
			case id := <-dead:
				t.Fatalf("%s went to OnFailure because its connection was lost during a release: an outage taken for a verdict (effects %v)", id, e.runs())
			default:
			}
			if got := e.runs()["p1"]; got != 1 {
				t.Fatalf("p1 applied %d times, want 1", got)
			}
		})
	}
}

// TestParkNULInErrorKeepsRunning: in NonBlocking mode a poison message
// whose handler error contains a NUL byte (an error that quotes the payload
// with %s) is parked and the other keys flow; the runner does not return.
// parker.insert writes f.err.Error() into a text column: PostgreSQL rejects
// NUL (SQLSTATE 22021) and Run returns that raw error for good.
func TestParkNULInErrorKeepsRunning(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("bad", "A", 1), msg("ok", "B", 1))
			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				if m.ID == "bad" {
					return errors.New("cannot decode payload \x00\x01 at byte 0")
				}
				return nil
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 5}
			applied := make(chan struct{})
			var once sync.Once
			testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				if m.ID == "ok" {
					once.Do(func() { close(applied) })
				}
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			select {
			case err := <-errc:
				t.Fatalf("Run returned for a poison message in NonBlocking mode: %v", err)
			case <-applied:
			case <-time.After(60 * time.Second):
				t.Fatal("the other key never flowed")
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestParkedHeadersRoundTrip: a message parked behind its key keeps
// its headers byte for byte. Header keys go into jsonb as JSON strings: a
// key with invalid UTF-8 comes back with U+FFFD, and a key with NUL makes the
// INSERT fail (SQLSTATE 22P05), which stops the runner.
func TestParkedHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, key string }{{"invalid-utf8", "trace-\xff\xfe"}, {"nul", "trace\x00id"}} {
		for _, md := range baseModes {
			t.Run(tc.name+"/"+md.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, 1)
				second := msg("a2", "A", 1)
				second.Headers = append(second.Headers, kafka.Header{Key: tc.key, Value: []byte("v")})
				e.produce(msg("a1", "A", 1), second, msg("b1", "B", 1))
				var mu sync.Mutex
				a1calls := 0
				var gotKeys []string
				cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
					mu.Lock()
					defer mu.Unlock()
					if m.ID == "a1" {
						a1calls++
						if a1calls == 1 {
							return errors.New("transient")
						}
					}
					if m.ID == "a2" {
						for _, h := range m.Headers {
							gotKeys = append(gotKeys, h.Key)
						}
					}
					return nil
				})
				cfg.FailureMode = consumer.NonBlocking
				cfg.Retry = retry.Policy{MaxAttempts: 1}
				cfg.ParkedRetry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 5}
				cfg.ParkedPoll = 50 * time.Millisecond
				done := make(chan struct{})
				var once sync.Once
				testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
					if m.ID == "a2" && o == consumer.Applied {
						once.Do(func() { close(done) })
					}
				}
				r, err := consumer.New(e.db.Pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errc := make(chan error, 1)
				go func() { errc <- r.Run(ctx) }()
				select {
				case err := <-errc:
					t.Fatalf("Run returned: %v", err)
				case <-done:
				case <-time.After(60 * time.Second):
					t.Fatal("a2 never applied")
				}
				cancel()
				<-errc
				mu.Lock()
				defer mu.Unlock()
				if len(gotKeys) != 2 || gotKeys[1] != tc.key {
					t.Fatalf("a2's header keys after parking: %q, want [%q %q]", gotKeys, consumer.IDHeaderDefault, tc.key)
				}
			})
		}
	}
}

// TestParkKeylessMessage: NonBlocking mode with messages that have no
// key (kafka.Message.Key nil, as many producers send): a failing one is
// parked like any other. message_key is bytea NOT NULL and pgx sends a nil
// []byte as NULL.
func TestParkKeylessMessage(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			bad, ok := msg("bad", "", 1), msg("ok", "", 1)
			bad.Key, ok.Key = nil, nil
			e.produce(bad, ok)
			var mu sync.Mutex
			badCalls := 0
			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if m.ID == "bad" {
					if badCalls++; badCalls == 1 {
						return errors.New("transient")
					}
				}
				return nil
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 5}
			cfg.ParkedPoll = 50 * time.Millisecond
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			select {
			case err := <-errc:
				t.Fatalf("Run returned: %v", err)
			case <-oc.done:
			case <-time.After(60 * time.Second):
				t.Fatal("keyless messages not both applied")
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if runs := e.runs(); runs["bad"] != 1 || runs["ok"] != 1 {
				t.Fatalf("effects %v", runs)
			}
		})
	}
}

// TestParkedGiveUpOutageOnFailureOnce: a parked head that fails for
// good goes to OnFailure once, even when PostgreSQL drops the runner's
// connections right after OnFailure took it. The in-place path waits out an
// outage before saving the position past such a message (giveUp); the
// parked path (parker.failed) removes the row on the runner's pool without waiting:
// the error ends the release, the head is run and handed to OnFailure again.
func TestParkedGiveUpOutageOnFailureOnce(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			pcfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			app := testenv.Name(t, "app")
			pcfg.ConnConfig.RuntimeParams["application_name"] = app
			pcfg.ConnConfig.RuntimeParams["search_path"] = ""
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			e.produce(msg("p1", "A", 1), msg("q1", "B", 1))
			var mu sync.Mutex
			calls := 0
			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				if m.ID != "p1" {
					return nil
				}
				mu.Lock()
				defer mu.Unlock()
				if calls++; calls == 1 {
					return errors.New("transient") // parks it
				}
				return retry.Permanent(errors.New("bad for good"))
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 5}
			cfg.ParkedPoll = 50 * time.Millisecond
			var dead []string
			cfg.OnFailure = func(_ context.Context, m *consumer.Message, _ error) error {
				mu.Lock()
				dead = append(dead, m.ID)
				n := len(dead)
				mu.Unlock()
				if n == 1 { // PostgreSQL restarts right after the letter was written
					if _, err := e.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid)
				FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, app); err != nil {
						t.Error(err)
					}
				}
				return nil
			}
			stop := run(t, pool, cfg)
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.db.Table(migrate.ParkedMessagesDefault)).Scan(&n); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				d := len(dead)
				mu.Unlock()
				if n == 0 && d > 0 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(500 * time.Millisecond)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(dead) != 1 {
				t.Fatalf("OnFailure called %d times (%v) for one parked message, want once", len(dead), dead)
			}
		})
	}
}
