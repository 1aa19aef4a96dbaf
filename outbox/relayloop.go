package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/pgtext"
)

// Shards: the relays split the Kafka keys into shardCount shards by
// lock_key & (shardCount-1) and lease whole shards, each with a session
// advisory lock (Store.shardNS, shard) held on the relay's lease connection
// across rounds. shardCount is part of the table's contract (every relay on
// a table must agree on it) and bounds how many relays share the work.
const shardCount = 64

// leaseInterval is how often a relay counts the relays on its table and
// takes or gives back shards to hold its share; hungryInterval, how often
// while it holds less than its share (a relay that just started, or one
// whose peer stopped), until the others gave back theirs.
const (
	leaseInterval  = 50 * time.Millisecond
	hungryInterval = 10 * time.Millisecond
)

// memberShard is the second key of the shared advisory lock every running
// relay holds, so that relays can count each other in pg_locks.
const memberShard = -1

// relaySQL adds the relay's statements to sq. $2 is a bigint whose bit s is
// set when the relay holds shard s; the shard filter tests it with one
// shift, whatever the number of shards held. It is written "<> 0", which
// the planner takes for a filter that lets most rows through (as it does
// with one relay, or a few): with "= 1" it expects 0.5% and, rather than
// walking the index in order to the LIMIT, reads and sorts every ready row.
func relaySQL(t string, sq *storeSQL) {
	const mine = `((($2::bigint >> (lock_key & 63)::int) & 1) <> 0)`
	// promote makes the waiting rows whose time has come ready again (at
	// most $1, in the order of their times) and releases the rows deferred
	// behind them. Dead rows never wake up: Store.Retry does that.
	sq.promote = `WITH w AS (
	UPDATE ` + t + ` SET waiting = false
	WHERE seq IN (
		SELECT seq FROM ` + t + `
		WHERE published_at IS NULL AND blocked_by IS NULL AND dead_at IS NULL AND waiting AND handler IS NULL
		  AND available_at <= now() AND ` + mine + `
		ORDER BY available_at
		LIMIT $1
	) AND waiting AND dead_at IS NULL
	RETURNING id
)
UPDATE ` + t + ` SET blocked_by = NULL
WHERE blocked_by IN (SELECT id FROM w) AND dead_at IS NULL AND published_at IS NULL`

	// read returns the first $1 ready rows of the held shards in enqueue
	// order, from one index. For each it probes the
	// index of waiting rows for the first row of its key before it that
	// waits: the row is then held behind that one. When no row waits at all
	// (the usual case: one probe, evaluated once), the per-row probes are
	// skipped. Nothing
	// is locked: the shard lease makes this relay the only one to publish
	// these keys.
	sq.read = `SELECT o.seq, o.id::text, o.lock_key, o.topic, o.msg_key, o.value, o.headers, o.attempts, o.created_at,
	o.available_at <= now(), h.id::text, h.dead
FROM ` + t + ` AS o
LEFT JOIN LATERAL (
	SELECT w.id, w.dead_at IS NOT NULL AS dead FROM ` + t + ` AS w
	WHERE (SELECT lock_key FROM ` + t + `
	       WHERE published_at IS NULL AND blocked_by IS NULL AND waiting AND handler IS NULL
	       ORDER BY lock_key, seq LIMIT 1) IS NOT NULL
	  AND w.lock_key = o.lock_key AND w.seq < o.seq
	  AND w.published_at IS NULL AND w.blocked_by IS NULL AND w.waiting AND w.handler IS NULL
	ORDER BY w.seq
	LIMIT 1
) AS h ON true
WHERE o.published_at IS NULL AND o.blocked_by IS NULL AND o.dead_at IS NULL AND NOT o.waiting AND o.handler IS NULL
  AND ` + `((($2::bigint >> (o.lock_key & 63)::int) & 1) <> 0)` + `
ORDER BY o.seq
LIMIT $1`

	// fail records failed attempts and rows found not due: each becomes a
	// waiting row (out of the ready index) until its time (delay from now,
	// or its own available_at when delay is NULL), or for good when dead.
	sq.fail = `UPDATE ` + t + ` AS o SET
	attempts = o.attempts + f.add,
	last_error = COALESCE(f.err, o.last_error),
	waiting = true,
	available_at = CASE WHEN f.delay_us IS NULL THEN o.available_at ELSE now() + f.delay_us * interval '1 microsecond' END,
	dead_at = CASE WHEN f.dead THEN now() ELSE o.dead_at END
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[]) AS f (seq, add, err, delay_us, dead)
WHERE o.seq = f.seq AND o.published_at IS NULL`

	// block holds rows behind the waiting row of their key that comes
	// before them: deferred (blocked_by set) behind a row that waits for a
	// time, dead behind a dead row. The waiting rows are read FOR SHARE
	// and must still wait: Store.Retry locks a dead row FOR UPDATE before
	// it releases the rows behind it, so either it sees the rows this
	// statement marked dead, or this statement sees the row ready and holds
	// nothing behind it.
	sq.block = `WITH f AS (
	SELECT * FROM unnest($1::bigint[], $2::uuid[]) AS f (seq, head)
), h AS (
	SELECT id, dead_at IS NOT NULL AS dead FROM ` + t + `
	WHERE id IN (SELECT head FROM f) AND waiting AND published_at IS NULL AND blocked_by IS NULL
	FOR SHARE
)
UPDATE ` + t + ` AS o SET
	blocked_by = h.id,
	dead_at = CASE WHEN h.dead THEN now() END,
	last_error = CASE WHEN h.dead THEN 'blocked: message ' || h.id::text || ' of the same key is dead' ELSE o.last_error END
FROM f JOIN h ON h.id = f.head
WHERE o.seq = f.seq AND o.published_at IS NULL AND o.blocked_by IS NULL AND o.dead_at IS NULL AND NOT o.waiting`

	// acquire takes, without waiting, up to $3 shards not in the mask $2,
	// starting at shard $4 (so relays starting together spread out); the
	// lock call is evaluated row by row until the LIMIT is reached.
	sq.acquire = `SELECT s FROM (SELECT ((g + $4::int) % 64)::int AS s FROM generate_series(0, 63) AS g) AS x
WHERE (($2::bigint >> s) & 1) = 0 AND pg_try_advisory_lock($1::int, s)
LIMIT $3`
	sq.release = `SELECT count(*) FROM unnest($2::int[]) AS s WHERE pg_advisory_unlock($1::int, s)`
	// migrated: the table exists with the column the relay reads.
	sq.migrated = `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'waiting' AND NOT attisdropped)`
	sq.join = `SELECT pg_try_advisory_lock_shared($1::int, ` + fmt.Sprint(memberShard) + `)`
	// members counts the relays of this table: the holders of the shared
	// member lock in this database.
	sq.members = `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = ($1::int::bigint & 4294967295)::oid AND objid = ($2::int::bigint & 4294967295)::oid`
}

