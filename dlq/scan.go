package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/topicscan"
)

// ErrNoTopic means the dead-letter topic does not exist.
var ErrNoTopic = errors.New("dlq: topic does not exist")

// Scan calls fn for every message of topic that exists when Scan starts,
// partition by partition in offset order, and returns at the end of the
// topic (messages written meanwhile are left for the next scan). It reads
// without a consumer group: scanning moves no offset.
func Scan(ctx context.Context, brokers []string, topic string, fn func(kafka.Message) error) error {
	err := topicscan.Scan(ctx, brokers, topic, fn)
	switch {
	case errors.Is(err, topicscan.ErrNoTopic):
		return fmt.Errorf("%w: %s", ErrNoTopic, topic)
	case err != nil:
		return fmt.Errorf("dlq: %w", err)
	}
	return nil
}
