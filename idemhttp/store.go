package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/migrate"
)

// Defaults of StoreConfig and of Store methods.
const (
	// PurgeBatchDefault is the number of rows Purge deletes per statement
	// when given a batch size of zero or less.
	PurgeBatchDefault = 1000
	// FindLimitDefault is the number of records FindStuck and Reconcile look
	// at when given a limit of zero or less.
	FindLimitDefault = 100
)

// ErrNotFound is returned by Store.Get when no live record has the key.
var ErrNotFound = errors.New("idemhttp: record not found")

// ErrNotMigrated means the records table does not exist: run package
// migrate (`idemkit migrate up`) with the same Schema
// and table name. Every Store method wraps it then, and the middleware
// answers 503 store_unavailable and logs it.
var ErrNotMigrated = fmt.Errorf("idemhttp: table missing: %w", idemkit.ErrNotMigrated)

// translate maps a missing table to ErrNotMigrated.
func translate(err error) error {
	return pgexec.NotMigrated(ErrNotMigrated, err)
}

// State is the state of a record.
type State string

// The states of a record.
const (
	// StateProcessing: a request holds the key and runs its handler, until
	// its lease ends. Other requests with the key get 409.
	StateProcessing State = "PROCESSING"
	// StateCompleted: the stored response is replayed to every request with
	// the key until the record expires.
	StateCompleted State = "COMPLETED"
	// StateFailed: a reconciler decided the operation failed; requests with
	// the key get 409 operation_failed until the record expires.
	StateFailed State = "FAILED"
	// StateUnknown: a reconciler could not decide; requests with the key get
	// 409 outcome_unknown until someone resolves the record or it expires.
	StateUnknown State = "UNKNOWN"
)

// DBTX runs queries: a pgx.Tx, a *pgxpool.Pool and a *pgx.Conn all satisfy it.
type DBTX = pgexec.DB

// StoreConfig says where records live and which clock measures leases and
// expiry. The table is created by package migrate, which must be given the
// same migrate.Tables (the one value every package takes to say where its
// tables live).
type StoreConfig struct {
	// Tables says where the tables live (migrate.Tables; the zero value:
	// schema "public", every default name); this store uses
	// Tables.IdempotencyRecords, which defaults to "idempotency_records"
	// (migrate.IdempotencyRecordsDefault).
	Tables migrate.Tables
	// Now is the clock of leases and expiry: every timestamp in the table is
	// written from it, and lease ends and expiry are compared with it. All
	// processes sharing a table need clocks in step (NTP) within a small
	// fraction of the lease. Tests inject a clock here. Defaults to time.Now.
	Now func() time.Time
}

// Store reads and writes idempotency records. It holds no connection and no
// state besides its SQL and clock: it is safe for concurrent use.
type Store struct {
	now   func() time.Time
	table string // quoted schema.table: part of the advisory lock keys

	readSQL            string
	lockSQL            string
	insertSQL          string
	insertCompletedSQL string
	reserveSQL         string
	takeoverSQL        string
	leaseSQL           string
	completeSQL        string
	completeTxSQL      string
	releaseSQL         string
	getSQL             string
	stuckSQL           string
	countStuckSQL      string
	resolveSQL         string
	purgeSQL           string
	pagesSQL           string

	// mismatchLooked, when set (by this package's tests), runs after a
	// look found the key held by a request with another fingerprint.
	mismatchLooked func()
}

