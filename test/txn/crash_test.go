package txn

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// The consumer child process of the crash tests is configured through
// these variables.
const (
	childEnv    = "IDEMKIT_TXN_CHILD"  // set: run as the consumer process
	childTopic  = "IDEMKIT_TXN_TOPIC"  // the topic (one partition)
	childGroup  = "IDEMKIT_TXN_GROUP"  // consumer group and dedup name
	childSchema = "IDEMKIT_TXN_SCHEMA" // schema of the dedup and effects tables
	childBatch  = "IDEMKIT_TXN_BATCH"  // batch size
	childUntil  = "IDEMKIT_TXN_UNTIL"  // exit 0 once Kafka's committed offset reaches this
	// SIGKILL itself after a transaction commits, before its offset goes
	// to Kafka, when its position (the offset after its last message) is
	// at or after childCrashFrom and one of the childCrashAt offsets, or
	// at or after childCrashBy.
	childCrashAt   = "IDEMKIT_TXN_CRASH_AT"
	childCrashFrom = "IDEMKIT_TXN_CRASH_FROM"
	childCrashBy   = "IDEMKIT_TXN_CRASH_BY"
)

// crashEffectsDDL is the business table of the crash tests: one row per
// message ID, how often its effect ran, and the order effects ran in.
const crashEffectsDDL = `CREATE TABLE %s (
	id      text   PRIMARY KEY,
	off     bigint NOT NULL,
	runs    int    NOT NULL,
	applied bigserial)`

