package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/idemhttp"
)

// ToleranceDefault is how far the timestamp of a Standard Webhooks or Stripe
// delivery may be from the receiver's clock, either way: the default of both
// specifications.
const ToleranceDefault = 5 * time.Minute

// The headers the schemes read.
const (
	HeaderWebhookID        = "Webhook-Id"            // Standard Webhooks: the event ID
	HeaderWebhookTimestamp = "Webhook-Timestamp"     // Standard Webhooks: the attempt's Unix time
	HeaderWebhookSignature = "Webhook-Signature"     // Standard Webhooks: "v1,<base64>", space-separated
	HeaderGitHubDelivery   = "X-GitHub-Delivery"     // GitHub: the event's GUID
	HeaderGitHubSignature  = "X-Hub-Signature-256"   // GitHub: "sha256=<hex>"
	HeaderStripeSignature  = "Stripe-Signature"      // Stripe: "t=<Unix time>,v1=<hex>[,v1=<hex>]"
	HeaderShopifyWebhookID = "X-Shopify-Webhook-Id"  // Shopify: the delivery's ID, the same on retries
	HeaderShopifyHMAC      = "X-Shopify-Hmac-Sha256" // Shopify: "<base64>"
)

// ErrSignature is matched (with errors.Is) by every error of a Verifier of
// this package for a delivery whose signature is missing, malformed or
// matches none of the secrets, or whose signed headers (the ID, the
// timestamp) are missing or malformed: the delivery is not authentic.
var ErrSignature = errors.New("webhook: signature not verified")

// ErrTimestamp is matched by the error of a Verifier of this package for a
// delivery whose signature matches but whose timestamp is further from now
// than the tolerance: an old delivery replayed, or a clock that is off.
var ErrTimestamp = errors.New("webhook: timestamp outside the tolerance")

// ErrInvalidConfig is wrapped by every error the constructors of this
// package return for a bad configuration.
var ErrInvalidConfig = fmt.Errorf("webhook: %w", idemkit.ErrInvalidConfig)

// verifyError is an error of a Scheme: it says what is wrong, without a
// secret, a signature or the body, and matches ErrSignature or ErrTimestamp.
type verifyError struct {
	kind   error
	scheme string
	reason string
}

func (e *verifyError) Error() string        { return "webhook: " + e.scheme + ": " + e.reason }
func (e *verifyError) Is(target error) bool { return target == e.kind }

// Verifier checks that a delivery comes from its provider, before anything
// is reserved: its signature over the raw body and, where the scheme has
// one, its timestamp. Verify returns nil for an authentic delivery, else an
// error matching ErrSignature or ErrTimestamp that quotes neither a secret
// nor the body. It must be safe for concurrent use.
type Verifier interface {
	Verify(r *http.Request, body []byte) error
}

// VerifierFunc adapts a function to a Verifier, for a provider this package
// has no Scheme for.
type VerifierFunc func(r *http.Request, body []byte) error

// Verify calls f.
func (f VerifierFunc) Verify(r *http.Request, body []byte) error { return f(r, body) }

// Scheme is one provider's signature scheme with an endpoint's secrets:
// StandardWebhooks, GitHub, Stripe or Shopify. It also knows where the
// scheme's deliveries name their event, and New takes the idempotency key
// from there. Signatures are HMAC-SHA256, compared in constant time
// (hmac.Equal) with the signature of every secret: list several during a
// rotation (the new one and the old one) and a delivery signed with either
// is authentic. Set Tolerance and Now before the Scheme is used; it is safe
// for concurrent use.
type Scheme struct {
	// Tolerance is how far a delivery's timestamp may be from Now, either
	// way, for the schemes that sign one (Standard Webhooks, Stripe); past
	// it Verify returns an error matching ErrTimestamp. GitHub and Shopify
	// sign no timestamp: a captured delivery can be sent again at any time;
	// under its own ID it is a duplicate, but their IDs are headers outside
	// the signature, so under a new one it runs again (see the package
	// documentation). Defaults to
	// ToleranceDefault (5 minutes).
	Tolerance time.Duration
	// Now is the clock timestamps are measured on. Defaults to time.Now.
	Now func() time.Time

	name    string
	secrets [][]byte
	verify  func(s *Scheme, h http.Header, body []byte) error
	sign    func(s *Scheme, h http.Header, body []byte, at time.Time) error
	key     idemhttp.KeyFunc
	intent  idemhttp.IntentFunc
}

