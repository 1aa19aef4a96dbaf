package idemtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
)

// Defaults NewConsumer fills in for fields a test need not set. No broker is
// ever contacted: BrokersDefault only satisfies consumer.New.
const (
	TopicDefault   = "idemtest"
	GroupIDDefault = "idemtest"
	BrokersDefault = "idemtest.invalid:9092"
)

// Effect reads the business effect under test, as committed (on a pool,
// not in the handler's transaction): a row count, a balance, a struct of
// several values, a counter kept in a Go variable. The helpers compare what
// it returns before and after each delivery.
type Effect[T comparable] func(ctx context.Context) (T, error)

// CrashPoint is where RequireRecovers makes a delivery fail.
type CrashPoint int

const (
	// CrashInHandler kills the transaction's PostgreSQL connection
	// (pg_terminate_backend) after the handler's statements, while the
	// handler is still running, as a process killed there would: the
	// transaction never commits.
	CrashInHandler CrashPoint = iota + 1
	// CrashBeforeCommit lets the handler return nil, having killed the
	// connection under it: COMMIT never reaches the server.
	CrashBeforeCommit
	// CrashAfterCommit lets the transaction commit, then drops what a
	// process killed before its Kafka offset commit loses: the message is
	// delivered again.
	CrashAfterCommit
)

// CrashPoints returns every crash point, in the order of the transaction.
func CrashPoints() []CrashPoint {
	return []CrashPoint{CrashInHandler, CrashBeforeCommit, CrashAfterCommit}
}

func (p CrashPoint) String() string {
	switch p {
	case CrashInHandler:
		return "in the handler"
	case CrashBeforeCommit:
		return "before commit"
	case CrashAfterCommit:
		return "after commit, before the offset commit"
	}
	return fmt.Sprintf("CrashPoint(%d)", int(p))
}

// errCrashed is what a handler "returns" when the kit killed its
// connection under it.
var errCrashed = errors.New("idemtest: connection killed in the handler")

// Consumer runs a consumer.Handler or consumer.BatchHandler through the
// runner's own transaction (consumer.Runner.Deliver), without Kafka, and
// counts the handler's calls per message ID. It is safe for concurrent use,
// but a crash armed by RequireRecovers applies to whichever delivery comes
// next: run those helpers one at a time per Consumer.
type Consumer struct {
	runner *consumer.Runner
	pool   *pgxpool.Pool

	mu       sync.Mutex
	calls    map[string]int
	pid      uint32     // backend of the last handler's transaction
	armed    CrashPoint // for the next delivery
	crashed  bool       // the armed crash happened
	crashErr error      // the crash could not be made
}

// NewConsumer returns a Consumer for pool and cfg, which are what you give
// consumer.New in production: cfg with Store (its schema migrated) and Handler
// or BatchHandler, with your Name, IDHeader, IDFunc, MissingID, Middleware
// and Observers. Empty Topic, GroupID and Brokers are set to TopicDefault,
// GroupIDDefault and BrokersDefault; no broker is contacted. cfg is not
// modified. An invalid cfg returns consumer.New's error.
func NewConsumer(pool *pgxpool.Pool, cfg *consumer.Config) (*Consumer, error) {
	if cfg == nil {
		return nil, fmt.Errorf("idemtest: %w: nil config", consumer.ErrInvalidConfig)
	}
	c := &Consumer{pool: pool, calls: map[string]int{}}
	rc := *cfg
	rc.Topic = cmp.Or(rc.Topic, TopicDefault)
	rc.GroupID = cmp.Or(rc.GroupID, GroupIDDefault)
	if len(rc.Kafka.Brokers) == 0 {
		rc.Kafka.Brokers = []string{BrokersDefault}
	}
	// The kit's middleware is the innermost: it sees exactly the calls the
	// runner makes to the user's handler, after the user's middleware.
	if rc.Handler != nil {
		rc.Middleware = append(slices.Clone(rc.Middleware), c.middleware)
	}
	if rc.BatchHandler != nil {
		rc.BatchMiddleware = append(slices.Clone(rc.BatchMiddleware), c.batchMiddleware)
	}
	rc.Observers = append(slices.Clone(rc.Observers), crashObserver{c})
	r, err := consumer.New(pool, &rc)
	if err != nil {
		return nil, fmt.Errorf("idemtest: %w", err)
	}
	c.runner = r
	return c, nil
}

