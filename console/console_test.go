package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

const (
	testToken = "s3cret-console-token"
	testName  = "operator"
	// testPAN is a card number: pages show it masked (************1111).
	testPAN = "4111111111111111"
)

// env is one test's schema, topics and console.
type env struct {
	t          *testing.T
	db         *testenv.DB
	topic, dlq string
	console    *Console
	writer     *dlq.Writer
	group      string
}

func newEnv(t *testing.T, edit func(*Config)) *env {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		return testenv.Migrate(ctx, pool, schema)
	})
	e := &env{t: t, db: db, topic: testenv.NewTopic(t, 1), group: testenv.Name(t, "g")}
	e.dlq = e.topic + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, e.dlq, 1)
	// The suffix is the test's own dead-letter topic: the overview lists it
	// only, not those of the tests that run beside it.
	cfg := &Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}, Authorize: TokenAuth(testToken, testName),
		DLQSuffix: e.dlq, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	if edit != nil {
		edit(cfg)
	}
	c, err := New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e.console = c
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Topic: e.dlq, Group: e.group, Consumer: e.group})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	e.writer = w
	return e
}

// deadLetter writes a dead letter for the message at offset of the origin
// topic.
func (e *env) deadLetter(offset int64, id, key, value string, err error) {
	e.t.Helper()
	msg := &consumer.Message{Message: kafka.Message{Topic: e.topic, Partition: 0, Offset: offset, Key: []byte(key),
		Value: []byte(value), Time: time.Now(), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)},
			{Key: "Authorization", Value: []byte("Bearer abc.def")}}}, ID: id}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.writer.OnFailure(ctx, msg, err); err != nil {
		e.t.Fatal(err)
	}
}

// response is what a request got.
type response struct {
	status int
	header http.Header
	body   string
}

// resolveForm gives a form made by form the token of the action that path
// takes, as the page holding the form would have; sent again, the form
// keeps it. A replay's token names the form's selection, as its dry run's
// does.
func (e *env) resolveForm(path string, form url.Values) {
	principal, ok := strings.CutPrefix(form.Get("csrf"), autoToken)
	if !ok {
		return
	}
	path, _, _ = strings.Cut(path, "?")
	seg := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i := range seg {
		seg[i], _ = url.PathUnescape(seg[i])
	}
	action := "unknown"
	switch {
	case strings.HasSuffix(path, "/reveal") && len(seg) >= 5:
		n := len(seg)
		action = targeted(actReveal, seg[n-4], seg[n-3], seg[n-2])
	case strings.HasSuffix(path, "/replay/dry-run"):
		action = actDryRun
	case strings.HasSuffix(path, "/replay"):
		topic, _ := url.PathUnescape(strings.TrimSuffix(path[strings.Index(path, "/dlq/")+len("/dlq/"):], "/replay"))
		lf, _ := parseFilter(form)
		action = selectionAction(topic, form.Get("scope"), lf, formIDs(&http.Request{PostForm: form}))
	case strings.HasSuffix(path, "/outbox/retry"):
		action = targeted(actOutboxRetry, form.Get("id"))
	case strings.HasSuffix(path, "/idemhttp/resolve"):
		action = targeted(actResolve, form.Get("account"), form.Get("operation"), form.Get("key"), form.Get("token"))
	case strings.HasSuffix(path, "/retry") && len(seg) >= 4:
		n := len(seg)
		if form.Get("all") == "1" {
			action = targeted(actParkedRetry, seg[n-3], seg[n-2], "all")
		} else {
			action = targeted(actParkedRetry, seg[n-3], seg[n-2], form.Get("partition"), form.Get("key_id"))
		}
	}
	form.Set("csrf", e.console.forms.issue(principal, action))
}

// revealAction is the action a reveal form's token is bound to, for the
// letter page at path.
func revealAction(path string) string {
	seg := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i := range seg {
		seg[i], _ = url.PathUnescape(seg[i])
	}
	n := len(seg)
	return targeted(actReveal, seg[n-3], seg[n-2], seg[n-1])
}

