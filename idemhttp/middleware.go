package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
)

// Middleware makes handlers idempotent per Idempotency-Key. It is safe for
// concurrent use.
type Middleware struct {
	backend Backend
	store   *Store // nil unless the records are in PostgreSQL (New)
	cfg     Config
	waiters waiters
}

// waiters counts the requests that may wait (Config.Wait), in all and per
// scope, while they are in Backend.Reserve.
type waiters struct {
	mu    sync.Mutex
	total int
	byKey map[string]int
}

// enter takes a place for a request of scope k, unless the bounds are
// reached; leave gives it back.
func (w *waiters) enter(k string, maxTotal, maxKey int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total >= maxTotal || w.byKey[k] >= maxKey {
		return false
	}
	if w.byKey == nil {
		w.byKey = map[string]int{}
	}
	w.total++
	w.byKey[k]++
	return true
}

func (w *waiters) leave(k string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if w.byKey[k]--; w.byKey[k] == 0 {
		delete(w.byKey, k)
	}
}

// reserve calls the backend's Reserve, without waiting when the bounds on
// waiting requests are reached.
func (m *Middleware) reserve(ctx context.Context, req *Request) (Reservation, error) {
	if req.Wait > 0 {
		var b bytes.Buffer
		writeField(&b, []byte(req.Account))
		writeField(&b, []byte(req.Operation))
		writeField(&b, []byte(req.Key))
		k := b.String()
		if m.waiters.enter(k, m.cfg.MaxWaiters, m.cfg.MaxKeyWaiters) {
			defer m.waiters.leave(k)
		} else {
			req.Wait = 0
		}
	}
	return m.backend.Reserve(ctx, req)
}

// New returns a Middleware whose records live in PostgreSQL, in cfg.Store,
// reached through pool: handlers run in a transaction that commits with
// their record (unless cfg.NoTx). It validates cfg (the error wraps
// ErrInvalidConfig) and does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Middleware, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	c, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	if c.Store == nil {
		if c.Store, err = NewStore(nil); err != nil {
			return nil, err
		}
	}
	return &Middleware{backend: &pgBackend{pool: pool, store: c.Store, log: c.Logger}, store: c.Store, cfg: c}, nil
}

// NewWithBackend returns a Middleware whose records live in b, for example
// the Redis store of module github.com/idemkit/idemkit/idemredis. Handlers run
// in a transaction only if b's holds have one; cfg.Store must be nil. It
// validates cfg (the error wraps ErrInvalidConfig) and does not touch b.
func NewWithBackend(b Backend, cfg *Config) (*Middleware, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidConfig)
	}
	c, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	if c.Store != nil {
		return nil, fmt.Errorf("%w: Store is set, but the records live in the backend", ErrInvalidConfig)
	}
	m := &Middleware{backend: b, cfg: c}
	if pb, ok := b.(*pgBackend); ok {
		m.store, m.cfg.Store = pb.store, pb.store
	}
	return m, nil
}

// Validate reports what New would refuse in c: a missing or contradictory
// field, a value out of range. The error wraps ErrInvalidConfig.
func (c *Config) Validate() error {
	_, err := validate(c)
	return err
}

func validate(cfg *Config) (Config, error) {
	if cfg == nil {
		return Config{}, fmt.Errorf("%w: nil Config (Account is required)", ErrInvalidConfig)
	}
	return cfg.withDefaults()
}

