package idemotel_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testobs"
)

// produced is a message produced inside a span of its own, with the span's
// context injected into its headers.
func (e *env) produced(id, key string, ctx context.Context) (kafka.Message, trace.SpanContext) {
	ctx, span := e.tp.Tracer("producer").Start(ctx, "send "+id, trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	m := msg(id, key)
	e.tel.Inject(ctx, &m.Headers)
	return m, span.SpanContext()
}

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// spansNamed returns the ended spans named name, in end order.
func (e *env) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// TestSpanContinuesProducerTrace: a message produced with a traceparent
// header is processed in a span of the same trace, child of the producer's
// span, with the messaging attributes; a span the handler starts from its
// context is the transaction span's child and the handler sees the
// producer's baggage. A message that fails once gets a failed span and a
// retry span with the retry event.
func TestSpanContinuesProducerTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	m1, producer1 := e.produced("one", "k", baggage.ContextWithBaggage(context.Background(), bag))
	m2, producer2 := e.produced("flaky", "k", context.Background())
	e.produce(m1, m2)

	var mu sync.Mutex
	tenant := ""
	var handlerSpans []trace.SpanContext
	failed := false
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, span := e.tp.Tracer("app").Start(ctx, "apply "+m.ID)
		defer span.End()
		mu.Lock()
		defer mu.Unlock()
		if m.ID == "one" {
			tenant = baggage.FromContext(ctx).Member("tenant").Value()
			handlerSpans = append(handlerSpans, span.SpanContext())
		}
		if m.ID == "flaky" && !failed {
			failed = true
			return errors.New("try again")
		}
		return e.effect(ctx, tx, m)
	})
	cfg.BatchSize = 1
	oc := newOutcomes(2)
	testobs.Of(cfg).OnOutcome = oc.hook
	if _, err := e.tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	wait(t, oc.done, "2 outcomes")
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	spans := e.spansNamed("process " + e.topic)
	if len(spans) != 3 {
		t.Fatalf("%d process spans, want 3 (one, flaky failed, flaky retried)", len(spans))
	}
	one := spans[0]
	if one.SpanContext().TraceID() != producer1.TraceID() || one.Parent().SpanID() != producer1.SpanID() ||
		!one.Parent().IsRemote() {
		t.Errorf("span of the message: trace %s parent %s, want trace %s parent %s (remote)",
			one.SpanContext().TraceID(), one.Parent().SpanID(), producer1.TraceID(), producer1.SpanID())
	}
	if one.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span kind %s, want consumer", one.SpanKind())
	}
	a := attrMap(one.Attributes())
	want := map[attribute.Key]string{
		"messaging.system":                   "kafka",
		"messaging.operation.type":           "process",
		"messaging.operation.name":           "process",
		"messaging.destination.name":         e.topic,
		"messaging.destination.partition.id": "0",
		"messaging.consumer.group.name":      e.group,
		"messaging.message.id":               "one",
		"messaging.kafka.offset":             "0",
		"idemkit.consumer":                   e.group,
		"idemkit.attempt":                    "1",
		"idemkit.outcome":                    "applied",
	}
	for k, v := range want {
		if got := a[k].Emit(); got != v {
			t.Errorf("attribute %s = %q, want %q", k, got, v)
		}
	}
	if len(handlerSpans) != 1 || handlerSpans[0].TraceID() != producer1.TraceID() {
		t.Fatalf("handler spans %v: want one in the producer's trace", handlerSpans)
	}
	for _, s := range e.spansNamed("apply one") {
		if s.Parent().SpanID() != one.SpanContext().SpanID() {
			t.Errorf("the handler's span has parent %s, want the transaction's span %s", s.Parent().SpanID(), one.SpanContext().SpanID())
		}
	}
	if tenant != "acme" {
		t.Errorf("the handler saw baggage tenant=%q, want acme", tenant)
	}

	// The failed attempt: an error status and the error recorded; the retry:
	// attempt 2 with the retry event, same parent.
	bad, retried := spans[1], spans[2]
	if bad.Status().Code != codes.Error || len(bad.Events()) == 0 || bad.Events()[0].Name != "exception" {
		t.Errorf("failed attempt: status %v, events %v: want an error and an exception event", bad.Status(), bad.Events())
	}
	if got := attrMap(bad.Attributes())["idemkit.outcome"]; got.Type() != attribute.INVALID {
		t.Errorf("failed attempt has outcome %s, want none", got.Emit())
	}
	for _, s := range []sdktrace.ReadOnlySpan{bad, retried} {
		if s.Parent().SpanID() != producer2.SpanID() {
			t.Errorf("span %v: parent %s, want the producer's %s", attrMap(s.Attributes())["idemkit.attempt"].Emit(), s.Parent().SpanID(), producer2.SpanID())
		}
	}
	ra := attrMap(retried.Attributes())
	if ra["idemkit.attempt"].AsInt64() != 2 || ra["idemkit.outcome"].AsString() != "applied" || retried.Status().Code == codes.Error {
		t.Errorf("retry span: attributes %v status %v: want attempt 2, applied", ra, retried.Status())
	}
	if ev := retried.Events(); len(ev) != 1 || ev[0].Name != idemotel.EventRetry {
		t.Errorf("retry span events %v, want one %s", ev, idemotel.EventRetry)
	} else if ea := attrMap(ev[0].Attributes); ea["idemkit.retry.attempt"].AsInt64() != 1 ||
		ea["idemkit.retry.class"].AsString() != "transient" || ea["exception.message"].AsString() != "try again" {
		t.Errorf("retry event attributes %v", ea)
	}
}

