package dlq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestRepublishCoordinateIDOnce: a dead letter of a MissingIDUseCoordinates
// consumer (its original has no message-id header) is republished with the
// ID the first attempt had, so that a second republish of it (a crash
// between the write and its replay record, then a rerun) is deduplicated:
// its effect happens once. Copies that took new IDs from their new offsets
// would be applied twice.
func TestRepublishCoordinateIDOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(), kafka.Message{Key: []byte("k"), Value: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	coordinates := func(c *consumer.Config) { c.MissingID = consumer.MissingIDUseCoordinates }
	var fixed atomic.Bool
	fail := func(*consumer.Message, int) error {
		if !fixed.Load() {
			return retry.Permanent(errors.New("bug"))
		}
		return nil
	}
	e.consumeWith(1, fail, coordinates)
	id := consumer.CoordinateID(e.topic, 0, 0, 0)

	sum, err := e.reprocessor(dlq.Republish, nil, nil).Run(context.Background())
	if err != nil || sum.Records[dlq.Republished] != 1 {
		t.Fatalf("republish: %v %v", sum, err)
	}
	// The replay record is lost (as by a crash right after the write): the
	// next run republishes the letter again.
	if _, err := e.db.Pool.Exec(context.Background(), `DELETE FROM `+e.db.Table(migrate.DLQReplaysDefault)); err != nil {
		t.Fatal(err)
	}
	sum, err = e.reprocessor(dlq.Republish, nil, nil).Run(context.Background())
	if err != nil || sum.Records[dlq.Republished] != 1 {
		t.Fatalf("republish again: %v %v", sum, err)
	}
	fixed.Store(true)
	e.consumeWith(2, fail, coordinates)
	if runs := e.runs(); runs[id] != 1 || len(runs) != 1 {
		t.Fatalf("effects %v, want %s once", runs, id)
	}
}
