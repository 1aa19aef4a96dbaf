package idemtest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// CountRuns wraps next and counts the requests that reach it: place it
// inside idemhttp's middleware (mw.Handler(counted)) and pass runs to
// RequireReplay as the effect, to check that a replay did not run the
// handler.
func CountRuns(next http.Handler) (counted http.Handler, runs Effect[int64]) {
	var n atomic.Int64
	counted = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		next.ServeHTTP(w, r)
	})
	return counted, func(context.Context) (int64, error) { return n.Load(), nil }
}

// RequireReplay sends the request newRequest makes (with an
// Idempotency-Key header) through h twice, in process (httptest), and
// checks that the first answer is not a replay and changes what effect
// reads, and that the second is its replay: header Idempotent-Replayed:
// true, the same status, a byte-identical body, no header the first answer
// did not have with the same values, and the effect left as the first
// request left it (the handler did not run again). h is your handler with
// idemhttp's middleware in it, as your server serves it. newRequest is
// called once per request (a body is read once) and the request gets ctx.
// It returns both answers. Failures are reported with tb.Errorf, or
// tb.Fatalf when the requests cannot be made.
//
// Only idemhttp's public contract is used: its headers, not its tables.
func RequireReplay[T comparable](ctx context.Context, tb testing.TB, h http.Handler, newRequest func() *http.Request, effect Effect[T]) (first, replay *http.Response) {
	tb.Helper()
	send := func(which string) (*http.Response, []byte) {
		tb.Helper()
		req := newRequest()
		if req == nil {
			tb.Fatalf("idemtest: RequireReplay: newRequest returned nil")
			return nil, nil
		}
		if req.Header.Get(idemhttp.HeaderKey) == "" {
			tb.Fatalf("idemtest: RequireReplay: the %s request has no %s header", which, idemhttp.HeaderKey)
			return nil, nil
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req.WithContext(ctx))
		res := rec.Result()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			tb.Fatalf("idemtest: RequireReplay: read the %s answer: %v", which, err)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		return res, body
	}
	base := read(ctx, tb, effect, "before the first request")
	first, firstBody := send("first")
	once := read(ctx, tb, effect, "after the first request")
	if v := first.Header.Get(idemhttp.HeaderReplayed); v != "" {
		tb.Errorf("idemtest: the first request was answered with %s: %s (status %d): is its key new?", idemhttp.HeaderReplayed, v, first.StatusCode)
	}
	if once == base {
		tb.Errorf("idemtest: the first request (status %d) left the effect at %v: the effect reads nothing the handler does, so the test proves nothing", first.StatusCode, base)
	}
	replay, replayBody := send("second")
	after := read(ctx, tb, effect, "after the second request")
	if v := replay.Header.Get(idemhttp.HeaderReplayed); v != "true" {
		tb.Errorf("idemtest: the second request was answered with status %d and %s %q, want \"true\": the first answer (status %d) was not stored, or the requests differ in key or scope",
			replay.StatusCode, idemhttp.HeaderReplayed, v, first.StatusCode)
	}
	if replay.StatusCode != first.StatusCode {
		tb.Errorf("idemtest: the replay has status %d, the first answer %d", replay.StatusCode, first.StatusCode)
	}
	if !bytes.Equal(replayBody, firstBody) {
		tb.Errorf("idemtest: the replay's body differs from the first answer's:\n\tfirst:  %q\n\treplay: %q", firstBody, replayBody)
	}
	for k, vs := range replay.Header {
		if k == idemhttp.HeaderReplayed || k == "Date" || k == "Content-Length" {
			continue
		}
		if !slices.Equal(first.Header.Values(k), vs) {
			tb.Errorf("idemtest: the replay's header %s is %q, the first answer's %q", k, vs, first.Header.Values(k))
		}
	}
	if after != once {
		tb.Errorf("idemtest: the second request moved the effect from %v to %v: the handler ran again", once, after)
	}
	return first, replay
}
