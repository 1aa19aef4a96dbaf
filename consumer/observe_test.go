package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

type ctxKey struct{}

// trace records what the seams saw, in order.
type trace struct {
	mu     sync.Mutex
	events []string
}

func (tr *trace) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, fmt.Sprintf(format, args...))
}

func (tr *trace) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.events)
}

// tag returns the value TxStart put in ctx, or "-".
func tag(ctx context.Context) string {
	if v, ok := ctx.Value(ctxKey{}).(string); ok {
		return v
	}
	return "-"
}

// recorder is an observer that writes what it sees to a trace, under its
// name; its TxStart puts the attempt in the context.
type recorder struct {
	name string
	tr   *trace
	done chan struct{} // closed at the first Applied outcome (the first recorder's)
}

func (r *recorder) TxStart(ctx context.Context, e *consumer.TxStartEvent) context.Context {
	r.tr.add("%s start %d msgs attempt %d ctx=%s", r.name, len(e.Messages), e.Attempt, tag(ctx))
	return context.WithValue(ctx, ctxKey{}, fmt.Sprintf("%s%d", r.name, e.Attempt))
}

func (r *recorder) TxEnd(ctx context.Context, e *consumer.TxEndEvent) {
	r.tr.add("%s end ctx=%s outcomes=%v err=%v positive=%v", r.name, tag(ctx), e.Outcomes, e.Err != nil, e.Duration > 0)
}

func (r *recorder) Outcome(ctx context.Context, e *consumer.OutcomeEvent) {
	r.tr.add("%s outcome %s %s ctx=%s", r.name, e.Message.ID, e.Outcome, tag(ctx))
	if e.Outcome == consumer.Applied && r.done != nil {
		close(r.done)
	}
}

func (r *recorder) Retry(ctx context.Context, e *consumer.RetryEvent) {
	r.tr.add("%s retry %s attempt %d class %s err=%v ctx=%s", r.name, e.Message.ID, e.Attempt, e.Class, e.Err, tag(ctx))
}

// TestObserversCompose: two observers both see every event: TxStart in
// the order of Config.Observers, each getting the context the one before
// returned, TxEnd in the reverse order; the last TxStart's context reaches
// the middleware (which wraps the handler in order), the handler, TxEnd,
// Retry and Outcome. A failing attempt is retried with Retry reporting it,
// TxEnd reporting the rollback, and TxStart the next attempt's number.
func TestObserversCompose(t *testing.T) {
	t.Parallel()
	for _, md := range []mode{modes[0], modes[3]} {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m1", "k", 1))

			tr := &trace{}
			fails := 2
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				tr.add("handler %s ctx=%s", m.ID, tag(ctx))
				if fails > 0 {
					fails--
					return errors.New("flaky") // unknown errors are transient
				}
				return nil
			})
			cfg.Retry = retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, MaxAttempts: 5}
			wrap := func(name string) consumer.Middleware {
				return func(next consumer.Handler) consumer.Handler {
					return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
						tr.add("%s before ctx=%s", name, tag(ctx))
						err := next.Handle(ctx, tx, m)
						tr.add("%s after err=%v", name, err)
						return err
					})
				}
			}
			cfg.Middleware = []consumer.Middleware{wrap("outer"), wrap("inner")}
			done := make(chan struct{})
			cfg.Observers = []consumer.Observer{&recorder{name: "a", tr: tr, done: done}, &recorder{name: "b", tr: tr}}
			stop := run(t, e.db.Pool, cfg)
			wait(t, done, "the message applied")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			var want []string
			for attempt := 1; attempt <= 3; attempt++ {
				b := fmt.Sprintf("b%d", attempt)
				want = append(want,
					fmt.Sprintf("a start 1 msgs attempt %d ctx=-", attempt),
					fmt.Sprintf("b start 1 msgs attempt %d ctx=a%d", attempt, attempt),
					"outer before ctx="+b, "inner before ctx="+b, "handler m1 ctx="+b)
				if attempt < 3 {
					want = append(want, "inner after err=flaky", "outer after err=flaky",
						"b end ctx="+b+" outcomes=[] err=true positive=true",
						"a end ctx="+b+" outcomes=[] err=true positive=true",
						fmt.Sprintf("a retry m1 attempt %d class transient err=flaky ctx=%s", attempt, b),
						fmt.Sprintf("b retry m1 attempt %d class transient err=flaky ctx=%s", attempt, b))
					continue
				}
				want = append(want, "inner after err=<nil>", "outer after err=<nil>",
					"b end ctx="+b+" outcomes=[applied] err=false positive=true",
					"a end ctx="+b+" outcomes=[applied] err=false positive=true",
					"a outcome m1 applied ctx="+b, "b outcome m1 applied ctx="+b)
			}
			if got := tr.list(); !slices.Equal(got, want) {
				t.Fatalf("events:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
			if runs := e.runs(); runs["m1"] != 1 {
				t.Fatalf("effects %v, want m1 once", runs)
			}
		})
	}
}

