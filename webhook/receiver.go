package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/retry"
)

// TTLDefault is the receiver's default of idemhttp.Config.TTL, how long a
// delivery's record is kept: longer than the retry horizon of every
// provider this package knows (Stripe: 3 days; the Standard Webhooks
// schedule: a little over 3 days; GitHub's redeliveries: 3 days; Shopify:
// 4 hours).
const TTLDefault = 7 * 24 * time.Hour

// MaxProviderLength is the longest Config.Provider, in bytes.
const MaxProviderLength = 64

// The codes of the receiver's own error responses, written with
// idemhttp.Config.WriteError (by default {"error":{"code":…,"message":…}}).
const (
	// CodeSignatureInvalid (401): the delivery's signature is missing,
	// malformed or matches no secret (ErrSignature).
	CodeSignatureInvalid = "signature_invalid"
	// CodeTimestampInvalid (401): the signature matches, but the delivery
	// was signed further from now than the tolerance (ErrTimestamp).
	CodeTimestampInvalid = "timestamp_invalid"
	// CodeHandlerFailed (500): the handler returned an error; nothing it
	// wrote was committed and the provider sends the delivery again.
	CodeHandlerFailed = "handler_failed"
)

// maxStoredError is the longest error text stored with an acknowledged
// permanent failure, in bytes.
const maxStoredError = 1024

// Delivery is one verified delivery, as the handler gets it.
type Delivery struct {
	// Provider is Config.Provider.
	Provider string
	// ID is the provider's event ID: the idempotency key.
	ID string
	// Body is the raw body whose signature was verified. The handler must
	// not modify it.
	Body []byte
	// Request is the HTTP request, for its other headers (GitHub's
	// X-GitHub-Event, Shopify's X-Shopify-Topic) and its path values.
	Request *http.Request
}

// Handler applies a delivery's effects. It writes them in tx, the
// transaction that also records the delivery's ID and its answer, and
// commits them together (tx is nil when the records are not in
// PostgreSQL: NewWithBackend, or idemhttp.Config.NoTx). A nil error
// answers 200; an error answers 500 and rolls everything back, so that the
// provider sends the delivery again, unless Config.AcknowledgePermanent is
// set and the error is permanent (retry.Permanent). The middleware commits
// or rolls back tx: its Commit and Rollback return idemhttp.ErrTxManaged.
// Keep it short (the providers wait 5 to 30 seconds for an answer, then
// count a failure): send slow work on through the outbox (outbox.Store's
// EnqueueTx in tx).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, d *Delivery) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d *Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, d *Delivery) error { return f(ctx, tx, d) }

// Config is a receiver's policy: one per provider and endpoint.
type Config struct {
	// Provider names the sender ("stripe", "github", "clerk"): the scope of
	// its event IDs (the idempotency account is "webhook:" + Provider, so
	// that two providers' IDs never meet; the route is the operation) and
	// the provider of the receiver's logs and Events. 1 to
	// MaxProviderLength bytes of lower-case letters, digits, '-', '_' and
	// '.'. Required.
	Provider string

	// Verify checks each delivery before anything is reserved: a Scheme of
	// this package (StandardWebhooks, GitHub, Stripe, Shopify) or a
	// Verifier of your own. A delivery it refuses gets 401 and leaves no
	// record. Required.
	Verify Verifier

	// AcknowledgePermanent answers a handler error that retry.IsPermanent
	// reports with 200 and stores it as the delivery's answer
	// ({"status":"failed","error":…}, the error's text cut to 1 KiB, sent to
	// the provider too): the handler's writes are undone (it runs in a
	// savepoint; without a transaction, undoing them is the handler's job),
	// the delivery counts as done, the provider stops sending it, and its
	// duplicates get that answer. It is logged at ERROR and
	// reported as OutcomeFailed: that log and metric are then the only
	// trace of the failure, so watch them. Defaults to false: a permanent
	// error answers 500 like any other, and the provider retries it until
	// its horizon (Stripe: 3 days, then the endpoint may be disabled), which
	// keeps the failure visible in the provider's dashboard and lets a fix
	// deployed meanwhile apply the event.
	AcknowledgePermanent bool

	// Observe, when set, is called once per delivery after its answer, with
	// what the receiver did (Event) and the request's context (see the
	// module github.com/idemkit/idemkit/idemotel for metrics). It must not
	// block.
	Observe func(ctx context.Context, e Event)

	// HTTP configures the idempotency middleware underneath (package
	// idemhttp), whose contract the receiver keeps: FingerprintKeys is
	// required; Store, Lease, Wait, MaxRequestBytes (a longer body gets 413
	// and leaves no record), Logger, WriteError and Observe keep their
	// meaning. New sets Account from Provider and refuses it set, as it
	// refuses Optional (every delivery must name its event) and Retryable
	// (the receiver decides what is retried). Key defaults to where the
	// Scheme's deliveries name their event (required with a Verifier of your
	// own); Intent to the Scheme's, else idemhttp.IntentDefault; TTL to
	// TTLDefault (7 days): keep it longer than the provider's retry horizon,
	// or a delivery retried after it runs again.
	HTTP idemhttp.Config
}

