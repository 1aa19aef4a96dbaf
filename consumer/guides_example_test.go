package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// Where the message ID comes from: a header of another name, a function of
// the record, or, for a producer that sends none, the record's coordinates.
func ExampleConfig_messageID() {
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}
	handler := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error { return nil })

	byHeader := &consumer.Config{Kafka: kc, Topic: "payments", GroupID: "ledger", Handler: handler,
		IDHeader: "ce_id"} // a CloudEvents binding's ID header
	byFunc := &consumer.Config{Kafka: kc, Topic: "payments", GroupID: "ledger", Handler: handler,
		IDFunc: func(msg *kafka.Message) (string, error) {
			if len(msg.Key) == 0 {
				return "", errors.New("no key") // no usable ID: see MissingID
			}
			return "payment:" + string(msg.Key), nil // one payment per key
		}}
	byCoordinates := &consumer.Config{Kafka: kc, Topic: "legacy-payments", GroupID: "ledger", Handler: handler,
		MissingID: consumer.MissingIDUseCoordinates} // dedups redeliveries only, not a producer's resend
	for _, cfg := range []*consumer.Config{byHeader, byFunc, byCoordinates} {
		fmt.Println(cfg.Validate())
	}
	fmt.Println(consumer.CoordinateID("legacy-payments", 2, 1041, 0))
	// Output:
	// <nil>
	// <nil>
	// <nil>
	// legacy-payments/2/1041
}

// A batch handler: the new messages of a batch in one call, written with
// one set-based statement.
func ExampleConfig_batchHandler() {
	cfg := &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}, Topic: "page-views", GroupID: "analytics",
		BatchHandler: consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			ids, pages := make([]string, len(msgs)), make([]string, len(msgs))
			for i, m := range msgs { // only the newly claimed messages, in offset order
				ids[i], pages[i] = m.ID, string(m.Key)
			}
			_, err := tx.Exec(ctx, `INSERT INTO views (id, page) SELECT * FROM unnest($1::text[], $2::text[])`, ids, pages)
			return err // an error splits the batch until the failing message stands alone
		}),
		BatchSize: 1000, // at most this many per transaction; 1: one transaction per message
	}
	fmt.Println(cfg.Validate())
	// Output:
	// <nil>
}

// A consumer whose failing accounts do not stall the others: transient
// errors are retried in place, then the message is parked with the later
// messages of its key; what fails for good goes to OnFailure.
func ExampleConfig_nonBlocking() {
	errUnknownAccount := errors.New("unknown account")
	cfg := &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}, Topic: "transfers", GroupID: "ledger",
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			tag, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = $1`, string(msg.Key))
			if err != nil {
				return err // retry.Classify decides: a lost connection is retried, a constraint violation is not
			}
			if tag.RowsAffected() == 0 {
				return retry.Permanent(fmt.Errorf("%w %q", errUnknownAccount, msg.Key)) // never retried
			}
			return nil
		}),
		// Three attempts in place, the partition waiting; then the message is
		// parked with the later messages of its key, and other keys flow.
		Retry:       retry.Policy{InitialInterval: 200 * time.Millisecond, MaxAttempts: 3},
		FailureMode: consumer.NonBlocking,
		ParkedRetry: retry.Policy{InitialInterval: time.Second, MaxInterval: time.Minute, MaxAttempts: 10},
		OnFailure: func(ctx context.Context, msg *consumer.Message, err error) error {
			return nil // a dlq.Writer's OnFailure in a real service: nil means taken care of
		},
	}
	fmt.Println(cfg.Validate())
	// Output:
	// <nil>
}

// Dedup records purged after 14 days by the runner itself; a message older
// than the horizon whose claim is new goes to OnFailure, not to the handler.
func ExampleConfig_retention() {
	cfg := &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}, Topic: "payments", GroupID: "order-service",
		Handler:         consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error { return nil }),
		Retention:       14 * 24 * time.Hour,  // longer than any redelivery or replay you expect
		OnBeyondHorizon: consumer.HorizonFail, // the default; HorizonApply where applying twice is harmless
	}
	fmt.Println(cfg.Validate())
	// Output:
	// <nil>
}