// NewStore returns a Store for the table cfg names. cfg may be nil, meaning
// every default. An invalid cfg returns an error wrapping
// migrate.ErrInvalidConfig. NewStore does not touch the database.
func NewStore(cfg *StoreConfig) (*Store, error) {
	var c StoreConfig
	if cfg != nil {
		c = *cfg
	}
	mc := c.Tables.WithDefaults()
	if err := mc.Validate(); err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	t := pgx.Identifier{mc.Schema, mc.IdempotencyRecords}.Sanitize()
	const key = `account = $1 AND operation = $2 AND idempotency_key = $3`
	const cols = `account, operation, idempotency_key, state, fingerprint, token, locked_until,
	response_status, created_at, updated_at, completed_at, expires_at`
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Store{
		now:   c.Now,
		table: t,

		// The record of a key, live or not: read by a request in transaction
		// mode after each try of the key's lock (lockSQL), in a statement
		// of its own.
		readSQL: `SELECT state, fingerprint, token, locked_until, expires_at,
	response_status, response_headers, response_body
FROM ` + t + ` WHERE ` + key,

		// The key's lock, taken by a request in transaction mode, which
		// then reads the record with readSQL in the same round trip: a
		// statement of its own, whose snapshot is taken after the lock was
		// granted, so that it sees what the holder before committed. Every
		// holder of the key's lock ($1) first takes the lock of its scope
		// and fingerprint ($2) shared, and keeps both to its transaction's
		// end. A request that cannot take the key's lock then tests its own
		// fingerprint's lock exclusively, and those of its fingerprints
		// under older keys ($3): when they are free and the key's lock is
		// still taken, its holder took a fingerprint lock that is none of
		// these, so its fingerprint differs (2: 422). A holder with the same
		// fingerprint, or a contender testing it, gives 0 (in flight); 1 is
		// the key's lock granted. CASE evaluates its branches in order, and
		// no further.
		lockSQL: `SELECT CASE
	WHEN NOT pg_catalog.pg_try_advisory_xact_lock_shared($2) THEN 0
	WHEN pg_catalog.pg_try_advisory_xact_lock($1) THEN 1
	WHEN NOT pg_catalog.pg_try_advisory_xact_lock($2) THEN 0
	WHEN EXISTS (SELECT FROM pg_catalog.unnest($3::bigint[]) AS o(k)
		WHERE NOT pg_catalog.pg_try_advisory_xact_lock(o.k)) THEN 0
	WHEN pg_catalog.pg_try_advisory_xact_lock($1) THEN 1
	ELSE 2 END`,

		// The COMPLETED record of a request in transaction mode whose key
		// had no record: a plain INSERT, pipelined with COMMIT; a record
		// committed meanwhile makes it fail (unique violation), so that the
		// COMMIT after it rolls back. $9 is the request's start, $10 now,
		// $11 the expiry.
		insertSQL: `INSERT INTO ` + t + ` (account, operation, idempotency_key, fingerprint, state, token,
	response_status, response_headers, response_body, created_at, updated_at, completed_at, expires_at)
VALUES ($1, $2, $3, $4, 'COMPLETED', $5, $6, $7, $8, $9, $10, $10, $11)`,

		// The record of a request in transaction mode, written once,
		// COMPLETED, pipelined with COMMIT: it replaces an expired record or
		// the PROCESSING record with token $12 whose lease ended (taken over;
		// its created_at is kept). Any other record (one reserved meanwhile
		// by a request of NoTx or NoLeaseTakeover, which takes no lock) makes
		// it fail (leaseLostMarker), so that the COMMIT after it rolls back.
		// $9 is the request's start, $10 now, $11 the expiry.
		insertCompletedSQL: `WITH done AS (
	INSERT INTO ` + t + ` AS r (account, operation, idempotency_key, fingerprint, state, token,
		response_status, response_headers, response_body, created_at, updated_at, completed_at, expires_at)
	VALUES ($1, $2, $3, $4, 'COMPLETED', $5, $6, $7, $8, $9, $10, $10, $11)
	ON CONFLICT (account, operation, idempotency_key) DO UPDATE SET
		fingerprint = EXCLUDED.fingerprint, state = 'COMPLETED', token = EXCLUDED.token, locked_until = NULL,
		response_status = EXCLUDED.response_status, response_headers = EXCLUDED.response_headers,
		response_body = EXCLUDED.response_body,
		created_at = CASE WHEN r.expires_at <= $10 THEN EXCLUDED.created_at ELSE r.created_at END,
		updated_at = $10, completed_at = $10, expires_at = EXCLUDED.expires_at
	WHERE r.expires_at <= $10 OR (r.token = $12 AND r.state = 'PROCESSING' AND r.locked_until <= $10
		AND r.fingerprint = EXCLUDED.fingerprint)
	RETURNING 1
)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('` + leaseLostMarker + `' || count(*))::int END FROM done`,

		// One statement, one round trip: the insert reserves the key, or the
		// existing record is returned. When the conflicting row was committed
		// after this statement's snapshot, neither branch returns a row and
		// the caller runs the statement again.
		reserveSQL: reserveSQL(t),

		// An expired record counts as absent: a new request takes it over,
		// provided nobody changed it since it was read ($9, the token seen).
		takeoverSQL: `UPDATE ` + t + ` SET fingerprint = $4, state = 'PROCESSING', token = $5,
	locked_until = $7, created_at = $6, updated_at = $6, expires_at = $8, completed_at = NULL,
	response_status = NULL, response_headers = NULL, response_body = NULL
WHERE ` + key + ` AND token = $9 AND expires_at <= $6`,

		// A record whose holder's lease ended is taken over by a request
		// with the same fingerprint: a new token fences the old holder out,
		// a new lease and expiry start now; created_at keeps the first
		// reservation. It matches the token seen ($9) and still PROCESSING
		// past its lease: of several requests racing for it, the first
		// UPDATE wins and the others, re-checking the row once the winner
		// committed, change nothing. An old holder that completed first
		// (COMPLETED, same token) is not taken over either; one completing
		// holds the row until its transaction ends, and the UPDATE waits.
		leaseSQL: `UPDATE ` + t + ` SET token = $5, locked_until = $7, updated_at = $6, expires_at = $8
WHERE ` + key + ` AND token = $9 AND state = 'PROCESSING' AND locked_until <= $6 AND fingerprint = $4`,

		// The completion changes no indexed column when it comes within the
		// lease: the reservation set expires_at to the lease end plus the TTL,
		// which GREATEST keeps. So it is a HOT update (the table has no
		// index on state or locked_until for this reason).
		completeSQL: `UPDATE ` + t + ` SET ` + completeSet + `
WHERE ` + key + ` AND token = $4 AND state = 'PROCESSING'`,

		// completeTxSQL is completeSQL for the middleware's transaction,
		// sent in one round trip with COMMIT: when the record is no longer
		// held with the token it fails (leaseLostMarker), so that the
		// transaction is aborted and the COMMIT after it rolls back. The
		// cast of a text built from count(*) is evaluated per execution, never
		// folded at planning.
		completeTxSQL: `WITH done AS (
	UPDATE ` + t + ` SET ` + completeSet + `
	WHERE ` + key + ` AND token = $4 AND state = 'PROCESSING'
	RETURNING 1
)
SELECT CASE count(*) WHEN 1 THEN 1 ELSE ('` + leaseLostMarker + `' || count(*))::int END FROM done`,

		releaseSQL: `DELETE FROM ` + t + ` WHERE ` + key + ` AND token = $4 AND state = 'PROCESSING'`,

		getSQL: `SELECT ` + cols + ` FROM ` + t + ` WHERE ` + key + ` AND expires_at > $4`,

		stuckSQL: `SELECT ` + cols + ` FROM ` + t + `
WHERE state = 'PROCESSING' AND locked_until <= $1
ORDER BY locked_until
LIMIT $2`,

		countStuckSQL: `SELECT count(*) FROM ` + t + ` WHERE state = 'PROCESSING' AND locked_until <= $1`,

		// $5: the new state, or NULL to delete the record.
		resolveSQL: `WITH del AS (
	DELETE FROM ` + t + ` WHERE ` + key + ` AND token = $4 AND state IN ('PROCESSING', 'UNKNOWN')
		AND $5::text IS NULL
	RETURNING 1
), upd AS (
	UPDATE ` + t + ` SET state = $5, locked_until = NULL, updated_at = $6
	WHERE ` + key + ` AND token = $4 AND state IN ('PROCESSING', 'UNKNOWN') AND $5::text IS NOT NULL
	RETURNING 1
)
SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM upd)`,

		// Purges walk the heap in ranges of purgePages pages (a TID range
		// scan, no index: one on expires_at would have its right-most page
		// written by every first request), $2 and $3 the
		// range's first and end page, at most $4 rows per statement.
		purgeSQL: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + `
	WHERE ctid >= pg_catalog.format('(%s,0)', $2::bigint)::tid AND ctid < pg_catalog.format('(%s,0)', $3::bigint)::tid
		AND expires_at <= $1
	LIMIT $4
	FOR UPDATE SKIP LOCKED
))`,
		pagesSQL: `SELECT pg_catalog.pg_relation_size($1::regclass) / pg_catalog.current_setting('block_size')::bigint`,
	}, nil
}