// Deliver runs msgs, as one batch of one partition, through one transaction
// of the runner and returns each message's outcome (consumer.Applied or
// consumer.Duplicate); see consumer.Runner.Deliver. Messages with an empty
// Topic are taken as the consumer's topic.
func (c *Consumer) Deliver(ctx context.Context, msgs ...kafka.Message) ([]consumer.Outcome, error) {
	if c == nil || c.runner == nil {
		return nil, errors.New("idemtest: deliver: a Consumer not made by NewConsumer")
	}
	return c.runner.Deliver(ctx, msgs...)
}

// Calls returns how often the handler was called for the message ID id
// (for a BatchHandler: how many batches held it), whether its transaction
// committed or not.
func (c *Consumer) Calls(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

func (c *Consumer) called(tx pgx.Tx, msgs ...*consumer.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.calls[m.ID]++
	}
	c.pid = tx.Conn().PgConn().PID()
}

func (c *Consumer) middleware(next consumer.Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		c.called(tx, m)
		if err := next.Handle(ctx, tx, m); err != nil {
			return err
		}
		return c.crashAfter(ctx)
	})
}

func (c *Consumer) batchMiddleware(next consumer.BatchHandler) consumer.BatchHandler {
	return consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		c.called(tx, msgs...)
		if err := next.HandleBatch(ctx, tx, msgs); err != nil {
			return err
		}
		return c.crashAfter(ctx)
	})
}

// arm makes the next delivery crash at p.
func (c *Consumer) arm(p CrashPoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.crashed, c.crashErr = p, false, nil
}

// disarm ends an armed crash and says whether it happened.
func (c *Consumer) disarm() (crashed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	crashed, err = c.crashed, c.crashErr
	c.armed, c.crashed, c.crashErr = 0, false, nil
	return crashed, err
}

// take reports whether a crash is armed at p, and disarms it.
func (c *Consumer) take(p CrashPoint) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed != p {
		return false
	}
	c.armed = 0
	return true
}

// kill terminates the backend of the transaction in flight, from another
// connection, and waits until it is gone.
func (c *Consumer) kill(ctx context.Context) {
	c.mu.Lock()
	pid := c.pid
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var ok bool
	err := c.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, int32(pid)).Scan(&ok)
	if err == nil && !ok {
		err = fmt.Errorf("backend %d was not terminated", pid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.crashErr = fmt.Errorf("kill the transaction's connection: %w", err)
		return
	}
	c.crashed = true
}

// read runs effect and stops the test when it fails.
func read[T comparable](ctx context.Context, tb testing.TB, effect Effect[T], when string) T {
	tb.Helper()
	v, err := effect(ctx)
	if err != nil {
		tb.Fatalf("idemtest: read the effect %s: %v", when, err)
	}
	return v
}

// deliver delivers msgs and stops the test unless the outcomes are want.
func deliver(ctx context.Context, tb testing.TB, c *Consumer, what string, want []consumer.Outcome, msgs ...kafka.Message) {
	tb.Helper()
	got, err := c.Deliver(ctx, msgs...)
	if err != nil {
		tb.Fatalf("idemtest: %s: %v", what, err)
	}
	if !slices.Equal(got, want) {
		tb.Fatalf("idemtest: %s: outcomes %v, want %v", what, got, want)
	}
}

// calledOnce reports every message ID the handler was called for more
// than once since before (a snapshot).
func (c *Consumer) calledOnce(tb testing.TB, what string, before map[string]int) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.calls {
		if d := n - before[id]; d > 1 {
			tb.Errorf("idemtest: %s: the handler was called %d times for message ID %q, want once", what, d, id)
		}
	}
}

func (c *Consumer) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.calls))
	for id, n := range c.calls {
		out[id] = n
	}
	return out
}

// redelivered is msg produced again: the same record at the next offset
// (a producer retry, or the same event replayed).
func redelivered(msg kafka.Message) kafka.Message {
	msg.Offset++
	return msg
}

