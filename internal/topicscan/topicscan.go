// Package topicscan reads a Kafka topic from its start to the end it has
// when the scan starts, without a consumer group: reading moves no offset.
// The dead-letter tools and the tests use it.
package topicscan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrNoTopic means the topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Range is the part of one partition a scan reads: offsets First to End-1.
type Range struct {
	Partition  int
	First, End int64
}

// Ranges returns the range of every partition of topic that holds messages
// now, by partition: from its first offset to its end. Messages written
// later are past End.
func Ranges(ctx context.Context, brokers []string, topic string) ([]Range, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata for %s: %w", topic, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	if md.Topics[0].Error != nil {
		return nil, fmt.Errorf("metadata for %s: %w", topic, md.Topics[0].Error)
	}
	var parts []int
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
	}
	slices.Sort(parts)
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range parts {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	offs, err := client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("offsets of %s: %w", topic, err)
	}
	bounds := map[int]kafka.PartitionOffsets{}
	for _, po := range offs.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		bounds[po.Partition] = po
	}
	var out []Range
	for _, p := range parts {
		if b := bounds[p]; b.FirstOffset < b.LastOffset {
			out = append(out, Range{Partition: p, First: b.FirstOffset, End: b.LastOffset})
		}
	}
	return out, nil
}

// Scan calls fn for every message of topic that exists when Scan starts,
// partition by partition in offset order, and returns at the end of the
// topic (messages written meanwhile are left for the next scan). It reads
// without a consumer group: scanning moves no offset. An error of fn is
// returned as is.
func Scan(ctx context.Context, brokers []string, topic string, fn func(kafka.Message) error) error {
	ranges, err := Ranges(ctx, brokers, topic)
	if err != nil {
		return err
	}
	for _, r := range ranges {
		if err := Read(ctx, brokers, topic, r, fn); err != nil {
			return err
		}
	}
	return nil
}

// Read calls fn for every message of r in offset order and returns after
// the one at r.End-1; an empty range reads nothing. An error of fn is
// returned as is; errors reading are wrapped with the partition.
func Read(ctx context.Context, brokers []string, topic string, r Range, fn func(kafka.Message) error) error {
	if r.First >= r.End {
		return nil
	}
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: r.Partition,
		MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 250 * time.Millisecond})
	defer reader.Close()
	if err := reader.SetOffset(r.First); err != nil {
		return fmt.Errorf("%s/%d: %w", topic, r.Partition, err)
	}
	for {
		m, err := reader.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("read %s/%d: %w", topic, r.Partition, err)
		}
		if err := fn(m); err != nil {
			return err
		}
		if m.Offset >= r.End-1 {
			return nil
		}
	}
}
