package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/pgtext"
	"github.com/idemkit/idemkit/retry"
)

// Record is an outbox message as the relay and the dispatcher deliver it.
type Record struct {
	// ID is the stable ID fixed at enqueue.
	ID string
	// Topic is the Kafka topic (informative for Dispatcher messages).
	Topic string
	// Handler is the Dispatcher handler name; empty for Kafka messages.
	Handler string
	Key     []byte
	Value   []byte
	// Headers are the headers given at enqueue, without HeaderID.
	Headers []kafka.Header
	// Attempt counts delivery attempts, this one included: 1 the first time.
	Attempt int
	// EnqueuedAt is when the enqueuing statement ran, by the database clock.
	EnqueuedAt time.Time
}

// errNotAttempted is the error a deliverer reports for a record it left for
// a later round, untouched (the round's time is up).
var errNotAttempted = errors.New("outbox: left for a later round")

// errHeld is the error a deliverer reports for a record it did not attempt
// because an earlier record of the same key failed in the same round.
var errHeld = errors.New("outbox: held behind an earlier message of the same key")

// scanned is a due row whose key the scan locked.
type scanned struct {
	lockKey, seq int64
}

// scanRows runs a scan statement and collects its (lock_key, seq) rows.
func scanRows(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]scanned, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var s scanned
	var out []scanned
	_, err = pgx.ForEachRow(rows, []any{&s.lockKey, &s.seq}, func() error {
		out = append(out, s)
		return nil
	})
	return out, err
}

// row is one claimed row.
type row struct {
	seq         int64
	lockKey     int64
	rec         Record
	due         bool
	availableAt time.Time
	dead        bool
	// inWindow: among the first rows of its key (see keyRows), not only a
	// due row the scan found further on.
	inWindow bool
}

// verdict classifies a delivery error.
type verdict int

const (
	countedFailure   verdict = iota // attempts+1; dead at deadAfter
	transientFailure                // attempts+1; never dies
	permanentFailure                // dead now
)

// deliverer is what a Relay or a Dispatcher does with a round's rows: rows
// come in enqueue order, and only a prefix of each key's pending rows. It
// returns one error per row (nil: delivered), and must not attempt a row
// after a failed row of the same key (errHeld).
type deliverer interface {
	deliver(ctx context.Context, rows []*row) []error
	classify(err error) verdict
	// scan takes, without waiting, the locks of the keys of at most limit
	// due rows, the longest-waiting first, and returns those rows.
	scan(ctx context.Context, tx pgx.Tx, limit int) ([]scanned, error)
	// cut returns how many of the deliverable rows (in order) fit one round.
	cut(rows []*row) int
}

// loopConfig is what a Relay and a Dispatcher share.
type loopConfig struct {
	name            string // "relay" or "dispatcher", for errors and logs
	batchSize       int
	pollInterval    time.Duration
	retry           retry.Policy // the schedule of a failing row's attempts
	deadAfter       int          // failed attempts after which a row is dead; negative: never
	retention       time.Duration
	cleanupInterval time.Duration
	cleanupBatch    int
	statsInterval   time.Duration
	disableListen   bool
	maxOutage       time.Duration
	logger          *slog.Logger
	obs             observers
	// txBudget is how long a round's transaction may legitimately sit
	// idle (publishing, running handlers): its
	// idle_in_transaction_session_timeout is that plus pgsession.Margin,
	// and so is the deadline of the round's statements.
	txBudget time.Duration
}

// dbTimeout bounds a round's statements on the client's side: a
// connection gone silent is given up after it, closed, and the round tried
// again on a new one.
func (l loopConfig) dbTimeout() time.Duration { return pgsession.Timeout(l.txBudget) }

// engine claims rows key by key and hands them to a deliverer.
type engine struct {
	pool  *pgxpool.Pool
	store *Store
	cfg   loopConfig
	d     deliverer
	log   *slog.Logger
	// rounds runs the rounds; nil means the classic rounds of engine.round
	// (the dispatcher's). The relay sets its own (relayloop.go).
	rounds rounder
}

// rounder is what deliverLoop drives.
type rounder interface {
	// round runs one round.
	round(ctx context.Context) (roundResult, error)
	// idle waits, after a round with nothing more to do, for a wake-up,
	// PollInterval or the end of ctx.
	idle(ctx context.Context, wake <-chan struct{})
	// broken is called after a round failed: drop what the round relied on.
	broken(ctx context.Context)
	// close releases everything when the loop ends.
	close(ctx context.Context)
}

