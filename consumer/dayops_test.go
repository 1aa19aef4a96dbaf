package consumer_test

// Day-2 operations: what operators and outages do to a running consumer.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// recreateTopic deletes the env's topic and creates it again under the same
// name with the given partitions (testenv's cleanup deletes it at the end).
// It returns once the broker serves the new topic: every partition's log is
// empty. The controller acknowledges the deletion and the creation before
// the broker applies them, and the broker lists a topic in its metadata
// before its partitions take writes, so a writer that only waited for the
// metadata could still append to the old topic's partition, whose records
// the deletion then drops. The old topic must hold a record, so that the
// two are told apart.
func (e *env) recreateTopic(partitions int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := testenv.Client(e.t)
	old, err := kafkaoffsets.LogRange(ctx, client, e.topic)
	if err != nil {
		e.t.Fatalf("log range of the topic to delete: %v", err)
	}
	if old[0].End == 0 {
		e.t.Fatal("recreateTopic: the topic to delete holds no record: its partition 0 could not be told from the new one's")
	}
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{e.topic}})
	if err == nil {
		err = res.Errors[e.topic]
	}
	if err != nil {
		e.t.Fatalf("delete topic: %v", err)
	}
	for {
		res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
			Topic: e.topic, NumPartitions: partitions, ReplicationFactor: 1}}})
		if err == nil {
			err = res.Errors[e.topic]
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kafka.TopicAlreadyExists) || ctx.Err() != nil {
			e.t.Fatalf("create topic again: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // deletion is asynchronous
	}
	if err := testenv.WaitTopic(ctx, client, e.topic, partitions); err != nil {
		e.t.Fatal(err)
	}
	for {
		lr, err := kafkaoffsets.LogRange(ctx, client, e.topic)
		empty := err == nil && len(lr) == partitions
		for _, r := range lr {
			empty = empty && r.Start == 0 && r.End == 0
		}
		if empty {
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("the recreated topic is not served empty: log ranges %v, %v", lr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runUntil runs cfg until want outcomes were reported, then stops it.
func runUntil(t *testing.T, pool *pgxpool.Pool, cfg *consumer.Config, want int) *outcomes {
	t.Helper()
	oc := newOutcomes(want)
	testobs.Of(cfg).OnOutcome = oc.hook
	stop := run(t, pool, cfg)
	wait(t, oc.done, fmt.Sprintf("%d outcomes", want))
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return oc
}

// runErr runs cfg and returns Run's error, failing the test if Run does not
// return within a minute.
func runErr(t *testing.T, pool *pgxpool.Pool, cfg *consumer.Config) error {
	t.Helper()
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not return within a minute (it waits in silence); returned %v", err)
	}
	return err
}

// TestRecreatedTopicStops: a topic deleted and created again, with fewer
// messages than the stored position, stops the runner with an error that
// names the partition, the position and the log end; with RecreatedRestart
// the new messages are consumed as a new incarnation.
func TestRecreatedTopicStops(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			var first []kafka.Message
			for i := range 5 {
				first = append(first, msg(fmt.Sprintf("old-%d", i), "k", 1))
			}
			e.produce(first...)
			runUntil(t, e.db.Pool, e.config(md, nil), 5)

			e.recreateTopic(1)
			e.produce(msg("new-0", "k", 1), msg("new-1", "k", 1), msg("new-2", "k", 1))

			err := runErr(t, e.db.Pool, e.config(md, nil))
			var perr *consumer.PositionError
			if !errors.Is(err, consumer.ErrTopicRecreated) || !errors.As(err, &perr) {
				t.Fatalf("Run = %v, want a *PositionError matching ErrTopicRecreated", err)
			}
			if perr.Partition != 0 || perr.Position != 5 || perr.LogEnd != 3 || perr.LogStart != 0 {
				t.Fatalf("PositionError = %+v, want partition 0, position 5, log [0, 3)", perr)
			}
			if !strings.Contains(err.Error(), "idemkit consumer seek") {
				t.Fatalf("the error does not say how to proceed: %v", err)
			}
			if n := len(e.runs()); n != 5 {
				t.Fatalf("%d effects after the stop, want the 5 old ones only", n)
			}

			cfg := e.config(md, nil)
			cfg.OnRecreated = consumer.RecreatedRestart
			var moved atomic.Pointer[consumer.PositionError]
			testobs.Of(cfg).OnPositionMoved = func(err *consumer.PositionError) { moved.Store(err) }
			oc := runUntil(t, e.db.Pool, cfg, 3)
			if oc.count(consumer.Applied) != 3 {
				t.Fatalf("outcomes %v, want the 3 new messages applied", oc.byKind)
			}
			if m := moved.Load(); m == nil || !errors.Is(m, consumer.ErrTopicRecreated) {
				t.Fatalf("PositionMoved hook got %v, want the ErrTopicRecreated", m)
			}
			pos, err := e.store.ListPositions(context.Background(), e.db.Pool, e.group, e.topic)
			if err != nil {
				t.Fatal(err)
			}
			if p := pos[0]; len(pos) != 1 || p.Next != 3 || p.Incarnation != 1 {
				t.Fatalf("position after the restart = %+v, want next 3 in incarnation 1", p)
			}
		})
	}
}

