package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

type requestKey struct{}

// TestContextHeaders: Config.ContextHeaders stamps every message of an
// EnqueueTx from its context; the relay publishes the headers; a message's
// own header of the same key wins; returning HeaderID is refused.
func TestContextHeaders(t *testing.T) {
	t.Parallel()
	db, _ := newDB(t)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}, ContextHeaders: func(ctx context.Context) []kafka.Header {
		if v, ok := ctx.Value(requestKey{}).(string); ok {
			return []kafka.Header{{Key: "traceparent", Value: []byte(v)}, {Key: "type", Value: []byte("stamped")}}
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	topic := testenv.NewTopic(t, 1)
	pub := newPublished()
	run(t, newRelay(t, db, store, outbox.RelayConfig{Observers: []outbox.Observer{&testobs.Outbox{OnPublished: pub.hook}}}))

	ctx := context.WithValue(context.Background(), requestKey{}, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	var ids []string
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = store.EnqueueTx(ctx, tx,
			outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("plain")},
			outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("own type"),
				Headers: []kafka.Header{{Key: "type", Value: []byte("OrderPaid")}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	unstamped := enqueue(t, db.Pool, store, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("no context")})
	pub.wait(t, 30*time.Second, append(ids, unstamped...)...)

	byValue := map[string]kafka.Message{}
	for _, m := range readAll(t, testenv.Brokers(t), topic) {
		byValue[string(m.Value)] = m
	}
	if m := byValue["plain"]; header(m, "traceparent") == "" || header(m, "type") != "stamped" {
		t.Fatalf("plain: headers %v, want traceparent and type=stamped", m.Headers)
	}
	if m := byValue["own type"]; header(m, "type") != "OrderPaid" || header(m, "traceparent") == "" || strings.Count(headerKeys(m), "type") != 1 {
		t.Fatalf("own type: headers %v, want its own type once and the traceparent", m.Headers)
	}
	if m := byValue["no context"]; header(m, "traceparent") != "" || header(m, outbox.HeaderID) == "" {
		t.Fatalf("no context: headers %v, want no traceparent", m.Headers)
	}

	bad, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}, ContextHeaders: func(context.Context) []kafka.Header {
		return []kafka.Header{{Key: outbox.HeaderID, Value: []byte("x")}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := bad.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Value: []byte("v")})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), outbox.HeaderID) {
		t.Fatalf("ContextHeaders returning %s: %v, want an error naming it", outbox.HeaderID, err)
	}
}

func headerKeys(m kafka.Message) string {
	var keys []string
	for _, h := range m.Headers {
		keys = append(keys, h.Key)
	}
	return strings.Join(keys, ",")
}
