package txn

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/topicscan"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

func scan(t *testing.T, topic string) []rec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []kafka.Message
	err := topicscan.Scan(ctx, testenv.Client(t), topic, func(m kafka.Message) error {
		got = append(got, m)
		return nil
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return recsOf(t, got)
}

// TestScanCommittedOnly: topicscan (and so dlq.Scan, the reprocessor and
// the CLI) passes on the committed and non-transactional records of a
// transactional topic, no marker and no aborted record.
func TestScanCommittedOnly(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 3)
	committed, _ := mixedTopic(t, topic, txproducer.Lz4, kafka.Snappy)
	for p := range 3 {
		stableBounds(t, topic, p)
	}
	equalRecs(t, "topicscan.Scan", scan(t, topic), committed.sorted())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []kafka.Message
	if err := dlq.Scan(ctx, testenv.Kafka(t), topic, func(m kafka.Message) error {
		got = append(got, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	equalRecs(t, "dlq.Scan", recsOf(t, got), committed.sorted())
}

// TestScanOpenTransaction: a transaction open when the scan starts ends the
// scan at its first offset (the last stable offset) instead of blocking it;
// once it commits, the next scan has its records and those after it.
func TestScanOpenTransaction(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	jp := txproducer.Start(t, bootstrap(t))
	open := jp.Producer("", txproducer.None)
	var before, after want
	before.add(0, produce(t, topic, 0, 0, "n1"), "n1")
	open.Begin()
	sendAll(open, topic, 0, "h1")
	after.add(0, open.Flush(), "h1")
	after.add(0, produce(t, topic, 0, 0, "n2"), "n2")

	start := time.Now()
	equalRecs(t, "scan with a transaction open", scan(t, topic), before.sorted())
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the scan took %s: it waited for the open transaction", d)
	}
	open.Commit()
	stableBounds(t, topic, 0)
	equalRecs(t, "scan after the commit", scan(t, topic), append(before, after...).sorted())
}
