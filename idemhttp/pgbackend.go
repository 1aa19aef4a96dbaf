package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/pgsession"
)

// pgBackend is the PostgreSQL Backend: records in store's table, reached
// through pool.
//
// In transaction mode (the default) a request holds its key with a
// transaction-scoped advisory lock, taken in the transaction its handler
// runs in and pipelined with BEGIN and the read of the record, and the
// record is written once, COMPLETED, with COMMIT. With NoTx or NoTakeover
// the key is reserved by a PROCESSING record committed on its own (see
// reserveRecord).
type pgBackend struct {
	pool  *pgxpool.Pool
	store *Store
	log   *slog.Logger
	// checked: the pool's session settings were checked (pgsession.Check),
	// once, on the first connection a reservation took (New does not touch
	// the database).
	checked sync.Once
}

// pollMax bounds the pause between two looks at a record held by a request
// that holds no lock waiters can wait on (NoTx), or whose lock was free
// while the record did not move.
const pollMax = 50 * time.Millisecond

// mismatchLooks is how many looks in a row must find the key held by a
// request with another fingerprint before a request is answered 422. A
// holder's transaction frees its advisory locks one by one as it ends: a
// look can find the lock of its key still held and the lock of its
// fingerprint already free, which reads as another fingerprint's holder.
// The looks are apart by mismatchPause, then four times that, and so on.
const (
	mismatchLooks = 4
	mismatchPause = time.Millisecond
)

// finishTimeout bounds the statements that settle a request (complete,
// commit, rollback, release). They run detached from the request's context:
// a client that hung up must not leave its record half done.
const finishTimeout = 10 * time.Second

func finishContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
}

// acquireTimeout bounds the wait for a pooled connection: past it the
// request is answered 503 store_unavailable rather than queued for ever
// behind an exhausted pool.
const acquireTimeout = 5 * time.Second

// acquire takes a connection from the pool, waiting at most acquireTimeout.
func (b *pgBackend) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, acquireTimeout)
	defer cancel()
	conn, err := b.pool.Acquire(actx)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: reserve: acquire a connection: %w", err)
	}
	// Once, on the first connection taken: the pool's session settings
	// (it takes no other connection than the one the request holds).
	b.checked.Do(func() { pgsession.Check(actx, conn, &b.pool.Config().ConnConfig.Config, b.log, "idemhttp") })
	return conn, nil
}

// awaitLock waits, at most timeout, until it can take the advisory lock
// key in the given mode, and frees it at once: it reports false when the
// timeout passed first. It waits on a connection of its own, outside the
// pool (waiting requests never take the pool's connections from the
// requests that run; Config.MaxWaiters bounds them), closed afterwards.
func (b *pgBackend) awaitLock(ctx context.Context, key int64, shared bool, timeout time.Duration) (bool, error) {
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("idemhttp: wait for the request in flight: connect: %w", err)
	}
	defer func() {
		cctx, cancel := finishContext(ctx)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	return b.store.awaitLockOn(ctx, conn, key, shared, timeout)
}

// Backend returns the Backend of the records in s, reached through pool:
// what New uses, for NewWithBackend and the conformance suite
// (idemhttptest).
func (s *Store) Backend(pool *pgxpool.Pool) (Backend, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	return &pgBackend{pool: pool, store: s, log: slog.Default()}, nil
}

func (b *pgBackend) Reserve(ctx context.Context, req *Request) (Reservation, error) {
	if req.NoTx || req.NoTakeover {
		return b.reserveRecord(ctx, req)
	}
	return b.reserveLocked(ctx, req)
}