// relayRounds is the relay's rounder. Between rounds it holds a dedicated
// connection (the lease) with the session advisory locks of its shards.
// Rounds are pipelined: while round k's rows are being published, one round
// trip on the lease connection commits the transaction of round k-1 (whose
// rows Kafka has acknowledged) and, in a new transaction T(k), writes round
// k's holds, marks round k's rows published (optimistically: T(k) commits
// only once Kafka acknowledged them, in round k+1's round trip or before
// the relay waits), wakes the waiting rows whose time has come and reads
// round k+1's rows, which therefore leave out round k's. When a delivery of
// round k fails, T(k) is rolled back (with the rows it read) and round k's
// true outcome is written in a new transaction before the next read.
type relayRounds struct {
	e *engine
	k *kafkaDeliverer

	wakeDelay time.Duration
	onRound   func(delivered int) // test hook: after each round that read rows

	conn      *pgx.Conn // the lease; nil when not connected
	held      uint64    // mask of the shards held on conn
	nextLease time.Time

	inTx       bool       // a transaction is open on conn
	ahead      []*readRow // rows read in it, for the next round
	haveAhead  bool
	unreported []Record // marked published in the open transaction: Published runs at its commit

	// The outcome of the last round, when no transaction is open, waits
	// for the next round's read (one round trip and one transaction for
	// both) or, if none comes within deferMax, is written on its own.
	pending     outcome
	pendingDone []Record

	promoteEvery time.Duration
	nextPromote  time.Time
}

