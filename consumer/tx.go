package consumer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/pgsession"
)

// txSteps is what runTx runs: the claims queued after the transaction's
// BEGIN, and its body once they answered.
type txSteps interface {
	claims(b *pgx.Batch) error
	// body runs with the transaction's bounded context.
	body(ctx context.Context, tx pgx.Tx) error
}

// runTx runs one transaction of a partition: BEGIN, the transaction's
// bound and t's claims go to PostgreSQL in one round trip, then t's body
// runs (idemkit's own writes and the handler), then COMMIT. The transaction
// is bounded on both ends (see Config.HandlerTimeout): PostgreSQL ends it
// once idle longer than txBound (SET LOCAL, with BEGIN), and the runner
// gives it up after txBound (ctx's deadline for BEGIN, the claims and the
// body), so that a connection gone silent never holds the partition for
// long. Once the body returned, the commit (or rollback) is finished even
// if ctx is cancelled meanwhile, within commitTimeout: a shutdown does not
// leave the outcome of work in flight unknown. The connection goes back to
// the pool however it ends.
func (w *worker) runTx(ctx context.Context, t txSteps) error {
	cfg := &w.r.cfg
	// The bound covers taking a connection too: a new one dialled to a
	// server that went silent never answers its startup.
	bounded, cancel := context.WithTimeout(ctx, txBound(cfg.HandlerTimeout))
	defer cancel()
	conn, err := cfg.pool.Acquire(bounded)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := w.newBatch()
	b.BeginTx(pgx.TxOptions{})
	b.Queue(w.r.setLocal)
	if err := t.claims(b); err != nil {
		return err
	}
	// A claim waits for the lock of a concurrent claim of the same ID, or
	// of the partition's position row: say so when another session holds
	// it for long (an orphaned transaction, most often).
	if w.locks.DB == nil {
		w.locks = pgsession.LockWatch{DB: cfg.pool, Threshold: lockWaitWarn, Log: cmp.Or(w.log, slog.Default())}
	}
	w.locks.Start(bounded, conn.Conn().PgConn().PID())
	br := conn.SendBatch(bounded, b)
	tx := br.Tx()
	err = br.Close()
	clear(b.QueuedQueries) // pgx is done with the batch: keep nothing of it
	if waited, blocked := w.locks.Stop(); blocked {
		w.lockWait = waited
	}
	if err != nil {
		detached, cancel := detach(ctx)
		defer cancel()
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	err = t.body(bounded, tx)
	// Made once the body returned: the handler's own time does not count
	// against the commit's.
	detached, cancelDetached := detach(ctx)
	defer cancelDetached()
	if err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	if pc := conn.Conn(); !pc.IsClosed() && pc.PgConn().TxStatus() == 'I' {
		// The handler ended the transaction itself (tx.Rollback, a
		// ROLLBACK statement): nothing of it is committed, whatever a
		// COMMIT sent now answers (outside a transaction PostgreSQL
		// answers COMMIT, with a warning).
		_ = tx.Rollback(detached)
		return fmt.Errorf("consumer: the transaction ended before its commit: %w", pgx.ErrTxClosed)
	}
	if err := tx.Commit(detached); err != nil {
		dropReadOnly(detached, tx, err)
		_ = tx.Rollback(detached)
		return err
	}
	return nil
}

// newBatch returns the worker's batch, emptied: one transaction at a time
// uses it, and pgx is done with it once its results are closed.
func (w *worker) newBatch() *pgx.Batch {
	w.batch = pgx.Batch{QueuedQueries: w.batch.QueuedQueries[:0]}
	return &w.batch
}

// txBound is how long a transaction whose handler calls have handlerTimeout
// may last, and stay idle on the server: handlerTimeout plus a margin.
func txBound(handlerTimeout time.Duration) time.Duration { return pgsession.Timeout(handlerTimeout) }

// lockWaitWarn is how long a transaction's claims wait for another
// session's lock before the runner logs who holds it (a variable for
// tests).
var lockWaitWarn = 5 * time.Second

// detach returns a context with ctx's values (the transaction's trace)
// that ctx's cancellation does not reach and that ends after
// commitTimeout: for a commit or rollback.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
}

// claimResults are the outcomes of the claims queued by queueClaims.
type claimResults struct {
	dup        []bool // one per live message, for a claim batch
	one, moved bool   // for one message: duplicate, and whether its position row moved
}

// claim is the dedup claim of m.
func (w *worker) claim(m *Message) dedupq.Claim {
	return dedupq.Claim{Consumer: w.r.cfg.Name, MessageID: m.ID, Topic: m.Topic, Partition: m.Partition,
		Offset: m.Offset, Time: m.Time, Epoch: w.epoch}
}

// queueClaims queues on b the claims of msgs[i] for each i in live (the
// messages handled now; parking: others of msgs wait behind a parked
// message of their key) with the partition's position; their outcomes are
// stored in res when b's results are read.
func (w *worker) queueClaims(b *pgx.Batch, msgs []*Message, live []int, parking bool, res *claimResults) error {
	q := w.r.claims
	switch {
	case len(live) == 1 && !parking:
		// The position row is inserted in the transaction when it does not
		// exist yet (txRun.body).
		return q.QueueClaimMove(b, w.claim(msgs[0]), &res.one, &res.moved)
	case len(live) > 0:
		claims := make([]dedupq.Claim, len(live))
		for j, i := range live {
			claims[j] = w.claim(msgs[i])
		}
		return q.QueueClaimBatch(b, claims, &res.dup)
	}
	return nil
}