// reserveSQL returns the reserving statement on table t: one statement, one
// round trip. The insert reserves the key, or the existing record is
// returned. When the conflicting row was committed after this statement's
// snapshot, neither branch returns a row and the caller runs it again.
func reserveSQL(t string) string {
	return `WITH ins AS (
	INSERT INTO ` + t + ` (account, operation, idempotency_key, fingerprint, state, token,
		locked_until, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, $4, 'PROCESSING', $5, $7, $6, $6, $8)
	ON CONFLICT (account, operation, idempotency_key) DO NOTHING
	RETURNING 1
)
SELECT true, ''::text, ''::bytea, 0::bigint, NULL::timestamptz, NULL::timestamptz,
	NULL::int, NULL::jsonb, NULL::bytea
FROM ins
UNION ALL
SELECT false, state, fingerprint, token, locked_until, expires_at,
	response_status, response_headers, response_body
FROM ` + t + `
WHERE account = $1 AND operation = $2 AND idempotency_key = $3 AND NOT EXISTS (SELECT 1 FROM ins)`
}

// completeSet is the SET list of the completing UPDATE: $5 status, $6
// headers, $7 body, $8 now, $9 the expiry TTL after now. expires_at only
// grows: a completion within the lease leaves it at the lease end plus the
// TTL, set by the reservation, so that the UPDATE changes no indexed column.
const completeSet = `state = 'COMPLETED', locked_until = NULL,
	response_status = $5, response_headers = $6, response_body = $7,
	updated_at = $8, completed_at = $8, expires_at = GREATEST(expires_at, $9)`