// deferMax bounds how long an idle relay keeps the outcome of its last
// round unwritten, waiting for a round to carry it.
const deferMax = 50 * time.Millisecond

// outcome is what a round writes in its transaction.
type outcome struct {
	doneSeqs   []int64
	fails      []update
	blockSeqs  []int64
	blockHeads []string
}

func (o *outcome) empty() bool { return len(o.doneSeqs)+len(o.fails)+len(o.blockSeqs) == 0 }

// queue adds the outcome's statements to b and returns how many it added.
func (r *relayRounds) queue(b *pgx.Batch, o *outcome) int {
	n := 0
	if len(o.blockSeqs) > 0 {
		b.Queue(r.e.store.sql.block, o.blockSeqs, o.blockHeads)
		n++
	}
	if len(o.fails) > 0 {
		k := len(o.fails)
		var (
			seqs   = make([]int64, k)
			adds   = make([]int32, k)
			errs   = make([]pgtype.Text, k)
			delays = make([]pgtype.Int8, k)
			dead   = make([]bool, k)
		)
		for i, u := range o.fails {
			seqs[i], adds[i], errs[i], dead[i] = u.seq, u.add, u.err, u.dead
			delays[i] = pgtype.Int8{Int64: u.delayUS, Valid: u.delayUS >= 0 && !u.dead}
		}
		b.Queue(r.e.store.sql.fail, seqs, adds, errs, delays, dead)
		n++
	}
	if len(o.doneSeqs) > 0 {
		b.Queue(r.e.store.sql.markDone, o.doneSeqs)
		n++
	}
	return n
}

// committed reports the rows of the transaction that just committed to
// the PublishObservers.
func (r *relayRounds) committed() {
	recs := r.unreported
	r.unreported = nil
	r.e.cfg.obs.published(context.Background(), recs)
}

