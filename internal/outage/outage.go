// Package outage waits out a server that cannot be reached: every part of
// idemkit that talks to PostgreSQL or Kafka in a loop (the consumer runner,
// the outbox relay, the dead-letter writer and reprocessor) uses one Waiter
// per loop, so that an outage is logged once when it starts and once when it
// ends, with its duration, and is bounded by the user's MaxOutage.
package outage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idemkit/retry"
)

// The messages logged when an outage starts and when it ends: the server
// answered again (EndMsg), or no loop waits for it any more (StoppedMsg, see
// Waiter.Stop; whether the server is back is not known).
const (
	StartMsg   = "server unreachable; waiting it out"
	EndMsg     = "server reachable again"
	StoppedMsg = "stopped waiting for the server; the loop ended"
	GaveUpMsg  = "server unreachable for longer than MaxOutage; giving up"
)

// Policy is the backoff between two tries during an outage: 100ms doubling
// to 5s, with jitter, without bound (MaxOutage bounds the outage).
func Policy() *retry.Policy {
	return &retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 5 * time.Second,
		MaxAttempts: -1, MaxElapsedTime: -1}
}

// Waiter tracks one loop's outage. It is not safe for concurrent use: give
// each goroutine its own.
type Waiter struct {
	// Op names what waits, for logs and errors: "consumer orders/3".
	Op string
	// Log receives one Warn when an outage starts and one Info when it ends.
	Log *slog.Logger
	// Max bounds an outage; 0 or less waits for ever.
	Max time.Duration
	// Policy paces the tries; nil means Policy().
	Policy *retry.Policy
	// Bound, when positive, is how long one try of Do may take: its
	// context ends then, and a try given up so counts as the server not
	// answering (a connection that went silent is given up on, and the
	// next try takes another).
	Bound time.Duration
	// OnStart and OnEnd, when set, observe outages (hooks, tests).
	OnStart func(op string, err error)
	OnEnd   func(op string, d time.Duration)
	// Shared, when set, reports the outages of several waiters (the loops
	// of one runner) as one: logged and observed when the first waiter
	// enters it and when the last one leaves it. Log, OnStart and OnEnd are
	// then not used.
	Shared *Tracker

	since    time.Time
	schedule *retry.Schedule
	last     error
}