// req sends a request through the console; auth adds the token.
func (e *env) req(method, path string, form url.Values, hdr ...string) response {
	e.t.Helper()
	e.resolveForm(path, form)
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, path, body)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	r.Header.Set("Authorization", "Bearer "+testToken)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			r.Header.Del(hdr[i])
		} else {
			r.Header.Set(hdr[i], hdr[i+1])
		}
	}
	w := httptest.NewRecorder()
	e.console.ServeHTTP(w, r)
	return response{status: w.Code, header: w.Header(), body: w.Body.String()}
}

func (e *env) get(path string) response {
	e.t.Helper()
	res := e.req("GET", path, nil)
	if res.status != http.StatusOK {
		e.t.Fatalf("GET %s: %d\n%s", path, res.status, res.body)
	}
	return res
}

func (e *env) getJSON(path string, v any) {
	e.t.Helper()
	res := e.req("GET", path, nil, "Accept", "application/json")
	if res.status != http.StatusOK {
		e.t.Fatalf("GET %s (JSON): %d\n%s", path, res.status, res.body)
	}
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		e.t.Fatalf("GET %s: Content-Type %q", path, ct)
	}
	if err := json.Unmarshal([]byte(res.body), v); err != nil {
		e.t.Fatalf("GET %s: %v\n%s", path, err, res.body)
	}
}

// autoToken marks a form whose token req issues when it sends it, for the
// action of the path it is sent to (see resolveForm), to the principal
// after the colon.
const autoToken = "auto:"

// form returns a form that gets a fresh token of its action when sent.
func (e *env) form(kv ...string) url.Values {
	v := url.Values{"csrf": {autoToken + testName}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}

func (e *env) audit() []AuditEntry {
	e.t.Helper()
	entries, err := e.console.audit.recent(context.Background(), e.db.Pool, 100)
	if err != nil {
		e.t.Fatal(err)
	}
	return entries
}

func contains(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, body)
		}
	}
}

func lacks(t *testing.T, what, body string, bad ...string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(body, b) {
			t.Fatalf("%s holds %q:\n%s", what, b, body)
		}
	}
}

func TestNewRefusesAnonymousAccess(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := New(db.Pool, &Config{Kafka: testenv.Kafka(t)})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Authorize") {
		t.Fatalf("New without Authorize: %v, want ErrInvalidConfig naming Authorize", err)
	}
	_, err = New(db.Pool, &Config{Kafka: testenv.Kafka(t), Authorize: TokenAuth("t", "n"), Secret: []byte("short")})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a short secret: %v", err)
	}
}

func TestAuthAndHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BasePath = "/console" })
	// No credentials: to the sign-in page; a POST 401; JSON says so.
	res := e.req("GET", "/console/", nil, "Authorization", "")
	if res.status != http.StatusSeeOther || res.header.Get("Location") != "/console/login" {
		t.Fatalf("anonymous: %d to %q", res.status, res.header.Get("Location"))
	}
	res = e.req("GET", "/console/login", nil, "Authorization", "")
	contains(t, "sign-in page", res.body, `<label for="token">Token</label>`, `action="/console/login"`)
	if res := e.req("POST", "/console/outbox/retry", e.form("id", "x"), "Authorization", ""); res.status != http.StatusUnauthorized {
		t.Fatalf("anonymous POST: %d", res.status)
	}
	res = e.req("GET", "/console/?format=json", nil, "Authorization", "")
	if res.status != http.StatusUnauthorized || !strings.Contains(res.body, `"status": 401`) {
		t.Fatalf("anonymous JSON: %d %s", res.status, res.body)
	}
	if res := e.req("GET", "/console/?format=json", nil, "Authorization", "Bearer wrong"); res.status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", res.status)
	}
	// Sign-in: a wrong token sets nothing; the right one a strict cookie.
	res = e.req("POST", "/console/login", url.Values{"token": {"wrong"}}, "Authorization", "")
	if res.status != http.StatusUnauthorized || res.header.Get("Set-Cookie") != "" {
		t.Fatalf("wrong sign-in: %d, cookie %q", res.status, res.header.Get("Set-Cookie"))
	}
	res = e.req("POST", "/console/login", url.Values{"token": {testToken}}, "Authorization", "")
	cookie := res.header.Get("Set-Cookie")
	if res.status != http.StatusSeeOther || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") ||
		!strings.Contains(cookie, "Path=/console/") {
		t.Fatalf("sign-in: %d, cookie %q", res.status, cookie)
	}
	res = e.req("GET", "/console/", nil, "Authorization", "", "Cookie", strings.Split(cookie, ";")[0])
	if res.status != http.StatusOK {
		t.Fatalf("with the cookie: %d\n%s", res.status, res.body)
	}
	for h, want := range map[string]string{
		"X-Frame-Options": "DENY", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
	} {
		if got := res.header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	csp := res.header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP %q", csp)
	}
	lacks(t, "overview", res.body, "<script")
	// Outside the base path: not the console's.
	if res := e.req("GET", "/consolex", nil); res.status != http.StatusNotFound {
		t.Fatalf("outside the base path: %d", res.status)
	}
	// An Authorize that refuses: 403.
	f := newEnv(t, func(c *Config) {
		c.Authorize = func(*http.Request) (Principal, error) { return Principal{}, errors.New("not in the on-call group") }
	})
	if res := f.req("GET", "/", nil); res.status != http.StatusForbidden || !strings.Contains(res.body, "on-call group") {
		t.Fatalf("refused: %d\n%s", res.status, res.body)
	}
	// A cross-site POST (a browser says so): refused before anything.
	res = e.req("POST", "/console/outbox/retry", e.form("id", "x"), "Sec-Fetch-Site", "cross-site")
	if res.status != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", res.status)
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Thresholds.MaxLag = 1 })
	e.deadLetter(0, "pay-1", "k1", `{"amount":1}`, retry.Permanent(errors.New("no order 1")))
	// A consumer at offset 0 of a topic holding three messages: lag 3.
	testenv.Produce(t, e.topic, 0, kafka.Record{}, kafka.Record{}, kafka.Record{})
	if _, err := e.db.Pool.Exec(context.Background(), `INSERT INTO `+e.db.Table(migrate.ConsumerPositionsDefault)+
		` (consumer, topic, kafka_partition, next_offset) VALUES ($1, $2, 0, 0)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	res := e.get("/")
	contains(t, "overview", res.body, "Thresholds crossed", "lag 3 &gt; 1", e.dlq, "1 unresolved", "Layout: flat")
	var o overviewData
	e.getJSON("/?format=json", &o)
	if len(o.Crossed) != 1 || len(o.Consumers) != 1 || o.Consumers[0].Lag != 3 || !o.Consumers[0].Crossed {
		t.Fatalf("overview JSON: %+v", o)
	}
	var d *deadLetterTopic
	for i := range o.DeadLetters {
		if o.DeadLetters[i].Topic == e.dlq {
			d = &o.DeadLetters[i]
		}
	}
	if d == nil || d.Records != 1 || d.Unresolved != 1 || d.Oldest == nil || o.Outbox == nil || o.Idempotency == nil || o.Dedup.Layout != "flat" {
		t.Fatalf("overview JSON: %+v, dead letters %+v", o, d)
	}
	if res := e.req("GET", "/nowhere", nil); res.status != http.StatusNotFound {
		t.Fatalf("unknown page: %d", res.status)
	}
}

func TestDeadLetterListFiltersAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 5 {
		err := retry.Permanent(fmt.Errorf("no order %d", i))
		if i >= 3 {
			err = errors.New("timeout talking to the ledger")
		}
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), fmt.Sprintf("k%d", i), `{"n":1}`, err)
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	var d lettersData
	e.getJSON(base, &d)
	if d.Total != 5 || len(d.Letters) != 5 || d.States[dlq.StateUnresolved] != 5 {
		t.Fatalf("list: %+v", d)
	}
	e.getJSON(base+"?class=permanent", &d)
	if d.Total != 3 {
		t.Fatalf("class filter: %d letters, want 3", d.Total)
	}
	e.getJSON(base+"?error=ledger", &d)
	if d.Total != 2 {
		t.Fatalf("error filter: %d letters, want 2", d.Total)
	}
	e.getJSON(base+"?message_id=pay-4", &d)
	if d.Total != 1 || d.Letters[0].MessageID != "pay-4" {
		t.Fatalf("ID filter: %+v", d.Letters)
	}
	e.getJSON(base+"?origin=other", &d)
	if d.Total != 0 {
		t.Fatalf("origin filter: %d", d.Total)
	}
	e.getJSON(base+"?until=2000-01-01T00:00:00Z", &d)
	if d.Total != 0 {
		t.Fatalf("until filter: %d", d.Total)
	}
	e.getJSON(base+"?size=2&page=3", &d)
	if d.Total != 5 || d.Pages != 3 || len(d.Letters) != 1 || d.Letters[0].MessageID != "pay-4" {
		t.Fatalf("page 3 of 2: %+v", d)
	}
	res := e.get(base + "?size=2")
	contains(t, "page 1", res.body, "Page 1 of 3", `rel="next"`, `<label for="f-class">Error class</label>`)
	// Bad input: a clear error, 400 or 404.
	for path, want := range map[string]int{
		base + "?size=100000":             http.StatusBadRequest,
		base + "?page=0":                  http.StatusBadRequest,
		base + "?since=yesterday":         http.StatusBadRequest,
		"/dlq/" + e.topic:                 http.StatusNotFound, // not a dead-letter topic
		"/dlq/no-such-topic.dlq":          http.StatusNotFound,
		base + "/0/99":                    http.StatusNotFound,
		base + "/0/x":                     http.StatusBadRequest,
		base + "?since=2026-01-02T00:00Z": http.StatusBadRequest,
	} {
		if res := e.req("GET", path, nil); res.status != want {
			t.Errorf("GET %s: %d, want %d\n%s", path, res.status, want, res.body)
		}
	}
}

func TestDeadLetterEscapedRedactedAndRevealed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	value := `{"note":"<script>alert(1)</script>","card":"4111111111111111","memo":"pan 4111111111111111"}`
	e.deadLetter(0, "pay-x", "<b>key</b>", value, retry.Permanent(errors.New(`bad <img src=x onerror=alert(2)>`)))
	letter := "/dlq/" + url.PathEscape(e.dlq) + "/0/0"
	res := e.get(letter)
	lacks(t, "letter", res.body, "<script>alert", "<img src=x", "<b>key</b>", "4111111111111111", "abc.def")
	contains(t, "letter", res.body, "&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", "&lt;b&gt;key&lt;/b&gt;",
		"************1111", "Reveal the payload (audited)")
	// The list escapes the error text too.
	res = e.get("/dlq/" + url.PathEscape(e.dlq))
	lacks(t, "list", res.body, "<img src=x")

	// Reveal without a token, with a forged one, with an expired one:
	// refused, nothing audited, nothing shown.
	for name, f := range map[string]url.Values{
		"no token":       {},
		"forged token":   {"csrf": {"AAAA" + e.console.forms.issue(testName, actReveal)[4:]}},
		"other's":        {"csrf": {e.console.forms.issue("someone-else", actReveal)}},
		"another form's": {"csrf": {e.console.forms.issue(testName, actOutboxRetry)}},
		// Bound to another letter of the topic: a token acts on its own target only.
		"another letter's": {"csrf": {e.console.forms.issue(testName, targeted(actReveal, e.dlq, 0, 999999))}},
		"no letter's":      {"csrf": {e.console.forms.issue(testName, actReveal)}},
	} {
		res := e.req("POST", letter+"/reveal", f)
		if res.status != http.StatusForbidden || strings.Contains(res.body, "4111111111111111") {
			t.Fatalf("reveal with %s: %d\n%s", name, res.status, res.body)
		}
	}
	old := e.console.forms.now
	e.console.forms.now = func() time.Time { return time.Now().Add(-2 * FormTTLDefault) }
	expired := url.Values{"csrf": {e.console.forms.issue(testName, revealAction(letter))}}
	e.console.forms.now = old
	if res := e.req("POST", letter+"/reveal", expired); res.status != http.StatusForbidden || !strings.Contains(res.body, "expired") {
		t.Fatalf("reveal with an expired token: %d\n%s", res.status, res.body)
	}
	if n := len(e.audit()); n != 0 {
		t.Fatalf("%d audit entries after refused reveals", n)
	}
	f := e.form()
	res = e.req("POST", letter+"/reveal", f)
	if res.status != http.StatusOK {
		t.Fatalf("reveal: %d\n%s", res.status, res.body)
	}
	contains(t, "revealed letter", res.body, "4111111111111111", "&lt;script&gt;alert(1)&lt;/script&gt;", "Shown verbatim")
	lacks(t, "revealed letter", res.body, "<script>alert")
	if res.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("revealed page cacheable: %q", res.header.Get("Cache-Control"))
	}
	a := e.audit()
	if len(a) != 1 || a[0].Action != "dlq.reveal" || a[0].Principal != testName || a[0].Outcome != outcomeDone ||
		a[0].Target != e.dlq+"/0/0" || a[0].RemoteAddr == "" {
		t.Fatalf("audit after reveal: %+v", a)
	}
	// The same form again: refused, audited once.
	if res := e.req("POST", letter+"/reveal", f); res.status != http.StatusConflict {
		t.Fatalf("reveal form again: %d", res.status)
	}
	if n := len(e.audit()); n != 1 {
		t.Fatalf("%d audit entries after a reveal form sent twice", n)
	}
	// The audit page escapes what it shows.
	contains(t, "audit page", e.get("/audit").body, "dlq.reveal", testName)
}

// originMessages counts the records of the origin topic.
func (e *env) originMessages() int {
	return len(testenv.ReadAll(e.t, testenv.Brokers(e.t), e.topic))
}

func TestReplayDryRunThenConfirmOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 3 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{"n":1}`, retry.Permanent(fmt.Errorf("no order %d", i)))
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	// No selection, a bad scope: refused.
	if res := e.req("POST", base+"/replay/dry-run", e.form("scope", "selected")); res.status != http.StatusBadRequest {
		t.Fatalf("empty selection: %d", res.status)
	}
	if res := e.req("POST", base+"/replay/dry-run", e.form("scope", "everything")); res.status != http.StatusBadRequest {
		t.Fatalf("bad scope: %d", res.status)
	}
	// A dry run of two selected letters changes nothing.
	res := e.req("POST", base+"/replay/dry-run", e.form("scope", "selected", "id", "pay-0", "id", "pay-2"))
	if res.status != http.StatusOK {
		t.Fatalf("dry run: %d\n%s", res.status, res.body)
	}
	contains(t, "dry run", res.body, "Dry run: nothing was changed", "would-replay", "pay-0", "pay-2", "Confirm: replay")
	lacks(t, "dry run", res.body, "pay-1")
	if n := e.originMessages(); n != 0 {
		t.Fatalf("a dry run wrote %d messages", n)
	}
	// The confirm form, submitted twice: one replay.
	confirm := regexp.MustCompile(`(?s)<form method="post" action="[^"]*/replay" .*?</form>`).FindString(res.body)
	if confirm == "" {
		t.Fatalf("no confirm form:\n%s", res.body)
	}
	form := url.Values{}
	for _, m := range regexp.MustCompile(`name="([^"]+)" value="([^"]*)"`).FindAllStringSubmatch(confirm, -1) {
		form.Add(m[1], m[2])
	}
	res = e.req("POST", base+"/replay", form)
	if res.status != http.StatusOK {
		t.Fatalf("replay: %d\n%s", res.status, res.body)
	}
	contains(t, "replay", res.body, "republished", "audit entry")
	res = e.req("POST", base+"/replay", form, "Accept", "application/json")
	var again replayData
	if err := json.Unmarshal([]byte(res.body), &again); err != nil || again.Result == nil || !again.Result.Duplicate {
		t.Fatalf("replay form again: %v %s", err, res.body)
	}
	if n := e.originMessages(); n != 2 {
		t.Fatalf("%d messages republished, want 2 (once each)", n)
	}
	a := e.audit()
	if len(a) != 1 || a[0].Action != "dlq.replay" || a[0].Outcome != outcomeDone || !strings.Contains(a[0].Detail, "2 republished") {
		t.Fatalf("audit: %+v", a)
	}
	var d lettersData
	e.getJSON(base, &d)
	if d.States[dlq.StateReplayed] != 2 || d.States[dlq.StateUnresolved] != 1 {
		t.Fatalf("states after the replay: %v", d.States)
	}
	// Every filtered letter, by error class: only the unresolved one is
	// replayed anew.
	res = e.req("POST", base+"/replay/dry-run", e.form("scope", "filtered", "class", "permanent"), "Accept", "application/json")
	var dry replayData
	if err := json.Unmarshal([]byte(res.body), &dry); err != nil || dry.Records[dlq.WouldReplay] != 1 || dry.Records[dlq.AlreadyReplayed] != 2 {
		t.Fatalf("filtered dry run: %v %s", err, res.body)
	}
}

func TestReadOnlyHidesAndRefusesActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.ReadOnly = true })
	e.deadLetter(0, "pay-1", "k", `{}`, retry.Permanent(errors.New("boom")))
	base := "/dlq/" + url.PathEscape(e.dlq)
	for _, path := range []string{"/", base, base + "/0/0", "/outbox", "/consumers", "/idemhttp", "/audit"} {
		res := e.get(path)
		contains(t, path, res.body, "read-only")
		if n := strings.Count(res.body, `method="post"`); n != 1 { // sign out only
			t.Errorf("%s has %d POST forms in read-only mode", path, n)
		}
	}
	for _, path := range []string{base + "/0/0/reveal", base + "/replay/dry-run", base + "/replay", "/outbox/retry", "/idemhttp/resolve"} {
		if res := e.req("POST", path, e.form("scope", "filtered")); res.status != http.StatusForbidden || !strings.Contains(res.body, "read-only") {
			t.Errorf("POST %s in read-only mode: %d", path, res.status)
		}
	}
	if e.originMessages() != 0 || len(e.audit()) != 0 {
		t.Fatal("a read-only console acted")
	}
}

func TestOutboxRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.deadOutboxMessage("orders", "order-7", "broker said no: card 4111111111111111")
	res := e.get("/outbox")
	contains(t, "outbox", res.body, id, "order-7", "broker said no", "************1111", "dead 1")
	lacks(t, "outbox", res.body, "4111111111111111")
	var d outboxData
	e.getJSON("/outbox", &d)
	if d.DeadCount != 1 || len(d.Dead) != 1 || d.Dead[0].ID != id {
		t.Fatalf("outbox JSON: %+v", d)
	}
	if res := e.req("POST", "/outbox/retry", url.Values{"id": {id}}); res.status != http.StatusForbidden {
		t.Fatalf("retry without a token: %d", res.status)
	}
	// A token of another message's retry form retries nothing else.
	other := url.Values{"id": {id}, "csrf": {e.console.forms.issue(testName, targeted(actOutboxRetry, "another-id"))}}
	if res := e.req("POST", "/outbox/retry", other); res.status != http.StatusForbidden {
		t.Fatalf("retry with another message's token: %d", res.status)
	}
	f := e.form("id", id)
	res = e.req("POST", "/outbox/retry", f)
	contains(t, "retry", res.body, "requeued 1 message(s)")
	res = e.req("POST", "/outbox/retry", f)
	contains(t, "retry again", res.body, "This form was submitted before")
	e.getJSON("/outbox", &d)
	if d.DeadCount != 0 || d.Backlog != 1 {
		t.Fatalf("after retry: %+v", d)
	}
	// A message that is not dead: the action fails, audited as such.
	res = e.req("POST", "/outbox/retry", e.form("id", id))
	contains(t, "retry of a live message", res.body, "is not dead")
	a := e.audit()
	if len(a) != 2 || a[0].Outcome != outcomeFailed || a[1].Outcome != outcomeDone {
		t.Fatalf("audit: %+v", a)
	}
}