// exchange is a round's round trip: commit the open transaction, begin
// another, write o in it, wake the due waiting rows and read up to
// BatchSize ready rows.
func (r *relayRounds) exchange(ctx context.Context, o *outcome) ([]*readRow, error) {
	b := &pgx.Batch{}
	commit := r.inTx
	if commit {
		b.Queue("COMMIT")
	}
	b.Queue("BEGIN")
	writes := r.queue(b, o)
	b.Queue(r.e.store.sql.promote, r.e.cfg.batchSize, int64(r.held))
	b.Queue(r.e.store.sql.read, r.e.cfg.batchSize, int64(r.held))
	br := r.conn.SendBatch(ctx, b)
	defer br.Close()
	if commit {
		if _, err := br.Exec(); err != nil {
			r.unreported = nil
			return nil, fmt.Errorf("commit: %w", err)
		}
		r.inTx = false
		r.committed()
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	r.inTx = true
	for range writes {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("write the round's outcome: %w", translate(err))
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("wake waiting rows: %w", translate(err))
	}
	rs, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	rows, err := scanReadRows(rs)
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	return rows, nil
}

// promoteDue reports whether this read should wake the waiting rows whose
// time has come: at most every min(PollInterval, Retry.InitialInterval), sooner when
// a retry this relay scheduled is due. (A read of a full batch always
// does.) Waiting rows therefore become ready at most that late.
func (r *relayRounds) promoteDue() bool {
	now := time.Now()
	if now.Before(r.nextPromote) {
		return false
	}
	r.nextPromote = now.Add(r.promoteEvery)
	return true
}

// retryAt notes that a row of this relay becomes due after d.
func (r *relayRounds) retryAt(d time.Duration) {
	if t := time.Now().Add(d); t.Before(r.nextPromote) {
		r.nextPromote = t
	}
}

// flush commits the open transaction, if any, and forgets the rows read in
// it. When the commit fails, the rows it marked stay unpublished and are
// published again (duplicates with the same IDs, after later messages of
// their keys: the first delivery of every message was in order).
func (r *relayRounds) flush(ctx context.Context) error {
	r.ahead, r.haveAhead = nil, false
	if r.conn == nil {
		r.pending, r.pendingDone, r.unreported = outcome{}, nil, nil
		return nil
	}
	// Delivered: record it even if the run is being cancelled.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.dbTimeout())
	defer cancel()
	if r.inTx {
		_, err := r.conn.Exec(mctx, "COMMIT")
		r.inTx = false
		if err != nil {
			r.unreported = nil
			return fmt.Errorf("commit: %w", err)
		}
		r.committed()
	}
	if !r.pending.empty() {
		b := &pgx.Batch{}
		r.queue(b, &r.pending)
		r.pending = outcome{}
		err := r.conn.SendBatch(mctx, b).Close()
		r.unreported, r.pendingDone = r.pendingDone, nil
		if err != nil {
			r.unreported = nil
			return fmt.Errorf("write the round's outcome: %w", err)
		}
		r.committed()
	}
	return nil
}

func (r *relayRounds) round(ctx context.Context) (roundResult, error) {
	var res roundResult
	// The lease and the read give up on a connection gone silent.
	dctx, dcancel := context.WithTimeout(ctx, r.e.cfg.dbTimeout())
	defer dcancel()
	if err := r.lease(dctx); err != nil {
		return res, err
	}
	if r.held == 0 {
		return res, r.flush(ctx) // a standby: every shard is taken by other relays
	}
	if !r.haveAhead {
		rows, err := r.readNow(dctx)
		if err != nil {
			return res, err
		}
		r.ahead = rows
	}
	rows := r.ahead
	r.ahead, r.haveAhead = nil, false
	if len(rows) == 0 {
		return res, nil // idle commits the transaction and waits
	}

	// Per key, in seq order: a row held behind a waiting row is blocked
	// (with every later row of its key, which the read holds behind the
	// same row); a row found not due becomes waiting and its key stops for
	// this round (the next read holds the rest behind it).
	var (
		deliverable []*row
		out         outcome
		stopped     map[int64]bool
	)
	for _, w := range rows {
		switch {
		case stopped[w.lockKey]:
		case w.heldBy != "":
			out.blockSeqs = append(out.blockSeqs, w.seq)
			out.blockHeads = append(out.blockHeads, w.heldBy)
		case !w.due:
			out.fails = append(out.fails, update{seq: w.seq, delayUS: -1})
			if stopped == nil {
				stopped = map[int64]bool{}
			}
			stopped[w.lockKey] = true
		default:
			deliverable = append(deliverable, &w.row)
		}
	}
	// Rows are in enqueue order: any cut keeps a prefix of every key.
	deliverable = deliverable[:r.k.cut(deliverable)]
	if len(rows) < r.e.cfg.batchSize {
		// Not a full batch: the backlog is drained; no read ahead.
		return r.last(ctx, rows, deliverable, out, len(stopped) > 0)
	}

	// Publish, and meanwhile mark the rows published in a new transaction
	// and read the next round's rows.
	var errs []error
	published := make(chan struct{})
	go func() {
		defer close(published)
		if len(deliverable) > 0 {
			errs = r.k.deliver(ctx, deliverable)
		}
	}()
	optimistic := out
	for _, w := range deliverable {
		optimistic.doneSeqs = append(optimistic.doneSeqs, w.seq)
	}
	// Not cancelled with the run: a shutdown during the publication still
	// records what Kafka acknowledged (bounded like every write).
	xctx, xcancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.dbTimeout())
	defer xcancel()
	next, dberr := r.exchange(xctx, &optimistic)
	<-published
	if dberr != nil {
		// Published (or not) but not marked: published again later.
		return res, dberr
	}

	done, failures, ok, cancelled := r.evaluate(ctx, deliverable, errs, &out, &res)
	if !ok {
		// The optimistic transaction marked rows that were not published,
		// and read behind them: roll it back, write the true outcome and
		// commit it (the Failed and Dead hooks run after that), and read
		// again in the next round.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.dbTimeout())
		defer cancel()
		if _, err := r.conn.Exec(mctx, "ROLLBACK"); err != nil {
			return res, fmt.Errorf("rollback: %w", err)
		}
		r.inTx = false
		r.pending, r.pendingDone = out, done
		if err := r.flush(ctx); err != nil {
			return res, err
		}
		res.more = !cancelled && !res.stalled
		if r.onRound != nil {
			r.onRound(len(done))
		}
		r.e.report(ctx, failures, len(done), res.stalled)
		return res, nil
	}
	r.unreported = done
	r.ahead, r.haveAhead = next, true
	res.more = len(next) > 0
	if r.onRound != nil {
		r.onRound(len(done))
	}
	return res, nil
}

