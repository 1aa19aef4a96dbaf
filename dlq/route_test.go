package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

var errInvalid = errors.New("invalid order")

// TestRouteByError: a Writer with Routes sends each failure to the
// dead-letter topic its error chooses, the rest to the default one; a
// redrive that fails again with another error goes where the consumer
// would send it, keeping its lineage; List over both topics groups the
// rounds of a message and counts it once, in the topic of its latest round.
func TestRouteByError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	invalid := e.topic + ".invalid"
	testenv.CreateTopic(t, invalid, 1)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger,
		Routes: []dlq.Route{dlq.RouteErrors(invalid, errInvalid)}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := w.Topics(e.topic); !slices.Equal(got, []string{invalid, e.dlq}) {
		t.Fatalf("Topics %v, want %v", got, []string{invalid, e.dlq})
	}
	e.produce("schema", "bug", "ok")
	e.consumeWith(3, func(m *consumer.Message, _ int) error {
		switch m.ID {
		case "schema":
			return retry.Permanent(fmt.Errorf("%w: no customer", errInvalid))
		case "bug":
			return retry.Permanent(errors.New("nil pointer"))
		}
		return nil
	}, func(c *consumer.Config) { c.OnFailure = w.OnFailure })

	ids := func(topic string) []string {
		t.Helper()
		l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: []string{topic}, Tables: migrate.Tables{Schema: e.db.Schema}})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range l.Messages {
			out = append(out, m.MessageID)
		}
		return out
	}
	if got, got2 := ids(invalid), ids(e.dlq); !slices.Equal(got, []string{"schema"}) || !slices.Equal(got2, []string{"bug"}) {
		t.Fatalf("%s holds %v, %s holds %v; want schema and bug", invalid, got, e.dlq, got2)
	}

	// The invalid order is replayed, and fails again for another reason:
	// it goes to the default topic, round 1, with its history.
	sum, err := e.reprocessor(dlq.Redrive, func(context.Context, pgx.Tx, *consumer.Message) error {
		return errors.New("tax service down")
	}, func(c *dlq.ReprocessorConfig) { c.Topic, c.Destination = invalid, w.Route }).Run(ctx)
	if err != nil || !maps.Equal(sum.Records, dlq.Counts{dlq.FailedAgain: 1}) {
		t.Fatalf("replay of %s: %v, %v", invalid, sum, err)
	}
	if got := ids(invalid); len(got) != 1 {
		t.Fatalf("%s holds %v: the failed-again letter came back to it", invalid, got)
	}
	l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: w.Topics(e.topic), Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Messages) != 2 || l.Messages[0].MessageID != "schema" || len(l.Messages[0].Letters) != 2 {
		t.Fatalf("listing: %+v", l.Messages)
	}
	first, again := l.Messages[0].Letters[0], l.Messages[0].Letters[1]
	if first.Message.Topic != invalid || first.State != dlq.StateSuperseded || again.Message.Topic != e.dlq ||
		again.State != dlq.StateUnresolved || again.Round != 1 || len(again.History) != 2 ||
		again.Origin != first.Origin || again.History[1].Error != "tax service down" {
		t.Fatalf("rounds of schema: %s %s round %d, then %s %s round %d history %+v", first.Message.Topic, first.State,
			first.Round, again.Message.Topic, again.State, again.Round, again.History)
	}
	// Counted per topic, in the topic of each message's latest round, with
	// their failures' range there: the same whether the listing keeps every
	// letter or none.
	want := map[string]map[dlq.State]int{invalid: {}, e.dlq: {dlq.StateUnresolved: 2}}
	t0, t1 := l.Messages[0].Latest().Last().LastFailure, l.Messages[1].Latest().Last().LastFailure
	var oldest, newest time.Time
	if t1.Before(t0) {
		oldest, newest = t1, t0
	} else {
		oldest, newest = t0, t1
	}
	for _, window := range []*dlq.Window{nil, {}} {
		l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: w.Topics(e.topic),
			Tables: migrate.Tables{Schema: e.db.Schema}, Window: window})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]map[dlq.State]int{}
		for topic, c := range l.ByTopic {
			got[topic] = c.States
		}
		if c := l.ByTopic[e.dlq]; !maps.EqualFunc(got, want, maps.Equal) || !c.Oldest.Equal(oldest) || !c.Newest.Equal(newest) {
			t.Fatalf("window %v: by topic %v, %s: %v .. %v; want %v, %v .. %v", window, got, e.dlq, c.Oldest, c.Newest,
				want, oldest, newest)
		}
		if window != nil && len(l.Messages) != 0 {
			t.Fatalf("a listing that counts only kept %d messages", len(l.Messages))
		}
	}

	// Fixed: replaying the default topic applies both, once.
	sum, err = e.reprocessor(dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) { c.Destination = w.Route }).Run(ctx)
	if err != nil || !maps.Equal(sum.Records, dlq.Counts{dlq.Applied: 2}) {
		t.Fatalf("replay of %s: %v, %v", e.dlq, sum, err)
	}
	if runs := e.runs(); !maps.Equal(runs, map[string]int{"schema": 1, "bug": 1, "ok": 1}) {
		t.Fatalf("effects %v, want each once", runs)
	}
}

