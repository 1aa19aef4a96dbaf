package txn

import (
	"context"
	"fmt"
	"strings"
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

	// One batch with keys k1 to k8 (offsets 0-7), then k2 to k8 again
	// (8-14): compaction leaves the first batch with k1 alone, and its
	// offsets 1 to 7 empty. A later record (15) rolls the segment so that
	// the cleaner may compact it.
	var first, second []string
	want := []rec{{0, 0, "b0"}}
	for i := 1; i < 8; i++ {
		first = append(first, fmt.Sprintf("k%d:b%d", i+1, i))
		second = append(second, fmt.Sprintf("k%d:b%d", i+1, i+7))
		want = append(want, rec{0, int64(i + 7), fmt.Sprintf("b%d", i+7)})
	}
	produceKeyed(t, topic, append([]string{"k1:b0"}, first...)...)
	produceKeyed(t, topic, second...)
	time.Sleep(300 * time.Millisecond)
	produceKeyed(t, topic, "k9:b15")
	want = append(want, rec{0, 15, "b15"})
	const end = 16

	for {
		r := newReader(t, topic, 0, 0, nil)
		msgs, _ := readTo(t, r, end)
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
	// the first batch (k1 at 0) only, and the reader must end up after it,
	// at 8, in that one fetch.
	for start := int64(1); start < 8; start++ {
		r := newReader(t, topic, 0, start, func(c *kread.Config) { c.MaxBytes = 1 })
		f, err := r.Fetch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Records) != 0 || f.Next != 8 {
			t.Fatalf("fetch at %d: %v, Next %d; want no record and Next 8 (the end of the compacted batch)",
				start, recsOf(t, f.Records), f.Next)
		}
		msgs, last := readTo(t, r, end)
		equalRecs(t, fmt.Sprintf("from %d, one batch per fetch", start), recsOf(t, msgs), want[1:])
		if last.Next != end {
			t.Fatalf("Next %d, want %d", last.Next, end)
		}
	}
	r := newReader(t, topic, 0, 0, func(c *kread.Config) { c.MaxBytes = 1 })
	msgs, _ := readTo(t, r, end)
	equalRecs(t, "from 0, one batch per fetch", recsOf(t, msgs), want)
}

// produceKeyed writes "key:id" records to partition 0 as one batch.
func produceKeyed(t *testing.T, topic string, kv ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs := make([]kafka.Record, len(kv))
	for i, s := range kv {
		key, id, _ := strings.Cut(s, ":")
		recs[i] = kafka.Record{Key: kafka.NewBytes([]byte(key)), Value: kafka.NewBytes([]byte(s)),
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
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
