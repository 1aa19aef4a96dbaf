package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
)

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

// TestReviewAttackClassFilterQuadratic — LOW (CPU exhaustion by an
// authenticated user, or by the operator's own use during an incident).
// A replay of "every filtered letter" with an error-class filter turns the
// listing into message IDs, de-duplicating with slices.Contains inside the
// loop over every letter (deadletters.go replaySelection, case
// "filtered": O(n²)), and only then refuses more than ReplaySelectionMax.
// The loop does not look at the request's context either. At 40 000 letters
// the refusal costs several times the listing itself; at a few hundred
// thousand letters (a real incident) one click keeps a core busy for
// minutes, past the 2-minute bound. (The "selected" scope is protected by
// Go's own limit of 10 000 form values.)
// Fix: de-duplicate with a map and stop as soon as ReplaySelectionMax+1
// distinct IDs are found.
func TestReviewAttackClassFilterQuadratic(t *testing.T) {
	// Not parallel: CPU time is compared.
	e := newEnv(t, nil)
	e.writeLetters(40000)
	base := "/dlq/" + url.PathEscape(e.dlq)
	code, _, list := e.timed("GET", base+"?class=permanent", nil) // the same listing, rendered as a page
	if code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	code, body, dry := e.timed("POST", base+"/replay/dry-run", e.form("scope", "filtered", "class", "permanent"))
	if code != http.StatusBadRequest {
		t.Fatalf("dry run: %d %.300s", code, body)
	}
	if limit := list*3/2 + time.Second; dry > limit {
		t.Errorf("refusing a class-filtered replay of 40000 letters took %s, the listing %s: quadratic de-duplication before the limit",
			dry, list)
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

// TestReviewAttackLetterHeadersBlowUpMemory — MEDIUM (memory exhaustion,
// by whoever produces the messages that get dead-lettered). A dead-letter
// page, and the overview, list the whole topic with dlq.List(NoPayload),
// which drops key and value but keeps every letter's headers — the origin
// message's own headers, which its producer chooses (dlq/state.go List:
// only d.Message.Key, d.Message.Value = nil). The guide's "memory grows
// with the number of letters, not with their values" does not hold: here a
// page of ONE row holds ~50 MiB for 400 letters carrying a 128 KiB header
// (a tracing baggage, or a hostile client's messages made to fail). At a
// few thousand such letters every visit to the overview or a dead-letter
// page costs gigabytes, per concurrent request: the console (or the
// service it is mounted in) is OOM-killed during the incident it is opened
// for.
// Fix: in the listing keep only what the pages use (coordinates, ID,
// origin, history): drop d.Message.Headers with NoPayload (a letter's page
// reads its own letter again); bound concurrent listings.
func TestReviewAttackLetterHeadersBlowUpMemory(t *testing.T) {
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
