package idemotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/webhook"
)

// TestWebhookDeliveries: Telemetry.Webhook counts each delivery by provider
// and outcome (the provider's counters start at zero), records its
// duration, and keeps the Observe the configuration had.
func TestWebhookDeliveries(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, testenv.Migrate)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tel, err := idemotel.New(&idemotel.Config{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	github, err := webhook.GitHub("the webhook's secret")
	if err != nil {
		t.Fatal(err)
	}
	var before int
	cfg := &webhook.Config{Provider: "github", Verify: github,
		Observe: func(context.Context, webhook.Event) { before++ },
		HTTP:    idemhttp.Config{Store: store, FingerprintKeys: [][]byte{[]byte("idemotel tests: a fingerprint secret of 32 bytes or more")}}}
	if err := tel.Webhook(cfg); err != nil {
		t.Fatal(err)
	}
	recv, err := webhook.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := recv.Handler(webhook.HandlerFunc(func(context.Context, pgx.Tx, *webhook.Delivery) error { return nil }))
	deliver := func(id, body string, sign bool) int {
		r := httptest.NewRequest(http.MethodPost, "/webhooks/github", strings.NewReader(body))
		r.Header.Set("X-GitHub-Delivery", id)
		if sign {
			_ = github.Sign(r.Header, []byte(body), time.Now())
		} else {
			r.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	for _, d := range []struct {
		id, body string
		sign     bool
		status   int
	}{
		{"d-1", `{"ref":"refs/heads/main"}`, true, http.StatusOK},
		{"d-1", `{"ref":"refs/heads/main"}`, true, http.StatusOK},
		{"d-1", `{"ref":"refs/heads/dev"}`, true, http.StatusUnprocessableEntity},
		{"d-2", `{"ref":"refs/heads/main"}`, false, http.StatusUnauthorized},
	} {
		if got := deliver(d.id, d.body, d.sign); got != d.status {
			t.Fatalf("delivery %s %s: %d, want %d", d.id, d.body, got, d.status)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	pts := points(t, rm, "idemkit.webhook.deliveries")
	for outcome, n := range map[string]float64{"processed": 1, "duplicate": 1, "key_reused": 1, "bad_signature": 1,
		"bad_timestamp": 0, "failed": 0, "retry": 0} {
		if got, ok := pts[lbl("provider", "github", "outcome", outcome)]; !ok || got != n {
			t.Errorf("deliveries{provider=github,outcome=%s} = %v (present %v), want %v", outcome, got, ok, n)
		}
	}
	if d := points(t, rm, "idemkit.webhook.delivery.duration"); d[lbl("provider", "github", "outcome", "processed")] != 1 {
		t.Errorf("duration histogram %v", d)
	}
	if before != 4 {
		t.Errorf("the configuration's own Observe saw %d deliveries, want 4", before)
	}
}