// child runs a consumer of the test's topic until Kafka's committed offset
// reaches the given end (exit 0), or until the parent kills it.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	pool, err := pgxpool.New(ctx, os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	schema := os.Getenv(childSchema)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return fail(err)
	}
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	batch, _ := strconv.Atoi(os.Getenv(childBatch))
	until, err := strconv.ParseInt(os.Getenv(childUntil), 10, 64)
	if err != nil {
		return fail(err)
	}
	crashAt := map[int64]bool{}
	for _, f := range strings.FieldsFunc(os.Getenv(childCrashAt), func(r rune) bool { return r == ',' }) {
		o, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return fail(err)
		}
		crashAt[o] = true
	}
	crashFrom, _ := strconv.ParseInt(os.Getenv(childCrashFrom), 10, 64)
	crashBy, err := strconv.ParseInt(cmp.Or(os.Getenv(childCrashBy), "-1"), 10, 64)
	if err != nil {
		return fail(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r, err := consumer.New(pool, &consumer.Config{
		Kafka:     kafkaconn.Config{Brokers: strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")},
		Topic:     os.Getenv(childTopic),
		GroupID:   os.Getenv(childGroup),
		Store:     store,
		BatchSize: batch,
		// The broker's smallest: the member a SIGKILL left behind is
		// dropped from the group soon after the restart joins.
		SessionTimeout: 6 * time.Second,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, off, runs) VALUES ($1, $2, 1)
				ON CONFLICT (id) DO UPDATE SET runs = `+table+`.runs + 1`, m.ID, m.Offset)
			return err
		}),
		Observers: []consumer.Observer{&testobs.Hooks{
			OnAfterCommit: func(_ context.Context, msgs []*consumer.Message) {
				if next := msgs[len(msgs)-1].Offset + 1; next >= crashFrom && (crashAt[next] || crashBy >= 0 && next >= crashBy) {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			},
			OnOffsetCommitted: func(_ string, _ int, next int64) {
				if next >= until {
					stop()
				}
			},
			// A run that starts at the end (the previous one committed up to
			// it in PostgreSQL) handles nothing: it ends once Kafka's
			// committed offset is there too — at once when the previous run
			// committed it to Kafka, else when this run commits its start,
			// which is ahead of Kafka's (OnOffsetCommitted).
			OnAssigned: func(_ string, _ int, start int64) {
				if start < until {
					return
				}
				go func() {
					client := &kafka.Client{Addr: kafka.TCP(strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")...)}
					for runCtx.Err() == nil {
						res, err := client.OffsetFetch(runCtx, &kafka.OffsetFetchRequest{GroupID: os.Getenv(childGroup),
							Topics: map[string][]int{os.Getenv(childTopic): {0}}})
						if err == nil && res.Error == nil {
							if res.Topics[os.Getenv(childTopic)][0].CommittedOffset >= until {
								stop()
							}
							return
						}
						time.Sleep(100 * time.Millisecond) // the coordinator is busy: ask again
					}
				}()
			},
		}},
	})
	if err != nil {
		return fail(err)
	}
	if err := r.Run(runCtx); err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(errors.New("timed out"))
	}
	return 0
}

// transactionalLog writes about n records to partition 0 of topic, in
// random sizes: committed and aborted transactions of two Java producers,
// alone or interleaved batch by batch, and non-transactional batches
// between. It returns the records a committed reader must return and the
// aborted ones.
func transactionalLog(t *testing.T, topic string, n int, rng *rand.Rand) (committed, aborted want) {
	t.Helper()
	jp := txproducer.Start(t, bootstrap(t))
	prs := []*txproducer.Producer{jp.Producer("", txproducer.None), jp.Producer("", txproducer.Lz4)}
	written := 0
	newIDs := func(commit bool, k int) []string {
		prefix := "a-"
		if commit {
			prefix = "c-"
		}
		out := make([]string, k)
		for i := range out {
			out[i] = prefix + strconv.Itoa(written+i)
		}
		written += k
		return out
	}
	type open struct {
		pr     *txproducer.Producer
		commit bool
		ids    []string
		offs   []int64
	}
	send := func(o *open, k int) {
		ids := newIDs(o.commit, k)
		sendAll(o.pr, topic, 0, ids...)
		o.ids, o.offs = append(o.ids, ids...), append(o.offs, o.pr.Flush()...)
	}
	end := func(o *open) {
		if o.commit {
			o.pr.Commit()
			committed.add(0, o.offs, o.ids...)
		} else {
			o.pr.Abort()
			aborted.add(0, o.offs, o.ids...)
		}
	}
	for written < n {
		switch k := rng.IntN(10); {
		case k < 4: // one transaction, one to three batches
			o := &open{pr: prs[rng.IntN(2)], commit: rng.IntN(5) < 3}
			o.pr.Begin()
			for range 1 + rng.IntN(3) {
				send(o, 1+rng.IntN(25))
			}
			end(o)
		case k < 8: // two transactions interleaved batch by batch
			pair := []*open{{pr: prs[0], commit: rng.IntN(2) == 0}, {pr: prs[1], commit: rng.IntN(2) == 0}}
			for _, o := range pair {
				o.pr.Begin()
			}
			for range 2 + rng.IntN(3) {
				for _, i := range rng.Perm(2) {
					send(pair[i], 1+rng.IntN(15))
				}
			}
			for _, i := range rng.Perm(2) {
				end(pair[i])
			}
		default: // non-transactional records
			ids := newIDs(true, 1+rng.IntN(30))
			committed.add(0, produce(t, topic, 0, 0, ids...), ids...)
		}
	}
	return committed, aborted
}

// crashEffects returns how often each message's effect ran, and fails when
// effects ran out of offset order.
func crashEffects(t *testing.T, db *testenv.DB) map[string]int {
	t.Helper()
	ctx := context.Background()
	var backwards int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT off < lag(off) OVER (ORDER BY applied) AS b FROM `+
		db.Table("effects")+`) s WHERE b`).Scan(&backwards); err != nil {
		t.Fatal(err)
	}
	if backwards != 0 {
		t.Fatalf("%d effects ran after the effect of a later offset", backwards)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, runs FROM `+db.Table("effects"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var runs int
	if _, err := pgx.ForEachRow(rows, []any{&id, &runs}, func() error { out[id] = runs; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// runChild runs the test binary as the consumer process and reports
// whether it was killed with SIGKILL (false: it reached the end). With
// killAt > 0 the test kills it at a random moment shortly after at least
// killAt effects have committed and this process committed one.
func runChild(t *testing.T, db *testenv.DB, env []string, killAt int, rng *rand.Rand) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, childEnv+"=1", childSchema+"="+db.Schema,
		testenv.EnvDatabaseURL+"="+testenv.DatabaseURL(t),
		testenv.EnvKafkaBrokers+"="+strings.Join(testenv.Brokers(t), ","))...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	count := func() int {
		var n int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Table("effects")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waited := false
	wait := func() error { waited = true; return <-done }
	defer func() { // the test failed under way: the process must not outlive it
		if !waited {
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	// exited reports whether the process was killed with SIGKILL (by the
	// test or by itself), and fails the test when it failed otherwise.
	exited := func(err error) bool {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				return true
			}
		}
		if err != nil {
			t.Fatalf("consumer process: %v\nstderr:\n%s", err, stderr.String())
		}
		return false
	}
	timeout := time.After(4 * time.Minute)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case err := <-done:
			waited = true
			return exited(err)
		case <-timeout:
			_ = cmd.Process.Kill()
			_ = wait()
			t.Fatalf("the consumer process did not reach the end in 4 minutes; stderr:\n%s", stderr.String())
		case <-poll.C:
		}
		if killAt <= 0 {
			continue
		}
		if n := count(); n < killAt || n == before {
			continue
		}
		select {
		case err := <-done:
			waited = true
			return exited(err)
		case <-time.After(time.Duration(rng.IntN(20)) * time.Millisecond):
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		return exited(wait())
	}
}

// TestCrashInTransactionalPartition: a consumer process reading a
// partition of thousands of records in committed, aborted and interleaved
// transactions (with their markers) and non-transactional batches is
// killed with SIGKILL several times at random points and restarted (some
// kills are the process's own, right after a database commit that left its
// position on a marker or an aborted record, so that the restart starts
// there); after
// the last run every committed record was applied exactly once and in
// offset order, no aborted record was, and the position in PostgreSQL and
// the group's offset in Kafka are at the log end, per message, in the
// default mode (adaptive batches) and batched.
func TestCrashInTransactionalPartition(t *testing.T) {
	t.Parallel()
	const kills = 6
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	topic := testenv.NewTopic(t, 1)
	committed, aborted := transactionalLog(t, topic, 3000, rng)
	end := stableBounds(t, topic, 0).hw
	t.Logf("%d committed records, %d aborted, log end %d", len(committed), len(aborted), end)

	for _, md := range []struct {
		name  string
		batch int
	}{{"per-message", 1}, {"default", 0}, {"batched", 50}} {
		seed := rng.Uint64()
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 1))
			db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
				if err := testenv.Migrate(ctx, pool, schema); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, fmt.Sprintf(crashEffectsDDL, pgx.Identifier{schema, "effects"}.Sanitize()))
				return err
			})
			group := testenv.Name(t, "g")
			env := []string{childTopic + "=" + topic, childGroup + "=" + group,
				childBatch + "=" + strconv.Itoa(md.batch), childUntil + "=" + strconv.FormatInt(end, 10)}
			// Kill points spread over the first 80% of the partition: after
			// at least at[i] effects committed, or, for the process's own
			// kills, at the first position on a marker or an aborted record
			// from the at[i]-th record on, or else 5% further.
			var at []int
			for range kills {
				at = append(at, len(committed)/20+rng.IntN(len(committed)*3/4))
			}
			slices.Sort(at)
			var odd []string // offsets of markers and aborted records
			for o := range end {
				if !slices.ContainsFunc(committed, func(r rec) bool { return r.Offset == o }) {
					odd = append(odd, strconv.FormatInt(o, 10))
				}
			}
			sorted := committed.sorted()
			store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			landed := 0
			for i, killAt := range at {
				run := env
				if i%3 == 1 { // the process's own kill, at the next odd position
					run = append(slices.Clone(env), childCrashAt+"="+strings.Join(odd, ","),
						childCrashFrom+"="+strconv.FormatInt(sorted[killAt].Offset, 10),
						childCrashBy+"="+strconv.FormatInt(sorted[killAt+len(sorted)/20].Offset, 10))
					killAt = 0
				}
				if !runChild(t, db, run, killAt, rng) {
					break
				}
				landed++
				positions, err := store.Positions(ctx, db.Pool, group, topic)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("killed after %d of %d effects; position %d, at %s", len(crashEffects(t, db)), len(committed),
					positions[0], whatIsAt(positions[0], end, committed, aborted))
			}
			// A run killed or ending at the log end leaves no later kill
			// anything to land on. One transaction per message, or 50, gives
			// every kill point a commit near it. The default mode commits
			// what is already fetched, up to 500 of the ~1,500 committed
			// records at once, in a handful of transactions per run: the
			// last kill points can fall in the transaction that reaches the
			// end. There at least the first two must land before it (the
			// smallest of six points in the first 80% of the log, and the
			// next run's first commit).
			minLanded := kills
			if md.batch == 0 {
				minLanded = 2
			}
			if landed < minLanded {
				t.Fatalf("only %d of %d kills landed before the end, want at least %d", landed, kills, minLanded)
			}
			t.Logf("%d of %d kills landed before the end", landed, kills)
			if runChild(t, db, env, 0, rng) {
				t.Fatal("the last run was killed")
			}

			runs := crashEffects(t, db)
			for _, r := range committed {
				if runs[r.ID] != 1 {
					t.Fatalf("committed record %s (offset %d) applied %d times, want once", r.ID, r.Offset, runs[r.ID])
				}
			}
			for _, r := range aborted {
				if runs[r.ID] != 0 {
					t.Fatalf("aborted record %s (offset %d) applied %d times", r.ID, r.Offset, runs[r.ID])
				}
			}
			if len(runs) != len(committed) {
				t.Fatalf("%d records applied, want the %d committed", len(runs), len(committed))
			}
			positions, err := store.Positions(ctx, db.Pool, group, topic)
			if err != nil {
				t.Fatal(err)
			}
			if positions[0] != end {
				t.Fatalf("position %d, want the log end %d", positions[0], end)
			}
			res, err := testenv.Client(t).OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group,
				Topics: map[string][]int{topic: {0}}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Topics[topic][0].CommittedOffset; got != end {
				t.Fatalf("Kafka's committed offset %d, want the log end %d", got, end)
			}
		})
	}
}

// whatIsAt names what lies at offset of the partition.
func whatIsAt(offset, end int64, committed, aborted want) string {
	has := func(w want) bool { return slices.ContainsFunc(w, func(r rec) bool { return r.Offset == offset }) }
	switch {
	case offset >= end:
		return "the log end"
	case has(committed):
		return "a committed record"
	case has(aborted):
		return "a record of an aborted transaction"
	}
	return "a transaction marker"
}