// TestRecreatedTopicWithMoreMessages: the new topic already holds more
// messages than the stored position; the record before the position is not
// the one the consumer passed, and the runner says so instead of skipping
// the new topic's first messages.
func TestRecreatedTopicWithMoreMessages(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("old-0", "k", 1), msg("old-1", "k", 1), msg("old-2", "k", 1))
			runUntil(t, e.db.Pool, e.config(md, nil), 3)

			e.recreateTopic(1)
			var fresh []kafka.Message
			for i := range 6 {
				fresh = append(fresh, msg(fmt.Sprintf("new-%d", i), "k", 1))
			}
			e.produce(fresh...)
			lr, err := kafkaoffsets.LogRange(context.Background(), testenv.Client(t), e.topic, 0)
			if err != nil || lr[0].Start != 0 || lr[0].End != 6 {
				t.Fatalf("the recreated topic's log range is %v (%v), want 0 to 6", lr, err)
			}
			err = runErr(t, e.db.Pool, e.config(md, nil))
			var perr *consumer.PositionError
			if !errors.As(err, &perr) || !errors.Is(err, consumer.ErrTopicRecreated) {
				t.Fatalf("Run = %v, want ErrTopicRecreated", err)
			}
			if perr.Position != 3 || perr.LogEnd != 6 || !strings.Contains(perr.Reason, "offset 2") {
				t.Fatalf("PositionError = %+v, want position 3, log end 6, the record at offset 2 named", perr)
			}
		})
	}
}

// TestCoordinateIDsOfNewIncarnation: IDs made from coordinates of a recreated
// topic do not collide with the old topic's: the new messages are applied,
// not acknowledged as duplicates.
func TestCoordinateIDsOfNewIncarnation(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("", "k", 1), msg("", "k", 1), msg("", "k", 1))
			cfg := e.config(md, nil)
			cfg.MissingID = consumer.MissingIDUseCoordinates
			cfg.OnRecreated = consumer.RecreatedRestart
			runUntil(t, e.db.Pool, cfg, 3)

			e.recreateTopic(1)
			e.produce(msg("", "k", 1), msg("", "k", 1))
			cfg = e.config(md, nil)
			cfg.MissingID = consumer.MissingIDUseCoordinates
			cfg.OnRecreated = consumer.RecreatedRestart
			oc := runUntil(t, e.db.Pool, cfg, 2)
			if oc.count(consumer.Applied) != 2 || oc.count(consumer.Duplicate) != 0 {
				t.Fatalf("outcomes %v, want both new messages applied", oc.byKind)
			}
			runs := e.runs()
			for _, id := range []string{e.topic + "/0/0#1", e.topic + "/0/1#1", e.topic + "/0/0"} {
				if runs[id] != 1 {
					t.Fatalf("effects %v: want %s applied once", runs, id)
				}
			}
			if got := consumer.CoordinateID("t", 2, 7, 0); got != "t/2/7" {
				t.Fatalf("CoordinateID of the first incarnation = %q", got)
			}
		})
	}
}

