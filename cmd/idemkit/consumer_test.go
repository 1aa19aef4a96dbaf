package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
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
)

// seekEnv is one consumer's world: a migrated schema, a topic, a group.
type seekEnv struct {
	t                   *testing.T
	bin                 string
	db                  *testenv.DB
	store               *dedup.Store
	client              *kafka.Client
	topic, group, name  string
	env                 []string
	base                time.Time // the records' timestamps start here, one minute apart
	schema, groupTopicN []string  // common arguments
}

func newSeekEnv(t *testing.T, bin string, partitions int) *seekEnv {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
		if err == nil {
			_, err = m.Up(ctx)
		}
		return err
	})
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	e := &seekEnv{t: t, bin: bin, db: db, store: store, client: testenv.Client(t),
		topic: testenv.NewTopic(t, partitions), group: testenv.Name(t, "g"),
		base: time.Now().Add(-time.Hour).Truncate(time.Second)}
	e.name = e.group
	e.env = []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	e.schema = []string{"-schema", db.Schema}
	e.groupTopicN = []string{"-group", e.group, "-topic", e.topic}
	return e
}

// produce writes n records to partition, stamped base, base+1m, …
func (e *seekEnv) produce(partition, n int) {
	e.t.Helper()
	recs := make([]kafka.Record, n)
	for i := range recs {
		recs[i] = kafka.Record{Time: e.base.Add(time.Duration(i) * time.Minute), Value: kafka.NewBytes([]byte(strconv.Itoa(i)))}
	}
	testenv.Produce(e.t, e.topic, partition, recs...)
}

