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
// without a consumer group: scanning moves no offset. An error of fn ends
// the scan and is returned as is.
func Scan(ctx context.Context, brokers []string, topic string, fn func(kafka.Message) error) error {
	var fnErr error
	err := topicscan.Scan(ctx, brokers, topic, func(m kafka.Message) error {
		fnErr = fn(m)
		return fnErr
	})
	return scanError(err, fnErr, topic)
}

// scanError translates a topicscan error; fnErr, the callback's own error,
// is returned unchanged.
func scanError(err, fnErr error, topic string) error {
	switch {
	case err == nil:
		return nil
	case fnErr != nil:
		return fnErr
	case errors.Is(err, topicscan.ErrNoTopic):
		return fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	return fmt.Errorf("dlq: %w", err)
}