func TestRoutesRejectBadConfig(t *testing.T) {
	t.Parallel()
	for i, r := range []dlq.Route{{Topic: "x"}, {Match: func(*consumer.Message, error) bool { return true }}} {
		_, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "g", Routes: []dlq.Route{r}})
		if !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("route %d: %v, want ErrInvalidConfig", i, err)
		}
	}
}

// TestRoutePanicIsNoMatch: a Match that panics counts as no match.
func TestRoutePanicIsNoMatch(t *testing.T) {
	t.Parallel()
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "g", Routes: []dlq.Route{
		{Topic: "orders.broken", Match: func(*consumer.Message, error) bool { panic("oops") }},
		dlq.RouteErrors("orders.invalid", errInvalid),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m := &consumer.Message{ID: "m"}
	m.Topic = "orders"
	if got := w.Route(m, fmt.Errorf("x: %w", errInvalid)); got != "orders.invalid" {
		t.Fatalf("Route %q, want orders.invalid", got)
	}
	if got := w.Route(m, errors.New("other")); got != "orders.dlq" {
		t.Fatalf("Route %q, want orders.dlq", got)
	}
}

// TestRepublishKeepsLineageAcrossRoutes: a letter republished from one
// destination that the consumer fails again for another error goes to the
// destination of that error, with its origin, round and history.
func TestRepublishKeepsLineageAcrossRoutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	invalid := e.topic + ".invalid"
	testenv.CreateTopic(t, invalid, 1)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger,
		Routes: []dlq.Route{dlq.RouteErrors(invalid, errInvalid)}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	routed := func(c *consumer.Config) { c.OnFailure = w.OnFailure }
	e.produce("order")
	e.consumeWith(1, func(*consumer.Message, int) error {
		return retry.Permanent(fmt.Errorf("%w: no customer", errInvalid))
	}, routed)
	sum, err := e.reprocessor(dlq.Republish, nil, func(c *dlq.ReprocessorConfig) { c.Topic = invalid }).Run(ctx)
	if err != nil || !maps.Equal(sum.Records, dlq.Counts{dlq.Republished: 1}) {
		t.Fatalf("republish from %s: %v, %v", invalid, sum, err)
	}
	e.consumeWith(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("tax service down")) }, routed)

	l, err := dlq.List(ctx, e.db.Pool, &dlq.ListConfig{Kafka: testenv.Kafka(t), Topics: w.Topics(e.topic), Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Messages) != 1 || len(l.Messages[0].Letters) != 2 {
		t.Fatalf("listing: %+v", l.Messages)
	}
	m := l.Messages[0]
	first, again := m.Letters[0], m.Letters[1]
	if first.Message.Topic != invalid || first.State != dlq.StateSuperseded || again.Message.Topic != e.dlq ||
		again.Round != 1 || again.Origin != first.Origin || len(again.History) != 2 || m.State != dlq.StateUnresolved {
		t.Fatalf("rounds: %s %s round %d origin %+v, then %s %s round %d origin %+v history %+v", first.Message.Topic,
			first.State, first.Round, first.Origin, again.Message.Topic, again.State, again.Round, again.Origin, again.History)
	}
}
