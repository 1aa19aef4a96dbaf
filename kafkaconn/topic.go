package kafkaconn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// CreateTopic creates topic with the given number of partitions and
// replicas (its replication factor; -1: the broker's
// default.replication.factor) unless it exists, then waits until the
// cluster's metadata lists every partition with a leader, so that a
// producer or consumer started next finds it. A topic that exists already,
// whatever its partitions, is no error. idemkit never creates topics on its
// own: create them with this, `idemkit topic create`, or your own tooling.
func CreateTopic(ctx context.Context, c Config, topic string, partitions, replicas int) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: create topic: empty topic name", ErrInvalidConfig)
	case partitions < 1 || replicas < 1 && replicas != -1:
		return fmt.Errorf("%w: create topic %s: %d partitions and %d replicas, want at least 1 each (replicas -1: the broker's default)",
			ErrInvalidConfig, topic, partitions, replicas)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	t, err := c.Transport()
	if err != nil {
		return err
	}
	defer t.CloseIdleConnections()
	client := &kafka.Client{Addr: c.Addr(), Timeout: 10 * time.Second, Transport: t}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: replicas,
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("kafkaconn: create topic %s: %w", topic, c.Wrap(err))
	}
	// The controller answers before every broker knows the topic.
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && led(md.Topics[0].Partitions) {
			return nil
		}
		if err == nil && len(md.Topics) == 1 {
			err = md.Topics[0].Error
		}
		select {
		case <-ctx.Done():
			why := "a partition has no leader"
			if err != nil {
				why = c.Wrap(err).Error()
			}
			return fmt.Errorf("kafkaconn: topic %s created, not yet listed by the cluster (%s): %w", topic, why, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// led reports whether every partition has a leader.
func led(parts []kafka.Partition) bool {
	if len(parts) == 0 {
		return false
	}
	for _, p := range parts {
		if p.Leader.ID < 0 || p.Leader.Host == "" {
			return false
		}
	}
	return true
}
