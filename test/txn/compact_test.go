package txn

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestCompactedBatchTail: compaction removes the last records of a batch but
// keeps its offsets; kafka-go does not decode a batch's last offset, so a
// reader at an offset inside the removed tail sees only the batch's earlier
// records. kread must still move past the batch (in one Fetch) instead of
// fetching it for ever.
func TestCompactedBatchTail(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic := testenv.Name(t, "idemkit")
	client := testenv.Client(t)
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{
			{ConfigName: "cleanup.policy", ConfigValue: "compact"},
			{ConfigName: "segment.ms", ConfigValue: "100"},
			{ConfigName: "min.cleanable.dirty.ratio", ConfigValue: "0.001"},
			{ConfigName: "min.compaction.lag.ms", ConfigValue: "0"},
		},
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
	if err := testenv.WaitTopic(ctx, client, topic, 1); err != nil {
		t.Fatal(err)
	}

	// One batch with keys k1, k2, k3 (offsets 0-2), then k2 and k3 again
	// (3-4): compaction leaves the first batch with k1 alone, and its
	// offsets 1 and 2 empty. A later record rolls the segment so that the
	// cleaner may compact it.
	produceKeyed(t, topic, "k1:b1", "k2:b2", "k3:b3")
	produceKeyed(t, topic, "k2:b4", "k3:b5")
	time.Sleep(300 * time.Millisecond)
	produceKeyed(t, topic, "k9:b6")
	want := []rec{{0, 0, "b1"}, {0, 3, "b4"}, {0, 4, "b5"}, {0, 5, "b6"}}

	for {
		r := newReader(t, topic, 0, 0, nil)
		msgs, _ := readTo(t, r, 6)
		got := recsOf(t, msgs)
		if len(got) == len(want) {
			equalRecs(t, "after compaction", got, want)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the log cleaner did not compact the topic in time: %v", got)
		}
		time.Sleep(time.Second)
	}

	// One batch per fetch, from inside the removed tail: the fetch returns
	// the first batch (k1 at 0) only, and the reader must end up after it.
	r := newReader(t, topic, 0, 1, func(c *kread.Config) { c.MaxBytes = 1 })
	f, err := r.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Records) != 0 || f.Next != 3 {
		t.Fatalf("fetch at 1: %v, Next %d; want no record and Next 3 (the end of the compacted batch)", recsOf(t, f.Records), f.Next)
	}
	msgs, last := readTo(t, r, 6)
	equalRecs(t, "from 1, one batch per fetch", recsOf(t, msgs), want[1:])
	if last.Next != 6 {
		t.Fatalf("Next %d, want 6", last.Next)
	}
	r = newReader(t, topic, 0, 0, func(c *kread.Config) { c.MaxBytes = 1 })
	msgs, _ = readTo(t, r, 6)
	equalRecs(t, "from 0, one batch per fetch", recsOf(t, msgs), want)
}

// produceKeyed writes "key:id" records to partition 0 as one batch.
func produceKeyed(t *testing.T, topic string, kv ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs := make([]kafka.Record, len(kv))
	for i, s := range kv {
		recs[i] = kafka.Record{Key: kafka.NewBytes([]byte(s[:2])), Value: kafka.NewBytes([]byte(s)),
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(s[3:])}}}
	}
	res, err := testenv.Client(t).Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: 0,
		RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...)})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
}