// leaseLostMarker is in the error completeTxSQL raises when the record is no
// longer held with the request's token.
const leaseLostMarker = "idemhttp_lease_lost:"

// isLeaseLost reports whether err is the error completeTxSQL raises when the
// record is no longer held with the token.
func isLeaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, leaseLostMarker)
}

// Record is an idempotency record without its stored response body.
type Record struct {
	Account   string
	Operation string
	Key       string
	State     State
	// Fingerprint is the fingerprint (HMAC-SHA256, Config.FingerprintKeys)
	// of the request that reserved the key.
	Fingerprint []byte
	// Token changes at every reservation and takeover; completing and
	// resolving a record match it.
	Token int64
	// LockedUntil is the end of the holder's lease; zero unless PROCESSING.
	LockedUntil time.Time
	// Status is the stored response's status; zero unless COMPLETED.
	Status      int
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time
	// ExpiresAt is when the record stops counting: from then on the key is
	// unknown and a request with it runs anew.
	ExpiresAt time.Time
}

func scanRecord(row pgx.Row) (Record, error) {
	var (
		r                        Record
		lockedUntil, completedAt *time.Time
		status                   *int
	)
	err := row.Scan(&r.Account, &r.Operation, &r.Key, &r.State, &r.Fingerprint, &r.Token, &lockedUntil,
		&status, &r.CreatedAt, &r.UpdatedAt, &completedAt, &r.ExpiresAt)
	if lockedUntil != nil {
		r.LockedUntil = *lockedUntil
	}
	if completedAt != nil {
		r.CompletedAt = *completedAt
	}
	if status != nil {
		r.Status = *status
	}
	return r, err
}