// Wait is called after a try failed with err. When err is not a connection
// error it returns err unchanged: the caller handles it as before. Otherwise
// it logs the outage's start (first failure only), sleeps the next backoff
// and returns nil so that the caller tries again; it returns a
// *retry.OutageError once the outage lasted longer than Max, and ctx's error
// when ctx ends.
func (w *Waiter) Wait(ctx context.Context, err error) error {
	if err == nil {
		w.Ok()
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !retry.IsConnection(err) {
		return err
	}
	now := time.Now()
	if w.since.IsZero() {
		w.since = now
		p := w.Policy
		if p == nil {
			p = Policy()
		}
		w.schedule = p.Schedule()
		if w.Shared != nil {
			w.Shared.start(w.Op, err)
		} else {
			w.log().Warn(StartMsg, "op", w.Op, "err", err)
			if w.OnStart != nil {
				w.OnStart(w.Op, err)
			}
		}
	}
	w.last = err
	if d := now.Sub(w.since); w.Max > 0 && d > w.Max {
		log := w.log()
		if w.Shared != nil {
			log = w.Shared.log()
		}
		log.Error(GaveUpMsg, "op", w.Op, "outage", d.Round(time.Millisecond), "max_outage", w.Max, "err", err)
		oerr := &retry.OutageError{Op: w.Op, Since: w.since, Duration: d, Err: err}
		w.since = time.Time{}
		if w.Shared != nil {
			w.Shared.stop(err) // no "reachable again": this waiter gave up
		}
		return oerr
	}
	delay, ok := w.schedule.Next()
	if !ok {
		delay = 5 * time.Second
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Ok is called after a try succeeded: an outage in progress ends, and its
// end is logged with its duration.
func (w *Waiter) Ok() {
	if w.since.IsZero() {
		return
	}
	d := time.Since(w.since)
	if w.Shared != nil {
		w.Shared.end(w.last)
	} else {
		w.log().Info(EndMsg, "op", w.Op, "outage", d.Round(time.Millisecond), "last_err", w.last)
		if w.OnEnd != nil {
			w.OnEnd(w.Op, d)
		}
	}
	w.since, w.last = time.Time{}, nil
}

// Stop is called when the loop stops waiting for good (its context ended: a
// shutdown, or a rebalance that ends a partition's worker) while an outage
// may be in progress. Without it the outage would never end: no "reachable
// again" line, no OnEnd, and a Tracker would count the waiter as waiting for
// ever and log no later outage. An outage in progress ends for this waiter
// without a success: a waiter of a Tracker leaves it (the tracker's outage
// ends when no waiter is left in it); a waiter of its own logs that it
// stopped waiting, with the outage's duration, and calls OnEnd. Stop does
// nothing outside an outage.
func (w *Waiter) Stop() {
	if w.since.IsZero() {
		return
	}
	d := time.Since(w.since)
	if w.Shared != nil {
		w.Shared.stop(w.last)
	} else {
		w.log().Info(StoppedMsg, "op", w.Op, "outage", d.Round(time.Millisecond), "last_err", w.last)
		if w.OnEnd != nil {
			w.OnEnd(w.Op, d)
		}
	}
	w.since, w.last = time.Time{}, nil
}

// Tracker merges the outages of several waiters into one: the first waiter
// to meet an outage starts it, the last one to get through (or to stop
// waiting) ends it. It is safe for concurrent use.
type Tracker struct {
	// Log receives one Warn when an outage starts and one Info when it ends.
	Log *slog.Logger
	// OnStart and OnEnd, when set, observe the merged outages.
	OnStart func(op string, err error)
	OnEnd   func(op string, d time.Duration)

	mu     sync.Mutex
	active int
	since  time.Time
	op     string
}

func (t *Tracker) start(op string, err error) {
	t.mu.Lock()
	t.active++
	first := t.active == 1
	if first {
		t.since, t.op = time.Now(), op
	}
	t.mu.Unlock()
	if first {
		t.log().Warn(StartMsg, "op", op, "err", err)
		if t.OnStart != nil {
			t.OnStart(op, err)
		}
	}
}

func (t *Tracker) end(last error) { t.leave(EndMsg, last) }

func (t *Tracker) stop(last error) { t.leave(StoppedMsg, last) }

// leave takes a waiter out of the outage; the last one out ends it with msg.
func (t *Tracker) leave(msg string, last error) {
	t.mu.Lock()
	t.active--
	done := t.active == 0
	op, d := t.op, time.Since(t.since)
	t.mu.Unlock()
	if done {
		t.log().Info(msg, "op", op, "outage", d.Round(time.Millisecond), "last_err", last)
		if t.OnEnd != nil {
			t.OnEnd(op, d)
		}
	}
}

func (t *Tracker) log() *slog.Logger {
	if t.Log == nil {
		return slog.Default()
	}
	return t.Log
}

// InOutage reports whether an outage is in progress.
func (w *Waiter) InOutage() bool { return !w.since.IsZero() }

// Do runs op until it succeeds, fails with an error that is not a connection
// error (returned as is), the outage outlasts Max (a *retry.OutageError) or
// ctx ends (ctx's error).
func (w *Waiter) Do(ctx context.Context, op func(ctx context.Context) error) error {
	for {
		err := w.try(ctx, op)
		if err == nil {
			w.Ok()
			return nil
		}
		if werr := w.Wait(ctx, err); werr != nil {
			if werr == err && ctx.Err() == nil {
				w.Ok() // a verdict from a server that answered
			}
			return werr
		}
	}
}

// try runs op once, within Bound.
func (w *Waiter) try(ctx context.Context, op func(ctx context.Context) error) error {
	if w.Bound <= 0 {
		return op(ctx)
	}
	tctx, cancel := context.WithTimeout(ctx, w.Bound)
	defer cancel()
	err := op(tctx)
	if err != nil && tctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		// Whatever op made of its context's end, the server did not
		// answer in time.
		err = fmt.Errorf("no answer within %v: %w (%w)", w.Bound, context.DeadlineExceeded, err)
	}
	return err
}

func (w *Waiter) log() *slog.Logger {
	if w.Log == nil {
		return slog.Default()
	}
	return w.Log
}
