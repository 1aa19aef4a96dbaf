package outage_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func fast() *retry.Policy {
	return &retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond, MaxAttempts: -1, MaxElapsedTime: -1}
}

// An outage of several failed tries is logged once when it starts and once
// when it ends; the hooks see it once each.
func TestDoLogsAnOutageOnce(t *testing.T) {
	rec := &recorder{}
	var started, ended int
	w := &outage.Waiter{Op: "test", Log: slog.New(rec), Policy: fast(),
		OnStart: func(string, error) { started++ }, OnEnd: func(string, time.Duration) { ended++ }}
	tries := 0
	err := w.Do(context.Background(), func(context.Context) error {
		tries++
		if tries < 5 {
			return fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
		}
		return nil
	})
	if err != nil || tries != 5 {
		t.Fatalf("Do = %v after %d tries, want nil after 5", err, tries)
	}
	got := strings.Join(rec.msgs, "|")
	if got != "WARN server unreachable; waiting it out|INFO server reachable again" || started != 1 || ended != 1 {
		t.Fatalf("logs %q, hooks %d/%d; want one start and one end", got, started, ended)
	}
}

// An error that is not a connection error is returned at once, untouched.
func TestDoReturnsOtherErrors(t *testing.T) {
	w := &outage.Waiter{Op: "test", Log: slog.New(slog.DiscardHandler), Policy: fast()}
	verdict := errors.New("invalid input")
	tries := 0
	err := w.Do(context.Background(), func(context.Context) error { tries++; return verdict })
	if err != verdict || tries != 1 {
		t.Fatalf("Do = %v after %d tries, want the verdict after 1", err, tries)
	}
}

// Past Max, Do returns an *retry.OutageError wrapping the last error.
func TestDoBoundedByMax(t *testing.T) {
	w := &outage.Waiter{Op: "test", Log: slog.New(slog.DiscardHandler), Policy: fast(), Max: 30 * time.Millisecond}
	start := time.Now()
	err := w.Do(context.Background(), func(context.Context) error { return fmt.Errorf("dial: %w", syscall.ECONNREFUSED) })
	var oe *retry.OutageError
	if !errors.As(err, &oe) || !errors.Is(err, retry.ErrOutage) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Do = %v, want an OutageError wrapping the refusal", err)
	}
	if oe.Duration < 30*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("outage of %s after %s, want just over the 30ms bound", oe.Duration, time.Since(start))
	}
}

// A cancelled context ends the wait with the context's error.
func TestDoStopsWithContext(t *testing.T) {
	w := &outage.Waiter{Op: "test", Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := w.Do(ctx, func(context.Context) error { return fmt.Errorf("dial: %w", syscall.ECONNREFUSED) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v, want the context's deadline", err)
	}
}

// A loop that stops waiting (its context ended) in an outage ends the
// outage: logged as stopped, with OnEnd, so that starts and ends pair up.
func TestStopEndsAnAbandonedOutage(t *testing.T) {
	rec := &recorder{}
	var started, ended int
	w := &outage.Waiter{Op: "test", Log: slog.New(rec), Policy: fast(),
		OnStart: func(string, error) { started++ }, OnEnd: func(string, time.Duration) { ended++ }}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Do(ctx, func(context.Context) error { return fmt.Errorf("dial: %w", syscall.ECONNREFUSED) }); err == nil {
		t.Fatal("Do succeeded against a refusing server")
	}
	w.Stop()
	w.Stop() // outside an outage: nothing
	got := strings.Join(rec.msgs, "|")
	if got != "WARN server unreachable; waiting it out|INFO stopped waiting for the server; the loop ended" ||
		started != 1 || ended != 1 || w.InOutage() {
		t.Fatalf("logs %q, hooks %d/%d, in outage %v; want one start and one stop", got, started, ended, w.InOutage())
	}
}

// A waiter of a tracker that stops waiting leaves the tracker's outage:
// the outage ends when the other waiters get through, and the next outage
// is logged again. (Before Stop, a worker ended by a rebalance in an outage
// kept its runner's tracker in that outage for good.)
func TestStopLeavesTheTracker(t *testing.T) {
	rec := &recorder{}
	var started, ended int
	tr := &outage.Tracker{Log: slog.New(rec), OnStart: func(string, error) { started++ },
		OnEnd: func(string, time.Duration) { ended++ }}
	refused := fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
	enter := func(w *outage.Waiter) {
		t.Helper()
		if err := w.Wait(context.Background(), refused); err != nil {
			t.Fatal(err)
		}
	}
	a := &outage.Waiter{Op: "a", Shared: tr, Policy: fast()}
	b := &outage.Waiter{Op: "b", Shared: tr, Policy: fast()}
	enter(a)
	enter(b)
	a.Stop() // a's loop ended (a rebalance); b still waits
	b.Ok()
	enter(b) // a later outage
	b.Stop() // the last waiter stops: the outage ends as stopped
	got := strings.Join(rec.msgs, "|")
	want := "WARN server unreachable; waiting it out|INFO server reachable again|" +
		"WARN server unreachable; waiting it out|INFO stopped waiting for the server; the loop ended"
	if got != want || started != 2 || ended != 2 {
		t.Fatalf("logs %q, hooks %d/%d; want two outages, each started and ended once", got, started, ended)
	}
}

// With Bound, a try that gets no answer is given up when its context ends
// (whatever error it makes of that), counted as an outage, and tried again.
func TestDoGivesUpASilentTry(t *testing.T) {
	rec := &recorder{}
	var startErr error
	w := &outage.Waiter{Op: "test", Log: slog.New(rec), Policy: fast(), Bound: 10 * time.Millisecond,
		OnStart: func(_ string, err error) { startErr = err }}
	tries := 0
	err := w.Do(context.Background(), func(ctx context.Context) error {
		tries++
		if tries == 1 {
			<-ctx.Done() // a server that never answers
			return errors.New("read: closed")
		}
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("a try without a deadline")
		}
		return nil
	})
	if err != nil || tries != 2 {
		t.Fatalf("Do = %v after %d tries, want nil after 2", err, tries)
	}
	if !errors.Is(startErr, context.DeadlineExceeded) || !strings.Contains(startErr.Error(), "read: closed") {
		t.Fatalf("the outage started with %v, want a deadline error wrapping the try's", startErr)
	}
	if got := strings.Join(rec.msgs, "|"); got != "WARN server unreachable; waiting it out|INFO server reachable again" {
		t.Fatalf("logs %q", got)
	}
}
