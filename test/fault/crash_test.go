package fault

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// The child process is configured through these variables.
const (
	childEnv    = "IDEMKIT_FAULT_CHILD"  // set: run as the consumer process
	childTopic  = "IDEMKIT_FAULT_TOPIC"  // topic (one partition)
	childGroup  = "IDEMKIT_FAULT_GROUP"  // consumer group and dedup name
	childSchema = "IDEMKIT_FAULT_SCHEMA" // schema of the dedup and effects tables
	childCrash  = "IDEMKIT_FAULT_CRASH"  // "before-commit:ID", "after-commit:ID" or "after-dlq:ID": SIGKILL there
	childFail   = "IDEMKIT_FAULT_FAIL"   // this message ID fails permanently and goes to the dead-letter topic
	childBatch  = "IDEMKIT_FAULT_BATCH"  // batch size; 0: the default (adaptive batches)
	childUntil  = "IDEMKIT_FAULT_UNTIL"  // exit 0 once the Kafka offset reaches this
)

// child runs a consumer that kills itself with SIGKILL at the chosen point,
// or exits 0 when it has consumed up to the given offset. It prints one line
// per message outcome.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer pool.Close()
	schema := os.Getenv(childSchema)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	point, crashID, _ := strings.Cut(os.Getenv(childCrash), ":")
	batch, _ := strconv.Atoi(os.Getenv(childBatch))
	until, _ := strconv.ParseInt(os.Getenv(childUntil), 10, 64)
	crashIf := func(where string, msgs []*consumer.Message) {
		for _, m := range msgs {
			if where == point && m.ID == crashID {
				fmt.Printf("crash %s %s\n", where, crashID)
				_ = os.Stdout.Sync()
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	brokers := strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")
	dead, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Group: os.Getenv(childGroup)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer dead.Close()
	failID := os.Getenv(childFail)
	r, err := consumer.New(pool, &consumer.Config{
		Kafka:     kafkaconn.Config{Brokers: brokers},
		Topic:     os.Getenv(childTopic),
		GroupID:   os.Getenv(childGroup),
		Store:     store,
		BatchSize: batch,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == failID {
				return retry.Permanent(errors.New("rejected by a business rule"))
			}
			if err := applyEffect(ctx, tx, table, m); err != nil {
				return err
			}
			crashIf("before-commit", []*consumer.Message{m}) // its transaction not committed yet
			return nil
		}),
		OnFailure: func(ctx context.Context, m *consumer.Message, err error) error {
			if err := dead.OnFailure(ctx, m, err); err != nil {
				return err
			}
			crashIf("after-dlq", []*consumer.Message{m})
			return nil
		},
		Observers: []consumer.Observer{&testobs.Hooks{
			OnAfterCommit: func(_ context.Context, msgs []*consumer.Message) { crashIf("after-commit", msgs) },
			OnOutcome: func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				fmt.Printf("outcome %s %s\n", m.ID, o)
			},
			OnOffsetCommitted: func(_ string, _ int, next int64) {
				if next >= until {
					stop()
				}
			},
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := r.Run(runCtx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "child: timed out")
		return 1
	}
	return 0
}

// startChild runs the test binary as the consumer process and returns its
// outcome lines and whether it was killed by SIGKILL.
func startChild(t *testing.T, env []string) (lines []string, killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env,
		childEnv+"=1",
		testenv.EnvDatabaseURL+"="+testenv.DatabaseURL(t),
		testenv.EnvKafkaBrokers+"="+strings.Join(testenv.Brokers(t), ","))...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return lines, true
		}
	}
	if err != nil {
		t.Fatalf("consumer process: %v\nstderr:\n%s", err, stderr.String())
	}
	return lines, false
}

