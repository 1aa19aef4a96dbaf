package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idemkit/webhook"
)

// The signatures below are computed here with crypto/hmac, independently of
// the package's own code, as each provider documents its scheme.

func hmacSHA256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// whsecKey decodes a Standard Webhooks secret, "whsec_" and base64.
func whsecKey(t testing.TB, secret string) []byte {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func whsec(raw string) string { return "whsec_" + base64.StdEncoding.EncodeToString([]byte(raw)) }

// fixture is one provider's scheme, three secrets (the current one, the one
// it replaces, and one the receiver does not know) and how the provider
// signs a delivery.
type fixture struct {
	name        string
	scheme      func(secrets ...string) (*webhook.Scheme, error)
	secrets     [3]string
	timestamped bool
	// sign sets the headers of a delivery of event id with body, signed
	// with secret at at.
	sign func(t testing.TB, h http.Header, secret, id string, body []byte, at time.Time)
}

var fixtures = []fixture{
	{
		name: "standard-webhooks", scheme: webhook.StandardWebhooks, timestamped: true,
		secrets: [3]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", whsec("the previous secret, 32 bytes..."),
			whsec("a secret nobody configured, 32 b")},
		sign: func(t testing.TB, h http.Header, secret, id string, body []byte, at time.Time) {
			ts := strconv.FormatInt(at.Unix(), 10)
			h.Set("webhook-id", id)
			h.Set("webhook-timestamp", ts)
			h.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(
				hmacSHA256(whsecKey(t, secret), []byte(id+"."+ts+"."), body)))
		},
	},
	{
		name: "github", scheme: webhook.GitHub,
		secrets: [3]string{"It's a Secret to Everybody", "the previous GitHub secret", "an unknown GitHub secret"},
		sign: func(_ testing.TB, h http.Header, secret, id string, body []byte, _ time.Time) {
			h.Set("X-GitHub-Delivery", id)
			h.Set("X-GitHub-Event", "push")
			h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(hmacSHA256([]byte(secret), body)))
		},
	},
	{
		name: "stripe", scheme: webhook.Stripe, timestamped: true,
		secrets: [3]string{"whsec_current0stripe0signing0secret", "whsec_previous0stripe0signing0secret",
			"whsec_unknown0stripe0signing0secret"},
		sign: func(_ testing.TB, h http.Header, secret, _ string, body []byte, at time.Time) {
			ts := strconv.FormatInt(at.Unix(), 10)
			h.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(hmacSHA256([]byte(secret), []byte(ts+"."), body))+
				",v0=6ffbb59b2300aabe2ec5c4bc8a5b6a7b8a1e3f0d1c2b3a4958677685a4b3c2d1")
		},
	},
	{
		name: "shopify", scheme: webhook.Shopify,
		secrets: [3]string{"shpss_current_client_secret", "shpss_previous_client_secret", "shpss_unknown_client_secret"},
		sign: func(_ testing.TB, h http.Header, secret, id string, body []byte, _ time.Time) {
			h.Set("X-Shopify-Webhook-Id", id)
			h.Set("X-Shopify-Topic", "orders/paid")
			h.Set("X-Shopify-Hmac-Sha256", base64.StdEncoding.EncodeToString(hmacSHA256([]byte(secret), body)))
		},
	},
}

// fixedClock returns a clock that always reads at.
func fixedClock(at time.Time) func() time.Time { return func() time.Time { return at } }

