package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// The dispatcher's scan takes the lock of the keys it returns and of no
// other: a plan that filtered every pending row before sorting would take
// every key's lock at once.
func TestScanLocksOnlyWhatItReturns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newDB(t)
	for range 5 {
		var msgs []outbox.Message
		for i := range 1000 {
			msgs = append(msgs, outbox.Message{Handler: "mail", Key: fmt.Appendf(nil, "%d", i)})
		}
		enqueue(t, db.Pool, store, msgs...)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE `+store.Table()); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var locks int
		rows, err := tx.Query(ctx, outbox.HandlerScanSQL(store), 10, "mail")
		if err != nil {
			return err
		}
		keys := map[int64]bool{}
		var key, seq int64
		if _, err := pgx.ForEachRow(rows, []any{&key, &seq}, func() error {
			keys[key] = true
			return nil
		}); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).
			Scan(&locks); err != nil {
			return err
		}
		if len(keys) != 10 || locks != 10 {
			t.Errorf("scan with LIMIT 10 returned %d keys and holds %d advisory locks, want 10 and 10", len(keys), locks)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// explainPlan is the part of EXPLAIN (FORMAT JSON) the scan test reads.
type explainPlan struct {
	NodeType    string        `json:"Node Type"`
	IndexName   string        `json:"Index Name"`
	ActualRows  float64       `json:"Actual Rows"`
	SharedHit   int64         `json:"Shared Hit Blocks"`
	SharedRead  int64         `json:"Shared Read Blocks"`
	Plans       []explainPlan `json:"Plans"`
	TotalTimeMS float64       `json:"Actual Total Time"`
}

// walk calls f on p and every node under it.
func (p *explainPlan) walk(f func(*explainPlan)) {
	f(p)
	for i := range p.Plans {
		p.Plans[i].walk(f)
	}
}

// explain runs sql under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) in a
// transaction it rolls back (the scan takes advisory locks), after setup and
// before teardown (either may be empty), and returns the plan's root and the
// execution time.
func explain(t *testing.T, db *testenv.DB, setup, teardown, sql string, args ...any) (explainPlan, float64) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if setup != "" {
		if _, err := tx.Exec(ctx, setup); err != nil {
			t.Fatalf("%s: %v", setup, err)
		}
	}
	var out []struct {
		Plan          explainPlan `json:"Plan"`
		ExecutionTime float64     `json:"Execution Time"`
	}
	var raw []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	if teardown != "" {
		if _, err := tx.Exec(ctx, teardown); err != nil {
			t.Fatalf("%s: %v", teardown, err)
		}
	}
	return out[0].Plan, out[0].ExecutionTime
}

// The relay's and the dispatcher's scans read a bounded number of buffers
// however many rows are published, not due yet (not-before, retry backoff),
// or for the other kind of worker or another handler: 1,000,000 published
// rows, then 100,000 rows that are not due, then 10,000 due rows (Kafka, the
// "mail" handler and the "sms" handler), each kind's due rows behind every
// other row in enqueue order. Both the plan PostgreSQL picks for the
// statement's parameters and the generic plan of a prepared statement (what
// pgx's statement cache ends up running) are checked.
func TestScanCostIgnoresRowsNotDue(t *testing.T) {
	t.Parallel()
	const (
		published = 1_000_000
		notDue    = 100_000
		due       = 10_000
		batch     = 500
		maxBufs   = 200
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, store := newDB(t)
	start := time.Now()
	// One statement. Kafka rows have no handler; every row of the not-due
	// part waits an hour, half of them as retries (a topic in backoff); the
	// due part is Kafka, mail and sms rows in turn. Keys of the two parts
	// differ; IDs are sequential to keep the unique index cheap.
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+store.Table()+`
	(id, handler, topic, msg_key, value, lock_key, available_at, attempts, last_error, published_at, waiting)
SELECT lpad(to_hex(i), 32, '0')::uuid,
	CASE WHEN i <= $1::int THEN NULL
		WHEN i <= $1::int + $2::int THEN (ARRAY[NULL, 'mail'])[i % 2 + 1]
		ELSE (ARRAY[NULL, 'mail', 'sms'])[i % 3 + 1] END,
	't', convert_to('k' || i % 5000, 'UTF8'), '\x00'::bytea,
	CASE WHEN i <= $1::int + $2::int THEN i % 5000 ELSE 10000 + i % 5000 END,
	CASE WHEN i > $1::int AND i <= $1::int + $2::int THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END,
	CASE WHEN i > $1::int AND i <= $1::int + $2::int AND i % 4 < 2 THEN 3 ELSE 0 END,
	CASE WHEN i > $1::int AND i <= $1::int + $2::int AND i % 4 < 2 THEN 'broker unavailable' END,
	CASE WHEN i <= $1::int THEN now() - interval '1 hour' END,
	i > $1::int AND i <= $1::int + $2::int
FROM generate_series(1, $1::int + $2::int + $3::int) AS i`, published, notDue, due)
	if err != nil {
		t.Fatal(err)
	}
	// As autovacuum would soon after such a load. (Before it, the planner
	// knows the table's size but not how many rows are pending, and may
	// read the due range by bitmap and sort it: still no row that is not
	// due, but every due one.)
	if _, err := db.Pool.Exec(ctx, `ANALYZE `+store.Table()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows written in %v", published+notDue+due, time.Since(start).Round(time.Millisecond))

	index := func(suffix string) string { return migrate.OutboxDefault + suffix }
	for _, tc := range []struct {
		name, sql, index string
		args             []any
		prepare, execute string // parameter types and values of the generic plan's PREPARE and EXECUTE
		maxBufs          int64
	}{
		// The relay reads whole rows and probes the (here large) index of
		// waiting rows once per row: a few buffers per row returned, none
		// for the rows not due or published.
		{"relay", outbox.ReadSQL(store), index("_ready_idx"), []any{batch, -1}, "bigint, bigint", "500, -1", 8 * batch},
		{"dispatcher", outbox.HandlerScanSQL(store), index("_handler_due_idx"), []any{batch, "mail"}, "bigint, text", "500, 'mail'", maxBufs},
	} {
		for _, generic := range []bool{false, true} {
			sql, setup, teardown, args := tc.sql, "", "", tc.args
			name := tc.name + " custom plan"
			if generic {
				// A prepared statement outlives the transaction: deallocate it.
				name = tc.name + " generic plan"
				stmt := "scan_" + tc.name
				setup = "SET LOCAL plan_cache_mode = force_generic_plan; PREPARE " + stmt + " (" + tc.prepare + ") AS " + sql
				teardown = "DEALLOCATE " + stmt
				sql = "EXECUTE " + stmt + " (" + tc.execute + ")"
				args = nil
			}
			plan, ms := explain(t, db, setup, teardown, sql, args...)
			var indexes, nodes []string
			plan.walk(func(p *explainPlan) {
				nodes = append(nodes, p.NodeType)
				if p.IndexName != "" {
					indexes = append(indexes, p.IndexName)
				}
			})
			bufs := plan.SharedHit + plan.SharedRead
			t.Logf("%s: %d rows, %d buffers, %.3f ms, nodes %v, indexes %v", name, int(plan.ActualRows), bufs, ms, nodes, indexes)
			switch {
			case !slices.Contains(indexes, tc.index):
				t.Errorf("%s: plan uses indexes %v, want %s", name, indexes, tc.index)
			case bufs >= tc.maxBufs:
				t.Errorf("%s: read %d buffers, want < %d", name, bufs, tc.maxBufs)
			case int(plan.ActualRows) != batch:
				t.Errorf("%s: returned %d rows, want %d", name, int(plan.ActualRows), batch)
			}
		}
	}
}

// A key whose first message is not due (not-before, retry backoff) with more
// than a round's worth of messages behind it does not hold back the other
// keys: every round reads a bounded window of each key, and the scan finds
// the due messages further behind so that they are deferred too.
func TestWaitingKeyDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	db, store := newDB(t)
	topic := testenv.NewTopic(t, 1)
	pub := newPublished()
	run(t, newRelay(t, db, store, outbox.RelayConfig{BatchSize: 50, Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))
	var dbNow time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{{Topic: topic, Key: []byte("hot"), Value: []byte("later"), NotBefore: dbNow.Add(time.Hour)}}
	for i := range 200 {
		msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("hot"), Value: fmt.Appendf(nil, "hot/%d", i)})
	}
	hot := enqueue(t, db.Pool, store, msgs...)
	var others []string
	for i := range 100 {
		others = append(others, enqueue(t, db.Pool, store,
			outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("now")})...)
	}
	pub.wait(t, 20*time.Second, others...)
	// Every message behind the waiting one is held behind it, out of the
	// relay's read until it is ready.
	var early int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+store.Table()+`
		WHERE id = ANY($1::uuid[]) AND blocked_by IS DISTINCT FROM $2::uuid`, hot[1:], hot[0]).Scan(&early); err != nil {
		t.Fatal(err)
	}
	if early != 0 {
		t.Fatalf("%d messages behind the waiting one are not held behind it", early)
	}
	for _, id := range hot {
		if pub.count(id) != 0 {
			t.Fatalf("message %s of the waiting key was published", id)
		}
	}
}