// TestBatchSpanLinksMessages: a transaction of several messages has one
// span, linked to each message's producer span.
func TestBatchSpanLinksMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	var msgs []kafka.Message
	var producers []trace.SpanContext
	for i := range 3 {
		m, sc := e.produced("m"+strconv.Itoa(i), "k", context.Background())
		msgs, producers = append(msgs, m), append(producers, sc)
	}
	msgs = append(msgs, msg("untraced", "k")) // no traceparent: no link
	e.produce(msgs...)

	cfg := e.config(nil)
	cfg.BatchSize = 4
	cfg.BatchLinger = 5 * time.Second // the four messages share one transaction
	oc := newOutcomes(4)
	testobs.Of(cfg).OnOutcome = oc.hook
	if _, err := e.tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	wait(t, oc.done, "4 outcomes")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	spans := e.spansNamed("process " + e.topic)
	if len(spans) != 1 {
		t.Fatalf("%d process spans, want 1", len(spans))
	}
	s := spans[0]
	a := attrMap(s.Attributes())
	if a["messaging.batch.message_count"].AsInt64() != 4 || a["idemkit.messages.applied"].AsInt64() != 4 {
		t.Errorf("batch span attributes %v: want 4 messages, 4 applied", a)
	}
	if _, ok := a["messaging.message.id"]; ok {
		t.Errorf("a batch span carries a message ID")
	}
	links := s.Links()
	if len(links) != 3 {
		t.Fatalf("%d links, want 3", len(links))
	}
	for i, l := range links {
		la := attrMap(l.Attributes)
		if l.SpanContext.SpanID() != producers[i].SpanID() || l.SpanContext.TraceID() != producers[i].TraceID() ||
			la["messaging.message.id"].AsString() != "m"+strconv.Itoa(i) || la["messaging.kafka.offset"].AsInt64() != int64(i) {
			t.Errorf("link %d: %v %v, want producer %v, message m%d at offset %d", i, l.SpanContext, la, producers[i], i, i)
		}
	}
	if s.Parent().IsValid() {
		t.Errorf("batch span has parent %v, want a root", s.Parent())
	}
}

// TestInjectExtract: Inject writes W3C headers without touching the
// caller's slice, replaces stale ones, and Extract reads them back.
func TestInjectExtract(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tp.Tracer("t").Start(context.Background(), "produce")
	defer span.End()
	shared := []kafka.Header{{Key: "message-id", Value: []byte("x")}, {Key: "traceparent", Value: []byte("stale")}}
	headers := shared[:2:2]
	tel.Inject(ctx, &headers)
	if string(shared[1].Value) != "stale" {
		t.Errorf("Inject changed the caller's backing array")
	}
	n := 0
	for _, h := range headers {
		if h.Key == "traceparent" {
			n++
		}
	}
	if n != 1 || len(headers) != 2 {
		t.Errorf("headers after Inject %v: want message-id and one traceparent", headers)
	}
	got := trace.SpanContextFromContext(tel.Extract(context.Background(), headers))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsRemote() {
		t.Errorf("Extract = %v, want the injected span %v", got, span.SpanContext())
	}
	empty := []kafka.Header(nil)
	tel.Inject(context.Background(), &empty)
	if len(empty) != 0 {
		t.Errorf("Inject without a span wrote %v", empty)
	}
}