// classic is the rounder of engine.round: one transaction per round.
type classic struct{ e *engine }

func (c classic) round(ctx context.Context) (roundResult, error) {
	res, err := c.e.round(ctx)
	res.more = res.delivered > 0
	return res, err
}
func (c classic) idle(ctx context.Context, wake <-chan struct{}) {
	sleep(ctx, c.e.cfg.pollInterval, wake)
}
func (classic) broken(context.Context) {}
func (classic) close(context.Context)  {}

// run is the body of Relay.Run and Dispatcher.Run.
func (e *engine) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1) // size 1: wake-ups coalesce
	var wg sync.WaitGroup
	if !e.cfg.disableListen {
		wg.Go(func() { e.listen(ctx, wake) })
	}
	if e.cfg.retention > 0 {
		wg.Go(func() { e.cleanupLoop(ctx) })
	}
	if len(e.cfg.obs.stats) > 0 {
		wg.Go(func() { e.statsLoop(ctx) })
	}
	err := e.deliverLoop(ctx, wake)
	cancel()
	wg.Wait()
	return err
}

// newBackOff is the relay's retry schedule: Retry's jittered exponential
// backoff, unbounded (failures are counted per row, see deadAfter).
func (e *engine) newBackOff() *retry.Schedule {
	p := e.cfg.retry
	p.MaxAttempts, p.MaxElapsedTime = -1, -1
	return p.Schedule()
}

// retryInitial and retryMax are Retry's first and largest waits.
func (l *loopConfig) retryInitial() time.Duration {
	return cmp.Or(l.retry.InitialInterval, retry.InitialIntervalDefault)
}

func (l *loopConfig) retryMax() time.Duration { return l.retry.MaxIntervalOrDefault() }

// dies reports whether a row whose attempt-th delivery failed (a failure
// that counts) is dead.
func (l *loopConfig) dies(attempt int) bool { return l.deadAfter > 0 && attempt >= l.deadAfter }

// rowDelay is the wait after a record's attempt-th failure: the attempt-th
// step of the jittered exponential schedule.
func (e *engine) rowDelay(attempt int) time.Duration {
	b := e.newBackOff()
	d, _ := b.Next() // unbounded: it never gives up
	for i := 1; i < min(attempt, 64) && d < e.cfg.retryMax(); i++ {
		d, _ = b.Next()
	}
	return d
}

// sleep waits d or until ctx ends or wake fires (when wake is non-nil).
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
}

// waiter returns the outage waiter of one of the engine's servers.
func (e *engine) waiter(server string) *outage.Waiter {
	return &outage.Waiter{Op: "outbox " + e.cfg.name + ": " + server, Log: e.log, Max: e.cfg.maxOutage}
}

// deliverLoop runs rounds until ctx ends. An outage of PostgreSQL (a round
// fails with a connection error) or of Kafka (every delivery of a round
// failed with one) is waited out with backoff, logged once when it starts
// and once when it ends; past MaxOutage the loop returns the
// *retry.OutageError. Other failures are logged and retried with backoff.
func (e *engine) deliverLoop(ctx context.Context, wake chan struct{}) error {
	rr := e.rounds
	if rr == nil {
		rr = classic{e}
	}
	defer rr.close(ctx)
	bo := e.newBackOff()
	pgOutage, kafkaOutage := e.waiter("postgres"), e.waiter("kafka")
	for {
		if ctx.Err() != nil {
			return nil
		}
		res, err := rr.round(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNotMigrated) {
			return fmt.Errorf("outbox: %s: %w", e.cfg.name, err)
		}
		if err != nil {
			rr.broken(ctx)
			werr := pgOutage.Wait(ctx, err)
			var oerr *retry.OutageError
			switch {
			case werr == nil: // an outage: waited, try again
			case ctx.Err() != nil:
				return nil
			case errors.As(werr, &oerr):
				return oerr
			default: // PostgreSQL answered: not an outage
				pgOutage.Ok()
				d, _ := bo.Next()
				e.log.Warn("round failed; backing off", "err", err, "wait", d)
				sleep(ctx, d, nil)
			}
			continue
		}
		pgOutage.Ok()
		if res.stalled {
			// Every attempt failed for a reason outside the rows (the
			// broker is unreachable): back off the whole loop too.
			werr := kafkaOutage.Wait(ctx, res.err)
			var oerr *retry.OutageError
			switch {
			case werr == nil:
			case ctx.Err() != nil:
				return nil
			case errors.As(werr, &oerr):
				return oerr
			default: // transient, but not a connection error
				d, _ := bo.Next()
				e.log.Warn("every delivery failed; backing off", "err", res.err, "wait", d)
				sleep(ctx, d, nil)
			}
			continue
		}
		if res.attempted && !res.transient {
			kafkaOutage.Ok()
		}
		bo.Reset()
		if !res.more {
			rr.idle(ctx, wake)
		} // else there may be more: go again at once
	}
}