// TestPartitionsAddedAreConsumed: partitions added to a live topic are
// consumed without waiting for an unrelated rebalance.
func TestPartitionsAddedAreConsumed(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			oc := newOutcomes(2)
			cfg := e.config(md, nil)
			testobs.Of(cfg).OnOutcome = oc.hook
			assigned := make(chan int, 10)
			testobs.Of(cfg).OnAssigned = func(_ string, p int, _ int64) {
				select {
				case assigned <- p:
				default:
				}
			}
			stop := run(t, e.db.Pool, cfg)
			e.produce(msg("p0", "k", 1))
			select {
			case <-assigned:
			case <-time.After(time.Minute):
				t.Fatal("partition 0 never assigned")
			}

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			client := testenv.Client(t)
			res, err := client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{
				Name: e.topic, Count: 2}}})
			if err == nil {
				err = res.Errors[e.topic]
			}
			if err != nil {
				t.Fatalf("add a partition: %v", err)
			}
			if err := testenv.WaitTopic(ctx, client, e.topic, 2); err != nil {
				t.Fatal(err)
			}
			w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
				Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return 1 }), BatchTimeout: time.Millisecond}
			defer w.Close()
			if err := w.WriteMessages(ctx, msg("p1", "k", 1)); err != nil {
				t.Fatalf("produce to the new partition: %v", err)
			}
			wait(t, oc.done, "the message of the added partition")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if runs := e.runs(); runs["p1"] != 1 {
				t.Fatalf("effects %v, want p1 applied once", runs)
			}
		})
	}
}

// TestParkedReleasedAfterSwitchToBlocking: messages parked by a NonBlocking
// run are released, in order, by a runner restarted in Blocking mode.
func TestParkedReleasedAfterSwitchToBlocking(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("a1", "A", 1), msg("b1", "B", 1), msg("a2", "A", 1), msg("b2", "B", 1))

			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				if string(m.Key) == "B" {
					return errors.New("B's dependency is down")
				}
				return nil
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxAttempts: 1000}
			cfg.ParkedPoll = 20 * time.Millisecond
			oc := newOutcomes(-1)
			parked := make(chan struct{})
			var nParked atomic.Int32
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				oc.hook(ctx, m, o)
				if o == consumer.Parked && nParked.Add(1) == 2 {
					close(parked)
				}
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, parked, "b1 and b2 parked")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			e.produce(msg("b3", "B", 1))
			cfg = e.config(md, nil)
			cfg.FailureMode = consumer.Blocking
			cfg.ParkedPoll = 20 * time.Millisecond
			done := make(chan struct{})
			var once sync.Once
			testobs.Of(cfg).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				if m.ID == "b3" && o == consumer.Applied {
					once.Do(func() { close(done) })
				}
			}
			stop = run(t, e.db.Pool, cfg)
			wait(t, done, "b3 applied")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			order := e.appliedOrder()
			var b []string
			for _, id := range order {
				if strings.HasPrefix(id, "b") {
					b = append(b, id)
				}
			}
			if strings.Join(b, ",") != "b1,b2,b3" {
				t.Fatalf("B applied as %v (all: %v), want b1,b2,b3", b, order)
			}
		})
	}
}

