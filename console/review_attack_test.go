package console

// Security review of the web console (branch console-review): each test
// below is one attack that succeeds on the code as merged, so each FAILS
// until its finding is fixed. Find them with
//
//	go test -race -count=1 -run TestReviewAttack ./...
//
// The severity and the suggested fix are in each test's comment.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

const reviewPAN = "4111111111111111"

// TestReviewAttackParkedKeyHexLeaksRedactedKey — MEDIUM (redaction bypass,
// no audit). A consumer page masks a parked message's key (c.red.Bytes:
// "************1111") but puts the raw key, hex-encoded, in the HTML
// (hidden input key_hex, consumers.go:153 KeyHex: hex.EncodeToString(p.Key))
// and in the JSON (key_hex). Anyone who can read the page decodes the full
// card number without the audited Reveal. The retry action then writes the
// raw key in hex into the audit table's target and the log
// (consumers.go:204 "key %x"), and the audit page shows it.
// Fix: never emit raw key bytes; identify a parked key by an opaque handle
// (partition/offset of its head, or an HMAC of the key under the form
// secret) and write that, not the key, in the audit target and log.
func TestReviewAttackParkedKeyHexLeaksRedactedKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.db.Table(migrate.ConsumerPositionsDefault)+
		` (consumer, topic, kafka_partition, next_offset) VALUES ($1, $2, 0, 1)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.db.Table(migrate.ParkedMessagesDefault)+
		` (consumer, topic, kafka_partition, kafka_offset, message_key, message_id, attempts, last_error, next_attempt_at)
		VALUES ($1, $2, 0, 0, $3, 'm-1', 1, 'declined', now() + interval '1 hour')`, e.group, e.topic, []byte(reviewPAN)); err != nil {
		t.Fatal(err)
	}
	page := "/consumers/" + url.PathEscape(e.group) + "/" + url.PathEscape(e.topic)
	panHex := hex.EncodeToString([]byte(reviewPAN))
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
	if j := e.req("GET", page+"?format=json", nil).body; strings.Contains(j, panHex) || strings.Contains(j, reviewPAN) {
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
		if strings.Contains(a.Target, panHex) || strings.Contains(a.Target, reviewPAN) {
			leaks = append(leaks, "audit target "+a.Target)
		}
	}
	if strings.Contains(e.get("/audit").body, panHex) {
		leaks = append(leaks, "audit page")
	}
	if len(leaks) > 0 {
		t.Errorf("the parked key %q is masked on screen but readable unredacted (hex %s) in: %s", reviewPAN, panHex,
			strings.Join(leaks, "; "))
	}
}

// TestReviewAttackReplayDetailLeaksRedactedError — MEDIUM (redaction
// bypass, no audit). A letter's page redacts its history's error texts, but
// its state line prints the replay record's detail verbatim
// (templates/letter.html: {{with .Replay}} … {{.Detail}}; JSON "replay"),
// and dlq records the handler's (or the letter's last) error text there for
// failed-again, exhausted and write-failed replays (dlq/reprocessor.go
// record(...f.Error)). A handler error naming a card number shows in full.
// Fix: in letter() redact ld.Replay.Detail (copy the struct, c.red.Text),
// and ReplayedBy for good measure; likewise replayData.Error/actResult.Detail
// when they carry a replay's error.
func TestReviewAttackReplayDetailLeaksRedactedError(t *testing.T) {
	t.Parallel()
	var e *env
	e = newEnv(t, func(c *Config) {
		c.Redrive = map[string]consumer.Handler{c.DLQSuffix: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			return retry.Permanent(errors.New("issuer declined card " + reviewPAN))
		})}
	})
	e.deadLetter(0, "pay-r", "k", `{"n":1}`, retry.Permanent(errors.New("no order")))
	base := "/dlq/" + url.PathEscape(e.dlq)
	res := e.req("POST", base+"/replay", e.form("scope", "selected", "id", "pay-r"))
	if res.status != http.StatusOK {
		t.Fatalf("replay: %d\n%s", res.status, res.body)
	}
	lacks(t, "replay page", res.body, reviewPAN)
	letter := e.get(base + "/0/0")
	var ld letterData
	e.getJSON(base+"/0/0", &ld)
	if ld.Replay == nil {
		t.Fatalf("no replay record on the letter: %+v", ld)
	}
	if strings.Contains(letter.body, reviewPAN) || strings.Contains(ld.Replay.Detail, reviewPAN) {
		t.Errorf("the letter's page (redacted view, no reveal) shows the card number from its replay record: detail %q",
			ld.Replay.Detail)
	}
}

// TestReviewAttackCookieIsTheRawToken — MEDIUM (credential exposure). The
// sign-in cookie's value is the shared admin token itself (forms.go login:
// Value: token), for 12 h, and nothing server-side can end it: sign-out
// only asks the browser to drop it. Cookies are scoped by host, not port,
// so with the standalone command on 127.0.0.1:8089 every other local web
// server the operator's browser visits (127.0.0.1:3000, another console on
// :8090 for another cluster, …) receives the console's master token in
// its Cookie header (and the second console's sign-in overwrites the
// first's). Anyone reading a cookie jar or a request log gets a credential
// that never expires.
// Fix: put a session in the cookie, not the token: e.g. HMAC(secret,
// principal|expiry) with a server-side expiry (and a revocation list or
// epoch for sign-out), a port-specific or __Host- cookie name.
func TestReviewAttackCookieIsTheRawToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	if res.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", res.status)
	}
	c := (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 {
		t.Fatalf("cookies: %v", c)
	}
	if strings.Contains(c[0].Value, testToken) {
		t.Errorf("the session cookie %s holds the admin token verbatim (%q): every host:port sharing the host name gets it", c[0].Name, c[0].Value)
	}
	// Sign-out does not end the session: the cookie still works.
	cookie := c[0].Name + "=" + c[0].Value
	if r := e.req("POST", "/logout", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", r.status)
	}
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status == http.StatusOK {
		t.Errorf("a cookie captured before sign-out still signs in after it")
	}
	// A session expires whatever the browser keeps; one signed by another
	// console, or altered, is refused; each console names its own cookie.
	res = e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	c = (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 || !strings.HasPrefix(c[0].Name, "idemkit_console_") || c[0].MaxAge != int(SessionTTLDefault/time.Second) {
		t.Fatalf("cookie %+v", c)
	}
	cookie = c[0].Name + "=" + c[0].Value
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusOK {
		t.Fatalf("with the session: %d", r.status)
	}
	e.console.sessions.now = func() time.Time { return time.Now().Add(SessionTTLDefault + time.Minute) }
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", cookie); r.status != http.StatusUnauthorized {
		t.Errorf("an expired session: %d", r.status)
	}
	e.console.sessions.now = time.Now
	other := newEnv(t, nil)
	if other.console.cookieName(false) == e.console.cookieName(false) {
		t.Errorf("two consoles share the cookie name %s", c[0].Name)
	}
	if r := other.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", other.console.cookieName(false)+"="+c[0].Value); r.status != http.StatusUnauthorized {
		t.Errorf("another console's session: %d", r.status)
	}
	v := []byte(c[0].Value)
	v[3] ^= 1
	if r := e.req("GET", "/?format=json", nil, "Authorization", "", "Cookie", c[0].Name+"="+string(v)); r.status != http.StatusUnauthorized {
		t.Errorf("an altered session: %d", r.status)
	}
	// Over https: a __Host- cookie for the whole origin.
	res = e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "", "X-Forwarded-Proto", "https")
	c = (&http.Response{Header: res.header}).Cookies()
	if len(c) != 1 || c[0].Name != "__Host-"+e.console.cookieName(false) || c[0].Path != "/" || !c[0].Secure {
		t.Errorf("cookie over https: %q", res.header.Get("Set-Cookie"))
	}
}

// TestReviewAttackCookieNotSecureBehindTLSProxy — LOW. The cookie gets
// Secure only when the Go server itself terminates TLS (r.TLS != nil,
// forms.go login). The guide says to "put TLS in front of it" and the
// handler is meant to be mounted in services behind load balancers: there
// the cookie (the admin token, see above) is never Secure, so a single
// http:// request (a typo, a downgrade, a mixed-content link) sends it in
// clear. There is no option to force it.
// Fix: Config.SecureCookie (default true; the standalone command sets it
// unless it listens on loopback without TLS), or honour X-Forwarded-Proto
// from a trusted proxy; also consider the __Host- prefix.
func TestReviewAttackCookieNotSecureBehindTLSProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "", "X-Forwarded-Proto", "https")
	c := (&http.Response{Header: res.header}).Cookies()
	if res.status != http.StatusSeeOther || len(c) != 1 {
		t.Fatalf("sign-in: %d %v", res.status, c)
	}
	if !c[0].Secure {
		t.Errorf("sign-in over https (TLS terminated by a proxy): cookie %q without Secure", res.header.Get("Set-Cookie"))
	}
	// Config.SecureCookie: Secure whatever the request says.
	f := newEnv(t, func(c *Config) { c.SecureCookie = true })
	res = f.req("POST", "/login", url.Values{"token": {testToken}}, "Authorization", "")
	if c := (&http.Response{Header: res.header}).Cookies(); res.status != http.StatusSeeOther || len(c) != 1 || !c[0].Secure {
		t.Errorf("sign-in with SecureCookie: %d %q", res.status, res.header.Get("Set-Cookie"))
	}
}

// TestReviewAttackReplayWithoutDryRunAnyFormToken — LOW (defence in depth,
// documentation). The guide says "the first step is always a dry run" and
// that a selection replays "at most 100" messages; the server enforces
// neither. Form tokens are not bound to an action or a target
// (forms.check only checks the principal and age), so the token of any
// rendered form — here the "Reveal the payload" button of one letter —
// confirms a replay of every letter of the topic (scope=filtered, empty
// filter: no ReplaySelectionMax either, deadletters.go replaySelection),
// with no dry run ever shown.
// Fix: bind tokens to the action (HMAC over action name and, for the
// confirm form, a digest of the dry run's selection), and have the confirm
// form carry the dry run's token/ID; bound filtered replays too.
func TestReviewAttackReplayWithoutDryRunAnyFormToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 3 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{"n":1}`, retry.Permanent(errors.New("no order")))
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	// The token of the reveal form on a letter's page.
	page := e.get(base + "/0/0").body
	i := strings.Index(page, `/reveal"`)
	if i < 0 {
		t.Fatalf("no reveal form:\n%s", page)
	}
	tok := page[i:]
	tok = tok[strings.Index(tok, `name="csrf" value="`)+len(`name="csrf" value="`):]
	tok = tok[:strings.Index(tok, `"`)]
	res := e.req("POST", base+"/replay", url.Values{"csrf": {tok}, "scope": {"filtered"}})
	if res.status != http.StatusForbidden || e.originMessages() > 0 {
		t.Errorf("a reveal form's token replayed the whole topic with no dry run: %d, %d messages republished",
			res.status, e.originMessages())
	}
	// A dry run's token confirms its own selection, not a wider one.
	res = e.req("POST", base+"/replay/dry-run", e.form("scope", "selected", "id", "pay-0"), "Accept", "application/json")
	var dry replayData
	if err := json.Unmarshal([]byte(res.body), &dry); err != nil || dry.ConfirmToken == "" {
		t.Fatalf("dry run: %v %s", err, res.body)
	}
	wider := url.Values{"csrf": {dry.ConfirmToken}, "scope": {"selected"}, "id": {"pay-0", "pay-1"}}
	if res := e.req("POST", base+"/replay", wider); res.status != http.StatusForbidden {
		t.Errorf("a dry run's token of pay-0 confirming pay-0 and pay-1: %d", res.status)
	}
	if res := e.req("POST", base+"/replay", url.Values{"csrf": {dry.ConfirmToken}, "scope": {"filtered"}}); res.status != http.StatusForbidden {
		t.Errorf("a dry run's token of pay-0 confirming every letter: %d", res.status)
	}
	own := url.Values{"csrf": {dry.ConfirmToken}, "scope": {"selected"}, "id": {"pay-0"}}
	if res := e.req("POST", base+"/replay", own); res.status != http.StatusOK || e.originMessages() != 1 {
		t.Errorf("the dry run's own confirm: %d, %d republished\n%s", res.status, e.originMessages(), res.body)
	}
}

