package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// The scenario against the test server: every delivery gets the answer a
// provider must get, and every effect happens once.
func TestScenario(t *testing.T) {
	db := testenv.NewDB(t) // an empty schema, dropped at cleanup; run migrates it
	var out bytes.Buffer
	if err := run(context.Background(), testenv.DatabaseURL(t), db.Schema, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if strings.Contains(out.String(), "WRONG") {
		t.Fatalf("a check failed:\n%s", out.String())
	}
	for _, want := range []string{
		"every delivery answered as expected; every effect happened once",
		"→ 401 signature_invalid",
		"→ 401 timestamp_invalid",
		"→ 422 idempotency_key_reused",
		"→ 200 failed (replayed)",
		`level=ERROR msg="webhook: event ID reused with another body; nothing ran (422)" provider=stripe`,
		// The counters by provider and outcome.
		`idemkit_webhook_deliveries_total{outcome="processed",provider="stripe"} 2`,
		`idemkit_webhook_deliveries_total{outcome="duplicate",provider="stripe"} 2`,
		`idemkit_webhook_deliveries_total{outcome="bad_signature",provider="stripe"} 1`,
		`idemkit_webhook_deliveries_total{outcome="bad_timestamp",provider="stripe"} 1`,
		`idemkit_webhook_deliveries_total{outcome="key_reused",provider="stripe"} 1`,
		`idemkit_webhook_deliveries_total{outcome="failed",provider="stripe"} 1`,
		`idemkit_webhook_deliveries_total{outcome="processed",provider="github"} 2`,
		`idemkit_webhook_deliveries_total{outcome="bad_signature",provider="github"} 1`,
		`idemkit_webhook_deliveries_total{outcome="key_reused",provider="github"} 1`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}