func newScheme(t testing.TB, f fixture, secrets ...string) *webhook.Scheme {
	t.Helper()
	s, err := f.scheme(secrets...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func signed(t testing.TB, f fixture, secret, id string, body []byte, at time.Time) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/"+f.name, strings.NewReader(string(body)))
	r.Header.Set("Content-Type", "application/json")
	f.sign(t, r.Header, secret, id, body, at)
	return r
}

// TestStandardWebhooksVector: the test vector of the Standard Webhooks
// reference libraries (standard-webhooks/standard-webhooks,
// libraries/*/webhook_test: secret, message ID, timestamp, payload and the
// signature they expect).
func TestStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	const (
		secret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		msgID    = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts       = 1614265330
		payload  = `{"test": 2432232314}`
		expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	for _, key := range []string{secret, strings.TrimPrefix(secret, "whsec_")} {
		s, err := webhook.StandardWebhooks(key)
		if err != nil {
			t.Fatal(err)
		}
		s.Now = fixedClock(time.Unix(ts, 0))
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(payload))
		r.Header.Set("webhook-id", msgID)
		r.Header.Set("webhook-timestamp", strconv.Itoa(ts))
		r.Header.Set("webhook-signature", expected)
		if err := s.Verify(r, []byte(payload)); err != nil {
			t.Fatalf("the specification's vector: %v", err)
		}
		// The vector's delivery received 5 minutes and 1 second later.
		s.Now = fixedClock(time.Unix(ts, 0).Add(webhook.ToleranceDefault + time.Second))
		if err := s.Verify(r, []byte(payload)); !errors.Is(err, webhook.ErrTimestamp) {
			t.Fatalf("late: %v, want ErrTimestamp", err)
		}
		h := http.Header{}
		h.Set("webhook-id", msgID)
		if err := s.Sign(h, []byte(payload), time.Unix(ts, 0)); err != nil {
			t.Fatal(err)
		}
		if got := h.Get("webhook-signature"); got != expected {
			t.Fatalf("Sign: %q, want %q", got, expected)
		}
	}
}

// TestGitHubVector: the example of GitHub's documentation ("Validating
// webhook deliveries", docs.github.com): the secret "It's a Secret to
// Everybody", the payload "Hello, World!" and the signature it gives.
func TestGitHubVector(t *testing.T) {
	t.Parallel()
	const expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	s, err := webhook.GitHub("It's a Secret to Everybody")
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("Hello, World!"))
	r.Header.Set("X-Hub-Signature-256", expected)
	if err := s.Verify(r, []byte("Hello, World!")); err != nil {
		t.Fatalf("GitHub's example: %v", err)
	}
	if err := s.Verify(r, []byte("Hello, World?")); !errors.Is(err, webhook.ErrSignature) {
		t.Fatalf("another payload: %v, want ErrSignature", err)
	}
	h := http.Header{}
	if err := s.Sign(h, []byte("Hello, World!"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := h.Get("X-Hub-Signature-256"); got != expected {
		t.Fatalf("Sign: %q, want %q", got, expected)
	}
}

// TestSchemes: for each provider, a delivery signed with the current or the
// previous secret is authentic; one signed with another secret, with
// another body, or without its signature is not, and the error names
// neither a secret nor the body.
func TestSchemes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_750_000_000, 0)
	body := []byte(`{"id":"evt_42","type":"order.paid","data":{"secret_marker":"b0dy-m4rker"}}`)
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			s := newScheme(t, f, f.secrets[0], f.secrets[1])
			s.Now = fixedClock(now)
			check := func(what string, r *http.Request, b []byte, want error) {
				t.Helper()
				err := s.Verify(r, b)
				if !errors.Is(err, want) || (want == nil) != (err == nil) {
					t.Fatalf("%s: %v, want %v", what, err, want)
				}
				if err == nil {
					return
				}
				for _, secret := range f.secrets {
					if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), strings.TrimPrefix(secret, "whsec_")) {
						t.Fatalf("%s: the error %q names a secret", what, err)
					}
				}
				if strings.Contains(err.Error(), "b0dy-m4rker") {
					t.Fatalf("%s: the error %q quotes the body", what, err)
				}
			}
			check("current secret", signed(t, f, f.secrets[0], "evt_42", body, now), body, nil)
			check("previous secret", signed(t, f, f.secrets[1], "evt_42", body, now), body, nil)
			check("unknown secret", signed(t, f, f.secrets[2], "evt_42", body, now), body, webhook.ErrSignature)
			other := []byte(strings.Replace(string(body), "order.paid", "order.refunded", 1))
			check("another body", signed(t, f, f.secrets[0], "evt_42", body, now), other, webhook.ErrSignature)
			check("empty body", signed(t, f, f.secrets[0], "evt_42", body, now), nil, webhook.ErrSignature)
			bare := httptest.NewRequest(http.MethodPost, "/", nil)
			check("no headers", bare, body, webhook.ErrSignature)

			// A scheme that knows only the new secret refuses the old one's
			// deliveries: rotation ends when the old secret is dropped.
			only := newScheme(t, f, f.secrets[0])
			only.Now = fixedClock(now)
			if err := only.Verify(signed(t, f, f.secrets[1], "evt_42", body, now), body); !errors.Is(err, webhook.ErrSignature) {
				t.Fatalf("dropped secret: %v, want ErrSignature", err)
			}

			// Sign makes what Verify accepts.
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("webhook-id", "evt_42")
			if err := s.Sign(r.Header, body, now); err != nil {
				t.Fatal(err)
			}
			check("Sign", r, body, nil)
		})
	}
}