// TestStartCommitsPositionToKafka: a partition that starts from a
// PostgreSQL position ahead of Kafka's committed offset commits that
// position to Kafka at once, without waiting for a new message.
func TestStartCommitsPositionToKafka(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			var msgs []kafka.Message
			for i := range 10 {
				msgs = append(msgs, msg(fmt.Sprintf("m%d", i), "k", 1))
			}
			e.produce(msgs...)
			runUntil(t, e.db.Pool, e.config(md, nil), 10)

			// Kafka's committed offset falls behind (as after a crash between the
			// database commit and the offset commit).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			client := testenv.Client(t)
			if _, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: e.group, GenerationID: -1,
				Topics: map[string][]kafka.OffsetCommit{e.topic: {{Partition: 0, Offset: 2}}}}); err != nil {
				t.Fatalf("rewind Kafka's offset: %v", err)
			}

			committed := make(chan int64, 10)
			cfg := e.config(md, nil)
			testobs.Of(cfg).OnOffsetCommitted = func(_ string, _ int, next int64) {
				select {
				case committed <- next:
				default:
				}
			}
			stop := run(t, e.db.Pool, cfg)
			select {
			case next := <-committed:
				if next != 10 {
					t.Fatalf("committed %d, want the PostgreSQL position 10", next)
				}
			case <-time.After(time.Minute):
				t.Fatal("the PostgreSQL position was never committed to Kafka")
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: e.group, Topics: map[string][]int{e.topic: {0}}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Topics[e.topic][0].CommittedOffset; got != 10 {
				t.Fatalf("Kafka's committed offset = %d, want 10", got)
			}
		})
	}
}

// TestRetentionPurgesOnlyItsConsumer: a runner's retention purge leaves the
// records of other consumers sharing the table alone.
func TestRetentionPurgesOnlyItsConsumer(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := context.Background()
			processed := e.db.Table(migrate.ProcessedMessagesDefault)
			err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				for _, c := range []dedup.Claim{
					{Consumer: e.group, MessageID: "mine-old", Topic: e.topic},
					{Consumer: "other", MessageID: "other-old", Topic: e.topic},
				} {
					if _, err := e.store.ClaimTx(ctx, tx, c); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `UPDATE `+processed+` SET processed_at = now() - interval '2 hours'`)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			purged := make(chan int64, 10)
			cfg := e.config(md, nil)
			cfg.Retention = time.Hour
			cfg.PurgeInterval = time.Hour
			testobs.Of(cfg).OnPurged = func(n int64) {
				select {
				case purged <- n:
				default:
				}
			}
			stop := run(t, e.db.Pool, cfg)
			select {
			case n := <-purged:
				if n != 1 {
					t.Fatalf("purge deleted %d records, want this consumer's 1", n)
				}
			case <-time.After(time.Minute):
				t.Fatal("no purge")
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for id, want := range map[string]bool{"mine-old": false, "other-old": true} {
				consumerName := e.group
				if id == "other-old" {
					consumerName = "other"
				}
				got, err := e.store.Processed(ctx, e.db.Pool, consumerName, id)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("%s kept = %v, want %v", id, got, want)
				}
			}
		})
	}
}

// TestEmptyIDHeader: an empty message-id header is reported as empty, not as
// missing.
func TestEmptyIDHeader(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			m := msg("", "k", 1)
			m.Headers = []kafka.Header{{Key: consumer.IDHeaderDefault, Value: nil}}
			e.produce(m)
			err := runErr(t, e.db.Pool, e.config(md, nil))
			if !errors.Is(err, consumer.ErrMissingID) || !strings.Contains(err.Error(), `"message-id" header is empty`) {
				t.Fatalf("Run = %v, want ErrMissingID saying the header is empty", err)
			}
		})
	}
}

