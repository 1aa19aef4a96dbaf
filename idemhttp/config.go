package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idemkit"
)

// Defaults of Config.
const (
	// LeaseDefault is how long a request holds its key before its record
	// counts as stuck.
	LeaseDefault = time.Minute
	// TTLDefault is how long a record lives after it was completed.
	TTLDefault = 24 * time.Hour
	// RetryAfterDefault is the Retry-After of 409 request_in_flight.
	RetryAfterDefault = time.Second
	// MaxRequestBytesDefault is the longest request body read (1 MiB).
	MaxRequestBytesDefault = 1 << 20
	// MaxResponseBytesDefault is the longest response body stored (1 MiB).
	MaxResponseBytesDefault = 1 << 20
	// MaxWaitersDefault is how many requests of a middleware may wait at
	// once (Config.Wait), on all keys.
	MaxWaitersDefault = 16
	// MaxKeyWaitersDefault is how many requests of a middleware may wait at
	// once on one key.
	MaxKeyWaitersDefault = 4
)

// StoredHeadersDefault is the response header allow-list used when
// Config.StoredHeaders is nil: headers describing the representation and the
// created resource, never credentials or cookies.
var StoredHeadersDefault = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified", "Link",
}

// deniedHeaders may never be stored, whatever the allow-list says.
var deniedHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "Set-Cookie2",
	"Proxy-Authenticate", "WWW-Authenticate",
}

// ErrInvalidConfig is wrapped by every error New returns for a bad Config.
var ErrInvalidConfig = fmt.Errorf("idemhttp: %w", idemkit.ErrInvalidConfig)

// IntentFunc returns the bytes that define a request's intent; the
// fingerprint is the hash of the operation, the request's method and path,
// and these bytes. body is the
// whole request body (also readable by the handler afterwards). An error
// matching ErrInvalidJSON answers 400 invalid_json, any other error 400
// invalid_request with the error's text as message.
type IntentFunc func(r *http.Request, body []byte) ([]byte, error)