// Get returns the live (not expired) record of (account, operation, key),
// or ErrNotFound.
func (s *Store) Get(ctx context.Context, db DBTX, account, operation, key string) (Record, error) {
	r, err := scanRecord(db.QueryRow(ctx, s.getSQL, account, operation, key, s.now()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("idemhttp: get: %w", translate(err))
	}
	return r, nil
}

// FindStuck returns up to limit records still PROCESSING after their lease
// ended, longest overdue first (limit <= 0 means FindLimitDefault). Their
// holder crashed, hung, or is slow; see Reconcile. No
// index tells PROCESSING records apart (it would stop completions from
// being HOT updates), so it reads the whole table: call it every few
// minutes, not per request. Only requests that hold their key with a
// record of their own (Config.NoTx, Config.NoLeaseTakeover) leave such
// records: in the default transaction mode a request in flight has no
// record, a crashed one leaves nothing, and one past its lease is fenced
// out by the middleware.
// CountStuck counts the records FindStuck would list, without a limit and
// without reading them out: for gauges and probes. Like FindStuck it scans
// the table.
func (s *Store) CountStuck(ctx context.Context, db DBTX) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, s.countStuckSQL, s.now()).Scan(&n); err != nil {
		return 0, fmt.Errorf("idemhttp: count stuck: %w", translate(err))
	}
	return n, nil
}

func (s *Store) FindStuck(ctx context.Context, db DBTX, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = FindLimitDefault
	}
	rows, err := db.Query(ctx, s.stuckSQL, s.now(), limit)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: find stuck: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, fmt.Errorf("idemhttp: find stuck: %w", translate(err))
	}
	return out, nil
}

// Decision is what a Reconciler decides for a stuck record.
type Decision int

// The decisions. The zero Decision is invalid.
const (
	// AllowRetry deletes the record: the next request with the key runs the
	// handler anew. Safe when the operation surely did not happen, and always
	// safe for effects written in the middleware's transaction: a holder that
	// is still running can no longer complete (its token is gone), so its
	// transaction rolls back.
	AllowRetry Decision = iota + 1
	// MarkFailed makes the record FAILED: requests with the key get 409
	// operation_failed until it expires; the client must use a new key.
	MarkFailed
	// KeepUnknown makes the record UNKNOWN: requests with the key get 409
	// outcome_unknown, and FindStuck no longer lists it, until someone
	// resolves it (Resolve) or it expires.
	KeepUnknown
)

func (d Decision) String() string {
	switch d {
	case AllowRetry:
		return "AllowRetry"
	case MarkFailed:
		return "MarkFailed"
	case KeepUnknown:
		return "KeepUnknown"
	}
	return fmt.Sprintf("Decision(%d)", int(d))
}

// ErrInvalidDecision is returned for a Decision that is not one of the three.
var ErrInvalidDecision = errors.New("idemhttp: invalid decision")

// Reconciler decides what becomes of a record stuck in PROCESSING past its
// lease, for example by asking the payment provider whether the charge
// exists. An error leaves the record as it is, to be found again later.
type Reconciler interface {
	Reconcile(ctx context.Context, rec Record) (Decision, error)
}

// ReconcilerFunc adapts a function to Reconciler.
type ReconcilerFunc func(ctx context.Context, rec Record) (Decision, error)

// Reconcile calls f(ctx, rec).
func (f ReconcilerFunc) Reconcile(ctx context.Context, rec Record) (Decision, error) {
	return f(ctx, rec)
}

// Resolve applies d to the record rec names (from FindStuck or Get),
// provided it still has rec's token and is PROCESSING or UNKNOWN: an
// operator settles an UNKNOWN record with it too. It reports whether the
// record was changed: false means it moved on meanwhile (completed,
// released, taken over), which is not an error.
func (s *Store) Resolve(ctx context.Context, db DBTX, rec Record, d Decision) (bool, error) {
	var state *string
	switch d {
	case AllowRetry:
	case MarkFailed:
		v := string(StateFailed)
		state = &v
	case KeepUnknown:
		v := string(StateUnknown)
		state = &v
	default:
		return false, fmt.Errorf("idemhttp: resolve: %w: %v", ErrInvalidDecision, d)
	}
	var n int64
	if err := db.QueryRow(ctx, s.resolveSQL, rec.Account, rec.Operation, rec.Key, rec.Token, state, s.now()).
		Scan(&n); err != nil {
		return false, fmt.Errorf("idemhttp: resolve: %w", translate(err))
	}
	return n > 0, nil
}

