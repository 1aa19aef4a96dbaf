package kafkaoffsets_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// records returns n records, the i-th stamped at base + i minutes.
func records(base time.Time, n int) []kafka.Record {
	out := make([]kafka.Record, n)
	for i := range out {
		out[i] = kafka.Record{Time: base.Add(time.Duration(i) * time.Minute), Value: kafka.NewBytes([]byte("v"))}
	}
	return out
}

func TestLogRangeAndAtTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.Client(t)
	topic := testenv.NewTopic(t, 3)
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	testenv.Produce(t, topic, 0, records(base, 5)...)
	testenv.Produce(t, topic, 1, records(base, 2)...)
	testenv.DeleteRecords(t, topic, 0, 2) // as retention would

	parts, err := kafkaoffsets.Partitions(ctx, client, topic)
	if err != nil || !slices.Equal(parts, []int{0, 1, 2}) {
		t.Fatalf("Partitions = %v, %v", parts, err)
	}
	got, err := kafkaoffsets.LogRange(ctx, client, topic)
	if err != nil {
		t.Fatal(err)
	}
	// No transaction is open: the last stable offset is the log end.
	want := map[int]kafkaoffsets.Range{0: {Start: 2, Stable: 5, End: 5}, 1: {Start: 0, Stable: 2, End: 2}, 2: {}}
	if !maps.Equal(got, want) {
		t.Fatalf("LogRange = %v, want %v", got, want)
	}
	if got, err := kafkaoffsets.LogRange(ctx, client, topic, 1); err != nil || !maps.Equal(got, map[int]kafkaoffsets.Range{1: want[1]}) {
		t.Fatalf("LogRange(1) = %v, %v", got, err)
	}
	if r := want[0]; !r.Contains(2) || !r.Contains(5) || r.Contains(1) || r.Contains(6) {
		t.Fatalf("%v.Contains is wrong", r)
	}
	if r := want[0]; r.Held() || !(kafkaoffsets.Range{Start: 2, Stable: 3, End: 5}).Held() {
		t.Fatalf("Held is wrong")
	}

	// At base+1m: offset 1 is gone, so partition 0 answers its first record
	// at or after that time; partition 1 has offset 1; the empty partition
	// answers its end.
	at, err := kafkaoffsets.AtTime(ctx, client, topic, []int{0, 1, 2}, base.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{0: 2, 1: 1, 2: 0}; !maps.Equal(at, want) {
		t.Fatalf("AtTime(base+1m) = %v, want %v", at, want)
	}
	at, err = kafkaoffsets.AtTime(ctx, client, topic, []int{0, 1}, base.Add(3*time.Minute+time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{0: 4, 1: 2}; !maps.Equal(at, want) { // partition 1 has nothing that late: its end
		t.Fatalf("AtTime(base+3m1s) = %v, want %v", at, want)
	}

	if _, err := kafkaoffsets.LogRange(ctx, client, testenv.Name(t, "missing")); !errors.Is(err, kafkaoffsets.ErrNoTopic) {
		t.Fatalf("LogRange of a missing topic: %v, want ErrNoTopic", err)
	}
	if _, err := kafkaoffsets.LogRange(ctx, client, topic, 7); err == nil {
		t.Fatal("LogRange of a partition the topic does not have: no error")
	}
}

func TestGroupCommitDescribeRemove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.Client(t)
	topic := testenv.NewTopic(t, 2)
	group := testenv.Name(t, "g")
	testenv.Produce(t, topic, 0, records(time.Now(), 3)...)

	g, err := kafkaoffsets.Describe(ctx, client, group)
	if err != nil || g.State != "Dead" || g.Live() {
		t.Fatalf("unknown group: %+v, %v; want Dead", g, err)
	}
	if c, err := kafkaoffsets.Committed(ctx, client, group, topic, []int{0, 1}); err != nil || len(c) != 0 {
		t.Fatalf("Committed of an unknown group = %v, %v", c, err)
	}
	if err := kafkaoffsets.Commit(ctx, client, group, topic, map[int]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	if c, err := kafkaoffsets.Committed(ctx, client, group, topic, []int{0, 1}); err != nil || !maps.Equal(c, map[int]int64{0: 2}) {
		t.Fatalf("Committed = %v, %v; want partition 0 at 2", c, err)
	}
	if g, err := kafkaoffsets.Describe(ctx, client, group); err != nil || g.State != "Empty" || g.Live() {
		t.Fatalf("after a commit: %+v, %v; want Empty", g, err)
	}

	// A member holds a generation: commits from outside are refused.
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: group, Brokers: testenv.Brokers(t),
		Topics: []string{topic}, HeartbeatInterval: 30 * time.Second, SessionTimeout: time.Minute,
		RebalanceTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Close() })
	gctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	gen, err := cg.Next(gctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err = kafkaoffsets.Describe(ctx, client, group)
	if err != nil || !g.Live() || !slices.Equal(g.Members, []string{gen.MemberID}) {
		t.Fatalf("with a member: %+v, %v; want live with %s", g, err, gen.MemberID)
	}
	err = kafkaoffsets.Commit(ctx, client, group, topic, map[int]int64{0: 0})
	if !errors.Is(err, kafkaoffsets.ErrGroupNotEmpty) {
		t.Fatalf("commit into a live group: %v, want ErrGroupNotEmpty", err)
	}
	if c, _ := kafkaoffsets.Committed(ctx, client, group, topic, []int{0}); c[0] != 2 {
		t.Fatalf("the refused commit moved the offset to %d", c[0])
	}

	// Removed (it heartbeats only every 30s, so it does not come back before
	// the commit), the group is empty and takes the commit.
	if err := kafkaoffsets.RemoveMembers(ctx, client, group, g.Members); err != nil {
		t.Fatal(err)
	}
	if g, err := kafkaoffsets.Describe(ctx, client, group); err != nil || g.Live() {
		t.Fatalf("after removing its member: %+v, %v; want not live", g, err)
	}
	if err := kafkaoffsets.Commit(ctx, client, group, topic, map[int]int64{0: 0, 1: 0}); err != nil {
		t.Fatal(err)
	}
	if c, err := kafkaoffsets.Committed(ctx, client, group, topic, []int{0, 1}); err != nil || !maps.Equal(c, map[int]int64{0: 0, 1: 0}) {
		t.Fatalf("Committed = %v, %v; want both at 0", c, err)
	}
}
