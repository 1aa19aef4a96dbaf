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

	"github.com/idemkit/idemkit/internal/pgtext"
)

// Shards: the relays split the Kafka keys into shardCount shards by
// lock_key & (shardCount-1) and lease whole shards, each with a session
// advisory lock (Store.shardNS, shard) held on the relay's lease connection
// across rounds. shardCount is part of the table's contract (every relay on
// a table must agree on it) and bounds how many relays share the work.
const shardCount = 64

// leaseInterval is how often a relay counts the relays on its table and
// takes or gives back shards to hold its share.
const leaseInterval = time.Second

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
	// behind them. Parked rows never wake up: Store.Retry does that.
	sq.promote = `WITH w AS (
	UPDATE ` + t + ` SET waiting = false
	WHERE seq IN (
		SELECT seq FROM ` + t + `
		WHERE published_at IS NULL AND blocked_by IS NULL AND parked_at IS NULL AND waiting AND handler IS NULL
		  AND available_at <= now() AND ` + mine + `
		ORDER BY available_at
		LIMIT $1
	) AND waiting AND parked_at IS NULL
	RETURNING id
)
UPDATE ` + t + ` SET blocked_by = NULL
WHERE blocked_by IN (SELECT id FROM w) AND parked_at IS NULL AND published_at IS NULL`

	// read returns the first $1 ready rows of the held shards in enqueue
	// order, from one index (migrate version 11). For each it probes the
	// index of waiting rows for the first row of its key before it that
	// waits: the row is then held behind that one. When no row waits at all
	// (the usual case: one probe, evaluated once), the per-row probes are
	// skipped. Nothing
	// is locked: the shard lease makes this relay the only one to publish
	// these keys.
	sq.read = `SELECT o.seq, o.id::text, o.lock_key, o.topic, o.msg_key, o.value, o.headers, o.attempts, o.created_at,
	o.available_at <= now(), h.id::text, h.parked
FROM ` + t + ` AS o
LEFT JOIN LATERAL (
	SELECT w.id, w.parked_at IS NOT NULL AS parked FROM ` + t + ` AS w
	WHERE (SELECT lock_key FROM ` + t + `
	       WHERE published_at IS NULL AND blocked_by IS NULL AND waiting AND handler IS NULL
	       ORDER BY lock_key, seq LIMIT 1) IS NOT NULL
	  AND w.lock_key = o.lock_key AND w.seq < o.seq
	  AND w.published_at IS NULL AND w.blocked_by IS NULL AND w.waiting AND w.handler IS NULL
	ORDER BY w.seq
	LIMIT 1
) AS h ON true
WHERE o.published_at IS NULL AND o.blocked_by IS NULL AND o.parked_at IS NULL AND NOT o.waiting AND o.handler IS NULL
  AND ` + `((($2::bigint >> (o.lock_key & 63)::int) & 1) <> 0)` + `
ORDER BY o.seq
LIMIT $1`

	// fail records failed attempts and rows found not due: each becomes a
	// waiting row (out of the ready index) until its time (delay from now,
	// or its own available_at when delay is NULL), or for good when parked.
	sq.fail = `UPDATE ` + t + ` AS o SET
	attempts = o.attempts + f.add,
	last_error = COALESCE(f.err, o.last_error),
	waiting = true,
	available_at = CASE WHEN f.delay_us IS NULL THEN o.available_at ELSE now() + f.delay_us * interval '1 microsecond' END,
	parked_at = CASE WHEN f.park THEN now() ELSE o.parked_at END
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[]) AS f (seq, add, err, delay_us, park)
WHERE o.seq = f.seq AND o.published_at IS NULL`

	// block holds rows behind the waiting row of their key that comes
	// before them: deferred (blocked_by set) behind a row that waits for a
	// time, parked behind a parked row. The waiting rows are read FOR SHARE
	// and must still wait: Store.Retry locks a parked row FOR UPDATE before
	// it releases the rows behind it, so either it sees the rows this
	// statement parked, or this statement sees the row ready and holds
	// nothing behind it.
	sq.block = `WITH f AS (
	SELECT * FROM unnest($1::bigint[], $2::uuid[]) AS f (seq, head)
), h AS (
	SELECT id, parked_at IS NOT NULL AS parked FROM ` + t + `
	WHERE id IN (SELECT head FROM f) AND waiting AND published_at IS NULL AND blocked_by IS NULL
	FOR SHARE
)
UPDATE ` + t + ` AS o SET
	blocked_by = h.id,
	parked_at = CASE WHEN h.parked THEN now() END,
	last_error = CASE WHEN h.parked THEN 'blocked: message ' || h.id::text || ' of the same key is parked' ELSE o.last_error END
FROM f JOIN h ON h.id = f.head
WHERE o.seq = f.seq AND o.published_at IS NULL AND o.blocked_by IS NULL AND o.parked_at IS NULL AND NOT o.waiting`

	// acquire takes, without waiting, up to $3 shards not in the mask $2,
	// starting at shard $4 (so relays starting together spread out); the
	// lock call is evaluated row by row until the LIMIT is reached.
	sq.acquire = `SELECT s FROM (SELECT ((g + $4::int) % 64)::int AS s FROM generate_series(0, 63) AS g) AS x
WHERE (($2::bigint >> s) & 1) = 0 AND pg_try_advisory_lock($1::int, s)
LIMIT $3`
	sq.release = `SELECT count(*) FROM unnest($2::int[]) AS s WHERE pg_advisory_unlock($1::int, s)`
	// migrated: the table exists with version 11's column.
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
// connection (the lease) with the session advisory locks of its shards. A
// round is two round trips on that connection: write the outcome of the
// previous round (rows published, failed, found not due, held behind a
// waiting row: one transaction); wake the waiting rows whose time has come
// and read the first ready rows of its shards (another); then publish the
// deliverable rows in one go. Its outcome is written at the start of the
// next round, or before the relay waits (flush).
type relayRounds struct {
	e *engine
	k *kafkaDeliverer

	wakeDelay time.Duration
	onRound   func(delivered int) // test hook: after each round that read rows

	conn      *pgx.Conn // the lease; nil when not connected
	held      uint64    // mask of the shards held on conn
	nextLease time.Time

	out outcome // the last round's outcome, not written yet
}