// TestObserverImplementsNothing: New refuses an observer that takes no
// event, naming it.
func TestObserverImplementsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config(modes[0], nil)
	cfg.Observers = []consumer.Observer{&recorder{}, struct{ X int }{}}
	_, err := consumer.New(e.db.Pool, cfg)
	if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "Observers[1] (struct { X int })") {
		t.Fatalf("New: %v; want ErrInvalidConfig naming Observers[1]", err)
	}
}

// TestBatchMiddlewareAndDuplicates: batch middleware wraps the batch
// handler; a batch's transaction reports one TxStart/TxEnd with every
// message's outcome, duplicates included.
func TestBatchMiddlewareAndDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k", 1), msg("b", "k", 1), msg("a", "k", 1))

	var mu sync.Mutex
	var seen []consumer.Outcome
	var wrapped int
	oc := newOutcomes(3)
	cfg := e.config(modes[2], nil) // batch handler, batches of up to 50
	cfg.BatchMiddleware = []consumer.BatchMiddleware{func(next consumer.BatchHandler) consumer.BatchHandler {
		return consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			mu.Lock()
			wrapped += len(msgs)
			mu.Unlock()
			return next.HandleBatch(ctx, tx, msgs)
		})
	}}
	testobs.Of(cfg).OnTxEnd = func(ctx context.Context, msgs []*consumer.Message, outcomes []consumer.Outcome, err error, d time.Duration) {
		if err != nil || len(outcomes) != len(msgs) {
			t.Errorf("TxEnd: %d msgs, outcomes %v, err %v", len(msgs), outcomes, err)
			return
		}
		mu.Lock()
		seen = append(seen, outcomes...)
		mu.Unlock()
	}
	testobs.Of(cfg).OnOutcome = oc.hook
	stop := run(t, e.db.Pool, cfg)
	wait(t, oc.done, "three outcomes")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(seen)
	if want := []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Duplicate}; !slices.Equal(seen, want) {
		t.Fatalf("TxEnd outcomes %v, want %v", seen, want)
	}
	if wrapped != 2 {
		t.Fatalf("batch middleware saw %d messages, want the 2 new ones", wrapped)
	}
}