// Verify checks the delivery's signature with every secret, then its
// timestamp, if the scheme has one.
func (s *Scheme) Verify(r *http.Request, body []byte) error {
	return s.verify(s, r.Header, body)
}

// Sign sets the signature headers of a delivery of body sent at at, signed
// with the first secret, as the provider would: for tests and tools that
// replay deliveries. For Standard Webhooks, h must already hold the
// delivery's Webhook-Id (it is signed too).
func (s *Scheme) Sign(h http.Header, body []byte, at time.Time) error {
	return s.sign(s, h, body, at)
}

func (s *Scheme) fail(kind error, format string, args ...any) error {
	return &verifyError{kind: kind, scheme: s.name, reason: fmt.Sprintf(format, args...)}
}

// matches reports whether sig is the HMAC-SHA256 of the signed content
// under one of the secrets, in constant time for each.
func (s *Scheme) matches(sig []byte, macs [][]byte) bool {
	for _, m := range macs {
		if hmac.Equal(sig, m) {
			return true
		}
	}
	return false
}

// macs returns the signed content's HMAC-SHA256 under each secret.
func (s *Scheme) macs(prefix string, body []byte) [][]byte {
	out := make([][]byte, len(s.secrets))
	for i, k := range s.secrets {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(prefix))
		m.Write(body)
		out[i] = m.Sum(nil)
	}
	return out
}

// one returns the single value of header name, or an error matching
// ErrSignature when it is missing or repeated.
func (s *Scheme) one(h http.Header, name string) (string, error) {
	v := h.Values(name)
	switch {
	case len(v) == 0 || v[0] == "":
		return "", s.fail(ErrSignature, "no %s header", name)
	case len(v) > 1:
		return "", s.fail(ErrSignature, "the %s header appears %d times", name, len(v))
	}
	return v[0], nil
}

// parseUnix parses a Unix time of 1 to 18 decimal digits.
func parseUnix(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// checkTime returns an error matching ErrTimestamp when the Unix time ts is
// further from now than the tolerance.
func (s *Scheme) checkTime(ts int64) error {
	tol := s.Tolerance
	if tol <= 0 {
		tol = ToleranceDefault
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	d := now().Sub(time.Unix(ts, 0))
	switch {
	case d > tol:
		return s.fail(ErrTimestamp, "the delivery was signed %v ago, beyond the tolerance of %v", d.Truncate(time.Second), tol)
	case d < -tol:
		return s.fail(ErrTimestamp, "the delivery was signed %v ahead of this clock, beyond the tolerance of %v",
			(-d).Truncate(time.Second), tol)
	}
	return nil
}

func newScheme(name string, secrets []string, decode func(string) ([]byte, error)) (*Scheme, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: %s: no secret", ErrInvalidConfig, name)
	}
	s := &Scheme{name: name}
	for i, v := range secrets {
		k, err := decode(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: secret %d: %w", ErrInvalidConfig, name, i, err)
		}
		if len(k) == 0 {
			return nil, fmt.Errorf("%w: %s: secret %d is empty", ErrInvalidConfig, name, i)
		}
		s.secrets = append(s.secrets, k)
	}
	return s, nil
}

func rawSecret(v string) ([]byte, error) { return []byte(v), nil }

// StandardWebhooks returns the scheme of the Standard Webhooks
// specification (and of Svix, which it comes from): the signed content is
// the Webhook-Id, the Webhook-Timestamp (Unix seconds) and the body, joined
// by dots; Webhook-Signature lists space-separated signatures "v1,<base64
// HMAC-SHA256>" (a provider rotating its secret sends one per secret;
// other versions, such as the asymmetric v1a, are skipped). Each secret is
// given as the provider shows it, "whsec_" and the key in base64 (the
// prefix may be left out). The event ID is the Webhook-Id header.
func StandardWebhooks(secrets ...string) (*Scheme, error) {
	s, err := newScheme("standard-webhooks", secrets, func(v string) ([]byte, error) {
		k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "whsec_"))
		if err != nil {
			return nil, errors.New("not base64 after the whsec_ prefix")
		}
		return k, nil
	})
	if err != nil {
		return nil, err
	}
	s.key = idemhttp.KeyFromHeader(HeaderWebhookID)
	s.verify = verifyStandard
	s.sign = func(s *Scheme, h http.Header, body []byte, at time.Time) error {
		id := h.Get(HeaderWebhookID)
		if id == "" {
			return fmt.Errorf("webhook: %s: sign: the header has no %s", s.name, HeaderWebhookID)
		}
		ts := strconv.FormatInt(at.Unix(), 10)
		h.Set(HeaderWebhookTimestamp, ts)
		h.Set(HeaderWebhookSignature, "v1,"+base64.StdEncoding.EncodeToString(s.macs(id+"."+ts+".", body)[0]))
		return nil
	}
	return s, nil
}