// evaluate reads the delivery errors of a round: rows delivered go to
// out.doneSeqs, failures to out.fails (not when ctx was cancelled: a
// shutdown records nothing for them); the rows behind a failure of their
// key stay as they are. It runs AfterPublish and fills res.
func (r *relayRounds) evaluate(ctx context.Context, deliverable []*row, errs []error, out *outcome,
	res *roundResult) (done []Record, failures []failure, ok, cancelled bool) {
	cancelled = ctx.Err() != nil
	ok = true
	failedK := map[int64]bool{}
	allTransient := len(deliverable) > 0
	for i, w := range deliverable {
		if failedK[w.lockKey] {
			// Behind a failure of its key: left ready; the next read
			// holds it behind the failed row, which then waits.
			continue
		}
		err := errs[i]
		if err == nil {
			out.doneSeqs = append(out.doneSeqs, w.seq)
			done = append(done, w.rec)
			allTransient = false
			continue
		}
		ok = false
		failedK[w.lockKey] = true
		if cancelled {
			continue // shutting down: nothing recorded, the row stays as it was
		}
		v := r.k.classify(err)
		if v != transientFailure {
			allTransient = false
		} else {
			res.transient = true
			if res.err == nil {
				res.err = err
			}
		}
		dead := v == permanentFailure || v == countedFailure && r.e.cfg.dies(w.rec.Attempt)
		u := update{seq: w.seq, add: 1, err: pgtype.Text{String: pgtext.Text(err.Error(), maxErrorText), Valid: true}, dead: dead}
		if !dead {
			d := r.e.rowDelay(w.rec.Attempt)
			u.delayUS = d.Microseconds()
			r.retryAt(d)
		}
		out.fails = append(out.fails, u)
		failures = append(failures, failure{rec: w.rec, err: err, dead: dead})
	}
	r.e.cfg.obs.delivered(ctx, done)
	res.delivered = len(done)
	res.attempted = len(deliverable) > 0 && !cancelled
	res.stalled = allTransient && !cancelled
	return done, failures, ok, cancelled
}

// last is a round that is not followed by another at once (its batch was
// not full): publish, then write the outcome in one transaction, with the
// commit of the open transaction if any, in one round trip.
func (r *relayRounds) last(ctx context.Context, rows []*readRow, deliverable []*row, out outcome, reread bool) (roundResult, error) {
	var res roundResult
	var errs []error
	if len(deliverable) > 0 {
		errs = r.k.deliver(ctx, deliverable)
	}
	done, failures, _, cancelled := r.evaluate(ctx, deliverable, errs, &out, &res)
	// The outcome rides with the next read, or is written by idle
	// (flush) if none comes soon; written now when there is a
	// transaction to commit, the run ends, a backoff follows, or a
	// failure is to be reported (the Failed and Dead hooks run once it
	// is recorded).
	r.pending, r.pendingDone = out, done
	if r.inTx || cancelled || res.stalled || reread || len(failures) > 0 {
		if err := r.flush(ctx); err != nil {
			return res, err
		}
	}
	// Rows found not due were made waiting: read again at once, so that
	// the rows behind them are held.
	res.more = reread
	if r.onRound != nil && len(rows) > 0 {
		r.onRound(len(done))
	}
	r.e.report(ctx, failures, len(done), res.stalled)
	return res, nil
}

// readNow wakes the due waiting rows and reads up to BatchSize ready rows
// outside any transaction (one implicit transaction), in one round trip.
func (r *relayRounds) readNow(ctx context.Context) ([]*readRow, error) {
	if r.inTx {
		if err := r.flush(ctx); err != nil {
			return nil, err
		}
	}
	b := &pgx.Batch{}
	writes := r.queue(b, &r.pending)
	promote := r.promoteDue()
	if promote {
		b.Queue(r.e.store.sql.promote, r.e.cfg.batchSize, int64(r.held))
	}
	b.Queue(r.e.store.sql.read, r.e.cfg.batchSize, int64(r.held))
	done := r.pendingDone
	r.pending, r.pendingDone = outcome{}, nil
	br := r.conn.SendBatch(ctx, b)
	defer br.Close()
	for range writes {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("write the round's outcome: %w", translate(err))
		}
	}
	if promote {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("wake waiting rows: %w", translate(err))
		}
	}
	rs, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	rows, err := scanReadRows(rs)
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	r.unreported = done
	r.committed()
	return rows, nil
}