// Outcome is what the receiver did with a delivery, for Config.Observe.
type Outcome string

// Outcomes of a delivery.
const (
	// OutcomeProcessed: the handler ran; its effects and the 200 answer
	// committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: the event was processed before; its stored answer
	// was sent (Idempotent-Replayed: true) and nothing ran.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeFailed: the handler failed for good and, with
	// AcknowledgePermanent, the failure was stored as a 200 answer.
	OutcomeFailed Outcome = "failed"
	// OutcomeRetry: nothing was committed (the handler failed or panicked,
	// its hold on the key ended, or a reconciler settled the key) and the
	// answer (5xx or 409) makes the provider send the delivery again.
	OutcomeRetry Outcome = "retry"
	// OutcomeInFlight: 409, a delivery with the same event ID is being
	// processed; the provider sends it again later and gets the answer.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeKeyReused: 422, the event ID came before with another body;
	// nothing ran.
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeBadSignature: 401, the signature is missing, malformed or
	// matches no secret.
	OutcomeBadSignature Outcome = "bad_signature"
	// OutcomeBadTimestamp: 401, the signature matches but the delivery was
	// signed outside the tolerance: a replay, or a clock that is off.
	OutcomeBadTimestamp Outcome = "bad_timestamp"
	// OutcomeInvalid: 400 or 413, refused before anything ran (a body too
	// long, no event ID, a body that is not JSON).
	OutcomeInvalid Outcome = "invalid"
	// OutcomeUnavailable: 503, the record store could not be reached.
	OutcomeUnavailable Outcome = "unavailable"
)

// Event is one delivery the receiver answered, for Config.Observe.
type Event struct {
	// Provider is Config.Provider.
	Provider string
	// ID is the event ID, empty when the delivery was refused before it
	// was read (an unverified delivery, a missing ID).
	ID      string
	Outcome Outcome
	// Status is the response's status code.
	Status int
	// Err is the verification error (OutcomeBadSignature,
	// OutcomeBadTimestamp) or the handler's error (OutcomeFailed, and
	// OutcomeRetry when the handler returned one).
	Err error
	// Duration is from the delivery's arrival to its answer.
	Duration time.Duration
}

// Receiver receives one provider's deliveries on one endpoint: it verifies
// each, reserves its event ID and runs the handler once per event. It is
// safe for concurrent use.
type Receiver struct {
	mw         *idemhttp.Middleware
	provider   string
	verify     Verifier
	ack        bool
	observe    func(ctx context.Context, e Event)
	maxBody    int64
	log        *slog.Logger
	writeError func(w http.ResponseWriter, r *http.Request, e *idemhttp.Error)
}

// New returns a Receiver whose records live in PostgreSQL, reached through
// pool: each handler runs in the transaction that records its delivery
// (unless cfg.HTTP.NoTx). It validates cfg (the error wraps
// ErrInvalidConfig or idemhttp.ErrInvalidConfig) and does not touch the
// database.
func New(pool *pgxpool.Pool, cfg *Config) (*Receiver, error) {
	rc, hc, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	if rc.mw, err = idemhttp.New(pool, hc); err != nil {
		return nil, err
	}
	return rc, nil
}

// NewWithBackend returns a Receiver whose records live in b, for example
// the Redis store of module github.com/idemkit/idemkit/idemredis: handlers
// then get a nil transaction and the records are written after they
// return, with what that store's documentation says it cannot promise.
func NewWithBackend(b idemhttp.Backend, cfg *Config) (*Receiver, error) {
	rc, hc, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	if rc.mw, err = idemhttp.NewWithBackend(b, hc); err != nil {
		return nil, err
	}
	return rc, nil
}