// TestTolerance: a timestamped delivery is authentic up to the tolerance
// either way from the clock, and not one second beyond; a tolerance of
// its own replaces the default.
func TestTolerance(t *testing.T) {
	t.Parallel()
	signedAt := time.Unix(1_750_000_000, 0)
	body := []byte(`{"id":"evt_7","type":"charge.succeeded"}`)
	for _, f := range fixtures {
		if !f.timestamped {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range []struct {
				tolerance, skew time.Duration
				want            error
			}{
				{0, 0, nil},
				{0, webhook.ToleranceDefault, nil},
				{0, webhook.ToleranceDefault + time.Second, webhook.ErrTimestamp},
				{0, -webhook.ToleranceDefault, nil},
				{0, -webhook.ToleranceDefault - time.Second, webhook.ErrTimestamp},
				{0, 72 * time.Hour, webhook.ErrTimestamp},
				{10 * time.Minute, 10 * time.Minute, nil},
				{10 * time.Minute, 10*time.Minute + time.Second, webhook.ErrTimestamp},
				{time.Minute, 2 * time.Minute, webhook.ErrTimestamp},
			} {
				s := newScheme(t, f, f.secrets[0])
				s.Tolerance = c.tolerance
				s.Now = fixedClock(signedAt.Add(c.skew))
				err := s.Verify(signed(t, f, f.secrets[0], "evt_7", body, signedAt), body)
				if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
					t.Errorf("tolerance %v, received %v after signing: %v, want %v", c.tolerance, c.skew, err, c.want)
				}
			}
			// An old delivery signed with another secret is a bad signature,
			// not a bad timestamp: ErrTimestamp is for authentic deliveries.
			s := newScheme(t, f, f.secrets[0])
			s.Now = fixedClock(signedAt.Add(time.Hour))
			if err := s.Verify(signed(t, f, f.secrets[2], "evt_7", body, signedAt), body); !errors.Is(err, webhook.ErrSignature) {
				t.Fatalf("old and unknown: %v, want ErrSignature", err)
			}
		})
	}
}

