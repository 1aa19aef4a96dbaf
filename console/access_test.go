package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
	"github.com/segmentio/kafka-go"
)

// Every route, every method, every way of asking: without credentials
// nothing but the sign-in page and the static files answers 2xx, and no
// action runs.
func TestNoAnonymousAccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BasePath = "/console" })
	e.deadLetter(0, "pay-1", "k", `{"card":"4111111111111111"}`, retry.Permanent(errors.New("boom")))
	id := e.deadOutboxMessage("orders", "k", "boom")
	t1 := url.PathEscape(e.dlq)
	paths := []string{"/console", "/console/", "/console/audit", "/console/audit/", "/console/outbox", "/console/consumers",
		"/console/idemhttp", "/console/dlq/" + t1, "/console/dlq/" + t1 + "/", "/console/dlq/" + t1 + "/0/0",
		"/console/dlq/" + t1 + "/0/0/reveal", "/console/dlq/" + t1 + "/replay", "/console/dlq/" + t1 + "/replay/dry-run",
		"/console/outbox/retry", "/console/idemhttp/resolve", "/console/consumers/g/t", "/console/consumers/g/t/retry",
		"/console/%61udit", "/console/AUDIT", "/console/audit;x", "/console/audit%2f", "/console/static/../audit",
		"/console/static/%2e%2e/audit", "/console/dlq/" + strings.ReplaceAll(t1, ".", "%2e") + "/0/0"}
	methods := []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
	for _, p := range paths {
		for _, m := range methods {
			for _, variant := range [][]string{{}, {"Accept", "application/json"}, {"Accept", "*/*"}} {
				q := p
				if len(variant) == 0 {
					q += "?format=json"
				}
				form := e.form("id", id, "scope", "filtered")
				hdr := append([]string{"Authorization", ""}, variant...)
				res := e.req(m, q, form, hdr...)
				if res.status >= 200 && res.status < 300 {
					t.Errorf("%s %s %v without credentials: %d\n%.300s", m, q, variant, res.status, res.body)
				}
				if strings.Contains(res.body, "4111") {
					t.Errorf("%s %s: payload in an anonymous answer", m, q)
				}
				if loc := res.header.Get("Location"); loc != "" && !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") {
					t.Errorf("%s %s: redirect to %q", m, q, loc)
				}
			}
		}
	}
	// Wrong credentials of every form.
	for _, h := range [][]string{{"Authorization", "Bearer " + testToken + "x"}, {"Authorization", "Bearer "},
		{"Authorization", "Basic " + testToken}, {"Authorization", "", "Cookie", e.console.cookieName(false) + "=" + testToken},
		{"Authorization", "", "Cookie", e.console.cookieName(false) + "="}, {"Authorization", "Bearer  " + testToken}} {
		if res := e.req("GET", "/console/audit?format=json", nil, h...); res.status != http.StatusUnauthorized {
			t.Errorf("%q: %d", h, res.status)
		}
	}
	if len(e.audit()) != 0 || e.originMessages() != 0 {
		t.Fatal("an anonymous request acted")
	}
}

// Forms: tokens only from the body, never from the query; cross-site
// requests refused, sign-in included; tokens of others, forged, altered.
func TestFormTokensRefuseForgery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.deadOutboxMessage("orders", "k", "boom")
	tok := e.console.forms.issue(testName, actOutboxRetry)
	// A token in the URL of a GET or of a POST: refused.
	if res := e.req("GET", "/outbox/retry?csrf="+url.QueryEscape(tok)+"&id="+id, nil); res.status == http.StatusOK {
		t.Errorf("GET with the token in the query: %d", res.status)
	}
	if res := e.req("POST", "/outbox/retry?csrf="+url.QueryEscape(tok)+"&id="+id, url.Values{"id": {id}}); res.status != http.StatusForbidden {
		t.Errorf("POST with the token in the query: %d", res.status)
	}
	// Cross-site, by every header a browser sends.
	for _, h := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"}, {"Origin", "null"}, {"Origin", "http://example.com.evil.example"}} {
		if res := e.req("POST", "/outbox/retry", e.form("id", id), h...); res.status != http.StatusForbidden {
			t.Errorf("POST with %q: %d", h, res.status)
		}
		if res := e.req("POST", "/login", url.Values{"token": {testToken}}, append([]string{"Authorization", ""}, h...)...); res.status != http.StatusForbidden {
			t.Errorf("sign-in with %q: %d", h, res.status)
		}
	}
	// A token cut, padded, with its MAC of another principal, its time moved.
	b := []byte(tok)
	b[len(b)-1] ^= 1
	for _, bad := range []string{tok[:len(tok)-1], tok + "A", string(b), strings.ToUpper(tok), " " + tok} {
		if res := e.req("POST", "/outbox/retry", url.Values{"csrf": {bad}, "id": {id}}); res.status != http.StatusForbidden {
			t.Errorf("token %q: %d", bad, res.status)
		}
	}
	// Multipart: not parsed, so no token.
	if res := e.req("POST", "/outbox/retry", nil, "Content-Type", "multipart/form-data; boundary=x"); res.status != http.StatusForbidden {
		t.Errorf("multipart: %d", res.status)
	}
	if len(e.audit()) != 0 {
		t.Fatalf("refused forms audited: %+v", e.audit())
	}
}