// prepare validates cfg and returns the receiver (without its middleware)
// and the middleware's configuration.
func prepare(cfg *Config) (*Receiver, *idemhttp.Config, error) {
	if cfg == nil {
		return nil, nil, fmt.Errorf("%w: nil Config (Provider and Verify are required)", ErrInvalidConfig)
	}
	if err := validProvider(cfg.Provider); err != nil {
		return nil, nil, fmt.Errorf("%w: Provider: %w", ErrInvalidConfig, err)
	}
	if cfg.Verify == nil {
		return nil, nil, fmt.Errorf("%w: Verify is required: a Scheme (StandardWebhooks, GitHub, Stripe, Shopify) or a Verifier", ErrInvalidConfig)
	}
	hc := cfg.HTTP
	switch {
	case hc.Account != nil:
		return nil, nil, fmt.Errorf("%w: HTTP.Account is set: the receiver scopes event IDs by Provider", ErrInvalidConfig)
	case hc.Optional:
		return nil, nil, fmt.Errorf("%w: HTTP.Optional is set: every delivery must name its event", ErrInvalidConfig)
	case hc.Retryable != nil:
		return nil, nil, fmt.Errorf("%w: HTTP.Retryable is set: the receiver decides which answers are retried", ErrInvalidConfig)
	}
	scheme, _ := cfg.Verify.(*Scheme)
	if hc.Key == nil {
		if scheme == nil {
			return nil, nil, fmt.Errorf("%w: HTTP.Key is required with a Verifier that is not a Scheme of this package", ErrInvalidConfig)
		}
		hc.Key = scheme.key
	}
	if hc.Intent == nil && scheme != nil {
		hc.Intent = scheme.intent // nil: idemhttp's default
	}
	if hc.TTL == 0 {
		hc.TTL = TTLDefault
	}
	account := "webhook:" + cfg.Provider
	hc.Account = func(*http.Request) (string, error) { return account, nil }
	key := hc.Key
	hc.Key = func(r *http.Request, body []byte) (string, error) {
		k, err := key(r, body)
		if st := stateOf(r.Context()); st != nil && err == nil {
			st.id = k
		}
		return k, err
	}
	observe := hc.Observe
	hc.Observe = func(ctx context.Context, e idemhttp.Event) {
		if st := stateOf(ctx); st != nil {
			st.http, st.observed = e, true
		}
		if observe != nil {
			observe(ctx, e)
		}
	}
	if err := hc.Validate(); err != nil {
		return nil, nil, err
	}
	rc := &Receiver{
		provider:   cfg.Provider,
		verify:     cfg.Verify,
		ack:        cfg.AcknowledgePermanent,
		observe:    cfg.Observe,
		maxBody:    hc.MaxRequestBytes,
		log:        hc.Logger,
		writeError: hc.WriteError,
	}
	if rc.maxBody == 0 {
		rc.maxBody = idemhttp.MaxRequestBytesDefault
	}
	if rc.log == nil {
		rc.log = slog.Default()
	}
	if rc.writeError == nil {
		rc.writeError = idemhttp.WriteErrorJSON
	}
	rc.log = rc.log.With(slog.String("provider", cfg.Provider))
	return rc, &hc, nil
}

func validProvider(p string) error {
	if p == "" || len(p) > MaxProviderLength {
		return fmt.Errorf("%q: want 1 to %d bytes", p, MaxProviderLength)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%q: only lower-case letters, digits, '-', '_' and '.'", p)
		}
	}
	return nil
}

// state is what the receiver learns of one delivery along its way.
type state struct {
	id       string
	body     []byte
	http     idemhttp.Event
	observed bool
	err      error // the handler's
	failed   bool  // acknowledged as a permanent failure
}

type stateKey struct{}

func stateOf(ctx context.Context) *state {
	st, _ := ctx.Value(stateKey{}).(*state)
	return st
}

// Handler returns the http.Handler of the endpoint: register it for the
// route the provider posts to ("POST /webhooks/stripe"; the route is the
// operation of the scope). Each delivery is read (up to
// idemhttp.Config.MaxRequestBytes, else 413), verified (else 401), its
// event ID reserved, and h run once per event ID and body.
func (rc *Receiver) Handler(h Handler) http.Handler {
	inner := rc.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rc.run(w, r, h) }))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rc.serve(w, r, inner) })
}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request, inner http.Handler) {
	start := time.Now()
	st := &state{}
	ctx := context.WithValue(r.Context(), stateKey{}, st)
	r = r.WithContext(ctx)
	ev := Event{Provider: rc.provider}
	defer func() {
		ev.Duration = time.Since(start)
		if rc.observe != nil {
			rc.observe(ctx, ev)
		}
	}()

	body, err := readBody(r, rc.maxBody)
	if err != nil {
		ev.Outcome = OutcomeInvalid
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			ev.Status = http.StatusRequestEntityTooLarge
			rc.log.WarnContext(ctx, "webhook: delivery refused: body too long", slog.Int64("max_request_bytes", rc.maxBody))
			rc.writeError(w, r, &idemhttp.Error{Status: ev.Status, Code: idemhttp.CodeRequestTooLarge,
				Message: fmt.Sprintf("the request body is longer than %d bytes", rc.maxBody)})
			return
		}
		ev.Status = http.StatusBadRequest
		rc.writeError(w, r, &idemhttp.Error{Status: ev.Status, Code: idemhttp.CodeInvalidRequest,
			Message: "the request body could not be read"})
		return
	}
	if err := rc.verify.Verify(r, body); err != nil {
		ev.Status, ev.Err = http.StatusUnauthorized, err
		e := &idemhttp.Error{Status: ev.Status, Code: CodeSignatureInvalid, Message: "the delivery's signature was not verified"}
		ev.Outcome = OutcomeBadSignature
		if errors.Is(err, ErrTimestamp) {
			e.Code, e.Message = CodeTimestampInvalid, "the delivery was signed outside the accepted time window"
			ev.Outcome = OutcomeBadTimestamp
		}
		rc.log.WarnContext(ctx, "webhook: delivery refused: not verified", slog.String("outcome", string(ev.Outcome)),
			slog.Any("err", err))
		rc.writeError(w, r, e)
		return
	}
	st.body = body
	r.Body = io.NopCloser(bytes.NewReader(body))
	inner.ServeHTTP(w, r)

	ev.ID, ev.Status = st.id, st.http.Status
	ev.Outcome = outcomeOf(st)
	if st.failed || ev.Outcome == OutcomeRetry {
		ev.Err = st.err
	}
	log := rc.log.With(slog.String("event_id", ev.ID))
	switch ev.Outcome {
	case OutcomeProcessed:
		log.DebugContext(ctx, "webhook: delivery processed")
	case OutcomeDuplicate:
		log.InfoContext(ctx, "webhook: duplicate delivery answered from its record")
	case OutcomeInFlight:
		log.InfoContext(ctx, "webhook: delivery in flight elsewhere; the provider will send it again")
	case OutcomeKeyReused:
		log.ErrorContext(ctx, "webhook: event ID reused with another body; nothing ran (422)")
	case OutcomeInvalid:
		log.WarnContext(ctx, "webhook: delivery refused", slog.Int("status", ev.Status))
	}
}