type roundResult struct {
	delivered int
	// attempted: the round tried to deliver; transient: some attempt
	// failed for a reason outside its row; stalled: every attempt did, err
	// being the first such error.
	attempted, transient, stalled bool
	err                           error
	// more: there may be more to do at once.
	more bool
}

// update is one row's entry in markFailed.
// maxErrorText bounds the error text stored in last_error, in bytes.
const maxErrorText = 2000

type update struct {
	seq       int64
	add       int32
	err       pgtype.Text
	delayUS   int64
	floor     pgtype.Timestamptz
	dead      bool
	blockedBy pgtype.Text
}

// round claims keys, reads their rows, delivers a prefix of each key, and
// records the outcome, all in one transaction whose advisory locks keep
// other relays off these keys until the marks are committed.
func (e *engine) round(ctx context.Context) (res roundResult, err error) {
	// READ COMMITTED whatever default_transaction_isolation says: keyRows
	// must see, in a snapshot taken after the scan locked the keys, the marks
	// of the keys' previous holders. Under REPEATABLE READ it would read the
	// scan's snapshot and publish their rows again.
	//
	// The transaction is bounded: the server ends it when it stays idle
	// longer than the round may take (its client went away), and its
	// statements give up after as long.
	dctx, dcancel := context.WithTimeout(ctx, e.cfg.dbTimeout())
	defer dcancel()
	tx, err := e.pool.BeginTx(dctx, pgx.TxOptions{BeginQuery: pgsession.BeginQuery("READ COMMITTED", e.cfg.txBudget)})
	if err != nil {
		return res, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if retry.IsReadOnly(err) {
			// A session made read-only (SET SESSION CHARACTERISTICS, by
			// other code sharing the pool) stays so: close it before the
			// rollback gives it back, so that the pool opens a new one.
			_ = tx.Conn().Close(rctx)
		}
		_ = tx.Rollback(rctx) // no-op after Commit
	}()

	found, err := e.d.scan(dctx, tx, e.cfg.batchSize)
	if err != nil {
		return res, translate(err)
	}
	if len(found) == 0 {
		return res, tx.Commit(dctx)
	}
	rows, err := e.keyRows(dctx, tx, found)
	if err != nil {
		return res, translate(err)
	}

	// Per key, the deliverable prefix: due rows up to the first row that is
	// dead or not yet due. Rows behind such a row wait for it: behind a
	// dead row they are dead too, blocked by it; behind a row that is not
	// due they are deferred to its time, so the scan does not meet them
	// again in the meantime. A row past its key's window with no such row
	// in the window is left for a later round: an unread row may lie
	// between.
	var (
		deliverable []*row
		updates     []update
		blocker     = map[int64]*row{}
	)
	for _, r := range rows {
		if b := blocker[r.lockKey]; b != nil {
			switch {
			case b.dead:
				updates = append(updates, update{seq: r.seq, dead: true,
					err:       pgtype.Text{String: "blocked: message " + b.rec.ID + " of the same key is dead", Valid: true},
					blockedBy: pgtype.Text{String: b.rec.ID, Valid: true}})
			case r.due || r.availableAt.Before(b.availableAt):
				updates = append(updates, update{seq: r.seq, floor: pgtype.Timestamptz{Time: b.availableAt, Valid: true},
					blockedBy: pgtype.Text{}})
			}
			continue
		}
		if !r.inWindow {
			continue
		}
		if r.dead || !r.due {
			blocker[r.lockKey] = r
			continue
		}
		deliverable = append(deliverable, r)
	}
	// Rows are in enqueue order: any cut keeps a prefix of every key.
	deliverable = deliverable[:min(len(deliverable), e.cfg.batchSize)]
	deliverable = deliverable[:e.d.cut(deliverable)]

	var errs []error
	if len(deliverable) > 0 {
		errs = e.d.deliver(ctx, deliverable)
	}
	// Shutting down: failures caused by the cancellation are not recorded
	// (those rows stay as they were), deliveries are.
	cancelled := ctx.Err() != nil
	var done []Record
	doneSeqs := make([]int64, 0, len(deliverable))
	failed := map[int64]update{} // by key: the failure that holds the rest
	var failures []failure
	allTransient := len(deliverable) > 0
	for i, r := range deliverable {
		if f, ok := failed[r.lockKey]; ok {
			if !f.blockedBy.Valid {
				continue // behind a row left as it was: left as it is
			}
			// Behind a failure of its key: not delivered (or delivered
			// out of turn, and then delivered again in turn later).
			u := update{seq: r.seq, delayUS: f.delayUS}
			if f.dead {
				u.dead = true
				u.err = pgtype.Text{String: "blocked: message " + f.blockedBy.String + " of the same key is dead", Valid: true}
				u.blockedBy = f.blockedBy
			}
			updates = append(updates, u)
			continue
		}
		err := errs[i]
		if err != nil && (cancelled || errors.Is(err, errNotAttempted)) {
			failed[r.lockKey] = update{} // hold the rest of the key, record nothing
			continue
		}
		if err == nil {
			doneSeqs = append(doneSeqs, r.seq)
			done = append(done, r.rec)
			allTransient = false
			continue
		}
		v := e.d.classify(err)
		if v != transientFailure {
			allTransient = false
		} else {
			res.transient = true
			if res.err == nil {
				res.err = err
			}
		}
		dead := v == permanentFailure || v == countedFailure && e.cfg.dies(r.rec.Attempt)
		u := update{seq: r.seq, add: 1, err: pgtype.Text{String: pgtext.Text(err.Error(), maxErrorText), Valid: true}, dead: dead}
		if !dead {
			u.delayUS = e.rowDelay(r.rec.Attempt).Microseconds()
		}
		updates = append(updates, u)
		failed[r.lockKey] = update{delayUS: u.delayUS, dead: dead, blockedBy: pgtype.Text{String: r.rec.ID, Valid: true}}
		failures = append(failures, failure{rec: r.rec, err: err, dead: dead})
	}
	e.cfg.obs.delivered(ctx, done)

	// Delivered: record it even if the run is being cancelled.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.dbTimeout())
	defer cancel()
	if len(doneSeqs) > 0 {
		if _, err := tx.Exec(mctx, e.store.sql.markDone, doneSeqs); err != nil {
			return res, fmt.Errorf("mark delivered: %w", err)
		}
	}
	if len(updates) > 0 {
		if err := e.markFailed(mctx, tx, updates); err != nil {
			return res, fmt.Errorf("mark failed: %w", err)
		}
	}
	if err := tx.Commit(mctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}

	res.delivered = len(done)
	res.attempted = len(deliverable) > 0 && !cancelled
	res.stalled = allTransient && !cancelled
	e.cfg.obs.published(ctx, done)
	e.report(ctx, failures, len(done), res.stalled)
	return res, nil
}