// reserveLocked is the transaction mode's reservation: one round trip sends
// BEGIN, takes the key's advisory lock (pg_try_advisory_xact_lock; with
// Wait, pg_advisory_xact_lock bounded by lock_timeout) and reads the record
// in a statement that starts after the lock was granted, so that it sees
// whatever a previous holder committed. The lock is the hold: nobody else
// runs the key while this transaction is open, and PostgreSQL frees it when
// the transaction commits, rolls back or its connection ends (a crashed
// holder frees its key at once). The record is written only at completion.
func (b *pgBackend) reserveLocked(ctx context.Context, req *Request) (Reservation, error) {
	deadline := time.Now().Add(req.Wait)
	pause := time.Millisecond
	lock := b.store.lockKey(req.Account, req.Operation, req.Key)
	fpLock := b.store.fingerprintLockKey(req.Account, req.Operation, req.Key, req.Fingerprint)
	olderLocks := make([]int64, len(req.OlderFingerprints))
	for i, f := range req.OlderFingerprints {
		olderLocks[i] = b.store.fingerprintLockKey(req.Account, req.Operation, req.Key, f)
	}
	// A look never blocks, so that replays of a completed key never queue
	// on its lock; with Wait, a request that found the key held by a
	// request with its fingerprint waits, on a connection of its own, for
	// that fingerprint's lock (which the holder holds shared until its
	// transaction ends), and looks again.
	woken := false  // by the end of a holder this request waited for
	mismatches := 0 // looks in a row that found another fingerprint's holder
	for {
		conn, err := b.acquire(ctx)
		if err != nil {
			return Reservation{}, err
		}
		tx, locked, other, rec, err := b.store.beginLocked(ctx, conn, lock, fpLock, olderLocks, req)
		if err != nil {
			conn.Release()
			return Reservation{}, err
		}
		// The lease starts once the key is held (after any wait for it).
		start, now := time.Now(), b.store.now()
		end := func() {
			fctx, cancel := finishContext(ctx)
			defer cancel()
			if tx != nil {
				_ = tx.Rollback(fctx)
			}
			conn.Release()
		}
		live := rec != nil && rec.expiresAt.After(now)
		if locked || live || !other {
			mismatches = 0
		}
		switch {
		case !locked && !live && other:
			// A holder in flight with another fingerprint, or one whose
			// transaction is ending (see mismatchLooks).
			end()
			if b.store.mismatchLooked != nil {
				b.store.mismatchLooked()
			}
			mismatches++
			if mismatches >= mismatchLooks {
				return Reservation{State: StateProcessing, Mismatch: true}, nil
			}
			t := time.NewTimer(mismatchPause << (2 * (mismatches - 1)))
			select {
			case <-ctx.Done():
				t.Stop()
				return Reservation{State: StateProcessing}, nil // answered 409; the client is gone anyway
			case <-t.C:
			}
			continue
		case !locked && !live:
			// A holder in flight with this fingerprint; it has no record yet.
			end()
			left := time.Until(deadline)
			if left <= 0 {
				return Reservation{State: StateProcessing}, nil
			}
			if woken {
				// Woken, yet the key is still held: by a new holder, or
				// seemingly by another waiter queued for the lock this one
				// just had. A pause before waiting again lets that waiter
				// through rather than the two taking turns.
				woken = false
				t := time.NewTimer(min(pause, left))
				select {
				case <-ctx.Done():
					t.Stop()
					return Reservation{State: StateProcessing}, nil
				case <-t.C:
				}
				pause = min(2*pause, pollMax)
				continue
			}
			ok, err := b.awaitLock(ctx, fpLock, false, left)
			switch {
			case ctx.Err() != nil:
				return Reservation{State: StateProcessing}, nil // answered 409; the client is gone anyway
			case err != nil:
				return Reservation{}, err
			case !ok:
				return Reservation{State: StateProcessing}, nil // Wait is over: 409
			}
			woken = true
			continue
		case !live, locked && rec.state == StateProcessing && rec.token > 0 && !rec.lockedUntil.After(now) &&
			bytes.Equal(rec.fingerprint, req.Fingerprint):
			// No live record, or a PROCESSING record of an older version
			// whose lease ended (taken over). Records reserved with NoTx or
			// NoLeaseTakeover have negative tokens and are never taken over.
			h := &pgLockHold{b: b, conn: conn, tx: tx, req: req, start: now, leaseEnd: start.Add(req.Lease),
				replace: rec != nil}
			res := Reservation{Hold: h}
			if live {
				h.prevToken = rec.token
				res.TakenOver, res.PreviousToken = true, rec.token
			}
			return res, nil
		}
		end()
		res := rec.reservation()
		if rec.state != StateProcessing || !req.SameRequest(rec.fingerprint) || time.Until(deadline) <= 0 {
			return res, nil
		}
		// Held by a request that reserved with a record of its own (NoTx,
		// NoLeaseTakeover): it holds no lock this request can wait on.
		t := time.NewTimer(min(pause, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, nil // answered 409; the client is gone anyway
		case <-t.C:
		}
		pause = min(2*pause, pollMax)
	}
}

// pgLockHold is a hold of the transaction mode: the advisory lock of the
// transaction tx, on conn.
type pgLockHold struct {
	b         *pgBackend
	conn      *pgxpool.Conn
	tx        pgx.Tx
	req       *Request
	start     time.Time // store clock: created_at
	leaseEnd  time.Time // real time
	prevToken int64     // the PROCESSING record taken over, or 0
	replace   bool      // the key had a record (expired, or taken over)

	mu      sync.Mutex
	running bool // the handler runs
	fenced  bool // its session was ended at the lease's end
}

// Run runs f in the transaction until the lease ends. A handler still
// running then is fenced, also when its client has gone: its session is
// terminated (pg_terminate_backend, on a connection of its own outside the
// pool, which may be exhausted by then), which rolls its transaction back
// and frees the key for the next request; its completion then fails.
func (h *pgLockHold) Run(ctx context.Context, f func(context.Context, pgx.Tx)) {
	hctx, cancel := context.WithDeadline(ctx, h.leaseEnd)
	defer cancel()
	fctx, fcancel := context.WithDeadline(context.WithoutCancel(ctx), h.leaseEnd)
	defer fcancel()
	h.mu.Lock()
	h.running = true
	h.mu.Unlock()
	fenced := make(chan struct{})
	stop := context.AfterFunc(fctx, func() {
		defer close(fenced)
		if !errors.Is(fctx.Err(), context.DeadlineExceeded) {
			return
		}
		h.mu.Lock()
		fence := h.running
		h.fenced = fence
		h.mu.Unlock()
		if fence {
			h.b.fence(context.WithoutCancel(ctx), h.conn.Conn().PgConn().PID())
		}
	})
	defer func() {
		h.mu.Lock()
		h.running = false
		h.mu.Unlock()
		if !stop() {
			<-fenced // Complete sees fenced, and nothing commits after the fence
		}
	}()
	f(hctx, h.tx)
}

// fence terminates the PostgreSQL session pid, from a connection of its
// own, and logs what it could not do.
func (b *pgBackend) fence(ctx context.Context, pid uint32) {
	ctx, cancel := context.WithTimeout(ctx, finishTimeout)
	defer cancel()
	err := func() error {
		conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var done bool
		if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_terminate_backend($1)`, pid).Scan(&done); err != nil {
			return err
		}
		if !done {
			b.log.DebugContext(ctx, "idemhttp: fence: the holder's session had already ended", slog.Any("pid", pid))
		}
		return nil
	}()
	if err != nil {
		b.log.ErrorContext(ctx, "idemhttp: fence: could not end the session of a holder past its lease; "+
			"its key stays held until its handler returns", slog.Any("pid", pid), slog.Any("err", err))
	}
}

func (h *pgLockHold) Complete(ctx context.Context, resp Response) error {
	defer h.conn.Release()
	h.mu.Lock()
	fenced := h.fenced
	h.mu.Unlock()
	if fenced || !time.Now().Before(h.leaseEnd) {
		h.rollback(ctx)
		return fmt.Errorf("%w: the lease ended before the completion", ErrLeaseLost)
	}
	err := h.b.store.insertAndCommit(ctx, h.tx, h.req, h.start, h.replace, h.prevToken, resp)
	if err != nil {
		h.rollback(ctx)
	}
	return err
}

func (h *pgLockHold) Release(ctx context.Context) error {
	h.rollback(ctx)
	h.conn.Release()
	return nil
}

func (h *pgLockHold) rollback(ctx context.Context) {
	fctx, cancel := finishContext(ctx)
	defer cancel()
	_ = h.tx.Rollback(fctx)
}

// storedRecord is a record as the reservation read it.
type storedRecord struct {
	state       State
	fingerprint []byte
	token       int64
	lockedUntil time.Time
	expiresAt   time.Time
	response    Response
}

func (r *storedRecord) reservation() Reservation {
	return Reservation{State: r.state, Fingerprint: r.fingerprint, Response: r.response}
}

// lockKey is the advisory lock key of a scope: the first 8 bytes of the
// SHA-256 of the table and the scope, so that two tables (or two scopes)
// practically never share one. It can meet an application's own advisory
// lock keys: then one of them waits for the other (or a request gets 409).
func (s *Store) lockKey(account, operation, key string) int64 {
	var b bytes.Buffer
	b.WriteString("idemhttp/lock/1\n")
	writeField(&b, []byte(s.table))
	writeField(&b, []byte(account))
	writeField(&b, []byte(operation))
	writeField(&b, []byte(key))
	sum := sha256.Sum256(b.Bytes())
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// fingerprintLockKey is the advisory lock key of a scope and fingerprint,
// which every holder of the scope's lock (lockKey) takes shared first: see
// lockSQL.
func (s *Store) fingerprintLockKey(account, operation, key string, fingerprint []byte) int64 {
	var b bytes.Buffer
	b.WriteString("idemhttp/fingerprint-lock/1\n")
	writeField(&b, []byte(s.table))
	writeField(&b, []byte(account))
	writeField(&b, []byte(operation))
	writeField(&b, []byte(key))
	writeField(&b, fingerprint)
	sum := sha256.Sum256(b.Bytes())
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// beginLocked begins a transaction on conn, tries the lock and reads the
// record of req's key, in one round trip: the read is a statement of its
// own after the lock's, so that its snapshot sees what a holder before
// committed. tx is nil when the transaction did not begin; locked is false
// when the lock was not granted (tx is then still open: the caller rolls it
// back); other is true when its holder's fingerprint is not req's (see
// lockSQL).
func (s *Store) beginLocked(ctx context.Context, conn *pgxpool.Conn, lock, fpLock int64, olderLocks []int64,
	req *Request) (tx pgx.Tx, locked, other bool, rec *storedRecord, err error) {
	b := &pgx.Batch{}
	// READ COMMITTED whatever the session's default: the record is read in
	// a statement (and a snapshot) that starts after the lock was granted.
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	// The server ends the transaction if it sits idle past the lease and
	// a margin: its client went away, and its lock must not outlive it.
	b.Queue(pgsession.SetLocal(req.Lease))
	b.Queue(s.lockSQL, lock, fpLock, olderLocks)
	b.Queue(s.readSQL, req.Account, req.Operation, req.Key)
	br := conn.SendBatch(ctx, b)
	tx = br.Tx()
	_, err = br.Exec() // BEGIN
	if err == nil {
		_, err = br.Exec() // SET LOCAL
	}
	if err == nil {
		var outcome int
		err = br.QueryRow().Scan(&outcome)
		locked, other = outcome == 1, outcome == 2
	}
	if err == nil {
		rec, err = scanStored(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fctx, cancel := finishContext(ctx)
		defer cancel()
		_ = tx.Rollback(fctx)
		return nil, false, false, nil, fmt.Errorf("idemhttp: reserve: %w", translate(err))
	}
	return tx, locked, other, rec, nil
}

// scanStored scans a row of readSQL; no row is a nil record.
func scanStored(row pgx.Row) (*storedRecord, error) {
	var (
		r                      storedRecord
		lockedUntil, expiresAt *time.Time
		status                 *int
		token                  *int64
		headerJSON             []byte
		state                  *string
	)
	err := row.Scan(&state, &r.fingerprint, &token, &lockedUntil, &expiresAt, &status, &headerJSON,
		&r.response.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if state == nil {
		return nil, nil
	}
	r.state = State(*state)
	if token != nil {
		r.token = *token
	}
	if lockedUntil != nil {
		r.lockedUntil = *lockedUntil
	}
	if expiresAt != nil {
		r.expiresAt = *expiresAt
	}
	if status != nil {
		r.response.Status = *status
		if len(headerJSON) > 0 {
			if err := json.Unmarshal(headerJSON, &r.response.Header); err != nil {
				return nil, fmt.Errorf("stored headers: %w", err)
			}
		}
	}
	return &r, nil
}

// insertAndCommit writes the COMPLETED record with resp and commits tx, in
// one round trip. With replace, the record replaces an expired one, or the
// PROCESSING record with prevToken that the request took over (prevToken 0:
// none); without, it is inserted. Any other live record makes it fail with
// ErrLeaseLost, nothing committed.
func (s *Store) insertAndCommit(ctx context.Context, tx pgx.Tx, req *Request, start time.Time, replace bool,
	prevToken int64, resp Response) error {
	headerJSON, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("idemhttp: complete: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	fctx, cancel := finishContext(ctx)
	defer cancel()
	now := s.now()
	b := &pgx.Batch{}
	if replace {
		b.Queue(s.insertCompletedSQL, req.Account, req.Operation, req.Key, req.Fingerprint, newToken(),
			resp.Status, headerJSON, body, start, now, now.Add(req.TTL), prevToken)
	} else {
		b.Queue(s.insertSQL, req.Account, req.Operation, req.Key, req.Fingerprint, newToken(),
			resp.Status, headerJSON, body, start, now, now.Add(req.TTL))
	}
	b.Queue("COMMIT")
	err = s.sendCompletion(fctx, tx, b)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation: a record committed meanwhile
		return fmt.Errorf("%w: the key got a record meanwhile", ErrLeaseLost)
	}
	return err
}

// sendCompletion sends b, a completing statement and COMMIT, on tx, and
// reads what became of them.
func (s *Store) sendCompletion(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
		if err != nil {
			err = fmt.Errorf("commit: %w", err)
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	switch {
	case isLeaseLost(err):
		return fmt.Errorf("%w: the record is held by another request", ErrLeaseLost)
	case err != nil:
		return fmt.Errorf("idemhttp: complete: %w", translate(err))
	case tag.String() != "COMMIT":
		// PostgreSQL answers COMMIT of a failed transaction with ROLLBACK.
		return fmt.Errorf("idemhttp: complete: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// reserveRecord is the reservation of NoTx and NoLeaseTakeover: the key is
// reserved by a PROCESSING record committed on its own, visible to every
// other request at once and left behind by a holder that crashed, for the
// reconciler. While that record is PROCESSING with the request's
// fingerprint and Wait allows, the request waits for the holder: on the
// advisory lock a holder in a transaction takes on its token, else (NoTx)
// by looking again after a pause doubling up to pollMax.
func (b *pgBackend) reserveRecord(ctx context.Context, req *Request) (Reservation, error) {
	a := reserveArgs{account: req.Account, operation: req.Operation, key: req.Key, fingerprint: req.Fingerprint,
		lease: req.Lease, ttl: req.TTL, takeover: !req.NoTx && !req.NoTakeover, same: req.SameRequest}
	res, err := b.reserveOrWait(ctx, a, req.Wait)
	if err != nil || !res.reserved {
		if err != nil {
			return Reservation{}, err
		}
		return Reservation{State: res.state, Fingerprint: res.fingerprint, Response: res.response}, nil
	}
	h := &pgRecordHold{b: b, a: a, token: res.token, leaseEnd: res.leaseStart.Add(req.Lease)}
	out := Reservation{Hold: h, TakenOver: res.tookOver, PreviousToken: res.prevToken}
	if req.NoTx {
		// The handler runs without a transaction: it holds no connection.
		return out, nil
	}
	conn, err := b.acquire(ctx)
	if err != nil {
		_ = h.Release(ctx)
		return Reservation{}, err
	}
	h.conn = conn
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: pgsession.BeginQuery("", req.Lease)})
	if err == nil && req.Wait > 0 {
		if err = b.store.hold(ctx, tx, res.token); err != nil {
			fctx, cancel := finishContext(ctx)
			_ = tx.Rollback(fctx)
			cancel()
		}
	}
	if err != nil {
		_ = h.Release(ctx)
		return Reservation{}, fmt.Errorf("idemhttp: begin: %w", err)
	}
	h.tx = tx
	return out, nil
}

// reserveOrWait reserves the key, each look a statement on a pooled
// connection of its own; waits happen on connections outside the pool.
func (b *pgBackend) reserveOrWait(ctx context.Context, a reserveArgs, wait time.Duration) (reservation, error) {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	var waited int64 // the token whose holder's lock this request got
	for {
		res, err := b.reserveOnce(ctx, a)
		if err != nil || res.reserved || res.state != StateProcessing || !a.same(res.fingerprint) || wait <= 0 {
			return res, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return res, nil
		}
		if res.token == waited {
			t := time.NewTimer(min(pause, left))
			select {
			case <-ctx.Done():
				t.Stop()
				return res, nil // answered 409; the client is gone anyway
			case <-t.C:
			}
			pause = min(2*pause, pollMax)
			waited = 0
			continue
		}
		ok, err := b.awaitLock(ctx, res.token, true, left)
		if ctx.Err() != nil {
			return res, nil
		}
		if err != nil {
			return reservation{}, err
		}
		if !ok {
			return res, nil // Wait is over: 409
		}
		waited = res.token
	}
}

// reserveOnce runs Store.reserve on a pooled connection.
func (b *pgBackend) reserveOnce(ctx context.Context, a reserveArgs) (reservation, error) {
	conn, err := b.acquire(ctx)
	if err != nil {
		return reservation{}, err
	}
	defer conn.Release()
	return b.store.reserve(ctx, conn, a)
}

// pgRecordHold is a hold by a PROCESSING record with token: with a
// transaction on conn (NoLeaseTakeover), or none (NoTx).
type pgRecordHold struct {
	b        *pgBackend
	a        reserveArgs
	token    int64
	leaseEnd time.Time
	conn     *pgxpool.Conn // nil with NoTx
	tx       pgx.Tx
}

func (h *pgRecordHold) Run(ctx context.Context, f func(context.Context, pgx.Tx)) {
	hctx, cancel := context.WithDeadline(ctx, h.leaseEnd)
	defer cancel()
	var tx pgx.Tx
	if h.tx != nil {
		tx = h.tx
	}
	f(hctx, tx)
}

func (h *pgRecordHold) Complete(ctx context.Context, resp Response) error {
	fctx, cancel := finishContext(ctx)
	defer cancel()
	if h.tx == nil {
		ok, err := h.b.store.complete(fctx, h.b.pool, h.a, h.token, resp)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("%w: the record is no longer held with this request's token", ErrLeaseLost)
		}
		return nil
	}
	defer h.conn.Release()
	ok, err := h.b.store.completeAndCommit(fctx, h.tx, h.a, h.token, resp)
	if err != nil || !ok {
		_ = h.tx.Rollback(fctx)
	}
	switch {
	case err != nil:
		// A no-op if the commit did happen: the record is COMPLETED.
		if rerr := h.b.store.release(fctx, h.b.pool, h.a, h.token); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	case !ok:
		return fmt.Errorf("%w: the record is no longer held with this request's token", ErrLeaseLost)
	}
	return nil
}

// Release rolls the transaction back and deletes the record if it is
// still PROCESSING with the hold's token. When that fails, the record stays
// PROCESSING until its lease ends, then the reconciler sees it.
func (h *pgRecordHold) Release(ctx context.Context) error {
	fctx, cancel := finishContext(ctx)
	defer cancel()
	var db DBTX = h.b.pool
	if h.conn != nil {
		if h.tx != nil {
			_ = h.tx.Rollback(fctx)
		}
		if !h.conn.Conn().IsClosed() {
			db = h.conn // after the rollback: no second connection needed
		}
		defer h.conn.Release()
	}
	return h.b.store.release(fctx, db, h.a, h.token)
}