// outcomeOf maps what the middleware did to the delivery's outcome.
func outcomeOf(st *state) Outcome {
	if !st.observed {
		return OutcomeInvalid
	}
	switch st.http.Outcome {
	case idemhttp.OutcomeFirst:
		if st.failed {
			return OutcomeFailed
		}
		return OutcomeProcessed
	case idemhttp.OutcomeReplay:
		return OutcomeDuplicate
	case idemhttp.OutcomeInFlight:
		return OutcomeInFlight
	case idemhttp.OutcomeMismatch:
		return OutcomeKeyReused
	case idemhttp.OutcomeReleased, idemhttp.OutcomeLeaseLost, idemhttp.OutcomeSettled:
		return OutcomeRetry
	case idemhttp.OutcomeUnavailable:
		return OutcomeUnavailable
	default:
		return OutcomeInvalid
	}
}

func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	defer r.Body.Close()
	return io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
}

// run is the handler behind the middleware: it holds the delivery's key.
func (rc *Receiver) run(w http.ResponseWriter, r *http.Request, h Handler) {
	ctx := r.Context()
	st := stateOf(ctx)
	tx, _ := idemhttp.Tx(ctx)
	d := &Delivery{Provider: rc.provider, ID: st.id, Body: st.body, Request: r}
	var err error
	if rc.ack && tx != nil {
		err = inSavepoint(ctx, tx, func(sp pgx.Tx) error { return h.Handle(ctx, sp, d) })
	} else {
		err = h.Handle(ctx, tx, d)
	}
	log := rc.log.With(slog.String("event_id", st.id))
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{"status": "processed"})
	case rc.ack && retry.IsPermanent(err):
		st.err, st.failed = err, true
		log.ErrorContext(ctx, "webhook: handler failed for good; acknowledged with the error stored", slog.Any("err", err))
		writeJSON(w, http.StatusOK, map[string]string{"status": "failed", "error": cut(err.Error(), maxStoredError)})
	default:
		st.err = err
		log.ErrorContext(ctx, "webhook: handler failed; nothing committed, the provider will send the delivery again",
			slog.Bool("permanent", retry.IsPermanent(err)), slog.Any("err", err))
		rc.writeError(w, r, &idemhttp.Error{Status: http.StatusInternalServerError, Code: CodeHandlerFailed,
			Message: "the delivery was not processed; it will be when it is sent again"})
	}
}

// inSavepoint runs f in a savepoint of tx, rolled back when f fails.
func inSavepoint(ctx context.Context, tx pgx.Tx, f func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("webhook: savepoint: %w", err)
	}
	if err := f(managedTx{sp}); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return fmt.Errorf("webhook: roll back to the savepoint: %w (after %w)", rerr, err)
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("webhook: release the savepoint: %w", err)
	}
	return nil
}

// managedTx is the handler's view of the savepoint it runs in.
type managedTx struct{ pgx.Tx }

func (managedTx) Commit(context.Context) error   { return idemhttp.ErrTxManaged }
func (managedTx) Rollback(context.Context) error { return idemhttp.ErrTxManaged }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// cut returns s cut to at most n bytes, at a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
