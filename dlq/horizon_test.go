package dlq_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestReplayBeyondHorizon: with the plain dedup layout and Retention, a
// message applied two hours ago, whose dedup record was purged since, comes
// again with its original timestamp (a producer's retry, a mirror); the
// consumer refuses it as beyond the horizon and dead-letters it. Replaying
// that dead letter must not apply it a second time: in both modes the
// reprocessor reports BeyondHorizon and leaves it alone, unrecorded, so that
// a later run may take it once the operator opts in (HorizonApply).
func TestReplayBeyondHorizon(t *testing.T) {
	t.Parallel()
	for _, mode := range []dlq.Mode{dlq.Redrive, dlq.Republish} {
		t.Run(map[dlq.Mode]string{dlq.Redrive: "Redrive", dlq.Republish: "Republish"}[mode], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, true)
			old := time.Now().Add(-2 * time.Hour)
			// Its effect, applied when it first came; its dedup record is gone.
			if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.effects+` (id, runs) VALUES ('paid', 1)`); err != nil {
				t.Fatal(err)
			}
			testenv.Produce(t, e.topic, 0, kafka.Record{Time: old, Key: kafka.NewBytes([]byte("k")),
				Value: kafka.NewBytes([]byte("v")), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("paid")}}})
			e.consumeWith(1, func(*consumer.Message, int) error { return nil },
				func(c *consumer.Config) { c.Retention = time.Hour })
			dls := e.deadLetters()
			if len(dls) != 1 || !strings.Contains(dls[0].Last().Error, "dedup horizon") {
				t.Fatalf("dead letters %+v, want the message refused as beyond the horizon", dls)
			}
			if got := dls[0].Origin.Time; !got.Equal(old.Truncate(time.Millisecond)) {
				t.Fatalf("dead letter's origin time %v, want the message's timestamp %v", got, old)
			}

			var items []dlq.Item
			sum, err := e.reprocessor(mode, e.effect, func(c *dlq.ReprocessorConfig) {
				c.Retention = time.Hour
				c.Progress = func(it dlq.Item) { items = append(items, it) }
			}).Run(ctx)
			if err != nil || !maps.Equal(sum.Records, dlq.Counts{dlq.BeyondHorizon: 1}) {
				t.Fatalf("replay: %v, %v; want beyond-horizon", sum, err)
			}
			if !errors.Is(items[0].Err, consumer.ErrBeyondHorizon) {
				t.Fatalf("item error %v, want ErrBeyondHorizon", items[0].Err)
			}
			if runs := e.runs(); runs["paid"] != 1 {
				t.Fatalf("effects %v: applied twice", runs)
			}
			if n := len(testenv.ReadAll(t, testenv.Brokers(t), e.topic)); n != 1 {
				t.Fatalf("%d messages in the origin topic, want 1 (nothing republished)", n)
			}

			// The operator opts in: the next run replays it.
			sum, err = e.reprocessor(mode, e.effect, func(c *dlq.ReprocessorConfig) {
				c.Retention = time.Hour
				c.OnBeyondHorizon = consumer.HorizonApply
			}).Run(ctx)
			want := map[dlq.Mode]dlq.Action{dlq.Redrive: dlq.Applied, dlq.Republish: dlq.Republished}[mode]
			if err != nil || !maps.Equal(sum.Records, dlq.Counts{want: 1}) {
				t.Fatalf("replay with HorizonApply: %v, %v; want %s", sum, err, want)
			}
		})
	}
}