// outcome is what a round leaves to write.
type outcome struct {
	doneSeqs   []int64
	done       []Record
	fails      []update
	blockSeqs  []int64
	blockHeads []string
}

func (o *outcome) empty() bool { return len(o.doneSeqs)+len(o.fails)+len(o.blockSeqs) == 0 }

// queue adds the outcome's statements to b and returns how many it added.
func (r *relayRounds) queue(b *pgx.Batch, o *outcome) int {
	n := 0
	if len(o.doneSeqs) > 0 {
		b.Queue(r.e.store.sql.markDone, o.doneSeqs)
		n++
	}
	if len(o.fails) > 0 {
		k := len(o.fails)
		var (
			seqs   = make([]int64, k)
			adds   = make([]int32, k)
			errs   = make([]pgtype.Text, k)
			delays = make([]pgtype.Int8, k)
			parks  = make([]bool, k)
		)
		for i, u := range o.fails {
			seqs[i], adds[i], errs[i], parks[i] = u.seq, u.add, u.err, u.park
			delays[i] = pgtype.Int8{Int64: u.delayUS, Valid: u.delayUS >= 0 && !u.park}
		}
		b.Queue(r.e.store.sql.fail, seqs, adds, errs, delays, parks)
		n++
	}
	if len(o.blockSeqs) > 0 {
		b.Queue(r.e.store.sql.block, o.blockSeqs, o.blockHeads)
		n++
	}
	return n
}

// written runs the Published hook once an outcome is committed.
func (r *relayRounds) written(o *outcome) {
	if h := r.e.cfg.hooks.Published; h != nil && len(o.done) > 0 {
		h(o.done)
	}
}