// TestSeveralSignatures: providers rotating a secret send one signature per
// secret; one matching signature among others is enough, and none is not.
func TestSeveralSignatures(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_750_000_000, 0)
	body := []byte(`{"id":"evt_9"}`)
	ts := strconv.FormatInt(now.Unix(), 10)

	std := newScheme(t, fixtures[0], fixtures[0].secrets[1])
	std.Now = fixedClock(now)
	sig := func(secret string) string {
		return base64.StdEncoding.EncodeToString(hmacSHA256(whsecKey(t, secret), []byte("msg_9."+ts+"."), body))
	}
	for header, want := range map[string]error{
		"v1," + sig(fixtures[0].secrets[0]) + " v1," + sig(fixtures[0].secrets[1]):      nil,
		"v1a,c2lnbmF0dXJl v2," + sig(fixtures[0].secrets[1]) + " v1,bm90IGl0":           webhook.ErrSignature,
		"v1a,c2lnbmF0dXJl  v1," + sig(fixtures[0].secrets[1]):                           nil,
		"v1," + sig(fixtures[0].secrets[0]):                                             webhook.ErrSignature,
		"v1a," + sig(fixtures[0].secrets[1]):                                            webhook.ErrSignature,
		"v1," + sig(fixtures[0].secrets[1])[:20] + " v1," + sig(fixtures[0].secrets[2]): webhook.ErrSignature,
	} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("webhook-id", "msg_9")
		r.Header.Set("webhook-timestamp", ts)
		r.Header.Set("webhook-signature", header)
		if err := std.Verify(r, body); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("standard %q: %v, want %v", header, err, want)
		}
	}

	stripe := newScheme(t, fixtures[2], fixtures[2].secrets[1])
	stripe.Now = fixedClock(now)
	v1 := func(secret string) string {
		return hex.EncodeToString(hmacSHA256([]byte(secret), []byte(ts+"."), body))
	}
	for header, want := range map[string]error{
		"t=" + ts + ",v1=" + v1(fixtures[2].secrets[0]) + ",v1=" + v1(fixtures[2].secrets[1]): nil,
		"v1=" + v1(fixtures[2].secrets[1]) + ", t=" + ts:                                      nil,
		"t=" + ts + ",v0=" + v1(fixtures[2].secrets[1]):                                       webhook.ErrSignature,
		"t=" + ts + ",v1=" + v1(fixtures[2].secrets[0]):                                       webhook.ErrSignature,
		"t=" + ts + ",t=" + ts + ",v1=" + v1(fixtures[2].secrets[1]):                          webhook.ErrSignature,
		"t=" + ts + "0,v1=" + v1(fixtures[2].secrets[1]):                                      webhook.ErrSignature,
		"t=+" + ts + ",v1=" + v1(fixtures[2].secrets[1]):                                      webhook.ErrSignature,
		"v1=" + v1(fixtures[2].secrets[1]):                                                    webhook.ErrSignature,
	} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Stripe-Signature", header)
		if err := stripe.Verify(r, body); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("stripe %q: %v, want %v", header, err, want)
		}
	}

	// A signature header sent twice is refused, whatever it holds.
	gh := newScheme(t, fixtures[1], fixtures[1].secrets[0])
	r := signed(t, fixtures[1], fixtures[1].secrets[0], "d-1", body, now)
	r.Header.Add("X-Hub-Signature-256", r.Header.Get("X-Hub-Signature-256"))
	if err := gh.Verify(r, body); !errors.Is(err, webhook.ErrSignature) {
		t.Fatalf("repeated header: %v, want ErrSignature", err)
	}
}

// TestConstructorsValidate: a scheme needs secrets, none empty; a Standard
// Webhooks secret must be base64; the error names the secret's position,
// never its value.
func TestConstructorsValidate(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures {
		if _, err := f.scheme(); !errors.Is(err, webhook.ErrInvalidConfig) {
			t.Errorf("%s without a secret: %v", f.name, err)
		}
		if _, err := f.scheme(f.secrets[0], ""); !errors.Is(err, webhook.ErrInvalidConfig) {
			t.Errorf("%s with an empty secret: %v", f.name, err)
		}
	}
	_, err := webhook.StandardWebhooks("whsec_not*base64*secret-value")
	if !errors.Is(err, webhook.ErrInvalidConfig) || strings.Contains(err.Error(), "secret-value") {
		t.Fatalf("bad base64: %v", err)
	}
	if _, err := webhook.StandardWebhooks("whsec_"); !errors.Is(err, webhook.ErrInvalidConfig) {
		t.Fatalf("empty key: %v", err)
	}
}

// fuzzVerify runs the fuzz body shared by the schemes: Verify never panics,
// and accepts a delivery only if its signature header holds, as a token of
// its own, the genuine signature of this body (want, computed here).
func fuzzVerify(t *testing.T, s *webhook.Scheme, r *http.Request, body []byte, accepted func() bool) {
	err := s.Verify(r, body)
	if err == nil && !accepted() {
		t.Fatalf("accepted a delivery without the body's signature: %q %q", r.Header, body)
	}
	if err != nil && !errors.Is(err, webhook.ErrSignature) && !errors.Is(err, webhook.ErrTimestamp) {
		t.Fatalf("error %v matches neither ErrSignature nor ErrTimestamp", err)
	}
}

