package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// finishTimeout bounds the statements that settle a request (complete,
// commit, release). They run detached from the request's context: a client
// that hung up must not leave its record half done.
const finishTimeout = 10 * time.Second

// Middleware makes handlers idempotent per Idempotency-Key. It is safe for
// concurrent use.
type Middleware struct {
	pool  *pgxpool.Pool
	store *Store
	cfg   Config
}

// New returns a Middleware whose records live in cfg.Store, reached through
// pool. It validates cfg (the error wraps ErrInvalidConfig) and does not
// touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Middleware, error) {
	if pool == nil {
		return nil, errors.New("idemhttp: nil pool")
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil Config (Account is required)", ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Middleware{pool: pool, store: c.Store, cfg: c}, nil
}

// Store returns the store the middleware keeps its records in.
func (m *Middleware) Store() *Store { return m.store }

// Handler returns next wrapped by the middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if m.cfg.Observe != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.observe(w, r, next) })
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

type txKey struct{}

// Tx returns the transaction the middleware runs the handler in, from the
// request's context. Write the business effects (and outbox messages) in
// it: they commit together with the record's COMPLETED state and stored
// response, or not at all. The middleware owns it: its Commit and Rollback
// return ErrTxManaged (use tx.Begin for a savepoint). ok is false outside
// the middleware and with Config.NoTx.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// managedTx is the handler's view of the middleware's transaction.
type managedTx struct{ pgx.Tx }

func (managedTx) Commit(context.Context) error   { return ErrTxManaged }
func (managedTx) Rollback(context.Context) error { return ErrTxManaged }

func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if o := observed(r); o != nil {
		o.code = code
	}
	e := &Error{Status: status, Code: code, Message: msg}
	switch code {
	case CodeInFlight, CodeLeaseLost, CodeStoreUnavailable:
		e.RetryAfter = m.cfg.RetryAfter
	}
	m.cfg.WriteError(w, r, e)
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := ParseKey(r.Header.Values(HeaderKey))
	switch {
	case errors.Is(err, ErrKeyMissing) && m.cfg.Optional:
		if o := observed(r); o != nil {
			o.noKey = true
		}
		next.ServeHTTP(w, r)
		return
	case errors.Is(err, ErrKeyMissing):
		m.fail(w, r, http.StatusBadRequest, CodeKeyMissing, "this endpoint requires an Idempotency-Key header")
		return
	case err != nil:
		m.fail(w, r, http.StatusBadRequest, CodeKeyInvalid, err.Error())
		return
	}
	account, err := m.cfg.Account(r)
	if err == nil {
		err = validateAccount(account)
	}
	if err != nil {
		m.fail(w, r, http.StatusUnauthorized, CodeUnauthorized, "the request's account could not be established")
		return
	}
	operation := m.cfg.Operation(r)
	if err := validateOperation(operation); err != nil {
		m.fail(w, r, http.StatusBadRequest, CodeOperationInvalid, err.Error())
		return
	}
	a := reserveArgs{account: account, operation: operation, key: key, lease: m.cfg.Lease, ttl: m.cfg.TTL,
		async: !m.cfg.NoTx, takeover: !m.cfg.NoTx && !m.cfg.NoLeaseTakeover}
	log := m.cfg.Logger.With(slog.String("idempotency_key", key), slog.String("account", account),
		slog.String("operation", a.operation))
	noteScope(r, account, operation, key)

	body, err := readBody(r, m.cfg.MaxRequestBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			m.fail(w, r, http.StatusRequestEntityTooLarge, CodeRequestTooLarge,
				fmt.Sprintf("the request body is longer than %d bytes", m.cfg.MaxRequestBytes))
			return
		}
		m.fail(w, r, http.StatusBadRequest, CodeInvalidRequest, "reading the request body: "+err.Error())
		return
	}
	intent, err := m.cfg.Intent(r, body)
	switch {
	case errors.Is(err, ErrInvalidJSON):
		m.fail(w, r, http.StatusBadRequest, CodeInvalidJSON, err.Error())
		return
	case err != nil:
		m.fail(w, r, http.StatusBadRequest, CodeInvalidRequest, err.Error())
		return
	}
	a.fingerprint = fingerprint(a.operation, intent)

	// One connection serves the request: the reservation, the wait for a
	// request in flight, the handler's transaction and its completion.
	conn, err := m.pool.Acquire(r.Context())
	if err != nil {
		log.ErrorContext(r.Context(), "idemhttp: acquire a connection failed", slog.Any("err", err))
		m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
		return
	}
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	res, err := m.reserveOrWait(r.Context(), conn, a)
	if err != nil {
		log.ErrorContext(r.Context(), "idemhttp: reserve failed", slog.Any("err", err))
		m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
		return
	}
	if !res.reserved {
		conn.Release()
		conn = nil
		m.answerExisting(w, r, a, res)
		return
	}
	if res.tookOver {
		log.WarnContext(r.Context(), "idemhttp: lease ended; record taken over, its holder fenced out",
			slog.Int64("previous_token", res.prevToken), slog.Time("lease_ended", res.prevLockedUntil))
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if m.cfg.NoTx {
		// The handler runs without a transaction: it holds no connection.
		conn.Release()
		conn = nil
	}
	m.execute(w, r, next, a, res, conn, log)
}