// Config is the middleware's policy.
type Config struct {
	// Store is where records live. Defaults to NewStore(nil): the table
	// public.idempotency_records on the clock time.Now.
	Store *Store

	// FingerprintKeys are the server-side secrets a request's fingerprint is
	// keyed with (HMAC-SHA256), so that someone who reads the records (the
	// table, a backup, Redis) cannot test guesses of a request's content
	// against them: a card number whose first six and last four digits are
	// known, a PIN, a one-time code. The first keys every new fingerprint;
	// the others are older secrets, still accepted when a stored fingerprint
	// is compared. Each is at least MinFingerprintKeyLength (32) random
	// bytes, kept like any other secret, and the same on every process
	// sharing the records. To rotate: add the new secret at the end of the
	// list on every process, then move it to the front, then drop the old
	// one a TTL later (a process that does not know a record's secret
	// answers 422 to its retries). Required: without it, New fails.
	FingerprintKeys [][]byte

	// Account returns the principal a request acts for, typically from the
	// authentication your earlier middleware put in the context: the user
	// or API client, not only the tenant, since a replay skips the
	// handler's own permission checks. Keys are scoped by it: two accounts
	// never see each other's records. It must
	// return a non-empty string of at most MaxAccountLength bytes; an error
	// answers 401 unauthorized (authenticate before this middleware to
	// answer otherwise). Required.
	Account func(r *http.Request) (string, error)

	// Operation names what a request does, the second part of the scope. It
	// is also the operation label of the metrics (module
	// github.com/idemkit/idemkit/idemotel): return one of a bounded set of names,
	// never something taken from the request as the client wrote it. The
	// fingerprint covers the request's method and path whatever this
	// returns, so that one key on two resources of an operation
	// (/payments/1/refunds, /payments/2/refunds) answers 422. Defaults to
	// OperationDefault: the method and the http.ServeMux pattern that
	// matched ("POST /payments/{id}/refunds"), else the method and
	// "unmatched". An operation longer than MaxOperationLength, not valid
	// UTF-8 or holding NUL answers 400 operation_invalid.
	Operation func(r *http.Request) string

	// Key takes the idempotency key from the request: KeyFromHeader for a
	// header of another name (a webhook provider's delivery ID:
	// "X-GitHub-Delivery", "webhook-id"), KeyFromJSON for a member of the
	// body (Stripe's "id"). When set, the body is read (up to
	// MaxRequestBytes) before the key. Account and Operation still scope
	// the key: give each sender its own account (package webhook uses
	// "webhook:" and the provider's name) so that two senders' IDs never
	// meet. Defaults to nil: the Idempotency-Key header (ParseKey), read
	// before the body.
	Key KeyFunc

	// Intent returns the bytes that define a request's intent, hashed into
	// its fingerprint. Defaults to IntentDefault: the canonical JSON of a
	// JSON body (else the raw body) and the sorted query. IntentJSON selects
	// members of a JSON body.
	Intent IntentFunc

	// Optional lets requests without an Idempotency-Key header through to
	// the handler unprotected, with no transaction. Defaults to false: they
	// get 400 idempotency_key_missing.
	Optional bool

	// NoTx runs handlers without a transaction: Tx reports false, the key is
	// reserved by a PROCESSING record committed first, and the record is
	// completed by its own statement after the handler returns. For
	// handlers whose effects are outside this database (then a crash
	// between the effect and the completion leaves the record PROCESSING for
	// the reconciler; it is never taken over, by a middleware of any mode).
	// Defaults to false: every handler runs in a transaction the middleware
	// commits together with the record.
	NoTx bool

	// NoLeaseTakeover reserves each key with a PROCESSING record committed
	// before the handler runs (in its transaction), and leaves records
	// whose lease ended to the reconciler: requests with their key get 409
	// request_in_flight until a Reconciler settles them (Store.Reconcile,
	// Store.Resolve) or they expire (TTL), also on middlewares of the
	// default mode. Set it when a handler's effects do not all go through
	// the middleware's transaction (it calls a payment provider itself), so
	// that a request whose holder crashed is not run again before someone
	// checked. With NoTx records are never taken over, whatever this says.
	// Defaults to false: in transaction mode a request holds its key with an
	// advisory lock in its transaction, a holder that crashed frees it at
	// once, and one still running at its lease end is fenced out (its
	// session ended, its transaction rolled back, 409 lease_lost) so that
	// the next request runs.
	NoLeaseTakeover bool

	// Lease is how long a request holds its key: its handler's context ends
	// then. In transaction mode a holder still running is then fenced out
	// and the next request with the key runs; with a record of its own
	// (NoTx, NoLeaseTakeover) the record counts as stuck (FindStuck) from
	// then on until it completes or a reconciler settles it. At least 1ms.
	// Defaults to LeaseDefault (1 minute).
	Lease time.Duration

	// TTL is how long a record lives after it completed (and, with a record
	// of its own, after its lease would end). After it, the key is unknown
	// and a request with it runs anew. Defaults to TTLDefault (24 hours).
	TTL time.Duration

	// Wait is how long a request whose key is in flight waits for the first
	// request to finish (then it is answered with the replay, or runs the
	// handler if the first released the key) before it gets 409
	// request_in_flight. It is woken by the holder's end, not by polling
	// (see the package documentation, Waiting); with the PostgreSQL store it
	// waits on a connection of its own, outside the pool. Set it on every
	// middleware of an operation: with NoLeaseTakeover a holder takes the
	// lock waiters wait on only when its own Wait is set. Defaults to 0: 409
	// at once.
	Wait time.Duration

	// MaxWaiters bounds the requests of this middleware that wait at once
	// (Wait), on all keys, and MaxKeyWaiters those on one key: a request
	// past either bound does not wait, and gets 409 request_in_flight at
	// once if its key is in flight. Default to MaxWaitersDefault (16) and
	// MaxKeyWaitersDefault (4).
	MaxWaiters, MaxKeyWaiters int

	// RetryAfter is the Retry-After sent with 409 request_in_flight and
	// lease_lost, and 503 store_unavailable. Defaults to RetryAfterDefault
	// (1 second).
	RetryAfter time.Duration

	// Retryable reports whether a response status releases the key instead
	// of being stored: the transaction is rolled back, the response is sent
	// as it is, and a retry with the key runs the handler again. Defaults to
	// RetryableDefault: 5xx, 408, 425 and 429.
	Retryable func(status int) bool

	// StoredHeaders is the allow-list of response headers stored and
	// replayed; other headers reach the first response only. Authorization,
	// Proxy-Authorization, Cookie, Set-Cookie, Set-Cookie2,
	// Proxy-Authenticate and WWW-Authenticate are refused by New. Defaults
	// to StoredHeadersDefault.
	StoredHeaders []string

	// MaxRequestBytes is the longest request body; longer ones get 413
	// request_too_large before anything is reserved. Defaults to
	// MaxRequestBytesDefault (1 MiB).
	MaxRequestBytes int64

	// MaxResponseBytes is the longest response body a handler may write.
	// Past it, Write returns ErrResponseTooLarge, the transaction is rolled
	// back, the key released, and the client gets 500 response_too_large.
	// Defaults to MaxResponseBytesDefault (1 MiB).
	MaxResponseBytes int

	// WriteError writes the middleware's own error responses. Defaults to
	// WriteErrorJSON.
	WriteError func(w http.ResponseWriter, r *http.Request, e *Error)

	// Observe, when set, is called once per request the middleware answered,
	// after the answer, with what it did (Event: scope, Outcome, status,
	// duration) and the request's context, which carries the span a tracing
	// middleware in front started: metrics, logs and traces (see the module
	// github.com/idemkit/idemkit/idemotel). It must not block.
	Observe func(ctx context.Context, e Event)

	// Logger receives what the middleware cannot tell the client: failed
	// releases, recovered panics with their stack, lost leases. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// RetryableDefault reports whether status is 5xx, 408 Request Timeout, 425
// Too Early or 429 Too Many Requests: outcomes a retry may change.
func RetryableDefault(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooEarly ||
		status == http.StatusTooManyRequests
}

// OperationUnmatched is the route part of OperationDefault's operation
// for a request that carries no http.ServeMux pattern.
const OperationUnmatched = "unmatched"

// OperationOther is the method part of OperationDefault's operation for a
// method that is not one of the standard ones (RFC 9110 and PATCH).
const OperationOther = "OTHER"

// OperationDefault returns the method and the route pattern http.ServeMux
// matched (r.Pattern, without the method it may start with, so that "POST
// /payments" and "/payments" both give "POST /payments"), or the method and
// OperationUnmatched ("POST unmatched") when no pattern is set (other
// routers, or a middleware wrapped around the mux rather than the route's
// handler: wrap the handler you register to get the pattern). A method
// that is not standard counts as OperationOther. So the operations are a
// bounded set, whatever the client sends: the patterns you register times
// ten methods, or ten without patterns (the operation is a label of the
// metrics of module github.com/idemkit/idemkit/idemotel). The request's own
// method and path are in its fingerprint, whatever the operation.
func OperationDefault(r *http.Request) string {
	m := r.Method
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace:
	default:
		m = OperationOther
	}
	p := r.Pattern
	if p == "" {
		return m + " " + OperationUnmatched
	}
	if i := strings.IndexAny(p, " \t"); i >= 0 && !strings.Contains(p[:i], "/") {
		p = strings.TrimLeft(p[i:], " \t")
	}
	return m + " " + p
}