// ran records what a consumer that ran would have: positions in PostgreSQL
// (pg) and committed offsets in Kafka (kafka).
func (e *seekEnv) ran(pg, committed map[int]int64) {
	e.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		for p, next := range pg {
			if err := e.store.SavePositionTx(ctx, tx, e.name, e.topic, p, next, time.Now(), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	// The consumer anchors what it writes.
	if _, err := e.db.Pool.Exec(ctx, `UPDATE `+e.db.Table(migrate.ConsumerPositionsDefault)+` SET anchor_time = $1`, e.base); err != nil {
		e.t.Fatal(err)
	}
	if len(committed) > 0 {
		if err := kafkaoffsets.Commit(ctx, e.client, e.group, e.topic, committed); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *seekEnv) positions() map[int]dedup.Position {
	e.t.Helper()
	list, err := e.store.ListPositions(context.Background(), e.db.Pool, e.name, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]dedup.Position{}
	for _, p := range list {
		out[p.Partition] = p
	}
	return out
}

func (e *seekEnv) next() map[int]int64 {
	out := map[int]int64{}
	for p, pos := range e.positions() {
		out[p] = pos.Next
	}
	return out
}

func (e *seekEnv) committed(partitions ...int) map[int]int64 {
	e.t.Helper()
	c, err := kafkaoffsets.Committed(context.Background(), e.client, e.group, e.topic, partitions)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// want checks the positions' next offsets and the committed offsets.
func (e *seekEnv) want(what string, pg, committed map[int]int64) {
	e.t.Helper()
	if got := e.next(); !maps.Equal(got, pg) {
		e.t.Fatalf("%s: positions %v, want %v", what, got, pg)
	}
	ps, err := kafkaoffsets.Partitions(context.Background(), e.client, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	if got := e.committed(ps...); !maps.Equal(got, committed) {
		e.t.Fatalf("%s: committed %v, want %v", what, got, committed)
	}
}

// cli runs the command with the schema argument added.
func (e *seekEnv) cli(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	return cli(e.t, e.bin, e.env, append(args, e.schema...)...)
}

// seek runs `consumer seek` for the env's group and topic and wants exit 0.
func (e *seekEnv) seek(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.cli(append(append([]string{"consumer", "seek"}, e.groupTopicN...), args...)...)
	if code != 0 {
		e.t.Fatalf("seek %v: exit %d\n%s%s", args, code, out, errOut)
	}
	return out
}

// refused runs `consumer seek` and wants exit 1 with one line containing want.
func (e *seekEnv) refused(want string, args ...string) {
	e.t.Helper()
	out, errOut, code := e.cli(append(append([]string{"consumer", "seek"}, e.groupTopicN...), args...)...)
	if code != 1 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		e.t.Fatalf("seek %v: exit %d, stderr %q; want exit 1 and one line with %q\n%s", args, code, errOut, want, out)
	}
}

func TestCLIConsumerPositionsAndSeek(t *testing.T) {
	t.Parallel()
	bin := binary(t)

	t.Run("positions", func(t *testing.T) {
		t.Parallel()
		e := newSeekEnv(t, bin, 3)
		e.produce(0, 10)
		e.produce(1, 4)
		testenv.DeleteRecords(t, e.topic, 1, 3) // retention took 0..2 of partition 1
		e.ran(map[int]int64{0: 6, 1: 2, 2: 5, 5: 9}, map[int]int64{0: 6, 2: 0})
		// Partition 0's position moves on to 7 past Kafka's committed 6.
		err := pgx.BeginFunc(context.Background(), e.db.Pool, func(tx pgx.Tx) error {
			return e.store.SavePositionTx(context.Background(), tx, e.name, e.topic, 0, 7, e.base, 0)
		})
		if err != nil {
			t.Fatalf("move partition 0: %v", err)
		}

		out, errOut, code := e.cli(append([]string{"consumer", "positions", "-json"}, e.groupTopicN...)...)
		if code != 0 {
			t.Fatalf("positions -json: exit %d\n%s%s", code, out, errOut)
		}
		var got struct {
			Topic, Group, Name string
			GroupState         string `json:"group_state"`
			Partitions         []positionRow
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("positions -json: %v\n%s", err, out)
		}
		if got.Topic != e.topic || got.Group != e.group || got.Name != e.group || got.GroupState != "Empty" ||
			len(got.Partitions) != 4 {
			t.Fatalf("positions -json:\n%s", out)
		}
		type row struct {
			partition                                  int
			position, committed, start, end, lag, pLag string
			anchored                                   bool
			flags                                      string
		}
		var rows []row
		for _, r := range got.Partitions {
			rows = append(rows, row{r.Partition, num(r.Position), num(r.Committed), num(r.LogStart), num(r.LogEnd),
				num(r.Lag), num(r.PositionLag), r.AnchorTime != nil && r.AnchorTime.Equal(e.base), strings.Join(r.Flags, ",")})
		}
		want := []row{
			{0, "7", "6", "0", "10", "3", "3", true, ""},
			{1, "2", "-", "3", "4", "1", "2", true, "below_log_start"}, // offset 2 is gone: 1 left to read
			{2, "5", "0", "0", "0", "-5", "-5", true, "past_log_end"},
			{5, "9", "-", "-", "-", "-", "-", true, "not_in_topic"},
		}
		if fmt.Sprint(rows) != fmt.Sprint(want) {
			t.Fatalf("positions -json rows\n got %v\nwant %v\n%s", rows, want, out)
		}

		out, _, code = e.cli(append([]string{"consumer", "positions"}, e.groupTopicN...)...)
		lines := strings.Split(out, "\n")
		if code != 0 || len(lines) < 6 || !strings.Contains(out, "offsets 2..2 deleted unread") ||
			!strings.Contains(out, "position past the log end") || !strings.Contains(out, "the topic has no such partition") ||
			!strings.Contains(out, "-recreated") {
			t.Fatalf("positions: exit %d\n%s", code, out)
		}
		// Aligned: each value starts under its header.
		header, first := lines[1], lines[2]
		for _, col := range []struct{ name, value string }{{"POSITION", "7"}, {"COMMITTED", "6"}, {"LOG END", "10"}, {"LAG", "3"}} {
			i := strings.Index(header, col.name)
			if i < 0 || !strings.HasPrefix(first[i:], col.value+" ") {
				t.Errorf("column %s: header %q, row %q", col.name, header, first)
			}
		}
	})

	t.Run("seek", func(t *testing.T) {
		t.Parallel()
		e := newSeekEnv(t, bin, 2)
		e.produce(0, 10)
		e.produce(1, 6)
		e.ran(map[int]int64{0: 8, 1: 6}, map[int]int64{0: 8, 1: 6})

		out := e.seek("-to-offset", "2", "-dry-run")
		if !strings.Contains(out, "8 → 2") || !strings.Contains(out, "6 → 2") ||
			!strings.Contains(out, "dry run, nothing changed: would move 2 partition(s)") {
			t.Fatalf("dry run:\n%s", out)
		}
		e.want("after a dry run", map[int]int64{0: 8, 1: 6}, map[int]int64{0: 8, 1: 6})
		if p := e.positions()[0]; p.AnchorTime.IsZero() {
			t.Fatal("the dry run cleared the anchor")
		}

		out = e.seek("-to-offset", "2", "-partitions", "0")
		if !strings.Contains(out, "moved 1 partition(s)") || !strings.Contains(out, "8 → 2") {
			t.Fatalf("to-offset:\n%s", out)
		}
		e.want("to-offset 2 on partition 0", map[int]int64{0: 2, 1: 6}, map[int]int64{0: 2, 1: 6})
		if p := e.positions(); !p[0].AnchorTime.IsZero() || p[1].AnchorTime.IsZero() {
			t.Fatalf("anchors: %v; want partition 0's cleared, 1's kept", p)
		}

		e.seek("-to-latest")
		e.want("to-latest", map[int]int64{0: 10, 1: 6}, map[int]int64{0: 10, 1: 6})
		e.seek("-to-earliest")
		e.want("to-earliest", map[int]int64{0: 0, 1: 0}, map[int]int64{0: 0, 1: 0})
		e.seek("-to-time", e.base.Add(3*time.Minute).Format(time.RFC3339))
		e.want("to-time", map[int]int64{0: 3, 1: 3}, map[int]int64{0: 3, 1: 3})
		e.seek("-to-time", e.base.Add(7*time.Minute).Format(time.RFC3339)) // partition 1 has nothing that late
		e.want("to-time past partition 1's records", map[int]int64{0: 7, 1: 6}, map[int]int64{0: 7, 1: 6})
		e.seek("-to-time", e.base.Add(2*time.Minute).Format(time.RFC3339))
		e.want("back in time", map[int]int64{0: 2, 1: 2}, map[int]int64{0: 2, 1: 2})

		// The consumer, started now, reads again from there.
		starts := runConsumer(t, e, 2)
		if want := map[int]int64{0: 2, 1: 2}; !maps.Equal(starts, want) {
			t.Fatalf("the consumer started at %v, want %v", starts, want)
		}
	})

	t.Run("live member", func(t *testing.T) {
		t.Parallel()
		e := newSeekEnv(t, bin, 1)
		e.produce(0, 5)
		e.ran(map[int]int64{0: 5}, map[int]int64{0: 5})

		// A member holds a generation; it heartbeats only every 30s, so it
		// does not come back between its removal and the commit.
		cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: e.group, Brokers: testenv.Brokers(t),
			Topics: []string{e.topic}, HeartbeatInterval: 30 * time.Second, SessionTimeout: time.Minute,
			RebalanceTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cg.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cg.Next(ctx); err != nil {
			t.Fatal(err)
		}

		e.refused("1 live member(s)", "-to-earliest")
		e.refused("1 live member(s)", "-to-earliest", "-dry-run")
		e.want("after the refusal", map[int]int64{0: 5}, map[int]int64{0: 5})
		out := e.seek("-to-earliest", "-force")
		if !strings.Contains(out, "removed 1 live member(s)") || !strings.Contains(out, "5 → 0") {
			t.Fatalf("-force:\n%s", out)
		}
		e.want("after -force", map[int]int64{0: 0}, map[int]int64{0: 0})
	})

	t.Run("recreated", func(t *testing.T) {
		t.Parallel()
		e := newSeekEnv(t, bin, 2)
		e.produce(0, 3)
		e.produce(1, 3)
		// Positions from the topic's first life: partition 0 went further
		// than the new topic holds, partition 3 is gone. Kafka dropped the
		// old topic's committed offsets with it.
		e.ran(map[int]int64{0: 50, 1: 2, 3: 7}, nil)

		e.refused("position 50 is past the log end 3", "-to-earliest")
		e.refused("past the log end", "-to-offset", "1", "-partitions", "0")
		e.want("after the refusal", map[int]int64{0: 50, 1: 2, 3: 7}, map[int]int64{})
		if _, errOut, code := e.cli(append(append([]string{"consumer", "seek"}, e.groupTopicN...),
			"-to-earliest", "-recreated", "-partitions", "0")...); code != 2 || !strings.Contains(errOut, "whole topic") {
			t.Fatalf("-recreated with -partitions: exit %d, %q", code, errOut)
		}

		out := e.seek("-to-earliest", "-recreated")
		if !strings.Contains(out, "0 → 1") || !strings.Contains(out, "not in topic") || !strings.Contains(out, "moved 3 partition(s)") {
			t.Fatalf("-recreated:\n%s", out)
		}
		e.want("after -recreated", map[int]int64{0: 0, 1: 0, 3: 0}, map[int]int64{0: 0, 1: 0})
		for p, pos := range e.positions() {
			if pos.Incarnation != 1 || !pos.AnchorTime.IsZero() {
				t.Fatalf("partition %d: %+v; want incarnation 1, no anchor", p, pos)
			}
		}
		e.seek("-to-offset", "1", "-recreated")
		for p, pos := range e.positions() {
			if pos.Incarnation != 2 {
				t.Fatalf("partition %d: incarnation %d after a second -recreated, want 2", p, pos.Incarnation)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		t.Parallel()
		e := newSeekEnv(t, bin, 2)
		e.produce(0, 4)
		e.ran(map[int]int64{0: 3}, map[int]int64{0: 3})
		seek := append([]string{"consumer", "seek"}, e.groupTopicN...)
		for _, args := range [][]string{
			{"consumer", "seek", "-topic", e.topic, "-to-earliest"},
			{"consumer", "positions", "-group", e.group},
			slices.Clone(seek),
			append(slices.Clone(seek), "-to-earliest", "-to-latest"),
			append(slices.Clone(seek), "-to-offset", "1", "-to-time", e.base.Format(time.RFC3339)),
			append(slices.Clone(seek), "-to-offset", "-1"),
			append(slices.Clone(seek), "-to-time", "yesterday"),
			append(slices.Clone(seek), "-to-time", ""),
			append(slices.Clone(seek), "-to-earliest=false"),
			append(slices.Clone(seek), "-to-earliest", "-partitions", "0,x"),
			append(slices.Clone(seek), "-to-earliest", "extra"),
			append(slices.Clone(seek), "-to-earliest", "-name", "tab\there"),
		} {
			_, errOut, code := e.cli(args...)
			if code != 2 || !strings.Contains(errOut, "usage:") {
				t.Errorf("%v: exit %d, want 2 with usage; stderr %q", args, code, errOut)
			}
		}
		e.refused("outside the log (partition 0 holds 0..4, partition 1 holds 0..0)", "-to-offset", "5")
		e.refused("topic "+e.topic+" has no partition 9", "-to-earliest", "-partitions", "9")
		e.refused("consumer someone-else has no position", "-to-earliest", "-name", "someone-else")
		out, errOut, code := e.cli("consumer", "seek", "-group", e.group, "-topic", testenv.Name(t, "missing"), "-to-earliest")
		if code != 1 || !strings.Contains(errOut, "does not exist") {
			t.Fatalf("unknown topic: exit %d\n%s%s", code, out, errOut)
		}
		out, errOut, code = cli(t, bin, e.env, "consumer", "positions", "-group", e.group, "-topic", e.topic, "-schema", "nowhere")
		if code != 1 || !strings.Contains(errOut, "migrate up") {
			t.Fatalf("no tables: exit %d\n%s%s", code, out, errOut)
		}
		e.want("after the bad input", map[int]int64{0: 3}, map[int]int64{0: 3})

		// -new creates the positions of a consumer that has not run yet.
		e.name = "newcomer"
		e.seek("-to-offset", "0", "-name", "newcomer", "-new")
		e.want("-new", map[int]int64{0: 0, 1: 0}, map[int]int64{0: 0, 1: 0})
	})

	t.Run("help", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"-h"}, {"consumer", "-h"}, {"help"}} {
			out, _, code := cli(t, bin, nil, args...)
			if code != 0 || !strings.Contains(out, "idemkit consumer seek") {
				t.Errorf("%v: exit %d\n%s", args, code, out)
			}
		}
		out, _, code := cli(t, bin, nil, "consumer", "seek", "-h")
		if code != 0 || !strings.Contains(out, "kafka-consumer-groups --reset-offsets") || !strings.Contains(out, "-to-offset") ||
			!strings.Contains(out, "-recreated") {
			t.Errorf("consumer seek -h: exit %d\n%s", code, out)
		}
		out, _, code = cli(t, bin, nil, "dlq", "list", "-h")
		if code != 0 || !strings.Contains(out, "-topic") {
			t.Errorf("dlq list -h: exit %d\n%s", code, out)
		}
	})
}

// runConsumer runs the real consumer on e's group and topic until each of
// its partitions handled a message, and returns the offset each started at.
func runConsumer(t *testing.T, e *seekEnv, partitions int) map[int]int64 {
	t.Helper()
	var (
		mu      sync.Mutex
		starts  = map[int]int64{}
		handled = map[int]int64{}
	)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := consumer.New(e.db.Pool, &consumer.Config{
		Kafka: testenv.Kafka(t), Topic: e.topic, GroupID: e.group, Store: e.store,
		MissingID: consumer.MissingIDUseCoordinates, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		Observers: []consumer.Observer{&testobs.Hooks{ // signals only: a hook must never block the runner
			OnAssigned: func(_ string, partition int, start int64) {
				mu.Lock()
				defer mu.Unlock()
				if _, ok := starts[partition]; !ok {
					starts[partition] = start
				}
			},
			OnOutcome: func(_ context.Context, msg *consumer.Message, _ consumer.Outcome) {
				mu.Lock()
				defer mu.Unlock()
				if _, ok := handled[msg.Partition]; !ok {
					handled[msg.Partition] = msg.Offset
					if len(handled) == partitions {
						close(done)
					}
				}
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	select {
	case <-done:
	case err := <-ran:
		t.Fatalf("the consumer stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the consumer handled nothing in a minute")
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !maps.Equal(starts, handled) {
		t.Fatalf("the consumer started at %v but first handled %v", starts, handled)
	}
	return maps.Clone(starts)
}
