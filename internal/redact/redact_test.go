package redact_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/redact"
)

// TestRedactor: the CLI's rules, as the console gets them: cards keep their
// last four digits, sensitive names and token shapes are masked whole, the
// caller's names and patterns too; Show shows everything.
func TestRedactor(t *testing.T) {
	t.Parallel()
	r := redact.New([]string{"memo"}, []*regexp.Regexp{regexp.MustCompile(`ORD-\d+`)})
	got := r.Value([]byte(`{"card":"4111111111111111","note":"pan 4111111111111111","memo":"x","ref":"ORD-42","token":"t"}`))
	for _, bad := range []string{"4111111111111111", `"x"`, "ORD-42", `"t"`} {
		if strings.Contains(got, bad) {
			t.Errorf("Value kept %s: %s", bad, got)
		}
	}
	if !strings.Contains(got, "************1111") {
		t.Errorf("Value lost the card's last four digits: %s", got)
	}
	if got := r.Header("Authorization", []byte("Bearer abc")); got != redact.Mark {
		t.Errorf("Header(Authorization) = %q", got)
	}
	if got := r.Text("failed: Bearer eyJhbGciOi.eyJzdWIiOi.sig"); strings.Contains(got, "eyJ") {
		t.Errorf("Text kept a token: %q", got)
	}
	show := &redact.Redactor{Show: true}
	if got := show.Value([]byte(`{"card":"4111111111111111"}`)); !strings.Contains(got, "4111111111111111") {
		t.Errorf("Show masked: %q", got)
	}
	if got := r.Bytes([]byte{0xff}); got != "(1 bytes, not UTF-8)" {
		t.Errorf("Bytes(binary) = %q", got)
	}
}