func FuzzStandardWebhooksHeader(f *testing.F) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", []byte(`{"test": 2432232314}`))
	f.Add("msg_1", "1614265330", "v1a,abc v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,", []byte(`{}`))
	f.Add("msg_1.2", "+1614265330", "v1,,v1,=", []byte(nil))
	f.Add("", "", "", []byte("x"))
	s, err := webhook.StandardWebhooks(secret)
	if err != nil {
		f.Fatal(err)
	}
	s.Now = fixedClock(time.Unix(1614265330, 0))
	key := whsecKey(f, secret)
	f.Fuzz(func(t *testing.T, id, ts, sigs string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header["Webhook-Id"] = []string{id}
		r.Header["Webhook-Timestamp"] = []string{ts}
		r.Header["Webhook-Signature"] = []string{sigs}
		want := "v1," + base64.StdEncoding.EncodeToString(hmacSHA256(key, []byte(id+"."+ts+"."), body))
		fuzzVerify(t, s, r, body, func() bool {
			for _, tok := range strings.Split(sigs, " ") {
				if tok == want {
					return true
				}
			}
			return false
		})
	})
}

func FuzzStripeHeader(f *testing.F) {
	const secret = "whsec_current0stripe0signing0secret"
	body := []byte(`{"id":"evt_1","object":"event"}`)
	good := "t=1750000000,v1=" + hex.EncodeToString(hmacSHA256([]byte(secret), []byte("1750000000."), body))
	f.Add(good, body)
	f.Add(good+",v0=00,t=1", body)
	f.Add("t=1750000000,v1=,v1=zz,t", []byte(nil))
	f.Add(",,=,t==,v1==", []byte("{}"))
	s, err := webhook.Stripe(secret)
	if err != nil {
		f.Fatal(err)
	}
	s.Now = fixedClock(time.Unix(1_750_000_000, 0))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header["Stripe-Signature"] = []string{header}
		fuzzVerify(t, s, r, body, func() bool {
			// Some t= element's value and some v1= element's must be the
			// genuine signature of that timestamp and this body.
			var ts, sigs []string
			for _, part := range strings.Split(header, ",") {
				k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
				switch k {
				case "t":
					ts = append(ts, v)
				case "v1":
					sigs = append(sigs, strings.ToLower(v))
				}
			}
			for _, tv := range ts {
				want := hex.EncodeToString(hmacSHA256([]byte(secret), []byte(tv+"."), body))
				for _, sig := range sigs {
					if sig == want {
						return true
					}
				}
			}
			return false
		})
	})
}

func FuzzGitHubHeader(f *testing.F) {
	const secret = "It's a Secret to Everybody"
	f.Add("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", []byte("Hello, World!"))
	f.Add("sha256=757107EA0EB2509FC211221CCE984B8A37570B6D7586C22C46F4379C8B043E17", []byte("Hello, World!"))
	f.Add("sha1=757107ea0eb2509fc211221cce984b8a37570b6d", []byte("Hello, World!"))
	f.Add("sha256=", []byte(nil))
	s, err := webhook.GitHub(secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header["X-Hub-Signature-256"] = []string{header}
		want := "sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), body))
		accepted := strings.EqualFold(header, want) && strings.HasPrefix(header, "sha256=")
		err := s.Verify(r, body)
		if (err == nil) != accepted {
			t.Fatalf("header %q, body %q: Verify %v, want accepted=%v", header, body, err, accepted)
		}
		fuzzVerify(t, s, r, body, func() bool { return accepted })
	})
}

func FuzzShopifyHeader(f *testing.F) {
	const secret = "shpss_current_client_secret"
	body := []byte(`{"id":820982911946154508,"email":"jon@example.com"}`)
	f.Add(base64.StdEncoding.EncodeToString(hmacSHA256([]byte(secret), body)), body)
	f.Add("", []byte(nil))
	f.Add("=====", []byte("{}"))
	f.Add(base64.RawStdEncoding.EncodeToString(hmacSHA256([]byte(secret), body)), body)
	s, err := webhook.Shopify(secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header["X-Shopify-Hmac-Sha256"] = []string{header}
		fuzzVerify(t, s, r, body, func() bool {
			got, err := base64.StdEncoding.DecodeString(header)
			return err == nil && hmac.Equal(got, hmacSHA256([]byte(secret), body))
		})
	})
}
