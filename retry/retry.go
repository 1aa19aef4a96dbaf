package retry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

// Defaults of Policy.
const (
	InitialIntervalDefault     = 100 * time.Millisecond
	MaxIntervalDefault         = 10 * time.Second
	MultiplierDefault          = 2.0
	RandomizationFactorDefault = 0.5
	MaxAttemptsDefault         = 5
	MaxElapsedTimeDefault      = 2 * time.Minute
)

// Class is how an error is treated.
type Class int

const (
	// ClassTransient errors are retried under the policy.
	ClassTransient Class = iota + 1
	// ClassPermanent errors are never retried: invalid data, rejected
	// business rules. They go to the dead-letter path at once.
	ClassPermanent
	// ClassStop means the caller's context ended: stop without a verdict.
	ClassStop
)

func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassStop:
		return "stopped"
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// PermanentError marks an error that must not be retried (see Permanent).
type PermanentError struct {
	Err error
}

// Error is the wrapped error's text.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err in a *PermanentError so that it is never retried. It
// returns nil for a nil err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent (errors marked with backoff/v4's Permanent are recognised too).
func IsPermanent(err error) bool {
	var p *PermanentError
	var bp *backoff.PermanentError
	return errors.As(err, &p) || errors.As(err, &bp)
}

// Classify is the default classifier:
//   - context cancellation and deadline: ClassStop;
//   - errors marked with Permanent: ClassPermanent;
//   - decode and validation errors (JSON syntax and type errors, number
//     parsing errors, errors matching ErrInvalid), PostgreSQL data and
//     integrity errors (SQLSTATE classes 22 and 23), Kafka errors that are
//     not temporary: ClassPermanent;
//   - PostgreSQL serialization failures and deadlocks, connection errors
//     (pgconn.SafeToRetry, a dropped connection, network errors), Kafka
//     temporary errors: ClassTransient;
//   - anything else: ClassTransient, bounded by the policy's attempts — unknown
//     errors are retried a few times before they are given up on.
func Classify(err error) Class {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		numErr    *strconv.NumError
		pgErr     *pgconn.PgError
		kafkaErr  kafka.Error
	)
	switch {
	case err == nil:
		return ClassTransient
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassStop
	case IsPermanent(err), errors.Is(err, ErrInvalid):
		return ClassPermanent
	case errors.As(err, &syntaxErr), errors.As(err, &typeErr), errors.As(err, &numErr):
		return ClassPermanent
	case errors.As(err, &pgErr):
		switch pgErr.Code[:2] {
		case "40", "08", "53", "57": // serialization/deadlock, connection, resources, operator intervention
			return ClassTransient
		case "22", "23": // data exceptions, integrity constraint violations: the data is wrong
			return ClassPermanent
		}
		return ClassTransient
	case errors.As(err, &kafkaErr):
		if kafkaErr.Temporary() {
			return ClassTransient
		}
		return ClassPermanent
	}
	return ClassTransient
}

// ErrInvalid marks invalid input: wrap it (fmt.Errorf("...: %w", retry.ErrInvalid))
// in a handler's validation error and Classify treats the error as permanent.
var ErrInvalid = errors.New("invalid input")

// Policy is a bounded exponential backoff with jitter, built on
// cenkalti/backoff/v4, with a split between transient and permanent errors.
// The zero value is usable: every field has a default. A Policy is safe for
// concurrent use; each retried operation gets its own Schedule.
type Policy struct {
	// InitialInterval is the delay after the first failure, before jitter.
	// Defaults to 100ms.
	InitialInterval time.Duration
	// MaxInterval caps one delay, before jitter. Defaults to 10s.
	MaxInterval time.Duration
	// Multiplier grows the delay after each failure. Defaults to 2.
	Multiplier float64
	// RandomizationFactor spreads each delay uniformly over
	// [d·(1−f), d·(1+f)] so that many failing workers do not retry in step.
	// Defaults to 0.5; a negative value means no jitter.
	RandomizationFactor float64
	// MaxAttempts bounds the attempts, the first one included. Defaults to 5;
	// a negative value means no bound on attempts (MaxElapsedTime still holds).
	MaxAttempts int
	// MaxElapsedTime bounds the time from the first failure on. Defaults to
	// 2m; a negative value means no bound on time.
	MaxElapsedTime time.Duration
	// Classifier decides which errors are retried. Defaults to Classify.
	Classifier func(error) Class

	// Rand returns a uniform number in [0, 1) for the jitter. Defaults to
	// math/rand/v2. Tests inject a fixed sequence.
	Rand func() float64
	// Clock measures elapsed time. Defaults to the system clock.
	Clock Clock
}

// Clock tells the time; tests inject one to make MaxElapsedTime pass.
type Clock interface {
	Now() time.Time
}