// ReconcileError reports the records a Reconcile call could not settle.
type ReconcileError struct {
	// Errs holds one error per record left as it was, naming its key.
	Errs []error
}

func (e *ReconcileError) Error() string {
	return fmt.Sprintf("idemhttp: reconcile: %d record(s) left stuck: %v", len(e.Errs), errors.Join(e.Errs...))
}

// Unwrap returns the per-record errors.
func (e *ReconcileError) Unwrap() []error { return e.Errs }

// Reconcile hands up to limit stuck records (FindStuck) to r one by one and
// applies each decision with Resolve. It returns how many records it
// changed. Records r fails on are left stuck and reported in a
// *ReconcileError after the others are done. Run it on a schedule you own,
// for example every lease period.
func (s *Store) Reconcile(ctx context.Context, db DBTX, r Reconciler, limit int) (int, error) {
	if r == nil {
		return 0, errors.New("idemhttp: reconcile: nil reconciler")
	}
	stuck, err := s.FindStuck(ctx, db, limit)
	if err != nil {
		return 0, err
	}
	var (
		changed int
		errs    []error
	)
	for _, rec := range stuck {
		if err := ctx.Err(); err != nil {
			return changed, fmt.Errorf("idemhttp: reconcile: %w", err)
		}
		d, err := callReconciler(ctx, r, rec)
		if err == nil {
			var ok bool
			ok, err = s.Resolve(ctx, db, rec, d)
			if ok {
				changed++
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%q %q %q: %w", rec.Account, rec.Operation, rec.Key, err))
		}
	}
	if len(errs) > 0 {
		return changed, &ReconcileError{Errs: errs}
	}
	return changed, nil
}

func callReconciler(ctx context.Context, r Reconciler, rec Record) (d Decision, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = idemkit.NewPanicError("idemhttp: reconciler", p)
		}
	}()
	return r.Reconcile(ctx, rec)
}

// purgePages is the number of heap pages a purge statement looks at.
const purgePages = 64

// Purge deletes records whose expiry has passed (by the store's clock, read
// when Purge starts), at most batchSize rows per statement, each statement
// its own short transaction on db, until none is left in the table as it
// was when Purge started, or ctx ends. It returns how many records it
// deleted, also with an error. batchSize <= 0 means PurgeBatchDefault. Rows
// locked by a concurrent Purge or request are skipped. Expired records are
// already ignored by requests (their key runs anew), so Purge only reclaims
// space. It reads the table once, in ranges of pages (no index), so run it
// every hour or so rather than per request; it needs PostgreSQL 14 or later
// (TID range scans).
func (s *Store) Purge(ctx context.Context, db *pgxpool.Pool, batchSize int) (int64, error) {
	if db == nil {
		return 0, errors.New("idemhttp: purge: nil pool")
	}
	if batchSize <= 0 {
		batchSize = PurgeBatchDefault
	}
	now := s.now()
	var pages int64
	if err := db.QueryRow(ctx, s.pagesSQL, s.table).Scan(&pages); err != nil {
		return 0, fmt.Errorf("idemhttp: purge: %w", translate(err))
	}
	var deleted int64
	for p := int64(0); p < pages; {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("idemhttp: purge: %w", err)
		}
		tag, err := db.Exec(ctx, s.purgeSQL, now, p, p+purgePages, batchSize)
		if err != nil {
			return deleted, fmt.Errorf("idemhttp: purge: %w", translate(err))
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			p += purgePages
		}
	}
	return deleted, nil
}

// reservation is the outcome of reserve: either this request holds the key
// (reserved, with token, from leaseStart on), or the other fields describe
// the existing record (token is then its holder's).
type reservation struct {
	reserved bool
	token    int64
	// leaseStart is the real time just before the reserving statement: the
	// record's lease ends Lease after it, or later.
	leaseStart time.Time
	// tookOver is true when the key was reserved by taking over a record
	// whose lease ended, held with prevToken until prevLockedUntil.
	tookOver        bool
	prevToken       int64
	prevLockedUntil time.Time

	state       State
	fingerprint []byte
	lockedUntil time.Time
	response    Response
}