// keyRows reads the rows of the scanned rows' keys that a round needs (see
// storeSQL.keyRows): per key a window of about BatchSize / keys rows (at
// least one), so that the round reads about BatchSize rows in all and one
// busy key cannot crowd out the others, and the scanned rows themselves.
func (e *engine) keyRows(ctx context.Context, tx pgx.Tx, found []scanned) ([]*row, error) {
	seqs := make([]int64, len(found))
	var keys []int64
	seen := map[int64]bool{}
	for i, f := range found {
		seqs[i] = f.seq
		if !seen[f.lockKey] {
			seen[f.lockKey] = true
			keys = append(keys, f.lockKey)
		}
	}
	window := max(1, (e.cfg.batchSize+len(keys)-1)/len(keys))
	rs, err := tx.Query(ctx, e.store.sql.keyRows, keys, window, seqs)
	if err != nil {
		return nil, err
	}
	var out []*row
	var (
		seq, lockKey     int64
		id, topic        string
		handler          pgtype.Text
		key, value, hdrs []byte
		attempts         int
		due, dead, live  bool
		availableAt, at  time.Time
		perKey           = map[int64]int{}
	)
	_, err = pgx.ForEachRow(rs, []any{&seq, &id, &lockKey, &handler, &topic, &key, &value, &hdrs, &attempts,
		&due, &availableAt, &dead, &at, &live}, func() error {
		if !live {
			return nil // published meanwhile, or dead behind its blocker
		}
		// A key's window is its first rows: those come first, in seq order.
		perKey[lockKey]++
		inWindow := perKey[lockKey] <= window
		r := &row{seq: seq, lockKey: lockKey, due: due, availableAt: availableAt, dead: dead, inWindow: inWindow, rec: Record{
			ID: id, Topic: topic, Handler: handler.String, Attempt: attempts + 1, EnqueuedAt: at,
			Key: cloneOrNil(key), Value: cloneOrNil(value),
		}}
		if len(hdrs) > 0 {
			var hs []storedHeader
			if err := json.Unmarshal(hdrs, &hs); err != nil {
				return fmt.Errorf("headers of message %s: %w", id, err)
			}
			r.rec.Headers = make([]kafka.Header, len(hs))
			for i, h := range hs {
				r.rec.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
			}
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

func cloneOrNil(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func (e *engine) markFailed(ctx context.Context, tx pgx.Tx, us []update) error {
	n := len(us)
	var (
		seqs      = make([]int64, n)
		adds      = make([]int32, n)
		errs      = make([]pgtype.Text, n)
		delays    = make([]int64, n)
		floors    = make([]pgtype.Timestamptz, n)
		dead      = make([]bool, n)
		blockedBy = make([]pgtype.Text, n)
	)
	for i, u := range us {
		seqs[i], adds[i], errs[i], delays[i], floors[i], dead[i], blockedBy[i] =
			u.seq, u.add, u.err, u.delayUS, u.floor, u.dead, u.blockedBy
	}
	_, err := tx.Exec(ctx, e.store.sql.markFailed, seqs, adds, errs, delays, floors, dead, blockedBy)
	return err
}

// listen wakes the delivery loop on every NOTIFY from EnqueueTx, on a
// connection of its own taken out of the pool; it reconnects with backoff.
func (e *engine) listen(ctx context.Context, wake chan<- struct{}) {
	bo := e.newBackOff()
	for {
		err := e.listenOnce(ctx, wake, bo)
		if ctx.Err() != nil {
			return
		}
		d, _ := bo.Next()
		// An outage is logged once, by the delivery loop.
		e.logUnlessOutage(err, "LISTEN connection lost; polling until it is back", "err", err, "wait", d)
		sleep(ctx, d, nil)
	}
}

func (e *engine) listenOnce(ctx context.Context, wake chan<- struct{}, bo *retry.Schedule) error {
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := pgsession.SetSession(ctx, conn, e.cfg.txBudget, 0); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.store.channel}.Sanitize()); err != nil {
		return err
	}
	bo.Reset()
	signal(wake) // anything enqueued while nobody listened
	for {
		// A connection that went silent delivers no notification and no
		// error: after listenCheck without a notification, a ping
		// (bounded) tells whether the server still answers.
		wctx, cancel := context.WithTimeout(ctx, listenCheck)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			signal(wake)
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			pctx, cancel := context.WithTimeout(ctx, e.cfg.dbTimeout())
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
		default:
			return err
		}
	}
}

// listenCheck is how long the LISTEN connection waits for a notification
// before it checks that the server still answers.
const listenCheck = 30 * time.Second

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (e *engine) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := e.store.Cleanup(ctx, e.pool, e.cfg.retention, e.cfg.cleanupBatch)
		if err != nil && ctx.Err() == nil {
			e.logUnlessOutage(err, "cleanup failed", "deleted", n, "err", err)
		} else if n > 0 {
			e.log.Debug("cleanup", "deleted", n)
		}
	}
}

func (e *engine) statsLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.statsInterval)
	defer t.Stop()
	for {
		st, err := e.store.Stats(ctx, e.pool)
		if err == nil {
			e.cfg.obs.statsOf(ctx, st)
		} else if ctx.Err() == nil {
			e.logUnlessOutage(err, "stats failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// logUnlessOutage logs a failure of a side loop (LISTEN, cleanup, stats) as
// a warning, or at debug level when it is a connection error: the delivery
// loop meets the same outage and logs it once, with its duration.
func (e *engine) logUnlessOutage(err error, msg string, args ...any) {
	if retry.IsConnection(err) {
		e.log.Debug(msg, args...)
		return
	}
	e.log.Warn(msg, args...)
}

// isPermanent reports an error marked with retry.Permanent.
func isPermanent(err error) bool { return retry.IsPermanent(err) }