// flush writes the pending outcome on its own. When it fails, the rows
// published stay unpublished and are published again (duplicates with the
// same IDs, after later messages of their keys: the first delivery of every
// message was in order).
func (r *relayRounds) flush(ctx context.Context) error {
	if r.out.empty() || r.conn == nil {
		r.out = outcome{}
		return nil
	}
	o := r.out
	r.out = outcome{}
	// Delivered: record it even if the run is being cancelled.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	r.queue(b, &o)
	if err := r.conn.SendBatch(mctx, b).Close(); err != nil {
		return fmt.Errorf("write the round's outcome: %w", err)
	}
	r.written(&o)
	return nil
}

func (r *relayRounds) round(ctx context.Context) (roundResult, error) {
	var res roundResult
	if err := r.lease(ctx); err != nil {
		return res, err
	}
	if r.held == 0 {
		return res, r.flush(ctx) // a standby: every shard is taken by other relays
	}
	batch := r.e.cfg.batchSize
	// The previous round's outcome is committed on its own, before the
	// read: written in the read's transaction, the rows it marks would
	// still be read (their old versions, deleted by a transaction in
	// progress) and walked again by the next read.
	if err := r.flush(ctx); err != nil {
		return res, err
	}
	rows, err := r.read(ctx)
	if err != nil {
		return res, err
	}

	// Per key, in seq order: a row held behind a waiting row is blocked
	// (with every later row of its key, which the read holds behind the
	// same row); a row found not due becomes waiting and its key stops for
	// this round (the next read holds the rest behind it).
	var (
		deliverable []*row
		out         outcome
		stopped     map[int64]bool
		changed     bool
	)
	for _, w := range rows {
		switch {
		case stopped[w.lockKey]:
			changed = true
		case w.heldBy != "":
			out.blockSeqs = append(out.blockSeqs, w.seq)
			out.blockHeads = append(out.blockHeads, w.heldBy)
			changed = true
		case !w.due:
			out.fails = append(out.fails, update{seq: w.seq, delayUS: -1})
			if stopped == nil {
				stopped = map[int64]bool{}
			}
			stopped[w.lockKey] = true
			changed = true
		default:
			deliverable = append(deliverable, &w.row)
		}
	}
	full := len(rows) >= batch
	// Rows are in enqueue order: any cut keeps a prefix of every key.
	if n := r.k.cut(deliverable); n < len(deliverable) {
		deliverable, full = deliverable[:n], true
	}

	var errs []error
	if len(deliverable) > 0 {
		errs = r.k.deliver(ctx, deliverable)
	}
	cancelled := ctx.Err() != nil
	var (
		failedK  = map[int64]bool{}
		failures []failure
	)
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
			out.done = append(out.done, w.rec)
			allTransient = false
			continue
		}
		failedK[w.lockKey] = true
		changed = true
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
		park := v == permanentFailure || v == countedFailure && w.rec.Attempt >= r.e.cfg.parkAfter
		u := update{seq: w.seq, add: 1, err: pgtype.Text{String: pgtext.Text(err.Error(), maxErrorText), Valid: true}, park: park}
		if !park {
			u.delayUS = r.e.rowDelay(w.rec.Attempt).Microseconds()
		}
		out.fails = append(out.fails, u)
		failures = append(failures, failure{rec: w.rec, err: err, parked: park})
	}
	if h := r.e.cfg.hooks.AfterPublish; h != nil && len(out.done) > 0 {
		h(ctx, out.done)
	}
	r.out = out

	res.delivered = len(out.done)
	res.attempted = len(deliverable) > 0 && !cancelled
	res.stalled = allTransient && !cancelled
	// Go again at once when the batch was full, or rows were held back only
	// for this round. Otherwise idle flushes the outcome and waits. A
	// stalled round backs off instead (deliverLoop), after a flush.
	res.more = full || changed
	if res.stalled || cancelled {
		if err := r.flush(ctx); err != nil {
			return res, err
		}
	}
	if r.onRound != nil && len(rows) > 0 {
		r.onRound(len(out.done))
	}
	r.e.report(failures, len(out.done), res.stalled)
	return res, nil
}