// TestPostgresConnectionLossIsWaitedOut: connections of the runner killed
// with pg_terminate_backend again and again, in the middle of transactions
// and commits: Run does not return, every message is applied once, and the
// outage is reported.
func TestPostgresConnectionLossIsWaitedOut(t *testing.T) {
	t.Parallel()
	// In the default mode most of a batch's time is spent in handlers, so
	// most kills land there and must count as an outage (see
	// TestHandlerConnectionLossIsNotAnAttempt) for the outage check below.
	// Batches must keep moving: rerunning a whole batch after each kill
	// would never commit one that takes longer than the kill interval.
	for _, md := range []mode{modes[0], modes[1], modes[3]} {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 3)
			app := testenv.Name(t, "app")
			pcfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			pcfg.ConnConfig.RuntimeParams["application_name"] = app
			pcfg.ConnConfig.RuntimeParams["search_path"] = ""
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)

			const n = 300
			var msgs []kafka.Message
			for i := range n {
				msgs = append(msgs, msg(fmt.Sprintf("m%d", i), fmt.Sprintf("k%d", i%7), 1))
			}
			e.produce(msgs...)

			oc := newOutcomes(n)
			cfg := e.config(md, func(ctx context.Context, _ *consumer.Message) error {
				time.Sleep(2 * time.Millisecond) // widen the window of a kill inside a transaction
				return nil
			})
			testobs.Of(cfg).OnOutcome = oc.hook
			var outages atomic.Int32
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }

			r, err := consumer.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()

			var kills atomic.Int32
			killCtx, stopKilling := context.WithCancel(context.Background())
			var killer sync.WaitGroup
			killer.Go(func() {
				for killCtx.Err() == nil {
					tag, err := e.db.Pool.Exec(killCtx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
						WHERE application_name = $1 AND pid <> pg_backend_pid()`, app)
					if err == nil && tag.RowsAffected() > 0 {
						kills.Add(1)
					}
					select {
					case <-killCtx.Done():
					case <-time.After(150 * time.Millisecond):
					}
				}
			})
			select {
			case <-oc.done:
			case err := <-errc:
				stopKilling()
				killer.Wait()
				t.Fatalf("Run returned during the connection losses: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatalf("timed out: %d of %d outcomes", oc.count(consumer.Applied)+oc.count(consumer.Duplicate), n)
			}
			// An ambiguous commit reports its messages again as duplicates:
			// the outcomes may run ahead of the effects; wait for the effects.
			runs := e.runs()
			for deadline := time.Now().Add(time.Minute); len(runs) < n && time.Now().Before(deadline); runs = e.runs() {
				select {
				case err := <-errc:
					t.Fatalf("Run returned during the connection losses: %v", err)
				case <-time.After(100 * time.Millisecond):
				}
			}
			stopKilling()
			killer.Wait()
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
			runs = e.runs()
			if len(runs) != n {
				t.Fatalf("%d effects, want %d", len(runs), n)
			}
			for id, c := range runs {
				if c != 1 {
					t.Fatalf("%s applied %d times", id, c)
				}
			}
			if kills.Load() < 3 || outages.Load() == 0 {
				t.Fatalf("%d kills, %d outages reported: the test did not exercise connection losses", kills.Load(), outages.Load())
			}
		})
	}
}

// TestPrefetchBoundedByBytes: with large messages and a handler stuck on the
// first one, the messages fetched ahead stay within MaxBufferedBytes (plus
// the documented per-partition allowance), not a queue of messages per
// partition.
func TestPrefetchBoundedByBytes(t *testing.T) {
	// Not parallel, nor are its subtests: it measures this process's heap.
	// Large messages, and small ones, which decode to several times their
	// size on the wire (a fetch sized on the wire alone held about three
	// times the budget with them).
	sizes := []struct {
		name          string
		size, perPart int
		budget        int64
		batch         int // the producer's batch, in messages
	}{
		{"900KB", 900 << 10, 40, 8 << 20, 1},
		{"10B", 10, 100_000, 4 << 20, 5000},
	}
	for _, sz := range sizes {
		for _, md := range baseModes {
			t.Run(sz.name+"/"+md.name, func(t *testing.T) {
				testPrefetchBounded(t, md, sz.size, sz.perPart, sz.budget, sz.batch)
			})
		}
	}
}

func testPrefetchBounded(t *testing.T, md mode, size, perPart int, budget int64, batch int) {
	e := newEnv(t, 2)
	value := []byte(strings.Repeat("x", size))
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, BatchBytes: 2 << 20, BatchSize: batch}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for from := 0; from < 2*perPart; from += 10_000 {
		msgs := make([]kafka.Message, 0, 10_000)
		for i := from; i < min(from+10_000, 2*perPart); i++ {
			msgs = append(msgs, kafka.Message{Value: value,
				Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: fmt.Appendf(nil, "m-%d", i)}}})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	_ = w.Close()
	largestBatch := max(size, batch*(size+32))

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc

	blocked := make(chan struct{})
	var once sync.Once
	release := make(chan struct{})
	cfg := e.config(md, nil)
	cfg.MaxBufferedBytes = budget
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *consumer.Message) error {
		once.Do(func() { close(blocked) })
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	stop := run(t, e.db.Pool, cfg)
	wait(t, blocked, "the handler")
	var peak uint64
	for range 60 { // 3 s: the readers have long filled whatever they may
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	_ = stop()
	grown := int64(peak) - int64(base)
	// Documented bound: 1.5 × MaxBufferedBytes + partitions × (64 KiB + 3 ×
	// largest batch); 8 MiB more for kafka-go's and pgx's own buffers and
	// the runtime.
	bound := budget*3/2 + int64(2*(64<<10+3*largestBatch)) + 8<<20
	t.Logf("heap grew by %.1f MiB (bound %.1f MiB)", float64(grown)/(1<<20), float64(bound)/(1<<20))
	if grown > bound {
		t.Fatalf("heap grew by %d bytes with a stuck handler, over the bound %d", grown, bound)
	}
}

// TestSessionTimeoutOutOfBrokerBounds: a session timeout the broker refuses
// (below group.min.session.timeout.ms, 6s by default) makes Run return an
// error that says so, instead of joining again for ever.
func TestSessionTimeoutOutOfBrokerBounds(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			cfg := e.config(md, nil)
			cfg.SessionTimeout = 2 * time.Second
			err := runErr(t, e.db.Pool, cfg)
			if !errors.Is(err, kafka.InvalidSessionTimeout) {
				t.Fatalf("Run = %v, want kafka.InvalidSessionTimeout", err)
			}
		})
	}
}

// TestDefaultBatchesDoNotWait: with default settings a message alone on an
// idle partition is committed in a transaction of its own, without waiting
// for a batch to fill (the default takes what is already fetched, up to
// BatchSizeDefault, and BatchLinger is 0); a backlog is taken in batches.
func TestDefaultBatchesDoNotWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config(mode{name: "default"}, nil)
	if cfg.BatchSize != 0 || cfg.BatchLinger != 0 {
		t.Fatalf("the test needs the defaults, got BatchSize %d, BatchLinger %s", cfg.BatchSize, cfg.BatchLinger)
	}
	sizes := make(chan int, 100)
	testobs.Of(cfg).OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) {
		select {
		case sizes <- len(msgs):
		default:
		}
	}
	stop := run(t, e.db.Pool, cfg)
	e.produce(msg("alone", "k", 1))
	select {
	case n := <-sizes:
		if n != 1 {
			t.Fatalf("the lone message committed in a batch of %d", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("the lone message was not committed")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	// A backlog of 300 is read in batches, not one transaction each.
	var backlog []kafka.Message
	for i := range 300 {
		backlog = append(backlog, msg(fmt.Sprintf("b%d", i), "k", 1))
	}
	e.produce(backlog...)
	sizes = make(chan int, 400)
	oc := newOutcomes(300)
	testobs.Of(cfg).OnOutcome = oc.hook
	testobs.Of(cfg).OnAfterCommit = func(_ context.Context, msgs []*consumer.Message) { sizes <- len(msgs) }
	stop = run(t, e.db.Pool, cfg)
	wait(t, oc.done, "the backlog")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(sizes)
	largest := 0
	for n := range sizes {
		largest = max(largest, n)
	}
	if largest < 2 {
		t.Fatalf("a backlog of 300 was committed one message per transaction")
	}
}