// RequireIdempotent delivers msg (whose ID must be new to the consumer)
// through c, then again at the same offset (a redelivery after a rebalance
// or a crash), then at the next offset (a producer retry), and checks that
// the first delivery is Applied and changes what effect reads, that both
// copies are Duplicates that leave it as the first delivery left it, and that
// the handler ran once. Failures are reported with tb.Errorf, or tb.Fatalf
// when the deliveries cannot go on; each says which delivery and what was
// seen.
//
// Deliveries that commit cannot show effects written outside the
// transaction (a counter in memory, a statement on the pool, an HTTP call):
// RequireRecovers makes a transaction fail and finds those.
func RequireIdempotent[T comparable](ctx context.Context, tb testing.TB, c *Consumer, msg kafka.Message, effect Effect[T]) {
	tb.Helper()
	calls := c.snapshot()
	base := read(ctx, tb, effect, "before the first delivery")
	deliver(ctx, tb, c, fmt.Sprintf("first delivery of offset %d", msg.Offset), []consumer.Outcome{consumer.Applied}, msg)
	once := read(ctx, tb, effect, "after the first delivery")
	if once == base {
		tb.Errorf("idemtest: the first delivery of offset %d left the effect at %v: the effect reads nothing the handler does, so the test proves nothing", msg.Offset, base)
	}
	deliver(ctx, tb, c, fmt.Sprintf("redelivery of offset %d", msg.Offset), []consumer.Outcome{consumer.Duplicate}, msg)
	if got := read(ctx, tb, effect, "after the redelivery"); got != once {
		tb.Errorf("idemtest: a redelivery of offset %d was acknowledged as a duplicate, yet the effect moved from %v to %v", msg.Offset, once, got)
	}
	retried := redelivered(msg)
	got, err := c.Deliver(ctx, retried)
	switch {
	case err != nil:
		tb.Fatalf("idemtest: producer retry (the same record at offset %d): %v", retried.Offset, err)
	case !slices.Equal(got, []consumer.Outcome{consumer.Duplicate}):
		tb.Errorf("idemtest: producer retry (the same record at offset %d): outcome %v, want duplicate: the message ID changes with the record's offset (an ID from coordinates?), so a producer retry is applied twice",
			retried.Offset, got)
	}
	if got := read(ctx, tb, effect, "after the producer retry"); got != once {
		tb.Errorf("idemtest: after a producer retry of offset %d the effect is %v, want %v as after the first delivery", msg.Offset, got, once)
	}
	c.calledOnce(tb, "RequireIdempotent", calls)
}

// RequireIdempotentBatch delivers a batch that holds msg (whose ID must be
// new) twice, at its offset and the next (a producer retry fetched in the
// same batch), then the same batch again, and checks that the outcomes are
// Applied, Duplicate and then Duplicate, Duplicate, that the first batch
// changes what effect reads and the second leaves it, and that the handler
// ran once for the ID (a BatchHandler: got it in one batch, once).
// Failures are reported as by RequireIdempotent.
func RequireIdempotentBatch[T comparable](ctx context.Context, tb testing.TB, c *Consumer, msg kafka.Message, effect Effect[T]) {
	tb.Helper()
	calls := c.snapshot()
	batch := []kafka.Message{msg, redelivered(msg)}
	base := read(ctx, tb, effect, "before the batch")
	deliver(ctx, tb, c, fmt.Sprintf("a batch of offsets %d and %d, one message ID", msg.Offset, msg.Offset+1),
		[]consumer.Outcome{consumer.Applied, consumer.Duplicate}, batch...)
	once := read(ctx, tb, effect, "after the batch")
	if once == base {
		tb.Errorf("idemtest: the batch of offsets %d and %d left the effect at %v: the effect reads nothing the handler does, so the test proves nothing", msg.Offset, msg.Offset+1, base)
	}
	deliver(ctx, tb, c, "the same batch again", []consumer.Outcome{consumer.Duplicate, consumer.Duplicate}, batch...)
	if got := read(ctx, tb, effect, "after the batch again"); got != once {
		tb.Errorf("idemtest: the batch delivered again was acknowledged as duplicates, yet the effect moved from %v to %v", once, got)
	}
	c.calledOnce(tb, "RequireIdempotentBatch", calls)
}