// Every field an attacker can write (dead-letter headers, history, key,
// header names; outbox errors and destinations; idempotency keys; the
// principal; query parameters; paths) is escaped; JSON is JSON.
func TestEveryFieldIsEscaped(t *testing.T) {
	t.Parallel()
	const x = `"'><x-xss>`
	principal := "op" + x
	e := newEnv(t, func(c *Config) {
		c.Authorize = func(r *http.Request) (Principal, error) {
			if r.Header.Get("Authorization") != "Bearer "+testToken {
				return Principal{}, ErrUnauthorized
			}
			return Principal{Name: principal}, nil
		}
	})
	now := time.Now().UTC().Format(time.RFC3339Nano)
	history := fmt.Sprintf(`[{"round":0,"error":%q,"class":%q,"attempts":1,"first_failure":%q,"last_failure":%q}]`,
		"err"+x, "cls"+x, now, now)
	testenv.Produce(t, e.dlq, 0, kafka.Record{Key: kafka.NewBytes([]byte("key" + x)), Value: kafka.NewBytes([]byte("val" + x)),
		Headers: []kafka.Header{{Key: dlq.HeaderOriginTopic, Value: []byte("topic" + x)}, {Key: dlq.HeaderOriginPartition, Value: []byte("0")},
			{Key: dlq.HeaderOriginOffset, Value: []byte("0")}, {Key: dlq.HeaderMessageID, Value: []byte("id" + x)},
			{Key: dlq.HeaderConsumer, Value: []byte("cons" + x)}, {Key: dlq.HeaderGroup, Value: []byte("grp" + x)},
			{Key: dlq.HeaderHistory, Value: []byte(history)}, {Key: "hk" + x, Value: []byte("hv" + x)}}})
	e.deadOutboxMessage("dest", "okey"+x, "oerr"+x)
	e.idemRecord("acct"+x, "op"+x, "ikey"+x, 7, -time.Minute)
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {autoToken + principal}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	type hit struct{ method, path string }
	var pages []response
	var names []hit
	add := func(m, p string, f url.Values) {
		pages = append(pages, e.req(m, p, f))
		names = append(names, hit{m, p})
	}
	q := "?origin=" + url.QueryEscape(x) + "&class=" + url.QueryEscape(x) + "&error=" + url.QueryEscape(x) + "&message_id=" + url.QueryEscape(x)
	add("GET", "/", nil)
	add("GET", base, nil)
	add("GET", base+q, nil)
	add("GET", base+"?since="+url.QueryEscape(x), nil)
	add("GET", base+"/0/0", nil)
	add("POST", base+"/0/0/reveal", form())
	add("POST", base+"/replay/dry-run", form("scope", "selected", "id", "id"+x, "origin", "topic"+x))
	add("POST", base+"/replay", form("scope", "selected", "id", "id"+x, "id", "other"+x))
	add("GET", "/outbox", nil)
	add("POST", "/outbox/retry", form("id", "id"+x))
	add("GET", "/idemhttp", nil)
	add("POST", "/idemhttp/resolve", form("account", "acct"+x, "operation", "op"+x, "key", "ikey"+x, "token", "7", "decision", "mark-failed"))
	add("POST", "/idemhttp/resolve", form("decision", "d"+x, "token", "1"))
	add("GET", "/consumers", nil)
	add("GET", "/consumers/"+url.PathEscape("c"+x)+"/t", nil)
	add("GET", "/nowhere/"+url.PathEscape(x), nil)
	add("GET", "/audit", nil)
	for i, res := range pages {
		ct := res.header.Get("Content-Type")
		t.Logf("%s %s: %d, escaped payloads %d", names[i].method, names[i].path, res.status, strings.Count(res.body, "&lt;x-xss&gt;"))
		if strings.Contains(res.body, "<x-xss>") {
			t.Errorf("%s %s (%d, %s): unescaped markup:\n%s", names[i].method, names[i].path, res.status, ct, res.body)
		}
		if !strings.HasPrefix(ct, "text/html") && !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s: Content-Type %q", names[i].method, names[i].path, ct)
		}
		if res.header.Get("X-Content-Type-Options") != "nosniff" || res.header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: headers %v", names[i].method, names[i].path, res.header)
		}
	}
	// The same as JSON: application/json, markup escaped by the encoder.
	for _, p := range []string{"/", base, base + "/0/0", "/outbox", "/idemhttp", "/audit", "/nowhere"} {
		res := e.req("GET", p+"?format=json", nil)
		if !strings.HasPrefix(res.header.Get("Content-Type"), "application/json") || strings.Contains(res.body, "<x-xss>") ||
			res.header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s JSON: %v\n%s", p, res.header, res.body)
		}
	}
}

