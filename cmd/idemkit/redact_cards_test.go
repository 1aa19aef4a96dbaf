package main

import (
	"flag"
	"strings"
	"testing"
)

// Card numbers the default redaction must mask (every digit but the last four).
// Card numbers next to letters, grouped by dots or double spaces, or used as
// a JSON field name are masked too.
func TestRedactionCatchesCardShapes(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var r redactor
	r.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := r.init(fs); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{
		"declined card_4111111111111111",   // '_' is a word character: no \b
		"pan4111111111111111",              // glued to a letter
		"4111.1111.1111.1111",              // dots
		"4111  1111  1111  1111",           // two spaces
		`{"note":"ref:x4111111111111111"}`, // in a JSON string
		`{"4111111111111111":"k"}`,         // JSON field name
	} {
		for _, out := range []string{r.text(in), r.value([]byte(in))} {
			if strings.Contains(strings.NewReplacer(".", "", " ", "").Replace(out), "411111111111") {
				t.Errorf("redacted %q = %q: the card number is still there", in, out)
			}
		}
	}
}
