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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
)

// The child process is configured through these variables.
const (
	childEnv    = "IDEMKIT_FAULT_CHILD"  // set: run as the consumer process
	childTopic  = "IDEMKIT_FAULT_TOPIC"  // topic (one partition)
	childGroup  = "IDEMKIT_FAULT_GROUP"  // consumer group and dedup name
	childSchema = "IDEMKIT_FAULT_SCHEMA" // schema of the dedup and effects tables
	childCrash  = "IDEMKIT_FAULT_CRASH"  // "before-commit:ID" or "after-commit:ID": SIGKILL there
	childBatch  = "IDEMKIT_FAULT_BATCH"  // batch size
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
	store, err := dedup.New(&dedup.Config{Schema: schema})
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
	r, err := consumer.New(&consumer.Config{
		Brokers:   strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ","),
		Topic:     os.Getenv(childTopic),
		GroupID:   os.Getenv(childGroup),
		Pool:      pool,
		Store:     store,
		BatchSize: batch,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			return applyEffect(ctx, tx, table, m)
		}),
		Hooks: consumer.Hooks{
			BeforeCommit: func(_ context.Context, msgs []*consumer.Message) { crashIf("before-commit", msgs) },
			AfterCommit:  func(_ context.Context, msgs []*consumer.Message) { crashIf("after-commit", msgs) },
			Outcome:      func(m *consumer.Message, o consumer.Outcome) { fmt.Printf("outcome %s %s\n", m.ID, o) },
			OffsetCommitted: func(_ string, _ int, next int64) {
				if next >= until {
					stop()
				}
			},
		},
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
		batch        int
		dropPosition bool // forget the Postgres position: the message is redelivered and dedup stops it
	}{
		{name: "after db commit", point: "after-commit"},
		{name: "after db commit, no position", point: "after-commit", dropPosition: true},
		{name: "before db commit", point: "before-commit"},
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
				childBatch + "=" + strconv.Itoa(max(tc.batch, 1)), childUntil + "=" + strconv.Itoa(n)}

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
