package txn

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// positionsRow is a partition of `idemkit consumer positions -json`.
type positionsRow struct {
	Partition  int      `json:"partition"`
	Position   *int64   `json:"position"`
	Committed  *int64   `json:"committed"`
	LogStart   *int64   `json:"log_start"`
	LastStable *int64   `json:"last_stable"`
	LogEnd     *int64   `json:"log_end"`
	Lag        *int64   `json:"lag"`
	Flags      []string `json:"flags"`
}

func (r positionsRow) String() string {
	n := func(v *int64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprint(*v)
	}
	return fmt.Sprintf("%d: position %s committed %s start %s stable %s end %s lag %s flags %v", r.Partition,
		n(r.Position), n(r.Committed), n(r.LogStart), n(r.LastStable), n(r.LogEnd), n(r.Lag), r.Flags)
}

// TestCLIPositionsHeldByTransaction: `idemkit consumer positions` counts
// the lag to the last stable offset, what a committed reader can read now:
// while a transaction is open its partition shows the stable end, the lag
// to it (the records before the transaction) and the held flag; once it
// commits or aborts, the lag runs to the log end, markers included, and
// the flag is gone; a consumer then reaches lag 0.
func TestCLIPositionsHeldByTransaction(t *testing.T) {
	t.Parallel()
	idemkit := idemkitCLI(t)
	for _, md := range consumerModes[:2] { // per-message and default
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			topic := testenv.NewTopic(t, 3)
			for p := range 3 {
				produce(t, topic, p, 0, ids(fmt.Sprintf("n%d-", p), 5)...) // offsets 0..4
			}
			jp := txproducer.Start(t, bootstrap(t))
			committing, aborting := jp.Producer("", txproducer.None), jp.Producer("", txproducer.None)
			// Offsets 5..7 of partitions 0 and 1: a transaction each, left open;
			// 8 and 9: records after it. Partition 2 has no transaction.
			committing.Begin()
			sendAll(committing, topic, 0, ids("c", 3)...)
			committing.Flush()
			aborting.Begin()
			sendAll(aborting, topic, 1, ids("a", 3)...)
			aborting.Flush()
			produce(t, topic, 0, 0, "n0-6", "n0-7")
			produce(t, topic, 1, 0, "n1-6", "n1-7")
			produce(t, topic, 2, 0, "n2-6", "n2-7")

			// The consumer stands at 2 in PostgreSQL; Kafka has 1 on partition 0
			// and 3 on partition 1 (it starts at the later one).
			c := newConsumerDB(t)
			cfg := c.config(t, md, topic)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
				for p := range 3 {
					if err := c.store.SavePositionTx(ctx, tx, cfg.GroupID, topic, p, 2, time.Time{}, 0); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := kafkaoffsets.Commit(ctx, testenv.Client(t), cfg.GroupID, topic, map[int]int64{0: 1, 1: 3}); err != nil {
				t.Fatal(err)
			}

			args := []string{"consumer", "positions", "-schema", c.db.Schema, "-group", cfg.GroupID, "-topic", topic}
			positions := func() []string {
				t.Helper()
				out, code := idemkit(append(args, "-json")...)
				var got struct{ Partitions []positionsRow }
				if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
					t.Fatalf("positions -json: exit %d, %v\n%s", code, err, out)
				}
				rows := make([]string, len(got.Partitions))
				for i, r := range got.Partitions {
					rows[i] = r.String()
				}
				return rows
			}
			check := func(what string, want ...string) {
				t.Helper()
				if got := positions(); strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Fatalf("%s: positions -json:\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			check("transactions open",
				"0: position 2 committed 1 start 0 stable 5 end 10 lag 3 flags [held_by_open_transaction]",
				"1: position 2 committed 3 start 0 stable 5 end 10 lag 2 flags [held_by_open_transaction]",
				"2: position 2 committed - start 0 stable 7 end 7 lag 5 flags []")
			out, code := idemkit(args...)
			if code != 0 || strings.Count(out, "held by an open transaction: offsets 5..9 wait for it") != 2 {
				t.Fatalf("positions: exit %d\n%s", code, out)
			}
			lines := strings.Split(out, "\n")
			header, first := lines[1], lines[2]
			for _, col := range []struct{ name, value string }{{"STABLE END", "5"}, {"LOG END", "10"}, {"LAG", "3"}} {
				if i := strings.Index(header, col.name); i < 0 || !strings.HasPrefix(first[i:], col.value+" ") {
					t.Fatalf("column %s: header %q, row %q", col.name, header, first)
				}
			}

			// A seek to the latest stops at the stable end while a transaction is
			// open: its records would be skipped if it committed later.
			out, code = idemkit("consumer", "seek", "-schema", c.db.Schema, "-group", cfg.GroupID, "-topic", topic,
				"-to-latest", "-dry-run")
			if code != 0 || !strings.Contains(out, "2 → 5") || strings.Contains(out, "2 → 10") {
				t.Fatalf("seek -to-latest -dry-run with transactions open: exit %d\n%s\nwant partitions 0 and 1 moved to their stable end 5", code, out)
			}

			// The markers take offset 10: the lag runs to the log end.
			committing.Commit()
			aborting.Abort()
			stableBounds(t, topic, 0)
			stableBounds(t, topic, 1)
			check("transactions ended",
				"0: position 2 committed 1 start 0 stable 11 end 11 lag 9 flags []",
				"1: position 2 committed 3 start 0 stable 11 end 11 lag 8 flags []",
				"2: position 2 committed - start 0 stable 7 end 7 lag 5 flags []")

			ends := map[int]int64{0: 11, 1: 11, 2: 7}
			var committedOffsets sync.Map
			testobs.Of(cfg).OnOffsetCommitted = func(_ string, p int, next int64) { committedOffsets.Store(p, next) }
			runConsumer(t, c.db.Pool, cfg, "positions at the log end", func() bool {
				for p, end := range ends {
					if v, ok := committedOffsets.Load(p); !ok || v.(int64) != end {
						return false
					}
				}
				return true
			})
			check("consumed",
				"0: position 11 committed 11 start 0 stable 11 end 11 lag 0 flags []",
				"1: position 11 committed 11 start 0 stable 11 end 11 lag 0 flags []",
				"2: position 7 committed 7 start 0 stable 7 end 7 lag 0 flags []")
		})
	}
}