func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	defer r.Body.Close()
	return io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
}

// pollMax bounds the pause between two looks at a record whose holder's
// transaction ended without settling it (see reserveOrWait).
const pollMax = 50 * time.Millisecond

// reserveOrWait reserves the key, or returns the existing record. While
// that record is PROCESSING with the request's fingerprint and Config.Wait
// allows, it waits for the holder's transaction to end, on the advisory
// lock the holder takes on its token (Store.hold): PostgreSQL wakes the
// waiter when the holder commits or rolls back, or its connection ends. It
// then looks at the record again: completed (the replay), released (this
// request reserves the key and runs), taken over (it waits for the new
// holder). A record whose holder's lock was free and that did not move (the
// holder is in the instant between its reservation and its lock, or
// between its rollback and its release, or runs without a transaction:
// Config.NoTx) is looked at again after a short pause, doubling up to
// pollMax.
func (m *Middleware) reserveOrWait(ctx context.Context, db DBTX, a reserveArgs) (reservation, error) {
	deadline := time.Now().Add(m.cfg.Wait)
	pause := time.Millisecond
	var waited int64 // the token whose holder's lock this request got
	for {
		res, err := m.store.reserve(ctx, db, a)
		if err != nil || res.reserved || res.state != StateProcessing ||
			!bytes.Equal(res.fingerprint, a.fingerprint) || m.cfg.Wait <= 0 {
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
		ok, err := m.store.awaitHolder(ctx, db, res.token, left)
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

// answerExisting answers a request whose key has a live record it does not hold.
func (m *Middleware) answerExisting(w http.ResponseWriter, r *http.Request, a reserveArgs, res reservation) {
	if !bytes.Equal(res.fingerprint, a.fingerprint) {
		m.fail(w, r, http.StatusUnprocessableEntity, CodeKeyReused,
			"this Idempotency-Key was used with a different request; use a new key for a new request")
		return
	}
	switch res.state {
	case StateCompleted:
		h := w.Header()
		for k, v := range res.response.header {
			h[k] = v
		}
		h.Set(HeaderReplayed, "true")
		w.WriteHeader(res.response.status)
		_, _ = w.Write(res.response.body)
	case StateProcessing:
		m.fail(w, r, http.StatusConflict, CodeInFlight,
			"a request with this Idempotency-Key is being processed; retry later with the same key")
	case StateFailed:
		m.fail(w, r, http.StatusConflict, CodeOperationFailed,
			"the operation with this Idempotency-Key failed; use a new key to try again")
	default:
		m.fail(w, r, http.StatusConflict, CodeOutcomeUnknown,
			"the outcome of the operation with this Idempotency-Key is not known yet; do not repeat it with a new key before checking")
	}
}

// execute runs the handler for a reserved key and settles the record. In
// transaction mode conn is the connection the key was reserved on; with
// NoTx it is nil.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, a reserveArgs, res reservation,
	conn *pgxpool.Conn, log *slog.Logger) {
	token := res.token
	finish := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(r.Context()), finishTimeout)
	}
	release := func(why string) {
		ctx, cancel := finish()
		defer cancel()
		var db DBTX = m.pool
		if conn != nil && !conn.Conn().IsClosed() {
			db = conn // after the rollback: no second connection needed
		}
		if err := m.store.release(ctx, db, a, token); err != nil {
			// The record stays PROCESSING until its lease ends, then the
			// reconciler sees it.
			log.ErrorContext(ctx, "idemhttp: release failed", slog.String("reason", why), slog.Any("err", err))
		}
	}

	// The handler's context ends when the record's lease does (it started
	// no earlier than leaseStart): from then on another request may take
	// the record over.
	hctx, cancel := context.WithDeadline(r.Context(), res.leaseStart.Add(m.cfg.Lease))
	defer cancel()
	var tx pgx.Tx
	if conn != nil {
		var err error
		tx, err = conn.Begin(hctx)
		if err == nil && m.cfg.Wait > 0 {
			if err = m.store.hold(hctx, tx, token); err != nil {
				_ = tx.Rollback(context.WithoutCancel(hctx))
			}
		}
		if err != nil {
			log.ErrorContext(hctx, "idemhttp: begin failed", slog.Any("err", err))
			release("begin failed")
			m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
			return
		}
		hctx = context.WithValue(hctx, txKey{}, pgx.Tx(managedTx{tx}))
	}
	rollback := func() {
		if tx == nil {
			return
		}
		ctx, cancel := finish()
		defer cancel()
		_ = tx.Rollback(ctx)
	}

	rec := &recorder{header: http.Header{}, max: m.cfg.MaxResponseBytes}
	perr := runHandler(next, rec, r.WithContext(hctx))
	switch {
	case perr != nil:
		if errors.Is(perr, http.ErrAbortHandler) {
			rollback()
			release("handler aborted")
			panic(http.ErrAbortHandler) // net/http's contract: abort the response silently
		}
		log.ErrorContext(r.Context(), "idemhttp: handler panicked; key released",
			slog.Any("panic", perr.Value), slog.String("stack", string(perr.Stack)))
		rollback()
		release("handler panicked")
		m.fail(w, r, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	case rec.badStatus != 0:
		log.ErrorContext(r.Context(), "idemhttp: handler wrote an invalid status; key released",
			slog.Int("status", rec.badStatus))
		rollback()
		release("invalid status")
		m.fail(w, r, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	case rec.overflow:
		log.ErrorContext(r.Context(), "idemhttp: response too large to store; key released",
			slog.Int("max_response_bytes", m.cfg.MaxResponseBytes))
		rollback()
		release("response too large")
		m.fail(w, r, http.StatusInternalServerError, CodeResponseTooLarge,
			fmt.Sprintf("the response is longer than %d bytes and cannot be stored; nothing was committed", m.cfg.MaxResponseBytes))
		return
	}
	status := rec.statusCode()
	if m.cfg.Retryable(status) {
		rollback()
		release(fmt.Sprintf("retryable status %d", status))
		rec.writeTo(w)
		return
	}

	resp := storedResponse{status: status, header: storedHeader(rec.header, m.cfg.StoredHeaders), body: rec.body.Bytes()}
	ctx, cancelFinish := finish()
	defer cancelFinish()
	if tx == nil {
		ok, err := m.store.complete(ctx, m.pool, a, token, resp)
		switch {
		case err != nil:
			log.ErrorContext(ctx, "idemhttp: complete failed; the record stays PROCESSING for the reconciler",
				slog.Any("err", err))
		case !ok:
			log.WarnContext(ctx, "idemhttp: lease lost before completion; the response was not stored")
		}
		// The effects happened outside any transaction of ours: the client
		// gets them.
		rec.writeTo(w)
		return
	}
	ok, err := m.store.completeAndCommit(ctx, tx, a, token, resp)
	if err == nil && !ok {
		rollback()
		log.WarnContext(ctx, "idemhttp: lease lost before completion; transaction rolled back")
		m.fail(w, r, http.StatusConflict, CodeLeaseLost,
			"this request's hold on the Idempotency-Key ended before it completed; nothing was committed; retry with the same key")
		return
	}
	if err != nil {
		rollback()
		log.ErrorContext(ctx, "idemhttp: completing the transaction failed", slog.Any("err", err))
		release("commit failed") // a no-op if the commit did happen: the record is COMPLETED
		m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
		return
	}
	rec.writeTo(w)
}

// runHandler calls next and returns the panic it recovered, if any.
func runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (perr *PanicError) {
	defer func() {
		if p := recover(); p != nil {
			perr = newPanicError(p)
		}
	}()
	next.ServeHTTP(w, r)
	return nil
}

// recorder buffers a handler's response until the record is settled.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	badStatus   int
	body        bytes.Buffer
	max         int
	overflow    bool
}

func (rc *recorder) Header() http.Header { return rc.header }

func (rc *recorder) WriteHeader(code int) {
	if rc.wroteHeader {
		return
	}
	switch {
	case code < 100 || code > 999:
		rc.badStatus = code
		rc.wroteHeader = true
	case code < 200:
		// 1xx informational responses are not final: not buffered, not stored.
	default:
		rc.status = code
		rc.wroteHeader = true
	}
}

func (rc *recorder) Write(p []byte) (int, error) {
	if !rc.wroteHeader {
		rc.WriteHeader(http.StatusOK)
	}
	if rc.overflow || rc.body.Len()+len(p) > rc.max {
		rc.overflow = true
		return 0, ErrResponseTooLarge
	}
	return rc.body.Write(p)
}

func (rc *recorder) statusCode() int {
	if rc.status == 0 {
		return http.StatusOK
	}
	return rc.status
}

func (rc *recorder) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range rc.header {
		h[k] = v
	}
	w.WriteHeader(rc.statusCode())
	_, _ = w.Write(rc.body.Bytes())
}
