package console

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/migrate"
)

// A parked key is shown masked, and its raw bytes (even in hex) are in no
// page, no JSON, no audit target: a retry form names it by its handle, and
// the audit names it masked.
func TestParkedKeyNeverShownRaw(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.db.Table(migrate.ConsumerPositionsDefault)+
		` (consumer, topic, kafka_partition, next_offset) VALUES ($1, $2, 0, 1)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.db.Table(migrate.ParkedMessagesDefault)+
		` (consumer, topic, kafka_partition, kafka_offset, message_key, message_id, attempts, last_error, next_attempt_at)
		VALUES ($1, $2, 0, 0, $3, 'm-1', 1, 'declined', now() + interval '1 hour')`, e.group, e.topic, []byte(testPAN)); err != nil {
		t.Fatal(err)
	}
	page := "/consumers/" + url.PathEscape(e.group) + "/" + url.PathEscape(e.topic)
	panHex := hex.EncodeToString([]byte(testPAN))
	res := e.get(page)
	contains(t, "consumer page", res.body, "************1111") // the key is shown masked...
	var leaks []string
	if strings.Contains(res.body, panHex) {
		leaks = append(leaks, "HTML (hidden key_hex)")
	}
	var d consumerData
	e.getJSON(page, &d)
	if len(d.Parked) != 1 {
		t.Fatalf("parked: %+v", d.Parked)
	}
	if j := e.req("GET", page+"?format=json", nil).body; strings.Contains(j, panHex) || strings.Contains(j, testPAN) {
		leaks = append(leaks, "JSON")
	}
	// The retry names the key by its handle; the audit table and its page
	// name it masked.
	r := e.req("POST", page+"/retry", e.form("partition", "0", "key_id", d.Parked[0].KeyID))
	if r.status != http.StatusOK || !strings.Contains(r.body, "made 1 key(s) due now") {
		t.Fatalf("retry: %d\n%s", r.status, r.body)
	}
	if r := e.req("POST", page+"/retry", e.form("partition", "0", "key_id", d.Parked[0].KeyID[1:]+"A")); r.status != http.StatusNotFound {
		t.Errorf("retry of an unknown handle: %d\n%s", r.status, r.body)
	}
	if a := e.audit(); len(a) != 1 || !strings.Contains(a[0].Target, "key ************1111") {
		t.Errorf("audit: %+v, want the retry with the key masked", a)
	}
	for _, a := range e.audit() {
		if strings.Contains(a.Target, panHex) || strings.Contains(a.Target, testPAN) {
			leaks = append(leaks, "audit target "+a.Target)
		}
	}
	if strings.Contains(e.get("/audit").body, panHex) {
		leaks = append(leaks, "audit page")
	}
	if len(leaks) > 0 {
		t.Errorf("the parked key %q is masked on screen but readable unredacted (hex %s) in: %s", testPAN, panHex,
			strings.Join(leaks, "; "))
	}
}