// IntentDefault defines a request's intent by its query (sorted by
// parameter), its media type (Content-Type, normalised: its type and
// parameter names in lower case) and its body: the canonical JSON
// (CanonicalJSON) of a body whose Content-Type is application/json or ends
// in +json, else the raw bytes. So key order, whitespace and number forms of
// JSON do not change the fingerprint; any change of a value does, and so
// does another media type. A query url.ParseQuery cannot read whole (a
// semicolon, a bad escape) is refused (400 invalid_request): the pairs it
// drops would not count.
func IntentDefault(r *http.Request, body []byte) ([]byte, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("the query cannot be read whole: %w", err)
	}
	var b bytes.Buffer
	writeField(&b, []byte(q.Encode()))
	writeField(&b, []byte(mediaType(r.Header.Get("Content-Type"))))
	if len(body) > 0 && isJSON(r.Header.Get("Content-Type")) {
		c, err := CanonicalJSON(body)
		if err != nil {
			return nil, err
		}
		body = c
	}
	writeField(&b, body)
	return b.Bytes(), nil
}

// IntentJSON returns an IntentFunc that defines a request's intent by the
// members of its JSON body that the given RFC 6901 JSON Pointers select
// ("/orderId", "/amount", "/items/0/sku"; a name without a leading slash is
// a top-level member: "amount" is "/amount"), in canonical form; everything else
// (other members, the query, headers) does not count. An absent member
// counts as absent, which differs from null. The body must be JSON whatever
// its Content-Type.
func IntentJSON(pointers ...string) IntentFunc {
	ps := make([]string, len(pointers))
	for i, p := range pointers {
		if !strings.HasPrefix(p, "/") {
			p = "/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1")
		}
		ps[i] = p
	}
	return func(_ *http.Request, body []byte) ([]byte, error) {
		p, err := canonicalize(body)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		for _, ptr := range ps {
			writeField(&b, []byte(ptr))
			sel, ok := lookupCanonical(p.out, ptr)
			if !ok {
				b.WriteByte(0)
				continue
			}
			b.WriteByte(1)
			writeField(&b, sel)
		}
		return b.Bytes(), nil
	}
}

// mediaType returns a Content-Type in one form per media type, or as it is
// when it does not parse.
func mediaType(contentType string) string {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return strings.TrimSpace(contentType)
	}
	return mime.FormatMediaType(mt, params)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// writeField appends a length-prefixed field, so that concatenations of
// fields are unambiguous.
func writeField(b *bytes.Buffer, p []byte) {
	var n [binary.MaxVarintLen64]byte
	b.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
	b.Write(p)
}

// MinFingerprintKeyLength is the shortest secret Config.FingerprintKeys
// accepts, in bytes.
const MinFingerprintKeyLength = 32