func verifyStandard(s *Scheme, h http.Header, body []byte) error {
	id, err := s.one(h, HeaderWebhookID)
	if err != nil {
		return err
	}
	tsv, err := s.one(h, HeaderWebhookTimestamp)
	if err != nil {
		return err
	}
	sigs, err := s.one(h, HeaderWebhookSignature)
	if err != nil {
		return err
	}
	ts, ok := parseUnix(tsv)
	if !ok {
		return s.fail(ErrSignature, "the %s header is not a Unix time", HeaderWebhookTimestamp)
	}
	macs := s.macs(id+"."+tsv+".", body)
	seen := false
	for _, f := range strings.Split(sigs, " ") {
		version, sig, ok := strings.Cut(f, ",")
		if !ok || version != "v1" {
			continue
		}
		seen = true
		b, err := base64.StdEncoding.Strict().DecodeString(sig)
		if err == nil && s.matches(b, macs) {
			return s.checkTime(ts)
		}
	}
	if !seen {
		return s.fail(ErrSignature, "the %s header has no v1 signature", HeaderWebhookSignature)
	}
	return s.fail(ErrSignature, "no v1 signature matches a secret")
}

// GitHub returns GitHub's scheme: X-Hub-Signature-256 is "sha256=" and the
// hex HMAC-SHA256 of the body under the webhook's secret. GitHub signs no
// timestamp and retries nothing by itself (a delivery is sent again when
// someone redelivers it, for three days). The event ID is the
// X-GitHub-Delivery header, which GitHub does not sign: see the package
// documentation.
func GitHub(secrets ...string) (*Scheme, error) {
	s, err := newScheme("github", secrets, rawSecret)
	if err != nil {
		return nil, err
	}
	s.key = idemhttp.KeyFromHeader(HeaderGitHubDelivery)
	s.verify = func(s *Scheme, h http.Header, body []byte) error {
		v, err := s.one(h, HeaderGitHubSignature)
		if err != nil {
			return err
		}
		hexSig, ok := strings.CutPrefix(v, "sha256=")
		if !ok || len(hexSig) != 2*sha256.Size {
			return s.fail(ErrSignature, "the %s header is not sha256= and 64 hex digits", HeaderGitHubSignature)
		}
		sig, err := hex.DecodeString(hexSig)
		if err != nil {
			return s.fail(ErrSignature, "the %s header is not sha256= and 64 hex digits", HeaderGitHubSignature)
		}
		if !s.matches(sig, s.macs("", body)) {
			return s.fail(ErrSignature, "the signature matches no secret")
		}
		return nil
	}
	s.sign = func(s *Scheme, h http.Header, body []byte, _ time.Time) error {
		h.Set(HeaderGitHubSignature, "sha256="+hex.EncodeToString(s.macs("", body)[0]))
		return nil
	}
	return s, nil
}