// TestCrashBetweenCommits kills the consumer process with SIGKILL at the two
// dangerous points and restarts it: every message's effect happens once.
func TestCrashBetweenCommits(t *testing.T) {
	t.Parallel()
	const n = 10
	for _, tc := range []struct {
		name         string
		point        string
		batch        int  // 1: one transaction per message; 0: the default (adaptive batches)
		dropPosition bool // forget the Postgres position: the message is redelivered and dedup stops it
	}{
		{name: "after db commit", point: "after-commit", batch: 1},
		{name: "after db commit, no position", point: "after-commit", batch: 1, dropPosition: true},
		{name: "before db commit", point: "before-commit", batch: 1},
		{name: "default after db commit", point: "after-commit"},
		{name: "default after db commit, no position", point: "after-commit", dropPosition: true},
		{name: "default before db commit", point: "before-commit"},
		{name: "batched after db commit, no position", point: "after-commit", batch: 4, dropPosition: true},
		{name: "batched before db commit", point: "before-commit", batch: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			topic := testenv.NewTopic(t, 1)
			group := testenv.Name(t, "g")
			produce(t, topic, "m-", 0, n, 3)
			env := []string{childTopic + "=" + topic, childGroup + "=" + group, childSchema + "=" + db.Schema,
				childBatch + "=" + strconv.Itoa(tc.batch), childUntil + "=" + strconv.Itoa(n)}

			_, killed := startChild(t, append(env, childCrash+"="+tc.point+":m-5"))
			if !killed {
				t.Fatal("the consumer process was not killed at the crash point")
			}
			runs := effectRuns(t, db)
			if tc.point == "after-commit" && runs["m-5"] != 1 {
				t.Fatalf("after the crash m-5 ran %d times, want 1 (its transaction committed)", runs["m-5"])
			}
			if tc.point == "before-commit" && runs["m-5"] != 0 {
				t.Fatalf("after the crash m-5 ran %d times, want 0 (its transaction never committed)", runs["m-5"])
			}
			if tc.dropPosition {
				if _, err := db.Pool.Exec(context.Background(), `DELETE FROM `+db.Table("consumer_positions")); err != nil {
					t.Fatal(err)
				}
			}

			lines, killed := startChild(t, env)
			if killed {
				t.Fatal("the restarted consumer was killed")
			}
			runs = effectRuns(t, db)
			for i := range n {
				if id := "m-" + strconv.Itoa(i); runs[id] != 1 {
					t.Fatalf("%s ran %d times, want 1 (outcomes after restart: %v)", id, runs[id], lines)
				}
			}
			redelivered := false
			for _, l := range lines {
				if l == "outcome m-5 duplicate" {
					redelivered = true
				}
			}
			if tc.dropPosition && !redelivered {
				t.Fatalf("without a position m-5 should come back and be acknowledged as a duplicate; got %v", lines)
			}
			if !tc.dropPosition && redelivered {
				t.Fatalf("with the position in Postgres m-5 should not come back at all; got %v", lines)
			}
			checkOrder(t, db)
		})
	}
}

// TestRepeatedCrashesInRuns kills the consumer process with SIGKILL right
// after the commit of messages in the middle of runs of chained
// transactions (whose claims leave the stored position behind), again and
// again, one crash right after a restart, and lets it finish: every effect
// happens once, in order, and no message ever comes back as a duplicate,
// since the position (with the claims past it) is in PostgreSQL.
func TestRepeatedCrashesInRuns(t *testing.T) {
	t.Parallel()
	const n = 240
	// One transaction per message: in the default mode the backlog goes
	// in a few large batches, which move the position themselves.
	for _, tc := range []struct {
		name  string
		batch int
	}{{"per-message", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := newDB(t)
			topic := testenv.NewTopic(t, 1)
			group := testenv.Name(t, "g")
			produce(t, topic, "m-", 0, n, 5)
			env := []string{childTopic + "=" + topic, childGroup + "=" + group, childSchema + "=" + db.Schema,
				childBatch + "=" + strconv.Itoa(tc.batch), childUntil + "=" + strconv.Itoa(n)}
			var all []string
			for _, k := range []int{23, 24, 61, 118, 119, 177, 230} {
				lines, killed := startChild(t, append(env, childCrash+"=after-commit:m-"+strconv.Itoa(k)))
				if !killed {
					t.Fatalf("the consumer process was not killed after the commit of m-%d", k)
				}
				all = append(all, lines...)
			}
			lines, killed := startChild(t, env)
			if killed {
				t.Fatal("the last consumer process was killed")
			}
			all = append(all, lines...)
			runs := effectRuns(t, db)
			for i := range n {
				if id := "m-" + strconv.Itoa(i); runs[id] != 1 {
					t.Fatalf("%s ran %d times, want 1", id, runs[id])
				}
			}
			applied := map[string]int{}
			for _, l := range all {
				switch {
				case strings.HasSuffix(l, " duplicate"):
					t.Errorf("came back as a duplicate after a crash: %q", l)
				case strings.HasSuffix(l, " applied"):
					id := strings.Fields(l)[1]
					if applied[id]++; applied[id] > 1 {
						t.Errorf("%s reported applied %d times", id, applied[id])
					}
				}
			}
			checkOrder(t, db)
		})
	}
}