// failure is a record whose delivery failed in a round.
type failure struct {
	rec    Record
	err    error
	parked bool
}

// report logs a round's failures and runs the Failed and Parked hooks.
func (e *engine) report(failures []failure, delivered int, stalled bool) {
	if len(failures) > 0 && !stalled { // a stalled round is an outage: deliverLoop logs it once
		e.log.Warn("delivery failed", "failed", len(failures), "delivered", delivered,
			"message_id", failures[0].rec.ID, "topic", failures[0].rec.Topic, "attempt", failures[0].rec.Attempt,
			"err", failures[0].err)
	}
	for _, f := range failures {
		if f.parked {
			e.log.Error("message parked", "message_id", f.rec.ID, "topic", f.rec.Topic, "handler", f.rec.Handler,
				"attempt", f.rec.Attempt, "err", f.err)
			if h := e.cfg.hooks.Parked; h != nil {
				h(f.rec, f.err)
			}
		} else if h := e.cfg.hooks.Failed; h != nil {
			h(f.rec, f.err)
		}
	}
}

// readRow is a row of the relay's read.
type readRow struct {
	row
	heldBy string // ID of the waiting row of its key it is held behind
}

// read wakes the due waiting rows and reads up to BatchSize ready rows, in
// one round trip.
func (r *relayRounds) read(ctx context.Context) ([]*readRow, error) {
	b := &pgx.Batch{}
	b.Queue(r.e.store.sql.promote, r.e.cfg.batchSize, int64(r.held))
	b.Queue(r.e.store.sql.read, r.e.cfg.batchSize, int64(r.held))
	br := r.conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("wake waiting rows: %w", translate(err))
	}
	rs, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	var (
		out              []*readRow
		seq, lockKey     int64
		id, topic        string
		key, value, hdrs []byte
		attempts         int
		at               time.Time
		due              bool
		heldBy           pgtype.Text
		heldParked       pgtype.Bool
	)
	_, err = pgx.ForEachRow(rs, []any{&seq, &id, &lockKey, &topic, &key, &value, &hdrs, &attempts, &at,
		&due, &heldBy, &heldParked}, func() error {
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
	if err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("read: %w", translate(err))
	}
	return out, nil
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
		var migrated bool
		if err := conn.QueryRow(ctx, r.e.store.sql.migrated, r.e.store.table).Scan(&migrated); err != nil {
			return err
		}
		if !migrated {
			return fmt.Errorf("%w (the relay needs version 11: the waiting column of %s)", ErrNotMigrated, r.e.store.table)
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
	}
	return nil
}

// idle writes the last round's outcome, then waits for a NOTIFY, PollInterval
// or the end of ctx. After a NOTIFY it waits WakeDelay more, so that the
// commits of a burst cost one round; the wake-ups that came meanwhile are
// dropped (that round reads their rows).
func (r *relayRounds) idle(ctx context.Context, wake <-chan struct{}) {
	if err := r.flush(ctx); err != nil {
		// The next round meets the same trouble and handles it.
		r.e.logUnlessOutage(err, "writing a round's outcome failed; its messages will be delivered again", "err", err)
		r.dropConn(ctx)
		return
	}
	wait := r.e.cfg.pollInterval
	if r.conn != nil && r.held == 0 {
		// A standby: look for shards to take at the next lease time.
		wait = max(min(wait, time.Until(r.nextLease)), time.Millisecond)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
		return
	case <-wake:
	}
	if r.wakeDelay > 0 {
		sleep(ctx, r.wakeDelay, nil)
	}
	select {
	case <-wake:
	default:
	}
}

// broken drops the lease after a failed round: the connection is closed
// (which releases the shards) and the next round connects again. An
// outcome not written is dropped: its rows are delivered again.
func (r *relayRounds) broken(ctx context.Context) {
	r.out = outcome{}
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
	r.conn, r.held = nil, 0
}

var _ rounder = (*relayRounds)(nil)