// TestRebalancedObserver: a runner's first generation reports its partitions.
func TestRebalancedObserver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	got := make(chan []int, 4)
	cfg := e.config(modes[3], nil)
	testobs.Of(cfg).OnRebalanced = func(generation int32, partitions []int) { got <- partitions }
	stop := run(t, e.db.Pool, cfg)
	select {
	case p := <-got:
		if !slices.Equal(p, []int{0, 1, 2}) {
			t.Fatalf("Rebalanced partitions %v, want [0 1 2]", p)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("no Rebalanced call")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestMiddlewareConfigErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	pass := func(h consumer.Handler) consumer.Handler { return h }
	for name, edit := range map[string]func(c *consumer.Config){
		"nil middleware": func(c *consumer.Config) { c.Middleware = []consumer.Middleware{pass, nil} },
		"returns nil": func(c *consumer.Config) {
			c.Middleware = []consumer.Middleware{func(consumer.Handler) consumer.Handler { return nil }}
		},
		"batch mw on handler": func(c *consumer.Config) {
			c.BatchMiddleware = []consumer.BatchMiddleware{func(h consumer.BatchHandler) consumer.BatchHandler { return h }}
		},
	} {
		cfg := e.config(modes[0], nil)
		edit(cfg)
		if _, err := consumer.New(e.db.Pool, cfg); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	cfg := e.config(modes[2], nil)
	cfg.Middleware = []consumer.Middleware{pass}
	if _, err := consumer.New(e.db.Pool, cfg); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("handler middleware with a batch handler: New = %v, want ErrInvalidConfig", err)
	}
}

// TestPartitionsStatus: Runner.Partitions shows the position, the lag
// behind the last stable offset and the parked messages while Run runs, and
// nothing after it returned.
func TestPartitionsStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k1", 1), msg("b", "k1", 1), msg("c", "k1", 1), msg("p", "bad", 1), msg("q", "bad", 1))

	gate := make(chan struct{})
	blocked := make(chan struct{})
	var once sync.Once
	cfg := e.config(modes[0], func(ctx context.Context, m *consumer.Message) error {
		switch m.ID {
		case "c":
			once.Do(func() { close(blocked) })
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		case "p":
			return errors.New("dependency down") // transient: parked
		}
		return nil
	})
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry = retry.Policy{MaxAttempts: 1}
	cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 10}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Partitions(); len(got) != 0 {
		t.Fatalf("before Run: %+v, want none", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	defer func() { cancel(); <-errc }()

	wait(t, blocked, "the handler of c")
	waitFor(t, "the position at c with lag 3", func() (bool, string) {
		ps := r.Partitions()
		ok := len(ps) == 1 && ps[0].Partition == 0 && ps[0].Next == 2 && ps[0].LastStable == 5 && ps[0].Lag == 3 &&
			ps[0].Parked == 0 && !ps[0].Assigned.IsZero() && !ps[0].Advanced.Before(ps[0].Assigned)
		return ok, fmt.Sprintf("%+v", ps)
	})
	close(gate)
	waitFor(t, "c applied, p and q parked, no lag", func() (bool, string) {
		ps := r.Partitions()
		ok := len(ps) == 1 && ps[0].Next == 5 && ps[0].Lag == 0 && ps[0].Parked == 2 && ps[0].Advanced.After(ps[0].Assigned)
		return ok, fmt.Sprintf("%+v", ps)
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	errc <- nil // for the deferred receive
	if got := r.Partitions(); len(got) != 0 {
		t.Fatalf("after Run: %+v, want none", got)
	}
}

// TestPartitionsStatusBeforeFirstCommit: a partition with no position yet
// shows the offset its first fetch began at, not the StartOffset sentinel,
// while its first message is being handled.
func TestPartitionsStatusBeforeFirstCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k1", 1), msg("b", "k1", 1), msg("c", "k1", 1))
	gate := make(chan struct{})
	blocked := make(chan struct{})
	var once sync.Once
	cfg := e.config(modes[0], func(ctx context.Context, m *consumer.Message) error {
		if m.ID == "a" {
			once.Do(func() { close(blocked) })
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	defer func() { cancel(); <-errc }()
	wait(t, blocked, "the handler of a")
	waitFor(t, "the position at a with lag 3", func() (bool, string) {
		ps := r.Partitions()
		return len(ps) == 1 && ps[0].Next == 0 && ps[0].LastStable == 3 && ps[0].Lag == 3, fmt.Sprintf("%+v", ps)
	})
	close(gate)
	waitFor(t, "no lag", func() (bool, string) {
		ps := r.Partitions()
		return len(ps) == 1 && ps[0].Next == 3 && ps[0].Lag == 0, fmt.Sprintf("%+v", ps)
	})
}

// waitFor polls cond until it holds, or fails with its last description.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}
