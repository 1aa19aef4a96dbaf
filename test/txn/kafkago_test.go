package txn

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// TestKafkaGoReaderIsNotReadCommitted shows why internal/kread exists: on
// the topic of TestCommittedOnly, kafka-go's Reader with IsolationLevel
// ReadCommitted returns transaction markers as messages and the records of
// aborted transactions (segmentio/kafka-go#1332). The test passes while
// kafka-go has the bug; if it fails, kafka-go's Reader has become usable on
// transactional topics and idemkit could read with it instead of
// internal/kread.
func TestKafkaGoReaderIsNotReadCommitted(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 3)
	committed, _ := mixedTopic(t, topic, txproducer.None, 0)

	var got []rec
	for p := range 3 {
		b := stableBounds(t, topic, p)
		got = append(got, readWithKafkaGo(t, topic, p, b.hw)...)
	}
	w := committed.sorted()
	if slices.Equal(got, w) {
		t.Fatalf("kafka-go's Reader returned exactly the committed records: segmentio/kafka-go#1332 looks fixed; "+
			"idemkit could read with it instead of internal/kread\n got %v", got)
	}
	var markers, aborted []rec
	isCommitted := map[rec]bool{}
	for _, r := range w {
		isCommitted[r] = true
	}
	for _, r := range got {
		switch {
		case r.ID[0] == '<':
			markers = append(markers, r)
		case !isCommitted[r]:
			aborted = append(aborted, r)
		}
	}
	t.Logf("kafka-go's Reader (IsolationLevel ReadCommitted) returned %d records for %d committed ones: "+
		"%d transaction markers as messages %v and %d records of aborted transactions %v",
		len(got), len(w), len(markers), markers, len(aborted), aborted)
	if len(markers) == 0 && len(aborted) == 0 {
		t.Fatalf("kafka-go's Reader differs from the committed records without markers or aborted records:\n got %v\nwant %v", got, w)
	}
}

// readWithKafkaGo reads partition p with kafka-go's Reader in read_committed
// mode until it returns a message at or past end-1 or stays silent for 5s.
func readWithKafkaGo(t *testing.T, topic string, p int, end int64) []rec {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: testenv.Brokers(t), Topic: topic, Partition: p,
		IsolationLevel: kafka.ReadCommitted, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var out []rec
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := r.FetchMessage(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("kafka-go reader: %v", err)
		}
		out = append(out, recsOf(t, []kafka.Message{m})...)
		if m.Offset >= end-1 {
			return out
		}
	}
}
