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

// Scan calls fn for every message of topic that exists when Scan starts,
// partition by partition in offset order, and returns at the end of the
// topic (messages written meanwhile are left for the next scan). It reads
// without a consumer group: scanning moves no offset.
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
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
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
		if err := scanPartition(ctx, brokers, topic, p, b.FirstOffset, b.LastOffset, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanPartition(ctx context.Context, brokers []string, topic string, partition int, first, end int64,
	fn func(kafka.Message) error) error {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition,
		MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 250 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return fmt.Errorf("%s/%d: %w", topic, partition, err)
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("read %s/%d: %w", topic, partition, err)
		}
		if err := fn(m); err != nil {
			return err
		}
		if m.Offset >= end-1 {
			return nil
		}
	}
}
