package idemhttp_test

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// A charge endpoint whose handler calls a payment provider itself: its key is
// held by a record of its own, so that a request whose holder crashed waits
// for the reconciler instead of running again. The fingerprint counts only
// the members that define the charge, and the fingerprint secret is being
// rotated.
func ExampleConfig_noLeaseTakeover() {
	newSecret, oldSecret := []byte(os.Getenv("IDEMPOTENCY_SECRET")), []byte(os.Getenv("IDEMPOTENCY_SECRET_OLD"))
	cfg := &idemhttp.Config{
		FingerprintKeys: [][]byte{newSecret, oldSecret}, // the first keys new fingerprints; both match stored ones
		Account:         func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Intent:          idemhttp.IntentJSON("/orderId", "/amount", "/currency"),
		NoLeaseTakeover: true,             // stuck records go to your Reconciler (Store.Reconcile)
		Lease:           30 * time.Second, // the handler's context ends then
		TTL:             72 * time.Hour,   // longer than any client's retries
		Wait:            5 * time.Second,  // a concurrent retry waits for the first answer
	}
	if err := cfg.Validate(); err != nil {
		fmt.Println(err) // for example a secret shorter than MinFingerprintKeyLength
	}
}
