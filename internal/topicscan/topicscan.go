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
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/outage"
)

// MaxOutage bounds how long a scan waits for an unreachable broker before
// it returns the *retry.OutageError.
const MaxOutage = time.Minute

// ErrNoTopic means the topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Scan calls fn for every committed message of topic that exists when Scan
// starts, partition by partition in offset order, and returns at the end of
// the topic (messages written or committed meanwhile are left for the next
// scan). It reads without a consumer group: scanning moves no offset. A
// broker that cannot be reached during the scan is waited for, up to
// MaxOutage.
func Scan(ctx context.Context, brokers []string, topic string, fn func(kafka.Message) error) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("metadata for %s: %w", topic, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		return fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	if md.Topics[0].Error != nil {
		return fmt.Errorf("metadata for %s: %w", topic, md.Topics[0].Error)
	}
	var parts []int
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
	}
	slices.Sort(parts)
	// Read committed: LastOffset is the last stable offset.
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}, IsolationLevel: kafka.ReadCommitted}
	for _, p := range parts {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	offs, err := client.ListOffsets(ctx, req)
	if err != nil {
		return fmt.Errorf("offsets of %s: %w", topic, err)
	}
	bounds := map[int]kafka.PartitionOffsets{}
	for _, po := range offs.Topics[topic] {
		if po.Error != nil {
			return fmt.Errorf("offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		bounds[po.Partition] = po
	}
	for _, p := range parts {
		b := bounds[p]
		if b.FirstOffset >= b.LastOffset {
			continue
		}
		if err := scanPartition(ctx, client, topic, p, b.FirstOffset, b.LastOffset, fn); err != nil {
			return err
		}
	}
	return nil
}

// scanPartition passes fn the committed messages of partition in [first, end).
func scanPartition(ctx context.Context, client *kafka.Client, topic string, partition int, first, end int64,
	fn func(kafka.Message) error) error {
	r, err := kread.New(&kread.Config{Client: client, Topic: topic, Partition: partition,
		MaxBytes: 8 << 20, MaxWait: 250 * time.Millisecond}, first)
	if err != nil {
		return err
	}
	w := &outage.Waiter{Op: fmt.Sprintf("scan %s/%d", topic, partition), Max: MaxOutage,
		Log: slog.New(slog.DiscardHandler)}
	for r.Offset() < end {
		var f kread.Fetch
		err := w.Do(ctx, func(ctx context.Context) error {
			var err error
			f, err = r.Fetch(ctx)
			return err
		})
		if err != nil {
			return fmt.Errorf("read %s/%d: %w", topic, partition, err)
		}
		for _, m := range f.Records {
			if m.Offset >= end {
				return nil
			}
			if err := fn(m); err != nil {
				return err
			}
		}
	}
	return nil
}
