package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// A letter's replay record holds the handler's error (dlq records it for
// failed-again, exhausted and write-failed replays): its page and JSON
// redact it as they redact the history, and so does the replay's own page.
func TestReplayDetailIsRedacted(t *testing.T) {
	t.Parallel()
	var e *env
	e = newEnv(t, func(c *Config) {
		c.Redrive = map[string]consumer.Handler{c.DLQSuffix: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			return retry.Permanent(errors.New("issuer declined card " + testPAN))
		})}
	})
	e.deadLetter(0, "pay-r", "k", `{"n":1}`, retry.Permanent(errors.New("no order")))
	base := "/dlq/" + url.PathEscape(e.dlq)
	res := e.req("POST", base+"/replay", e.form("scope", "selected", "id", "pay-r"))
	if res.status != http.StatusOK {
		t.Fatalf("replay: %d\n%s", res.status, res.body)
	}
	lacks(t, "replay page", res.body, testPAN)
	letter := e.get(base + "/0/0")
	var ld letterData
	e.getJSON(base+"/0/0", &ld)
	if ld.Replay == nil {
		t.Fatalf("no replay record on the letter: %+v", ld)
	}
	if strings.Contains(letter.body, testPAN) || strings.Contains(ld.Replay.Detail, testPAN) {
		t.Errorf("the letter's page (redacted view, no reveal) shows the card number from its replay record: detail %q",
			ld.Replay.Detail)
	}
}

// A replay runs only with the token its dry run issued for the same
// selection: not with another form's token (a reveal's), and not for a
// wider selection than the dry run showed.
func TestReplayRunsOnlyFromItsDryRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 3 {
		e.deadLetter(int64(i), fmt.Sprintf("pay-%d", i), "k", `{"n":1}`, retry.Permanent(errors.New("no order")))
	}
	base := "/dlq/" + url.PathEscape(e.dlq)
	// The token of the reveal form on a letter's page does not replay.
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

