package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/kafkaconn"
)

func TestIDFromJSON(t *testing.T) {
	t.Parallel()
	id := consumer.IDFromJSON("event_id")
	for _, tt := range []struct {
		value, want, err string
	}{
		{`{"event_id":"e-42","amount":100}`, "e-42", ""},
		{`{"amount":{"cents":[1,2,{"event_id":"inner"}]},"event_id":"outer"}`, "outer", ""},
		{`{"event_id":12345678901234567890}`, "12345678901234567890", ""},
		{` {"event_id" : "\u00e9t\u00e9"} `, "été", ""},
		{`{"event_id":"e-1"`, "e-1", ""}, // read only as far as the member
		{`{"amount":100}`, "", "no member"},
		{`{"event_id":null}`, "", "null"},
		{`{"event_id":""}`, "", "empty"},
		{`{"event_id":true}`, "", "not a string"},
		{`{"event_id":{"id":"x"}}`, "", "not a string"},
		{`["event_id","x"]`, "", "not a JSON object"},
		{`not json`, "", "not a JSON object"},
		{``, "", "not a JSON object"},
		{`{"amount":1,`, "", "not valid JSON"},
	} {
		got, err := id(&kafka.Message{Value: []byte(tt.value)})
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("%s: %q, %v; want %q", tt.value, got, err, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s: %q, %v; want an error saying %q", tt.value, got, err, tt.err)
		}
	}
}

// TestIDFromJSONDedups: with IDFromJSON, two records carrying the same
// event apply it once, and a record without the member is refused as
// without an ID.
func TestIDFromJSONDedups(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	cfg := &consumer.Config{Kafka: kafkaconn.Config{Brokers: []string{"unused.invalid:9092"}}, Topic: e.topic, GroupID: e.group,
		Store: e.store, IDFunc: consumer.IDFromJSON("event_id"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID != "pay-7" {
				return fmt.Errorf("handler got ID %q, want pay-7", m.ID)
			}
			return nil
		})}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	event := []byte(`{"event_id":"pay-7","amount":100}`)
	got, err := r.Deliver(ctx, kafka.Message{Offset: 0, Value: event}, kafka.Message{Offset: 1, Value: event})
	if err != nil || !slices.Equal(got, []consumer.Outcome{consumer.Applied, consumer.Duplicate}) {
		t.Fatalf("Deliver = %v, %v; want applied then duplicate", got, err)
	}
	if _, err := r.Deliver(ctx, kafka.Message{Offset: 2, Value: []byte(`{"amount":1}`)}); !errors.Is(err, consumer.ErrMissingID) {
		t.Fatalf("Deliver without the member: %v, want ErrMissingID", err)
	}
}