// RequireRecovers makes the delivery of msg (whose ID must be new) crash at
// crash, then delivers it again, as Kafka does after a crash, and once more,
// and checks that the effect happened exactly once:
//
//   - CrashInHandler, CrashBeforeCommit: the crashed delivery fails and
//     leaves what effect reads as it was (anything the handler did outside
//     its transaction shows here); the redelivery is Applied and changes it;
//     the last delivery is a Duplicate and leaves it.
//   - CrashAfterCommit: the crashed delivery is Applied and changes the
//     effect; the redelivery and the last delivery are Duplicates and leave
//     it.
//
// Failures are reported as by RequireIdempotent, naming the crash point.
func RequireRecovers[T comparable](ctx context.Context, tb testing.TB, c *Consumer, crash CrashPoint, msg kafka.Message, effect Effect[T]) {
	tb.Helper()
	if !slices.Contains(CrashPoints(), crash) {
		tb.Fatalf("idemtest: RequireRecovers: unknown crash point %d", int(crash))
		return
	}
	base := read(ctx, tb, effect, "before the delivery that crashes")
	c.arm(crash)
	got, err := c.Deliver(ctx, msg)
	crashed, crashErr := c.disarm()
	switch {
	case crashErr != nil:
		tb.Fatalf("idemtest: crash %s: %v", crash, crashErr)
	case !crashed && err != nil:
		tb.Fatalf("idemtest: the delivery of offset %d failed before the crash %s: %v", msg.Offset, crash, err)
	case !crashed:
		tb.Fatalf("idemtest: the delivery of offset %d never reached the crash %s (outcomes %v): is its ID new, and does the handler run?", msg.Offset, crash, got)
	}
	var once T
	if crash == CrashAfterCommit {
		if err != nil || !slices.Equal(got, []consumer.Outcome{consumer.Applied}) {
			tb.Fatalf("idemtest: the delivery that crashed %s: outcomes %v, %v; want applied", crash, got, err)
		}
		once = read(ctx, tb, effect, "after the crash")
		if once == base {
			tb.Errorf("idemtest: the committed delivery of offset %d left the effect at %v: the effect reads nothing the handler does, so the test proves nothing", msg.Offset, base)
		}
		deliver(ctx, tb, c, fmt.Sprintf("redelivery after the crash %s", crash), []consumer.Outcome{consumer.Duplicate}, msg)
		if got := read(ctx, tb, effect, "after the redelivery"); got != once {
			tb.Errorf("idemtest: after the crash %s the redelivery was a duplicate, yet the effect moved from %v to %v", crash, once, got)
		}
	} else {
		if err == nil {
			tb.Fatalf("idemtest: the delivery that crashed %s committed (outcomes %v): the kill did not reach its transaction", crash, got)
		}
		if after := read(ctx, tb, effect, "after the crash"); after != base {
			tb.Errorf("idemtest: after a crash %s the effect is %v, want %v as before: the transaction was rolled back, so the handler changed something outside it (memory, another connection, a remote call) that a redelivery will change again",
				crash, after, base)
		}
		deliver(ctx, tb, c, fmt.Sprintf("redelivery after the crash %s", crash), []consumer.Outcome{consumer.Applied}, msg)
		once = read(ctx, tb, effect, "after the redelivery")
		if once == base {
			tb.Errorf("idemtest: the redelivery after the crash %s left the effect at %v: the effect reads nothing the handler does, so the test proves nothing", crash, base)
		}
	}
	deliver(ctx, tb, c, fmt.Sprintf("a second redelivery after the crash %s", crash), []consumer.Outcome{consumer.Duplicate}, msg)
	if got := read(ctx, tb, effect, "after the second redelivery"); got != once {
		tb.Errorf("idemtest: after the crash %s a second redelivery was a duplicate, yet the effect moved from %v to %v", crash, once, got)
	}
}

// crashAfter crashes where the kit is armed to, once the handler returned
// nil: in the handler (the handler "returns" errCrashed) or before the
// commit (the handler returns nil and COMMIT meets a dead connection).
func (c *Consumer) crashAfter(ctx context.Context) error {
	switch {
	case c.take(CrashInHandler):
		c.kill(ctx)
		return errCrashed
	case c.take(CrashBeforeCommit):
		c.kill(ctx)
	}
	return nil
}

// crashObserver crashes after the commit, where the kit is armed to: the
// transaction committed, and what a process killed before its Kafka
// offset commit loses is lost.
type crashObserver struct{ c *Consumer }

func (o crashObserver) TxStart(ctx context.Context, _ *consumer.TxStartEvent) context.Context {
	return ctx
}

func (o crashObserver) TxEnd(_ context.Context, e *consumer.TxEndEvent) {
	if e.Err == nil && o.c.take(CrashAfterCommit) {
		o.c.mu.Lock()
		o.c.crashed = true
		o.c.mu.Unlock()
	}
}