// fingerprints returns the HMAC-SHA256, under each of keys, of a version
// tag, the operation, the request's method and path (as sent, escaped: the
// resource it names) and the intent: the fingerprint under the first key,
// and those under the older ones.
func fingerprints(keys [][]byte, operation string, r *http.Request, intent []byte) ([]byte, [][]byte) {
	var b bytes.Buffer
	b.WriteString("idemhttp/2\n")
	writeField(&b, []byte(operation))
	writeField(&b, []byte(r.Method))
	writeField(&b, []byte(r.URL.EscapedPath()))
	writeField(&b, intent)
	sum := func(k []byte) []byte {
		m := hmac.New(sha256.New, k)
		m.Write(b.Bytes())
		return m.Sum(nil)
	}
	var older [][]byte
	for _, k := range keys[1:] {
		older = append(older, sum(k))
	}
	return sum(keys[0]), older
}

// withDefaults returns a validated copy of c with every default applied.
func (c Config) withDefaults() (Config, error) {
	if c.Account == nil {
		return c, fmt.Errorf("%w: Account is required", ErrInvalidConfig)
	}
	if len(c.FingerprintKeys) == 0 {
		return c, fmt.Errorf("%w: FingerprintKeys is required: at least one secret of %d random bytes or more",
			ErrInvalidConfig, MinFingerprintKeyLength)
	}
	keys := make([][]byte, len(c.FingerprintKeys))
	for i, k := range c.FingerprintKeys {
		if len(k) < MinFingerprintKeyLength {
			return c, fmt.Errorf("%w: FingerprintKeys[%d] has %d bytes, fewer than %d",
				ErrInvalidConfig, i, len(k), MinFingerprintKeyLength)
		}
		keys[i] = bytes.Clone(k)
	}
	c.FingerprintKeys = keys
	if c.Operation == nil {
		c.Operation = OperationDefault
	}
	if c.Intent == nil {
		c.Intent = IntentDefault
	}
	if c.Retryable == nil {
		c.Retryable = RetryableDefault
	}
	if c.WriteError == nil {
		c.WriteError = WriteErrorJSON
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = StoredHeadersDefault
	}
	for name, d := range map[string]time.Duration{"Lease": c.Lease, "TTL": c.TTL, "Wait": c.Wait, "RetryAfter": c.RetryAfter} {
		if d < 0 {
			return c, fmt.Errorf("%w: %s %v is negative", ErrInvalidConfig, name, d)
		}
	}
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.TTL = cmp.Or(c.TTL, TTLDefault)
	c.RetryAfter = cmp.Or(c.RetryAfter, RetryAfterDefault)
	if c.Lease < time.Millisecond {
		return c, fmt.Errorf("%w: Lease %v is shorter than 1ms", ErrInvalidConfig, c.Lease)
	}
	if c.TTL < c.Lease {
		return c, fmt.Errorf("%w: TTL %v is shorter than Lease %v", ErrInvalidConfig, c.TTL, c.Lease)
	}
	if c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 {
		return c, fmt.Errorf("%w: negative MaxRequestBytes or MaxResponseBytes", ErrInvalidConfig)
	}
	if c.MaxWaiters < 0 || c.MaxKeyWaiters < 0 {
		return c, fmt.Errorf("%w: negative MaxWaiters or MaxKeyWaiters", ErrInvalidConfig)
	}
	c.MaxWaiters = cmp.Or(c.MaxWaiters, MaxWaitersDefault)
	c.MaxKeyWaiters = cmp.Or(c.MaxKeyWaiters, MaxKeyWaitersDefault)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, MaxRequestBytesDefault)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, MaxResponseBytesDefault)
	allowed := make([]string, 0, len(c.StoredHeaders))
	for _, h := range c.StoredHeaders {
		k := http.CanonicalHeaderKey(strings.TrimSpace(h))
		if k == "" {
			return c, fmt.Errorf("%w: empty name in StoredHeaders", ErrInvalidConfig)
		}
		for _, d := range deniedHeaders {
			if k == d {
				return c, fmt.Errorf("%w: StoredHeaders lists %s, which may carry credentials and is never stored", ErrInvalidConfig, k)
			}
		}
		allowed = append(allowed, k)
	}
	c.StoredHeaders = allowed
	return c, nil
}

// storedHeader returns the allow-listed part of h.
func storedHeader(h http.Header, allowed []string) http.Header {
	out := http.Header{}
	for _, k := range allowed {
		if v, ok := h[k]; ok && len(v) > 0 {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// canonicalHeader returns h with its names in canonical form, as a stored
// record may hold them otherwise.
func canonicalHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		out[ck] = append(out[ck], v...)
	}
	return out
}