// TestReviewAttackRedirectsLeaveTheBasePath — LOW. Mounted under BasePath,
// the handler strips the prefix and hands the rest to its ServeMux; the
// mux's own redirects (path cleaning of "//", "/./", "/../", and
// "/static" → "/static/") are computed on the stripped path, so they send
// the browser out of the console to the host service's root
// (/console//audit → /audit, /console/static → /static/). Not an
// open redirect to another host (the mux collapses leading slashes), but a
// redirect off the console's mount, into whatever the service serves there.
// Fix: register the routes with the BasePath in their patterns instead of
// stripping it, or clean and redirect before stripping.
func TestReviewAttackRedirectsLeaveTheBasePath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BasePath = "/console" })
	for p, want := range map[string]string{"/console//audit": "/console/audit", "/console/./audit": "/console/audit",
		"/console/dlq/x.dlq/..": "/console/dlq", "/console/static": "/console/static/", "/console": "/console/"} {
		res := e.req("GET", p, nil)
		if loc := res.header.Get("Location"); loc != want {
			t.Errorf("GET %s: %d to %q, want a redirect to %q", p, res.status, loc, want)
		}
	}
	// A path that cleans to outside the base path is not the console's.
	for _, p := range []string{"/console/../audit", "/console/static/../../x"} {
		if res := e.req("GET", p, nil); res.status != http.StatusNotFound {
			t.Errorf("GET %s: %d %q, want 404", p, res.status, res.header.Get("Location"))
		}
	}
	for _, bad := range []string{"/", "/console/", "console", "/a//b", "/a/../b", "/{x}", "/a b", "/%2e"} {
		if _, err := New(e.db.Pool, &Config{Kafka: e.console.cfg.Kafka, Authorize: TokenAuth(testToken, testName),
			BasePath: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("BasePath %q: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestReviewAttackCSPAllowsSameOriginScript — LOW (hardening). The console
// ships no JavaScript, yet its CSP says script-src 'self' (console.go
// ServeHTTP). Mounted in a service, 'self' is the whole service's origin:
// any HTML injection found later could load a script from any endpoint of
// the host service that returns attacker-influenced text as JavaScript
// (JSONP, an upload, a user-controlled file). script-src 'none' costs
// nothing.
// Fix: "script-src 'none'" (and connect-src 'none', object-src via
// default-src already).
func TestReviewAttackCSPAllowsSameOriginScript(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	csp := e.get("/audit").header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'none'") {
		t.Errorf("CSP %q: script-src should be 'none', the console has no script", csp)
	}
}

// TestReviewAttackStaticDirectoryListing — INFORMATIONAL. GET /static/ is
// served without authentication by http.FileServerFS, which renders a
// directory listing (an HTML page not made by the console's templates).
// Harmless today (two files), but the static route serves whatever is put
// in console/static, listed. Fix: serve the two files by name, or wrap the
// file server to refuse directories.
func TestReviewAttackStaticDirectoryListing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("GET", "/static/", nil, "Authorization", "")
	if res.status == http.StatusOK {
		t.Errorf("GET /static/ without credentials: a directory listing:\n%s", res.body)
	}
}

// TestReviewAttackReplayAbortedByClientDisconnect — LOW. replay() builds a
// 2-minute context (ctxTimeout) but runs the action through act(), which
// uses r.Context() (audit.go act: ctx := r.Context(); do(ctx)): the
// replay is neither bounded to 2 minutes as the guide says (the standalone
// server has no WriteTimeout either), nor independent of the browser: a
// closed tab or a dropped connection stops a confirmed replay half-way,
// the audit says failed: context canceled, and the operator has a partial
// replay to reason about.
// Fix: run do with context.WithTimeout(context.WithoutCancel(r.Context()),
// 2*time.Minute) (or a configurable bound), so a confirmed action runs to
// its end or its own deadline.
func TestReviewAttackReplayAbortedByClientDisconnect(t *testing.T) {
	t.Parallel()
	reqCtx, disconnect := context.WithCancel(context.Background())
	var mu sync.Mutex
	handled := map[string]bool{}
	e := newEnv(t, func(c *Config) {
		c.Redrive = map[string]consumer.Handler{c.DLQSuffix: consumer.HandlerFunc(func(ctx context.Context, _ pgx.Tx, m *consumer.Message) error {
			if m.ID == "pay-0" {
				disconnect() // the browser goes away while the replay runs
			} else if err := ctx.Err(); err != nil {
				return err
			}
			mu.Lock()
			handled[m.ID] = true
			mu.Unlock()
			return nil
		})}
	})
	for i := range 3 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{"n":1}`, retry.Permanent(errors.New("no order")))
	}
	form := e.form("scope", "selected", "id", "pay-0", "id", "pay-1", "id", "pay-2")
	e.resolveForm("/dlq/"+url.PathEscape(e.dlq)+"/replay", form)
	r := httptest.NewRequestWithContext(reqCtx, "POST", "/dlq/"+url.PathEscape(e.dlq)+"/replay", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Authorization", "Bearer "+testToken)
	e.console.ServeHTTP(httptest.NewRecorder(), r)
	mu.Lock()
	n := len(handled)
	mu.Unlock()
	a := e.audit()
	if n != 3 {
		t.Errorf("a confirmed replay of 3 letters stopped after %d when the client disconnected; audit: %+v", n, a)
	}
}

// TestReviewAttackConcurrentReplaysRepublishTwice — MEDIUM (double
// replay of payments). The same form posted twice acts once (the audit
// key), but two confirm forms of the same selection — two tabs, a
// reload after a new dry run, or two on-call engineers acting on the same
// incident — run two Reprocessors at once. In Republish mode (the
// default) each letter is checked (replayed: SELECT EXISTS), written to
// its origin topic, and only then recorded (dlq/reprocessor.go replay:
// rn.replayed … rn.back.write … rn.record), so both runs see "not
// replayed" and both republish: here 3 forms over 10 letters write up to
// 30 messages to the payments topic, and each audit entry claims its own
// "N republished". Only a consumer that deduplicates by message ID makes
// it harmless; Redrive mode claims first and is safe.
// Fix: serialize replays per dead-letter topic in the console
// (pg_advisory_xact_lock/pg_try_advisory_lock on the topic, refusing a
// second concurrent replay with "a replay of this topic is running"), and
// in dlq claim the replay record (outcome "republishing") before the write,
// as redriveTx does.
func TestReviewAttackConcurrentReplaysRepublishTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 10 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{"amount":100}`, retry.Permanent(errors.New("no order")))
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	var wg sync.WaitGroup
	for range 3 {
		f := e.form("scope", "filtered") // each tab's own confirm form
		wg.Go(func() { e.req("POST", base+"/replay", f) })
	}
	wg.Wait()
	if n := e.originMessages(); n != 10 {
		var details []string
		for _, a := range e.audit() {
			details = append(details, a.Detail)
		}
		t.Errorf("3 concurrent replays of 10 letters wrote %d messages to the origin topic, want 10; audit: %q", n, details)
	}
	// While a replay of the topic runs (its lock held), another is refused
	// and audited so.
	unlock, err := e.console.lockTopic(context.Background(), e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	res := e.req("POST", base+"/replay", e.form("scope", "filtered"))
	unlock()
	if res.status != http.StatusConflict || !strings.Contains(res.body, "a replay of this topic is running") {
		t.Errorf("a replay while another runs: %d\n%s", res.status, res.body)
	}
	if a := e.audit(); a[0].Outcome != outcomeFailed || !strings.HasPrefix(a[0].Detail, "refused: a replay of this topic is running") {
		t.Errorf("audit of the refused replay: %+v", a[0])
	}
	if res := e.req("POST", base+"/replay", e.form("scope", "filtered")); res.status != http.StatusOK {
		t.Errorf("a replay once the lock is released: %d\n%s", res.status, res.body)
	}
}