// Store returns the PostgreSQL store the middleware keeps its records in,
// or nil when they live in another Backend (NewWithBackend).
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
	var (
		key      string
		body     []byte
		bodyRead bool
		err      error
	)
	if m.cfg.Key == nil {
		key, err = ParseKey(r.Header.Values(HeaderKey))
	} else {
		if body, err = readBody(r, m.cfg.MaxRequestBytes); err != nil {
			m.failBody(w, r, err)
			return
		}
		bodyRead = true
		if key, err = m.cfg.Key(r, body); err == nil {
			if cerr := checkKey(key); cerr != nil {
				err = &keyError{kind: ErrKeyInvalid, msg: "idemhttp: invalid idempotency key: " + cerr.Error()}
			}
		}
	}
	switch {
	case errors.Is(err, ErrKeyMissing) && m.cfg.Optional:
		if o := observed(r); o != nil {
			o.noKey = true
		}
		if bodyRead {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		next.ServeHTTP(w, r)
		return
	case errors.Is(err, ErrKeyMissing):
		msg := "this endpoint requires an Idempotency-Key header"
		if m.cfg.Key != nil {
			msg = err.Error()
		}
		m.fail(w, r, http.StatusBadRequest, CodeKeyMissing, msg)
		return
	case errors.Is(err, ErrKeyInvalid):
		m.fail(w, r, http.StatusBadRequest, CodeKeyInvalid, err.Error())
		return
	case errors.Is(err, ErrInvalidJSON):
		m.fail(w, r, http.StatusBadRequest, CodeInvalidJSON, err.Error())
		return
	case err != nil:
		m.fail(w, r, http.StatusBadRequest, CodeInvalidRequest, err.Error())
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
	req := &Request{Account: account, Operation: operation, Key: key, Lease: m.cfg.Lease, TTL: m.cfg.TTL,
		Wait: m.cfg.Wait, NoTx: m.cfg.NoTx, NoTakeover: m.cfg.NoTx || m.cfg.NoLeaseTakeover}
	log := m.cfg.Logger.With(slog.String("idempotency_key", key), slog.String("account", account),
		slog.String("operation", operation))
	noteScope(r, account, operation, key)

	if !bodyRead {
		if body, err = readBody(r, m.cfg.MaxRequestBytes); err != nil {
			m.failBody(w, r, err)
			return
		}
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
	req.Fingerprint, req.OlderFingerprints = fingerprints(m.cfg.FingerprintKeys, operation, r, intent)

	res, err := m.reserve(r.Context(), req)
	if err != nil {
		log.ErrorContext(r.Context(), "idemhttp: reserve failed", slog.Any("err", err))
		m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
		return
	}
	if res.Hold == nil {
		m.answerExisting(w, r, req, res)
		return
	}
	if res.TakenOver {
		log.WarnContext(r.Context(), "idemhttp: lease ended; record taken over, its holder fenced out",
			slog.Int64("previous_token", res.PreviousToken))
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m.execute(w, r, next, res.Hold, log)
}

// failBody answers a request whose body could not be read: 413 past
// MaxRequestBytes, else 400.
func (m *Middleware) failBody(w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		m.fail(w, r, http.StatusRequestEntityTooLarge, CodeRequestTooLarge,
			fmt.Sprintf("the request body is longer than %d bytes", m.cfg.MaxRequestBytes))
		return
	}
	m.fail(w, r, http.StatusBadRequest, CodeInvalidRequest, "reading the request body: "+err.Error())
}

func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	defer r.Body.Close()
	return io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
}

// answerExisting answers a request whose key has a live record it does not hold.
func (m *Middleware) answerExisting(w http.ResponseWriter, r *http.Request, req *Request, res Reservation) {
	if res.Mismatch || (res.Fingerprint != nil && !req.SameRequest(res.Fingerprint)) {
		m.fail(w, r, http.StatusUnprocessableEntity, CodeKeyReused,
			"this Idempotency-Key was used with a different request; use a new key for a new request")
		return
	}
	switch res.State {
	case StateCompleted:
		// The stored headers go through the allow-list again: a record
		// stored under another allow-list (or written by anything else)
		// replays only what this middleware would store.
		h := w.Header()
		for k, v := range storedHeader(canonicalHeader(res.Response.Header), m.cfg.StoredHeaders) {
			h[k] = v
		}
		h.Set(HeaderReplayed, "true")
		w.WriteHeader(res.Response.Status)
		_, _ = w.Write(res.Response.Body)
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

// execute runs the handler for a key held with h and settles the record.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, h Hold, log *slog.Logger) {
	settled := false
	defer func() {
		// A handler that ended its goroutine (runtime.Goexit: t.FailNow in
		// a test server) skipped the rest: the key is released.
		if !settled {
			_ = h.Release(r.Context())
		}
	}()
	release := func(why string) {
		settled = true
		if err := h.Release(r.Context()); err != nil {
			// The record stays PROCESSING until its lease ends, then the
			// reconciler sees it.
			log.ErrorContext(r.Context(), "idemhttp: release failed", slog.String("reason", why), slog.Any("err", err))
		}
	}
	rec := &recorder{header: http.Header{}, max: m.cfg.MaxResponseBytes}
	var (
		perr  *idemkit.PanicError
		hadTx bool
	)
	h.Run(r.Context(), func(ctx context.Context, tx pgx.Tx) {
		if tx != nil {
			hadTx = true
			ctx = context.WithValue(ctx, txKey{}, pgx.Tx(managedTx{tx}))
		}
		perr = runHandler(next, rec, r.WithContext(ctx))
	})
	switch {
	case perr != nil:
		if errors.Is(perr, http.ErrAbortHandler) {
			release("handler aborted")
			panic(http.ErrAbortHandler) // net/http's contract: abort the response silently
		}
		log.ErrorContext(r.Context(), "idemhttp: handler panicked; key released",
			slog.Any("panic", perr.Value), slog.String("stack", string(perr.Stack)))
		release("handler panicked")
		m.fail(w, r, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	case rec.badStatus != 0:
		log.ErrorContext(r.Context(), "idemhttp: handler wrote an invalid status; key released",
			slog.Int("status", rec.badStatus))
		release("invalid status")
		m.fail(w, r, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	case rec.overflow:
		log.ErrorContext(r.Context(), "idemhttp: response too large to store; key released",
			slog.Int("max_response_bytes", m.cfg.MaxResponseBytes))
		release("response too large")
		m.fail(w, r, http.StatusInternalServerError, CodeResponseTooLarge,
			fmt.Sprintf("the response is longer than %d bytes and cannot be stored; nothing was committed", m.cfg.MaxResponseBytes))
		return
	}
	status := rec.statusCode()
	if m.cfg.Retryable(status) {
		release(fmt.Sprintf("retryable status %d", status))
		rec.writeTo(w)
		return
	}

	resp := Response{Status: status, Header: storedHeader(rec.header, m.cfg.StoredHeaders), Body: rec.body.Bytes()}
	settled = true
	err := h.Complete(r.Context(), resp)
	if !hadTx {
		switch {
		case errors.Is(err, ErrLeaseLost):
			log.WarnContext(r.Context(), "idemhttp: lease lost before completion; the response was not stored")
		case err != nil:
			log.ErrorContext(r.Context(), "idemhttp: complete failed; the record stays PROCESSING for the reconciler",
				slog.Any("err", err))
		}
		// The effects happened outside any transaction of ours: the client
		// gets them.
		rec.writeTo(w)
		return
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		log.WarnContext(r.Context(), "idemhttp: lease lost before completion; transaction rolled back")
		m.fail(w, r, http.StatusConflict, CodeLeaseLost,
			"this request's hold on the Idempotency-Key ended before it completed; nothing was committed; retry with the same key")
		return
	case err != nil:
		log.ErrorContext(r.Context(), "idemhttp: completing the transaction failed", slog.Any("err", err))
		m.fail(w, r, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable")
		return
	}
	rec.writeTo(w)
}

// runHandler calls next and returns the panic it recovered, if any.
func runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (perr *idemkit.PanicError) {
	defer func() {
		if p := recover(); p != nil {
			perr = idemkit.NewPanicError("idemhttp: handler", p)
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