// failure is a record whose delivery failed in a round.
type failure struct {
	rec  Record
	err  error
	dead bool
}

// report logs a round's failures and reports them to the
// FailureObservers.
func (e *engine) report(ctx context.Context, failures []failure, delivered int, stalled bool) {
	if len(failures) > 0 && !stalled { // a stalled round is an outage: deliverLoop logs it once
		e.log.Warn("delivery failed", "failed", len(failures), "delivered", delivered,
			"message_id", failures[0].rec.ID, "topic", failures[0].rec.Topic, "attempt", failures[0].rec.Attempt,
			"err", failures[0].err)
	}
	for _, f := range failures {
		if f.dead {
			e.log.Error("message dead", "message_id", f.rec.ID, "topic", f.rec.Topic, "handler", f.rec.Handler,
				"attempt", f.rec.Attempt, "err", f.err)
		}
		e.cfg.obs.failed(ctx, f.rec, f.err, f.dead)
	}
}

// readRow is a row of the relay's read.
type readRow struct {
	row
	heldBy string // ID of the waiting row of its key it is held behind
}

// scanReadRows collects the rows of the read statement.
func scanReadRows(rs pgx.Rows) ([]*readRow, error) {
	var (
		out              []*readRow
		seq, lockKey     int64
		id, topic        string
		key, value, hdrs []byte
		attempts         int
		at               time.Time
		due              bool
		heldBy           pgtype.Text
		heldDead         pgtype.Bool
	)
	_, err := pgx.ForEachRow(rs, []any{&seq, &id, &lockKey, &topic, &key, &value, &hdrs, &attempts, &at,
		&due, &heldBy, &heldDead}, func() error {
		w := &readRow{heldBy: heldBy.String, row: row{seq: seq, lockKey: lockKey, due: due, rec: Record{
			ID: id, Topic: topic, Attempt: attempts + 1, EnqueuedAt: at,
			Key: cloneOrNil(key), Value: cloneOrNil(value),
		}}}
		if len(hdrs) > 0 {
			var hs []storedHeader
			if err := json.Unmarshal(hdrs, &hs); err != nil {
				return fmt.Errorf("headers of message %s: %w", id, err)
			}
			w.rec.Headers = make([]kafka.Header, len(hs))
			for i, h := range hs {
				w.rec.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
			}
		}
		out = append(out, w)
		return nil
	})
	return out, err
}