// TestCrashAfterDeadLetterWrite kills the consumer between the dead-letter
// write and the position commit: after restart the message is not lost and
// not applied; it may stand in the dead-letter topic twice, as the same dead
// letter (same origin and round), and a replay applies it once.
func TestCrashAfterDeadLetterWrite(t *testing.T) {
	t.Parallel()
	for _, md := range []struct {
		name  string
		batch int // 1: one transaction per message; 0: the default (adaptive batches)
	}{{"per-message", 1}, {"default", 0}} {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			const n = 6
			db := newDB(t)
			topic := testenv.NewTopic(t, 1)
			testenv.CreateTopic(t, topic+dlq.TopicSuffixDefault, 1)
			group := testenv.Name(t, "g")
			produce(t, topic, "m-", 0, n, 2)
			env := []string{childTopic + "=" + topic, childGroup + "=" + group, childSchema + "=" + db.Schema,
				childBatch + "=" + strconv.Itoa(md.batch), childUntil + "=" + strconv.Itoa(n), childFail + "=m-2"}

			if _, killed := startChild(t, append(env, childCrash+"=after-dlq:m-2")); !killed {
				t.Fatal("the consumer process was not killed after the dead-letter write")
			}
			if _, killed := startChild(t, env); killed {
				t.Fatal("the restarted consumer was killed")
			}
			runs := effectRuns(t, db)
			for i := range n {
				id := "m-" + strconv.Itoa(i)
				want := 1
				if id == "m-2" {
					want = 0
				}
				if runs[id] != want {
					t.Fatalf("%s ran %d times, want %d", id, runs[id], want)
				}
			}
			var copies []*dlq.DeadLetter
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := dlq.Scan(ctx, testenv.Kafka(t), topic+dlq.TopicSuffixDefault, func(m kafka.Message) error {
				d, err := dlq.Parse(m)
				if err == nil {
					copies = append(copies, d)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(copies) < 1 || len(copies) > 2 {
				t.Fatalf("%d dead letters for m-2, want 1 or 2", len(copies))
			}
			for _, d := range copies {
				if d.MessageID != "m-2" || d.Origin != copies[0].Origin || d.Round != 0 {
					t.Fatalf("dead letter %+v differs from %+v", d, copies[0])
				}
			}
			table := db.Table("effects")
			rp, err := dlq.NewReprocessor(db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: topic + dlq.TopicSuffixDefault,
				Mode: dlq.Redrive, Tables: migrate.Tables{Schema: db.Schema},
				Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					return applyEffect(ctx, tx, table, m)
				})})
			if err != nil {
				t.Fatal(err)
			}
			defer rp.Close()
			sum, err := rp.Run(ctx)
			if err != nil || sum.Records[dlq.Applied] != 1 || sum.Records[dlq.AlreadyReplayed] != len(copies)-1 {
				t.Fatalf("replay: %v %v", sum, err)
			}
			if runs := effectRuns(t, db); runs["m-2"] != 1 {
				t.Fatalf("after replay m-2 ran %d times, want 1", runs["m-2"])
			}
		})
	}
}