func TestIdempotencyStuckResolve(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.idemRecord("acct", "POST /payments", "key-stuck", 7, -time.Minute)
	e.idemRecord("acct", "POST /payments", "key-live", 8, time.Hour)
	res := e.get("/idemhttp")
	contains(t, "stuck", res.body, "key-stuck", "Allow retry", "Mark failed")
	lacks(t, "stuck", res.body, "key-live")
	resolve := func(key string, token int64, decision string) string {
		return e.req("POST", "/idemhttp/resolve", e.form("account", "acct", "operation", "POST /payments", "key", key,
			"token", fmt.Sprint(token), "decision", decision)).body
	}
	contains(t, "in flight", resolve("key-live", 8, "allow-retry"), "in flight, not stuck")
	contains(t, "wrong token", resolve("key-stuck", 6, "mark-failed"), "another token")
	if res := e.req("POST", "/idemhttp/resolve", e.form("decision", "delete")); res.status != http.StatusBadRequest {
		t.Fatalf("bad decision: %d", res.status)
	}
	contains(t, "mark failed", resolve("key-stuck", 7, "mark-failed"), "MarkFailed applied")
	var d stuckData
	e.getJSON("/idemhttp", &d)
	if len(d.Records) != 0 {
		t.Fatalf("still stuck: %+v", d.Records)
	}
}

func TestConsumersPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if _, err := e.db.Pool.Exec(context.Background(), `INSERT INTO `+e.db.Table(migrate.ConsumerPositionsDefault)+
		` (consumer, topic, kafka_partition, next_offset) VALUES ($1, $2, 0, 0)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	contains(t, "consumers", e.get("/consumers").body, e.group)
	page := "/consumers/" + url.PathEscape(e.group) + "/" + url.PathEscape(e.topic)
	res := e.get(page)
	contains(t, "consumer", res.body, "idemkit consumer seek -group "+e.group, "PostgreSQL position", "Kafka committed")
	var d consumerData
	e.getJSON(page, &d)
	if len(d.Partitions) != 1 || d.Partitions[0].LogEnd == nil || d.Partitions[0].Position == nil {
		t.Fatalf("consumer JSON: %+v", d)
	}
	if res := e.req("GET", "/consumers/nobody/"+e.topic, nil); res.status != http.StatusNotFound {
		t.Fatalf("unknown consumer: %d", res.status)
	}
	// Nothing parked: the retry is refused, and audited as failed.
	contains(t, "retry", e.req("POST", page+"/retry", e.form("all", "1")).body, "nothing parked")
	if a := e.audit(); len(a) != 1 || a[0].Outcome != outcomeFailed {
		t.Fatalf("audit: %+v", a)
	}
}

// idemRecord writes a PROCESSING idempotency record whose lease ends in
// leaseLeft (negative: ended, the record stuck).
func (e *env) idemRecord(account, operation, key string, token int64, leaseLeft time.Duration) {
	e.t.Helper()
	if _, err := e.db.Pool.Exec(context.Background(), `INSERT INTO `+e.db.Table(migrate.IdempotencyRecordsDefault)+
		` (account, operation, idempotency_key, fingerprint, state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ($1, $2, $3, '\x00', 'PROCESSING', $4, now() + $5::bigint * interval '1 microsecond', now(), now(), now() + interval '1 day')`,
		account, operation, key, token, leaseLeft.Microseconds()); err != nil {
		e.t.Fatal(err)
	}
}

// Mounted under BasePath, the mux's own redirects (path cleaning, a subtree
// without its slash) stay within it, a path that cleans to outside it is
// not the console's, and New refuses a BasePath that is not a clean path.
func TestRedirectsStayWithinBasePath(t *testing.T) {
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

// The console has no script, and its CSP allows none: mounted in a service,
// 'self' would be every endpoint of the service.
func TestCSPAllowsNoScript(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	csp := e.get("/audit").header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'none'") {
		t.Errorf("CSP %q: script-src should be 'none', the console has no script", csp)
	}
}

// /static/ serves its files by name and lists nothing, to anyone.
func TestStaticListsNoDirectory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	res := e.req("GET", "/static/", nil, "Authorization", "")
	if res.status == http.StatusOK {
		t.Errorf("GET /static/ without credentials: a directory listing:\n%s", res.body)
	}
}