// lease connects the lease connection when needed and, every
// leaseInterval, takes or gives back shards so that each of the n relays
// running on the table holds about shardCount/n of them. A shard is given
// back only after the outcome of the rounds is written, so the relay that
// takes it next sees every row this one published as published.
func (r *relayRounds) lease(ctx context.Context) error {
	if r.conn == nil {
		pc, err := r.e.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conn := pc.Hijack()
		r.conn, r.held = conn, 0
		// The block statement needs READ COMMITTED to see a row Retry
		// released; every statement here is its own transaction.
		if _, err := conn.Exec(ctx, `SET default_transaction_isolation = 'read committed'`); err != nil {
			return err
		}
		// The session holds the shards' advisory locks: if its client
		// goes silent, the server ends it (and frees them) once it sits
		// idle in a transaction longer than a round may take, or outside
		// one longer than the relay ever waits between rounds (a poll, a
		// backoff, a round); server-side TCP keepalives end it when the
		// peer's host is gone.
		idle := max(r.e.cfg.pollInterval, r.e.cfg.retryMax(), 5*time.Second) + r.e.cfg.txBudget
		if err := pgsession.SetSession(ctx, conn, r.e.cfg.txBudget, pgsession.Timeout(idle)); err != nil {
			return err
		}
		var migrated bool
		if err := conn.QueryRow(ctx, r.e.store.sql.migrated, r.e.store.table).Scan(&migrated); err != nil {
			return err
		}
		if !migrated {
			return fmt.Errorf("%w (no waiting column in %s)", ErrNotMigrated, r.e.store.table)
		}
		var ok bool
		if err := conn.QueryRow(ctx, r.e.store.sql.join, r.e.store.shardNS).Scan(&ok); err != nil {
			return err
		}
		r.nextLease = time.Time{}
	}
	now := time.Now()
	if now.Before(r.nextLease) {
		return nil
	}
	r.nextLease = now.Add(leaseInterval)
	var members int
	if err := r.conn.QueryRow(ctx, r.e.store.sql.members, r.e.store.shardNS, memberShard).Scan(&members); err != nil {
		return err
	}
	target := (shardCount + max(members, 1) - 1) / max(members, 1)
	have := bits.OnesCount64(r.held)
	switch {
	case have > target:
		if err := r.flush(ctx); err != nil {
			return err
		}
		var give []int32
		for s := shardCount - 1; s >= 0 && have-len(give) > target; s-- {
			if r.held&(1<<s) != 0 {
				give = append(give, int32(s))
			}
		}
		var n int
		if err := r.conn.QueryRow(ctx, r.e.store.sql.release, r.e.store.shardNS, give).Scan(&n); err != nil {
			return err
		}
		for _, s := range give {
			r.held &^= 1 << s
		}
	case have < target:
		rows, err := r.conn.Query(ctx, r.e.store.sql.acquire, r.e.store.shardNS, int64(r.held), target-have,
			rand.IntN(shardCount))
		if err != nil {
			return err
		}
		var s int32
		if _, err := pgx.ForEachRow(rows, []any{&s}, func() error {
			r.held |= 1 << s
			return nil
		}); err != nil {
			return err
		}
		if bits.OnesCount64(r.held) < target {
			r.nextLease = now.Add(hungryInterval)
		}
	}
	return nil
}

// idle writes the last round's outcome, then waits for a NOTIFY, PollInterval
// or the end of ctx. After a NOTIFY it waits WakeDelay more, so that the
// commits of a burst cost one round; the wake-ups that came meanwhile are
// dropped (that round reads their rows).
func (r *relayRounds) idle(ctx context.Context, wake <-chan struct{}) {
	r.ahead, r.haveAhead = nil, false
	if r.inTx {
		r.flushOrDrop(ctx)
	}
	wait := r.e.cfg.pollInterval
	if r.conn != nil && r.held == 0 {
		// A standby: look for shards to take at the next lease time.
		wait = max(min(wait, time.Until(r.nextLease)), time.Millisecond)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var deferred <-chan time.Time
	if !r.pending.empty() {
		dt := time.NewTimer(deferMax)
		defer dt.Stop()
		deferred = dt.C
	}
	for woken := false; !woken; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-deferred:
			r.flushOrDrop(ctx)
			deferred = nil
		case <-wake:
			woken = true
		}
	}
	if r.wakeDelay > 0 {
		sleep(ctx, r.wakeDelay, nil)
	}
	select {
	case <-wake:
	default:
	}
}

// flushOrDrop writes what waits to be written; on failure it drops the
// connection (the next round connects again, and the rows not marked are
// published again).
func (r *relayRounds) flushOrDrop(ctx context.Context) {
	if err := r.flush(ctx); err != nil {
		r.e.logUnlessOutage(err, "writing a round's outcome failed; its messages will be delivered again", "err", err)
		r.dropConn(ctx)
	}
}

// broken drops the lease after a failed round: the connection is closed
// (which releases the shards) and the next round connects again. An
// outcome not written is dropped: its rows are delivered again.
func (r *relayRounds) broken(ctx context.Context) {
	r.unreported, r.ahead, r.haveAhead = nil, nil, false
	r.pending, r.pendingDone = outcome{}, nil
	r.dropConn(ctx)
}

func (r *relayRounds) close(ctx context.Context) {
	if err := r.flush(ctx); err != nil {
		r.e.logUnlessOutage(err, "writing a round's outcome failed; its messages will be delivered again", "err", err)
	}
	r.dropConn(ctx)
}

func (r *relayRounds) dropConn(ctx context.Context) {
	if r.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = r.conn.Close(cctx)
	r.conn, r.held, r.inTx = nil, 0, false
	r.pending, r.pendingDone, r.unreported = outcome{}, nil, nil
}

var _ rounder = (*relayRounds)(nil)