type reserveArgs struct {
	account, operation, key string
	fingerprint             []byte
	lease, ttl              time.Duration
	// takeover lets reserve take over a PROCESSING record with the same
	// fingerprint whose lease ended.
	takeover bool
	// same reports whether a stored fingerprint is the request's, under the
	// current key or an older one (Request.SameRequest).
	same func(fingerprint []byte) bool
}

// errReserveRace is returned when reserve kept losing to concurrent changes.
var errReserveRace = errors.New("idemhttp: reserve: the record kept changing")

// reserve reserves the key for a new request, or returns the live record.
// It runs on db outside any transaction, so the reservation is visible to
// every other request at once. An expired record counts as absent; with
// a.takeover, a PROCESSING record with a.fingerprint whose lease ended is
// taken over.
func (s *Store) reserve(ctx context.Context, db DBTX, a reserveArgs) (reservation, error) {
	sql := s.reserveSQL
	for range 8 {
		start := time.Now()
		now := s.now()
		// A record of its own has a negative token: the default mode never
		// takes it over (it takes over only the positive tokens that
		// versions before 13 gave every reservation).
		token := -newToken()
		var (
			reserved               bool
			res                    reservation
			lockedUntil, expiresAt *time.Time
			status                 *int
			headerJSON             []byte
			body                   []byte
			state                  string
			fingerprint            []byte
			existingToken          int64
		)
		err := db.QueryRow(ctx, sql, a.account, a.operation, a.key, a.fingerprint, token,
			now, now.Add(a.lease), now.Add(a.lease+a.ttl)).
			Scan(&reserved, &state, &fingerprint, &existingToken, &lockedUntil, &expiresAt, &status, &headerJSON, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // the conflicting row committed after this statement's snapshot
		}
		if err != nil {
			return reservation{}, fmt.Errorf("idemhttp: reserve: %w", translate(err))
		}
		if reserved {
			return reservation{reserved: true, token: token, leaseStart: start}, nil
		}
		expired := expiresAt != nil && !expiresAt.After(now)
		leaseEnded := a.takeover && State(state) == StateProcessing && lockedUntil != nil &&
			!lockedUntil.After(now) && bytes.Equal(fingerprint, a.fingerprint)
		if expired || leaseEnded {
			stmt, what := s.takeoverSQL, "expired record"
			if !expired {
				stmt, what = s.leaseSQL, "record whose lease ended"
			}
			tag, err := db.Exec(ctx, stmt, a.account, a.operation, a.key, a.fingerprint, token,
				now, now.Add(a.lease), now.Add(a.lease+a.ttl), existingToken)
			if err != nil {
				return reservation{}, fmt.Errorf("idemhttp: reserve: take over %s: %w", what, translate(err))
			}
			if tag.RowsAffected() != 1 {
				continue // changed meanwhile: read it again
			}
			taken := reservation{reserved: true, token: token, leaseStart: start}
			if !expired {
				taken.tookOver, taken.prevToken, taken.prevLockedUntil = true, existingToken, *lockedUntil
			}
			return taken, nil
		}
		res.state = State(state)
		res.token = existingToken
		res.fingerprint = fingerprint
		if lockedUntil != nil {
			res.lockedUntil = *lockedUntil
		}
		if status != nil {
			res.response.Status = *status
			res.response.Body = body
			if len(headerJSON) > 0 {
				if err := json.Unmarshal(headerJSON, &res.response.Header); err != nil {
					return reservation{}, fmt.Errorf("idemhttp: reserve: stored headers: %w", err)
				}
			}
		}
		return res, nil
	}
	return reservation{}, errReserveRace
}

