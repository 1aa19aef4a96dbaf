package testenv_test

import (
	"io"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
)

// TestProduceRetrySendsWholeRecords: a retried produce sends the records
// keys and values whole. Draining them first does what a refused first
// attempt (a topic just created, without a leader yet) does: the request was
// encoded, so the readers are at their end.
func TestProduceRetrySendsWholeRecords(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	recs := []kafka.Record{
		{Key: kafka.NewBytes([]byte("k0")), Value: kafka.NewBytes([]byte("v0"))},
		{Key: kafka.NewBytes([]byte("k1")), Value: kafka.NewBytes([]byte("v1"))},
	}
	for _, r := range recs {
		for _, b := range []kafka.Bytes{r.Key, r.Value} {
			if _, err := io.ReadAll(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.Produce(t, topic, 0, recs...)
	got := testenv.ReadAll(t, testenv.Brokers(t), topic)
	if len(got) != 2 {
		t.Fatalf("read %d records, want 2", len(got))
	}
	for i, m := range got {
		if want := []string{"k0", "k1"}[i]; string(m.Key) != want || string(m.Value) != "v"+want[1:] {
			t.Errorf("record %d: key %q, value %q; want %q, %q", i, m.Key, m.Value, want, "v"+want[1:])
		}
	}
}
