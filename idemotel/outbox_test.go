package idemotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// TestOutboxCarriesTheTrace: a message enqueued in a span's context is
// published by the relay with that trace context, and the consumer's span
// for it belongs to the same trace, as a child of the enqueuing span.
func TestOutboxCarriesTheTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ocfg := &outbox.Config{Tables: migrate.Tables{Schema: e.db.Schema}}
	if err := e.tel.Outbox(ocfg); err != nil {
		t.Fatal(err)
	}
	store, err := outbox.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(e.db.Pool, store, &outbox.RelayConfig{Kafka: testenv.Kafka(t)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancelRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() { cancelRelay(); <-relayDone }()

	ctx, span := e.tp.Tracer("http").Start(context.Background(), "POST /payments")
	if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		_, err := store.EnqueueTx(ctx, tx, outbox.Message{Topic: e.topic, Key: []byte("acct-1"), Value: []byte("PaymentCreated"),
			Headers: nil})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	span.End()

	cfg := e.config(nil)
	cfg.IDHeader = outbox.HeaderID // the relay's stable ID
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	if _, err := e.tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	select {
	case <-oc.done:
	case <-time.After(90 * time.Second):
		t.Fatal("the outbox message was not consumed")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range e.spans.Ended() {
		if s.SpanKind().String() != "consumer" {
			continue
		}
		found = true
		if s.SpanContext().TraceID() != span.SpanContext().TraceID() || s.Parent().SpanID() != span.SpanContext().SpanID() {
			t.Fatalf("consumer span trace %s parent %s, want trace %s parent %s", s.SpanContext().TraceID(), s.Parent().SpanID(),
				span.SpanContext().TraceID(), span.SpanContext().SpanID())
		}
	}
	if !found {
		t.Fatal("no consumer span")
	}
}

// TestRelayMetrics: a relay wired with Telemetry.Relay counts what it
// published, and a Monitor reports the backlog, under the names of the docs.
func TestRelayMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	rcfg := &outbox.RelayConfig{Kafka: testenv.Kafka(t), StatsInterval: 20 * time.Millisecond}
	published := make(chan int, 16)
	testobs.OutboxOf(&rcfg.Observers).OnPublished = func(recs []outbox.Record) { published <- len(recs) } // the user's own hook
	if err := e.tel.Relay(store, rcfg); err != nil {
		t.Fatal(err)
	}
	e.runMonitor(idemotel.MonitorConfig{})
	relay, err := outbox.NewRelay(e.db.Pool, store, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := pgx.BeginFunc(context.Background(), e.db.Pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(context.Background(), tx, outbox.Message{Topic: e.topic, Key: []byte("k"), Value: []byte{byte('a' + i)}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() { cancel(); <-done }()
	n := 0
	for n < 3 {
		select {
		case k := <-published:
			n += k
		case <-time.After(60 * time.Second):
			t.Fatalf("%d of 3 published", n)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rm := e.collect()
		pub := points(t, rm, "idemkit.outbox.messages")["outcome=published,table="+e.db.Schema+".idemkit_outbox"]
		lat := points(t, rm, "idemkit.outbox.publish_latency")["table="+e.db.Schema+".idemkit_outbox"]
		backlog, seen := points(t, rm, "idemkit.outbox.backlog_messages")["table="+e.db.Schema+".idemkit_outbox"]
		if pub == 3 && lat == 3 && seen && backlog == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("published %v (want 3), latency samples %v (want 3), backlog %v seen %v (want 0)", pub, lat, backlog, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