func (p *Policy) resolved() Policy {
	var c Policy
	if p != nil {
		c = *p
	}
	c.InitialInterval = cmp.Or(c.InitialInterval, InitialIntervalDefault)
	c.MaxInterval = cmp.Or(c.MaxInterval, MaxIntervalDefault)
	c.Multiplier = cmp.Or(c.Multiplier, MultiplierDefault)
	c.RandomizationFactor = cmp.Or(c.RandomizationFactor, RandomizationFactorDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.MaxElapsedTime = cmp.Or(c.MaxElapsedTime, MaxElapsedTimeDefault)
	if c.Classifier == nil {
		c.Classifier = Classify
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c
}

// Validate reports a policy that cannot work.
func (p *Policy) Validate() error {
	c := p.resolved()
	switch {
	case c.InitialInterval < 0, c.MaxInterval < 0:
		return fmt.Errorf("retry: intervals must not be negative")
	case c.MaxInterval < c.InitialInterval:
		return fmt.Errorf("retry: MaxInterval %s < InitialInterval %s", c.MaxInterval, c.InitialInterval)
	case c.Multiplier < 1:
		return fmt.Errorf("retry: Multiplier %v < 1", c.Multiplier)
	case c.RandomizationFactor >= 1:
		return fmt.Errorf("retry: RandomizationFactor %v must be below 1", c.RandomizationFactor)
	}
	return nil
}

// Classify classifies err with the policy's classifier.
func (p *Policy) Classify(err error) Class { return p.resolved().Classifier(err) }

// MaxIntervalOrDefault returns the cap on one delay, with the default applied.
func (p *Policy) MaxIntervalOrDefault() time.Duration { return p.resolved().MaxInterval }

// MaxAttemptsOrZero returns the attempt bound, or 0 when there is none.
func (p *Policy) MaxAttemptsOrZero() int { return max(p.resolved().MaxAttempts, 0) }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Schedule paces the attempts of one operation under a Policy.
type Schedule struct {
	b backoff.BackOff
}

// Next returns the wait before the next attempt; ok is false once the
// policy's attempts or elapsed time are used up.
func (s *Schedule) Next() (wait time.Duration, ok bool) {
	d := s.b.NextBackOff()
	return d, d != backoff.Stop
}

// Reset starts the schedule over: the next wait is the first one again.
func (s *Schedule) Reset() { s.b.Reset() }

// Schedule returns a fresh Schedule for one operation.
func (p *Policy) Schedule() *Schedule {
	c := p.resolved()
	exp := &backoff.ExponentialBackOff{
		InitialInterval:     c.InitialInterval,
		RandomizationFactor: 0, // jitter is ours, with an injectable source
		Multiplier:          c.Multiplier,
		MaxInterval:         c.MaxInterval,
		MaxElapsedTime:      max(c.MaxElapsedTime, 0),
		Stop:                backoff.Stop,
		Clock:               c.Clock,
	}
	exp.Reset()
	var b backoff.BackOff = &jittered{exp: exp, factor: max(c.RandomizationFactor, 0), rand: c.Rand}
	if c.MaxAttempts > 0 {
		b = backoff.WithMaxRetries(b, uint64(c.MaxAttempts-1))
	}
	return &Schedule{b: b}
}

// jittered spreads an exponential schedule's delays.
type jittered struct {
	exp    *backoff.ExponentialBackOff
	factor float64
	rand   func() float64
}

func (j *jittered) NextBackOff() time.Duration {
	d := j.exp.NextBackOff()
	if d == backoff.Stop || j.factor == 0 {
		return d
	}
	delta := j.factor * float64(d)
	return time.Duration(float64(d) - delta + j.rand()*2*delta)
}

func (j *jittered) Reset() { j.exp.Reset() }

// Error is what Do returns when it gives up: the last error, how many
// attempts ran, and the class that ended them.
type Error struct {
	Err      error
	Attempts int
	Class    Class
}

func (e *Error) Error() string {
	return fmt.Sprintf("retry: gave up after %d attempt(s) (%s): %v", e.Attempts, e.Class, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Do runs op until it succeeds, fails with a permanent error, the schedule
// is used up, or ctx ends. notify, when not nil, is called before each wait.
// The error it returns is a *Error, or ctx's error.
func (p *Policy) Do(ctx context.Context, op func(ctx context.Context) error, notify func(err error, attempt int, wait time.Duration)) error {
	c := p.resolved()
	b := p.Schedule()
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil {
			return nil
		}
		class := c.Classifier(err)
		if class == ClassTransient && ctx.Err() != nil {
			class = ClassStop
		}
		if class != ClassTransient {
			if class == ClassStop && ctx.Err() != nil {
				return ctx.Err()
			}
			return &Error{Err: err, Attempts: attempt, Class: class}
		}
		wait, ok := b.Next()
		if !ok {
			return &Error{Err: err, Attempts: attempt, Class: class}
		}
		if notify != nil {
			notify(err, attempt, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
