package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestReadOnlyServerIsAnOutage: the runner's connections reach a server that
// takes no writes (SQLSTATE 25006 read_only_sql_transaction), as a pool does
// during a failover when a connection landed on the standby before its
// promotion (its sessions take writes once it is promoted) or when an
// operator sets default_transaction_read_only. That is an outage, not a
// verdict on the messages: the runner waits it out, charges no attempt and
// does not stop; once the server takes writes, every message is applied
// once. The test's pool makes each session read-only while the "server" is
// (SET default_transaction_read_only at every acquire).
func TestReadOnlyServerIsAnOutage(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m1", "k", 1), msg("m2", "k", 2))
			var readOnly atomic.Bool
			readOnly.Store(true)
			pcfg := e.db.Pool.Config()
			pcfg.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
				v := "off"
				if readOnly.Load() {
					v = "on"
				}
				_, err := conn.Exec(ctx, `SET default_transaction_read_only = `+v)
				return err == nil, err
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{MaxAttempts: 1} // an attempt charged is the message's last
			var retries atomic.Int32
			testobs.Of(cfg).OnRetry = func(context.Context, *consumer.Message, int, error, retry.Class, time.Duration) { retries.Add(1) }
			// Transactions refused for the read-only server; outages seen.
			refused := make(chan struct{}, 1)
			testobs.Of(cfg).OnTxEnd = func(_ context.Context, _ []*consumer.Message, _ []consumer.Outcome, err error, _ time.Duration) {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "25006" {
					select {
					case refused <- struct{}{}:
					default:
					}
				}
			}
			var starts, ends atomic.Int32
			testobs.Of(cfg).OnOutageStarted = func(string, error) { starts.Add(1) }
			testobs.Of(cfg).OnOutageEnded = func(string, time.Duration) { ends.Add(1) }
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			r, err := consumer.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()

			// Two transactions refused: the runner went on after the first.
			for i := range 2 {
				select {
				case err := <-errc:
					t.Fatalf("Run returned %v while the server took no writes; want it to wait", err)
				case <-refused:
				case <-time.After(time.Minute):
					t.Fatalf("%d transactions refused with 25006 in a minute, want 2", i)
				}
			}
			if starts.Load() == 0 {
				t.Fatal("no outage reported while the server took no writes")
			}
			readOnly.Store(false)
			select {
			case err := <-errc:
				t.Fatalf("Run returned %v", err)
			case <-oc.done:
			case <-time.After(time.Minute):
				t.Fatal("m1 and m2 not applied once the server took writes")
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if s, e := starts.Load(), ends.Load(); s != e {
				t.Errorf("%d outages started, %d ended", s, e)
			}
			if runs := e.runs(); runs["m1"] != 1 || runs["m2"] != 1 || len(runs) != 2 {
				t.Fatalf("effects %v, want m1 and m2 once", runs)
			}
			if n := retries.Load(); n != 0 {
				t.Fatalf("%d handler retries: the read-only server was charged as attempts", n)
			}
		})
	}
}