// The same form submitted many times at once acts once; a missing audit
// table refuses every action.
func TestConcurrentSubmitsActOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 3 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{}`, retry.Permanent(errors.New("boom")))
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	f := e.form("scope", "filtered")
	e.resolveForm(base+"/replay", f)
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i] = e.req("POST", base+"/replay", f).status })
	}
	wg.Wait()
	if n := e.originMessages(); n != 3 {
		t.Errorf("the same form posted 8 times at once: %d messages republished, want 3 (%v)", n, codes)
	}
	if a := e.audit(); len(a) != 1 {
		t.Errorf("audit: %+v", a)
	}
	// Without the audit table: refused, nothing done.
	id := e.deadOutboxMessage("orders", "k", "boom")
	if _, err := e.db.Pool.Exec(context.Background(), `DROP TABLE `+e.db.Table(e.console.tables.ConsoleAudit)); err != nil {
		t.Fatal(err)
	}
	res := e.req("POST", "/outbox/retry", e.form("id", id))
	var d outboxData
	e.getJSON("/outbox", &d)
	if res.status != http.StatusInternalServerError || d.DeadCount != 1 {
		t.Errorf("retry without an audit table: %d, dead %d\n%s", res.status, d.DeadCount, res.body)
	}
	res = e.req("POST", base+"/0/0/reveal", e.form())
	if strings.Contains(res.body, `{}`) && res.status == http.StatusOK {
		t.Errorf("reveal without an audit table: %d", res.status)
	}
}

// Bad input: a clear 4xx, no crash, no huge allocation.
func TestBadInputIsAClearError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.deadLetter(0, "pay-1", "k", `{}`, retry.Permanent(errors.New("boom")))
	base := "/dlq/" + url.PathEscape(e.dlq)
	long := strings.Repeat("a", 1001)
	for p, want := range map[string]int{
		base + "?size=-1": 400, base + "?size=501": 400, base + "?page=-5": 400, base + "?page=99999999999999999999": 400,
		base + "?page=1073741824&size=500": 200, base + "?since=2026-13-45T99:99": 400, base + "?since=0000-01-01T00:00:00Z": 200,
		base + "?until=9999-12-31T23:59:59Z&since=9999-12-31T23:59:59Z": 400, base + "?error=" + long: 400,
		base + "/-1/0": 400, base + "/0/-1": 400, base + "/0/99999999999999999999": 400, base + "/2147483648/0": 404,
		"/dlq/" + strings.Repeat("x", 300) + ".dlq": 404, "/consumers/" + long + "/t": 400,
	} {
		if res := e.req("GET", p, nil); res.status != want {
			t.Errorf("GET %.120s: %d, want %d", p, res.status, want)
		}
	}
	for _, f := range []url.Values{e.form("token", "x", "decision", "allow-retry"), e.form("token", "99999999999999999999", "decision", "allow-retry")} {
		if res := e.req("POST", "/idemhttp/resolve", f); res.status != 400 {
			t.Errorf("resolve %v: %d", f, res.status)
		}
	}
	if res := e.req("POST", "/consumers/g/t/retry", e.form("partition", "0", "key_id", "zz")); res.status != 400 {
		t.Errorf("retry with a bad key: %d", res.status)
	}
	// A body past 1 MiB: refused.
	big := e.form("id", strings.Repeat("a", 2<<20))
	if res := e.req("POST", "/outbox/retry", big); res.status != 400 {
		t.Errorf("2 MiB form: %d", res.status)
	}
}
