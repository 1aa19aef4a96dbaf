package retry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/retry"
)

// seq returns the given numbers in turn, as an injected random source.
func seq(vals ...float64) func() float64 {
	i := 0
	return func() float64 { v := vals[i%len(vals)]; i++; return v }
}

func schedule(s *retry.Schedule) []time.Duration {
	var out []time.Duration
	for d, ok := s.Next(); ok; d, ok = s.Next() {
		out = append(out, d)
	}
	return out
}

func TestScheduleGrowsAndIsBounded(t *testing.T) {
	t.Parallel()
	p := &retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, MaxAttempts: 7,
		RandomizationFactor: -1}
	got := schedule(p.Schedule())
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	if len(got) != len(want) {
		t.Fatalf("schedule %v: %d waits, want %d (7 attempts)", got, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("wait %d = %s, want %s (schedule %v)", i, got[i], want[i]*time.Millisecond, got)
		}
	}
}

func TestJitterSpreadsWithInjectedRandom(t *testing.T) {
	t.Parallel()
	p := &retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 10 * time.Second, MaxAttempts: 4,
		RandomizationFactor: 0.5, Rand: seq(0, 0.5, 0.999999)}
	got := schedule(p.Schedule())
	// base 100ms, 200ms, 400ms; factor 0.5 → [50,150], [100,300], [200,600]
	want := []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 600 * time.Millisecond}
	for i := range want {
		if diff := got[i] - want[i]; diff < -time.Millisecond || diff > time.Millisecond {
			t.Fatalf("wait %d = %s, want ≈%s (schedule %v)", i, got[i], want[i], got)
		}
	}
	// Two schedules with different random draws differ: the delays are randomized.
	a := schedule((&retry.Policy{Rand: seq(0.1)}).Schedule())
	b := schedule((&retry.Policy{Rand: seq(0.9)}).Schedule())
	if a[0] == b[0] {
		t.Fatalf("jitter made no difference: %v vs %v", a, b)
	}
}

// fakeClock moves only when told.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func TestMaxElapsedTimeUsesInjectedClock(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Unix(1000, 0)}
	p := &retry.Policy{MaxAttempts: -1, MaxElapsedTime: 10 * time.Second, RandomizationFactor: -1, Clock: clock}
	b := p.Schedule()
	if d, ok := b.Next(); !ok || d != retry.InitialIntervalDefault {
		t.Fatalf("first wait %s, %v", d, ok)
	}
	clock.now = clock.now.Add(11 * time.Second)
	if d, ok := b.Next(); ok {
		t.Fatalf("after 11s of a 10s budget: %s, want give up", d)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	var syntax *json.SyntaxError
	jsonErr := json.Unmarshal([]byte("{"), &struct{}{})
	if !errors.As(jsonErr, &syntax) {
		t.Fatalf("setup: %T", jsonErr)
	}
	_, numErr := strconv.Atoi("x")
	for _, tc := range []struct {
		err  error
		want retry.Class
	}{
		{errors.New("timeout talking to provider"), retry.ClassTransient},
		{retry.Permanent(errors.New("card declined")), retry.ClassPermanent},
		{fmt.Errorf("wrapped: %w", backoff.Permanent(errors.New("x"))), retry.ClassPermanent},
		{fmt.Errorf("wrapped: %w", retry.Permanent(errors.New("x"))), retry.ClassPermanent},
		{fmt.Errorf("amount: %w", retry.ErrInvalid), retry.ClassPermanent},
		{fmt.Errorf("decode: %w", jsonErr), retry.ClassPermanent},
		{fmt.Errorf("parse: %w", numErr), retry.ClassPermanent},
		{&pgconn.PgError{Code: "40001"}, retry.ClassTransient},
		{&pgconn.PgError{Code: "40P01"}, retry.ClassTransient},
		{&pgconn.PgError{Code: "08006"}, retry.ClassTransient},
		{&pgconn.PgError{Code: "23505"}, retry.ClassPermanent},
		{&pgconn.PgError{Code: "22P02"}, retry.ClassPermanent},
		{kafka.LeaderNotAvailable, retry.ClassTransient},
		{kafka.MessageSizeTooLarge, retry.ClassPermanent},
		{context.Canceled, retry.ClassStop},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), retry.ClassStop},
	} {
		if got := retry.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestDo(t *testing.T) {
	t.Parallel()
	p := &retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond, MaxAttempts: 4}
	ctx := context.Background()

	calls := 0
	err := p.Do(ctx, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("flaky")
		}
		return nil
	}, nil)
	if err != nil || calls != 3 {
		t.Fatalf("heals after 3: err %v, calls %d", err, calls)
	}

	calls = 0
	var waits []time.Duration
	err = p.Do(ctx, func(context.Context) error { calls++; return errors.New("down") },
		func(_ error, _ int, d time.Duration) { waits = append(waits, d) })
	var rerr *retry.Error
	if !errors.As(err, &rerr) || rerr.Attempts != 4 || rerr.Class != retry.ClassTransient || calls != 4 || len(waits) != 3 {
		t.Fatalf("exhausted: %v (calls %d, waits %v)", err, calls, waits)
	}

	calls = 0
	err = p.Do(ctx, func(context.Context) error { calls++; return retry.Permanent(errors.New("declined")) }, nil)
	if !errors.As(err, &rerr) || rerr.Class != retry.ClassPermanent || calls != 1 {
		t.Fatalf("permanent: %v after %d calls", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err = (&retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour}).Do(cctx, func(context.Context) error {
		calls++
		cancel()
		return errors.New("down")
	}, nil)
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("cancelled: %v after %d calls", err, calls)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []*retry.Policy{
		{InitialInterval: time.Second, MaxInterval: time.Millisecond},
		{Multiplier: 0.5},
		{RandomizationFactor: 1},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v: Validate accepted it", p)
		}
	}
	if err := (&retry.Policy{}).Validate(); err != nil {
		t.Fatalf("zero policy: %v", err)
	}
}
