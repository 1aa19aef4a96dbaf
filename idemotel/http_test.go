package idemotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestTraceFromHTTPToConsumer: one trace runs from an HTTP request with an
// Idempotency-Key (its span carries account, operation, key and outcome),
// through EnqueueTx in the request's transaction, the relay and Kafka, into
// the consumer's span; a replay of the request gets a span marked replay
// and enqueues nothing.
func TestTraceFromHTTPToConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()

	ocfg := &outbox.Config{Tables: migrate.Tables{Schema: e.db.Schema}}
	if err := e.tel.Outbox(ocfg); err != nil {
		t.Fatal(err)
	}
	store, err := outbox.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	records, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	hcfg := &idemhttp.Config{Store: records, Account: func(r *http.Request) (string, error) { return "acct-1", nil },
		FingerprintKeys: [][]byte{[]byte("idemotel tests: a fingerprint secret of 32 bytes or more")}}
	front, err := e.tel.HTTP(hcfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(e.db.Pool, hcfg)
	if err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		if _, err := store.EnqueueTx(r.Context(), tx, outbox.Message{Topic: e.topic, Key: []byte("acct-1"),
			Value: []byte("PaymentCreated")}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(front(mw.Handler(handler)))
	defer srv.Close()
	post := func() *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, "pay-7")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	if r := post(); r.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %d", r.StatusCode)
	}
	if r := post(); r.StatusCode != http.StatusCreated || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %v", r.StatusCode, r.Header)
	}
	if st, err := store.Stats(ctx, e.db.Pool); err != nil || st.Backlog != 1 {
		t.Fatalf("outbox backlog %+v, %v: want the one message of the first request", st, err)
	}

	relay, err := outbox.NewRelay(e.db.Pool, store, &outbox.RelayConfig{Kafka: testenv.Kafka(t)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancelRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() { cancelRelay(); <-relayDone }()

	cfg := e.config(nil)
	cfg.IDHeader = outbox.HeaderID
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

	var first, replay, consumed sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		switch {
		case s.SpanKind() == trace.SpanKindServer && spanAttr(s, idemotel.AttrHTTPOutcome) == "first":
			first = s
		case s.SpanKind() == trace.SpanKindServer && spanAttr(s, idemotel.AttrHTTPOutcome) == "replay":
			replay = s
		case s.SpanKind() == trace.SpanKindConsumer:
			consumed = s
		}
	}
	if first == nil || replay == nil || consumed == nil {
		t.Fatalf("spans: first %v, replay %v, consumer %v", first != nil, replay != nil, consumed != nil)
	}
	if spanAttr(first, idemotel.AttrAccount) != "acct-1" || spanAttr(first, idemotel.AttrIdempotencyKey) != "pay-7" ||
		spanAttr(first, idemotel.AttrOperation) == "" {
		t.Fatalf("first request's span attributes %v", first.Attributes())
	}
	if consumed.SpanContext().TraceID() != first.SpanContext().TraceID() || consumed.Parent().SpanID() != first.SpanContext().SpanID() {
		t.Fatalf("consumer span in trace %s under %s; want trace %s under the first request's span %s",
			consumed.SpanContext().TraceID(), consumed.Parent().SpanID(), first.SpanContext().TraceID(), first.SpanContext().SpanID())
	}
	pts := points(t, e.collect(), "idemkit.http.requests")
	if pts["operation="+spanAttr(first, idemotel.AttrOperation)+",outcome=first"] != 1 ||
		pts["operation="+spanAttr(first, idemotel.AttrOperation)+",outcome=replay"] != 1 {
		t.Fatalf("request counters %v", pts)
	}
}

// TestStuckRecordsGauge: a record in flight past its lease shows in a
// Monitor's idemkit_http_stuck_records.
func TestStuckRecordsGauge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	records, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	_ = records
	e.runMonitor(idemotel.MonitorConfig{})
	table := lbl("table", e.db.Schema+".idempotency_records")
	e.eventually("idemkit.http.stuck_records", "0 before", func(m map[string]float64) bool { v, ok := m[table]; return ok && v == 0 })
	now := time.Now()
	if _, err := e.db.Pool.Exec(context.Background(), `INSERT INTO `+e.db.Table("idempotency_records")+` (account, operation,
		idempotency_key, fingerprint, state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ('acct-1', 'POST /payments', 'k-1', '\x00', 'PROCESSING', 7, $1, $2, $2, $3)`,
		now.Add(-time.Minute), now.Add(-2*time.Minute), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	e.eventually("idemkit.http.stuck_records", "1 stuck", func(m map[string]float64) bool { return m[table] == 1 })
}