// stripeIntent are the members of a Stripe event that define it, for its
// fingerprint: all but pending_webhooks, a count of the endpoints still to
// receive the event, which can differ from one attempt to the next.
var stripeIntent = idemhttp.IntentJSON("/id", "/object", "/type", "/api_version", "/created", "/livemode",
	"/account", "/context", "/request", "/data", "/related_object", "/reason")

// Stripe returns Stripe's scheme: Stripe-Signature is "t=<Unix
// time>,v1=<hex>", the v1 being the HMAC-SHA256 of the t value, a dot and
// the body under the endpoint's signing secret ("whsec_…", used as it is);
// during a rolled secret's overlap Stripe sends one v1 per secret, and
// other schemes (v0) are skipped. The event ID is the "id" member of the
// JSON body, which the signature covers; the fingerprint leaves out
// pending_webhooks (see stripeIntent).
func Stripe(secrets ...string) (*Scheme, error) {
	s, err := newScheme("stripe", secrets, rawSecret)
	if err != nil {
		return nil, err
	}
	s.key = idemhttp.KeyFromJSON("id")
	s.intent = stripeIntent
	s.verify = verifyStripe
	s.sign = func(s *Scheme, h http.Header, body []byte, at time.Time) error {
		ts := strconv.FormatInt(at.Unix(), 10)
		h.Set(HeaderStripeSignature, "t="+ts+",v1="+hex.EncodeToString(s.macs(ts+".", body)[0]))
		return nil
	}
	return s, nil
}

func verifyStripe(s *Scheme, h http.Header, body []byte) error {
	v, err := s.one(h, HeaderStripeSignature)
	if err != nil {
		return err
	}
	var (
		tsv  string
		sigs [][]byte
		seen bool
	)
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			if tsv != "" {
				return s.fail(ErrSignature, "the %s header has t= twice", HeaderStripeSignature)
			}
			tsv = val
			if tsv == "" {
				return s.fail(ErrSignature, "the %s header's t= is empty", HeaderStripeSignature)
			}
		case "v1":
			seen = true
			if len(val) != 2*sha256.Size {
				continue
			}
			if b, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	ts, ok := parseUnix(tsv)
	if !ok {
		return s.fail(ErrSignature, "the %s header has no t= Unix time", HeaderStripeSignature)
	}
	if !seen {
		return s.fail(ErrSignature, "the %s header has no v1= signature", HeaderStripeSignature)
	}
	macs := s.macs(tsv+".", body)
	for _, sig := range sigs {
		if s.matches(sig, macs) {
			return s.checkTime(ts)
		}
	}
	return s.fail(ErrSignature, "no v1= signature matches a secret")
}

// Shopify returns Shopify's scheme: X-Shopify-Hmac-Sha256 is the base64
// HMAC-SHA256 of the body under the app's client secret. Shopify signs no
// timestamp; it retries a failed delivery 8 times over 4 hours. The event
// ID is the X-Shopify-Webhook-Id header, the same on each retry of a
// delivery and not signed: an endpoint that several subscriptions of one
// topic deliver to receives an event once per subscription, each with its
// own ID (idemhttp.KeyFromHeader("X-Shopify-Event-Id") names the event
// instead).
func Shopify(secrets ...string) (*Scheme, error) {
	s, err := newScheme("shopify", secrets, rawSecret)
	if err != nil {
		return nil, err
	}
	s.key = idemhttp.KeyFromHeader(HeaderShopifyWebhookID)
	s.verify = func(s *Scheme, h http.Header, body []byte) error {
		v, err := s.one(h, HeaderShopifyHMAC)
		if err != nil {
			return err
		}
		sig, err := base64.StdEncoding.Strict().DecodeString(v)
		if err != nil || len(sig) != sha256.Size {
			return s.fail(ErrSignature, "the %s header is not a base64 HMAC-SHA256", HeaderShopifyHMAC)
		}
		if !s.matches(sig, s.macs("", body)) {
			return s.fail(ErrSignature, "the signature matches no secret")
		}
		return nil
	}
	s.sign = func(s *Scheme, h http.Header, body []byte, _ time.Time) error {
		h.Set(HeaderShopifyHMAC, base64.StdEncoding.EncodeToString(s.macs("", body)[0]))
		return nil
	}
	return s, nil
}
