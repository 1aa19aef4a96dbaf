package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/topicscan"
	"github.com/idemkit/idemkit/kafkaconn"
)

// ErrNoTopic means the dead-letter topic does not exist.
var ErrNoTopic = errors.New("dlq: topic does not exist")

// scanTimeout bounds each request of a scan.
const scanTimeout = 10 * time.Second

// Scan calls fn for every message of topic that exists when Scan starts,
// partition by partition in offset order, and returns at the end of the
// topic (messages written meanwhile are left for the next scan). It reads
// without a consumer group: scanning moves no offset. It connects as kc
// says and closes its connections before it returns. An error of fn ends
// the scan and is returned as is; brokers that refuse kc's credentials or
// certificates are a *kafkaconn.Error (errors.Is kafkaconn.ErrAuthentication
// or kafkaconn.ErrTLS); an invalid kc wraps ErrInvalidConfig.
func Scan(ctx context.Context, kc kafkaconn.Config, topic string, fn func(kafka.Message) error) error {
	client, closeClient, err := newClient(&kc)
	if err != nil {
		return err
	}
	defer closeClient()
	var fnErr error
	err = topicscan.Scan(ctx, client, topic, func(m kafka.Message) error {
		fnErr = fn(m)
		return fnErr
	})
	if fnErr == nil {
		err = kc.Wrap(err)
	}
	return scanError(err, fnErr, topic)
}

// newClient returns a client that connects as kc says and the function that
// closes its connections.
func newClient(kc *kafkaconn.Config) (*kafka.Client, func(), error) {
	t, err := kc.Transport()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	return &kafka.Client{Addr: kc.Addr(), Timeout: scanTimeout, Transport: t}, t.CloseIdleConnections, nil
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