// complete stores resp and marks the record COMPLETED, provided it is still
// held with token. ok is false when it is not (the lease was taken over).
func (s *Store) complete(ctx context.Context, db DBTX, a reserveArgs, token int64, resp Response) (ok bool, err error) {
	headerJSON, err := json.Marshal(resp.Header)
	if err != nil {
		return false, fmt.Errorf("idemhttp: complete: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	now := s.now()
	tag, err := db.Exec(ctx, s.completeSQL, a.account, a.operation, a.key, token,
		resp.Status, headerJSON, body, now, now.Add(a.ttl))
	if err != nil {
		return false, fmt.Errorf("idemhttp: complete: %w", translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// completeAndCommit stores resp, marks the record COMPLETED and commits tx,
// in one round trip, provided the record is still held with token. ok is
// false when it is not (the lease was taken over, or the reconciler settled
// the record): then tx was rolled back. On any other error the caller rolls
// tx back.
func (s *Store) completeAndCommit(ctx context.Context, tx pgx.Tx, a reserveArgs, token int64, resp Response) (ok bool, err error) {
	headerJSON, err := json.Marshal(resp.Header)
	if err != nil {
		return false, fmt.Errorf("idemhttp: complete: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	now := s.now()
	b := &pgx.Batch{}
	b.Queue(s.completeTxSQL, a.account, a.operation, a.key, token, resp.Status, headerJSON, body, now, now.Add(a.ttl))
	b.Queue("COMMIT")
	switch err := s.sendCompletion(ctx, tx, b); {
	case errors.Is(err, ErrLeaseLost):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// holdSQL takes the advisory lock of a reservation's token for the rest of
// the transaction: a request waiting for the holder (Config.Wait) waits on
// it, and wakes when the holder's transaction ends. The one-bigint form of
// the advisory locks, on a random 63-bit token, meets an application's own
// advisory lock keys practically never; when it does, a waiter waits longer.
const holdSQL = `SELECT pg_catalog.pg_advisory_xact_lock($1)`

// hold takes the advisory lock of token in tx.
func (s *Store) hold(ctx context.Context, tx pgx.Tx, token int64) error {
	if _, err := tx.Exec(ctx, holdSQL, token); err != nil {
		return fmt.Errorf("idemhttp: lock reservation: %w", err)
	}
	return nil
}

// awaitLockOn waits, on conn, until it can take the advisory lock key
// (shared, or exclusive), at most timeout, in a transaction of its own that
// ends at once. It reports false when the timeout passed first. A
// reservation's token is waited on shared, so that its waiters do not queue
// behind each other; a fingerprint's lock exclusively, as the holder holds
// it shared.
func (s *Store) awaitLockOn(ctx context.Context, conn *pgx.Conn, key int64, shared bool, timeout time.Duration) (bool, error) {
	ms := max(1, (timeout+time.Millisecond-1)/time.Millisecond) // lock_timeout 0 means none
	lockSQL := `SELECT pg_catalog.pg_advisory_xact_lock($1)`
	if shared {
		lockSQL = `SELECT pg_catalog.pg_advisory_xact_lock_shared($1)`
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', $1, true)`, strconv.FormatInt(int64(ms), 10))
	b.Queue(lockSQL, key)
	b.Queue("COMMIT")
	err := conn.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: lock_timeout
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idemhttp: wait for the request in flight: %w", err)
	}
	return true, nil
}

// sendBatch runs b on db, which must be able to send batches.
func sendBatch(ctx context.Context, db DBTX, b *pgx.Batch) error {
	bs, ok := db.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	})
	if !ok {
		return fmt.Errorf("idemhttp: %T cannot send batches", db)
	}
	return bs.SendBatch(ctx, b).Close()
}

// release deletes the record if it is still PROCESSING with token.
func (s *Store) release(ctx context.Context, db DBTX, a reserveArgs, token int64) error {
	if _, err := db.Exec(ctx, s.releaseSQL, a.account, a.operation, a.key, token); err != nil {
		return fmt.Errorf("idemhttp: release: %w", translate(err))
	}
	return nil
}

// newToken returns a random positive token. Tokens need to be unique per
// reservation of a key, not secret: 63 random bits make a repeat
// practically impossible.
func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}
