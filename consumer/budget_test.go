package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
)

// TestBudgetWithMutatingMiddleware: the byte budget is acquired with
// messageBytes(msg) when a message is fetched and released with
// messageBytes(msg) again after its transaction — recomputed from a
// *Message the handler and the middleware hold and may change. A
// middleware that drops the payload once handled (a decrypting or
// redacting middleware replacing m.Value) makes every release smaller than
// its acquire: the difference stays "used" for ever, and once it reaches
// MaxBufferedBytes the prefetcher waits for bytes that are never released
// — the partition stops for good with nothing in flight.
func TestBudgetWithMutatingMiddleware(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			big := strings.Repeat("0", 2000) + "1" // amount 1, 2 KB of payload
			var msgs []kafka.Message
			for i := range 60 {
				m := msg(fmt.Sprintf("m%d", i), "k", 0)
				m.Value = []byte(big)
				msgs = append(msgs, m)
			}
			e.produce(msgs...)
			cfg := e.config(md, nil)
			cfg.MaxBufferedBytes = 20 << 10 // about 8 such messages
			cfg.Middleware = []consumer.Middleware{func(next consumer.Handler) consumer.Handler {
				return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					err := next.Handle(ctx, tx, m)
					m.Value = nil // done with the payload
					return err
				})
			}}
			oc := newOutcomes(60)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			select {
			case <-oc.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("%d of 60 messages applied after 20s: the budget leaked what the middleware dropped and the prefetcher waits for ever",
					oc.count(consumer.Applied))
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