// A confirmed replay runs to its end when its client goes away mid-way (a
// closed tab, a dropped connection): it is bounded by ActionTimeout, not by
// the request, so the operator never has a half-done replay to reason
// about.
func TestConfirmedReplayOutlivesItsClient(t *testing.T) {
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

// Replays of one topic run one at a time: two Republish Reprocessors at once
// would both find a letter not yet replayed and both write it back to the
// origin topic. Concurrent confirm forms (two tabs, two engineers) write
// each letter once; a replay while another holds the topic's lock is
// refused with 409 and audited.
func TestConcurrentReplaysOfATopicRunOnce(t *testing.T) {
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
	// While a replay of the topic runs (here a redrive held in its
	// handler), another is refused and audited so.
	e.deadLetter(10, "pay-10", "k", `{"amount":100}`, retry.Permanent(errors.New("no order")))
	started, release := make(chan struct{}), make(chan struct{})
	rp, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: e.dlq, Mode: dlq.Redrive,
		Tables: migrate.Tables{Schema: e.db.Schema}, Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			close(started)
			<-release
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	ran := make(chan error, 1)
	go func() { _, err := rp.Run(context.Background()); ran <- err }()
	<-started
	res := e.req("POST", base+"/replay", e.form("scope", "filtered"))
	close(release)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if res.status != http.StatusConflict || !strings.Contains(res.body, "a replay of this dead-letter topic is running") {
		t.Errorf("a replay while another runs: %d\n%s", res.status, res.body)
	}
	if a := e.audit(); a[0].Outcome != outcomeFailed || !strings.HasPrefix(a[0].Detail, "refused: a replay of this dead-letter topic is running") {
		t.Errorf("audit of the refused replay: %+v", a[0])
	}
	if res := e.req("POST", base+"/replay", e.form("scope", "filtered")); res.status != http.StatusOK {
		t.Errorf("a replay once the lock is released: %d\n%s", res.status, res.body)
	}
}

// writeLetters writes n dead letters of distinct message IDs to e.dlq in
// batches, as the dlq.Writer writes them (see BenchmarkDeadLetterPage),
// each with the origin message's extra headers.
func (e *env) writeLetters(n int, extra ...kafka.Header) {
	e.t.Helper()
	now := time.Now().UTC()
	history := fmt.Sprintf(`[{"round":0,"error":"no order","class":"permanent","attempts":1,"first_failure":%q,"last_failure":%q}]`,
		now.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(e.t)...), Topic: e.dlq, RequiredAcks: kafka.RequireAll, BatchSize: 1000,
		BatchBytes: 1 << 20, BatchTimeout: time.Millisecond}
	defer w.Close()
	var batch []kafka.Message
	for i := range n {
		batch = append(batch, kafka.Message{Key: []byte("k"), Value: []byte(`{}`),
			Headers: []kafka.Header{{Key: dlq.HeaderOriginTopic, Value: []byte(e.topic)}, {Key: dlq.HeaderOriginPartition, Value: []byte("0")},
				{Key: dlq.HeaderOriginOffset, Value: []byte(strconv.Itoa(i))}, {Key: dlq.HeaderMessageID, Value: fmt.Appendf(nil, "pay-%08d", i)},
				{Key: dlq.HeaderConsumer, Value: []byte("c")}, {Key: dlq.HeaderGroup, Value: []byte("c")},
				{Key: dlq.HeaderHistory, Value: []byte(history)}}})
		batch[len(batch)-1].Headers = append(batch[len(batch)-1].Headers, extra...)
		if len(batch) == 1000 || i == n-1 {
			if err := w.WriteMessages(context.Background(), batch...); err != nil {
				e.t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// timed sends a request as a JSON client and returns its status, body and
// duration.
func (e *env) timed(method, path string, form url.Values) (int, string, time.Duration) {
	var r *http.Request
	e.resolveForm(path, form)
	if form != nil {
		r = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		r = httptest.NewRequest(method, path, nil)
	}
	r.Header.Set("Authorization", "Bearer "+testToken)
	r.Header.Set("Accept", "application/json")
	w := httptest.NewRecorder()
	start := time.Now()
	e.console.ServeHTTP(w, r)
	return w.Code, w.Body.String(), time.Since(start)
}

// A replay of every letter of an error class is a dlq.Filter the
// Reprocessor applies: it selects by class however many letters match
// (no list of message IDs, so no ReplaySelectionMax), and another class
// selects none.
func TestClassFilteredReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	n := ReplaySelectionMax + 5
	e.writeLetters(n)
	base := "/dlq/" + url.PathEscape(e.dlq)
	for _, tc := range []struct {
		class string
		want  int
	}{{"permanent", n}, {"transient", 0}} {
		res := e.req("POST", base+"/replay/dry-run", e.form("scope", "filtered", "class", tc.class), "Accept", "application/json")
		var dry replayData
		if err := json.Unmarshal([]byte(res.body), &dry); err != nil || res.status != http.StatusOK {
			t.Fatalf("class %s: %d %v %.300s", tc.class, res.status, err, res.body)
		}
		if got := dry.Records[dlq.WouldReplay]; got != tc.want || len(dry.Items) != tc.want {
			t.Errorf("class %s: %d would be replayed (%d items), want %d", tc.class, got, len(dry.Items), tc.want)
		}
	}
	if e.originMessages() != 0 || len(e.audit()) != 0 {
		t.Fatal("a dry run acted")
	}
}

// peakHeap runs f and returns how much the heap in use grew at most while
// it ran (sampled every 2ms).
func peakHeap(f func()) int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	f()
	close(stop)
	<-done
	return int64(peak.Load()) - int64(base)
}

// A dead-letter page and the overview list the whole topic without
// payloads or headers (dlq.ListConfig.DropHeaders): the origin's headers
// are its producer's to choose, so 400 more letters carrying 128 KiB of
// them each add no more than noise to the peak of a page's memory.
func TestListingMemoryIgnoresHeaders(t *testing.T) {
	// Not parallel: the heap is measured, collected often so that its
	// peak is what is held, not garbage.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	e := newEnv(t, nil)
	baggage := kafka.Header{Key: "trace-baggage", Value: []byte(strings.Repeat("b", 128<<10))}
	paths := []string{"/dlq/" + url.PathEscape(e.dlq) + "?size=1", "/"}
	peaks := func() []int64 {
		var out []int64
		for _, p := range paths {
			var code int
			grew := peakHeap(func() { code, _, _ = e.timed("GET", p, nil) })
			if code != http.StatusOK {
				t.Fatalf("GET %s: %d", p, code)
			}
			out = append(out, grew)
		}
		return out
	}
	e.writeLetters(100, baggage)
	before := peaks()
	e.writeLetters(400, baggage) // 50 MiB more of headers
	after := peaks()
	for i, p := range paths {
		if grew := after[i] - before[i]; grew > 24<<20 {
			t.Errorf("GET %s (one row shown): the heap's peak grew by %d MiB with 400 more letters of 128 KiB headers (%d MiB, then %d MiB)",
				p, grew>>20, before[i]>>20, after[i]>>20)
		}
	}
}
