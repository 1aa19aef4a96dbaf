// Package topicscan reads a Kafka topic from its start to the end it has
// when the scan starts, without a consumer group: reading moves no offset.
// The dead-letter tools (dlq.Scan, the reprocessor, the CLI) and the tests
// use it.
//
// It reads committed data only, as Kafka's Java consumer with
// isolation.level=read_committed does (internal/kread): transaction markers
// and records of aborted transactions are never passed on, and a
// partition's end is its last stable offset when the scan starts, so a
// transaction still open then neither blocks the scan nor shows its
// records; they, and what was written after them, are left for a later
// scan.
package topicscan

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/outage"
)

// MaxOutage bounds how long a scan waits for an unreachable broker before
// it returns the *retry.OutageError.
const MaxOutage = time.Minute

// ErrNoTopic means the topic does not exist.
var ErrNoTopic = kafkaoffsets.ErrNoTopic

// Range is the part of one partition a scan reads: offsets First to End-1.
type Range struct {
	Partition  int
	First, End int64
}

// Every function talks through client: its Addr (the bootstrap brokers) and
// Transport (TLS, SASL; see kafkaconn). Its Timeout bounds each request
// (10s is what the dead-letter tools use).

// Ranges returns the range of every partition of topic that holds committed
// messages now, by partition: from its first offset to its last stable
// offset. Messages written or committed later are past End.
func Ranges(ctx context.Context, client *kafka.Client, topic string) ([]Range, error) {
	ranges, err := kafkaoffsets.LogRange(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	var out []Range
	for _, p := range slices.Sorted(maps.Keys(ranges)) {
		if r := ranges[p]; r.Start < r.Stable {
			out = append(out, Range{Partition: p, First: r.Start, End: r.Stable})
		}
	}
	return out, nil
}

// Scan calls fn for every committed message of topic that exists when Scan
// starts, partition by partition in offset order, and returns at the end of
// the topic (messages written or committed meanwhile are left for the next
// scan). It reads without a consumer group: scanning moves no offset. A
// broker that cannot be reached during the scan is waited for, up to
// MaxOutage. An error of fn is returned as is.
func Scan(ctx context.Context, client *kafka.Client, topic string, fn func(kafka.Message) error) error {
	w := &outage.Waiter{Op: "scan " + topic, Max: MaxOutage, Log: slog.New(slog.DiscardHandler)}
	var ranges []Range
	if err := w.Do(ctx, func(ctx context.Context) error {
		var err error
		ranges, err = Ranges(ctx, client, topic)
		return err
	}); err != nil {
		return err
	}
	for _, r := range ranges {
		for {
			next := r.First
			var fnErr error
			err := Read(ctx, client, topic, r, func(m kafka.Message) error {
				if fnErr = fn(m); fnErr != nil {
					return fnErr
				}
				next = m.Offset + 1
				return nil
			})
			if err == nil {
				break
			}
			if fnErr != nil {
				return fnErr // fn's error as is, never taken for an outage
			}
			if werr := w.Wait(ctx, err); werr != nil {
				return werr
			}
			r.First = max(r.First, next) // go on after the last message passed on
		}
	}
	return nil
}

// Read calls fn for every committed message of r in offset order and
// returns once the reader passed r.End-1; an empty range reads nothing. An
// error of fn is returned as is; errors reading are wrapped with the
// partition, connection errors unchanged underneath (retry.IsConnection).
func Read(ctx context.Context, client *kafka.Client, topic string, r Range, fn func(kafka.Message) error) error {
	if r.First >= r.End {
		return nil
	}
	reader, err := kread.New(&kread.Config{Client: client, Topic: topic, Partition: r.Partition,
		MaxBytes: 1 << 20, MaxWait: 250 * time.Millisecond}, r.First)
	if err != nil {
		return err
	}
	for reader.Offset() < r.End {
		f, err := reader.Fetch(ctx)
		if err != nil {
			return fmt.Errorf("read %s/%d: %w", topic, r.Partition, err)
		}
		for _, m := range f.Records {
			if m.Offset >= r.End {
				return nil
			}
			if err := fn(m); err != nil {
				return err
			}
		}
	}
	return nil
}
