package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/webhook"
)

// providers send deliveries as Stripe and GitHub do: signed with the
// endpoint's secret, with their headers. forger signs like Stripe with a
// secret the service does not know.
type providers struct {
	stripe, github, forger *webhook.Scheme
	base                   string
	client                 *http.Client
}

func newProviders(sec secrets, base string, client *http.Client) (*providers, error) {
	stripe, err := webhook.Stripe(sec.stripe)
	if err != nil {
		return nil, err
	}
	github, err := webhook.GitHub(sec.github)
	if err != nil {
		return nil, err
	}
	forger, err := webhook.Stripe("whsec_" + rand.Text())
	if err != nil {
		return nil, err
	}
	return &providers{stripe: stripe, github: github, forger: forger, base: base, client: client}, nil
}

// answer is what the service answered a delivery.
type answer struct {
	status   int
	replayed bool
	what     string // the error code, or the status member of a 2xx body
}

func (a answer) String() string {
	s := fmt.Sprintf("%d %s", a.status, a.what)
	if a.replayed {
		s += " (replayed)"
	}
	return s
}

// post sends one delivery and reads its answer.
func (p *providers) post(ctx context.Context, path string, h http.Header, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+path, bytes.NewReader(body))
	if err != nil {
		return answer{what: err.Error()}
	}
	req.Header = h
	resp, err := p.client.Do(req)
	if err != nil {
		return answer{what: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v struct {
		Status string `json:"status"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &v)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(idemhttp.HeaderReplayed) == "true",
		what: v.Status + v.Error.Code}
}

// stripeEvent is a payment_intent.succeeded event as Stripe sends it.
func stripeEvent(id, order string, amount int64, pending int) []byte {
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "event", "api_version": "2024-06-20", "created": 1717171717, "livemode": false,
		"type": "payment_intent.succeeded", "pending_webhooks": pending,
		"request": map[string]any{"id": "req_" + id[4:], "idempotency_key": nil},
		"data": map[string]any{"object": map[string]any{
			"id": "pi_" + id[4:], "object": "payment_intent", "amount": amount, "currency": "eur",
			"status": "succeeded", "metadata": map[string]string{"order_id": order},
		}},
	})
	return b
}

// stripe delivers body as Stripe does, signed by signer at at.
func (p *providers) stripeDelivery(ctx context.Context, signer *webhook.Scheme, body []byte, at time.Time) answer {
	h := http.Header{}
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	_ = signer.Sign(h, body, at)
	return p.post(ctx, "/webhooks/stripe", h, body)
}

// pushEvent is a push event as GitHub sends it.
func pushEvent(repo, before, after, message string) []byte {
	b, _ := json.Marshal(map[string]any{
		"ref": "refs/heads/main", "before": before, "after": after,
		"repository":  map[string]any{"id": 186853002, "full_name": repo, "default_branch": "main"},
		"pusher":      map[string]string{"name": "octocat", "email": "octocat@github.com"},
		"head_commit": map[string]any{"id": after, "message": message},
	})
	return b
}

// githubDelivery delivers body as GitHub does, under delivery GUID guid;
// tamper changes the body after it was signed.
func (p *providers) githubDelivery(ctx context.Context, guid string, body []byte, tamper bool) answer {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "GitHub-Hookshot/7e1b2f4")
	h.Set("X-GitHub-Event", "push")
	h.Set("X-GitHub-Delivery", guid)
	h.Set("X-GitHub-Hook-ID", "492837465")
	_ = p.github.Sign(h, body, time.Time{})
	if tamper {
		body = bytes.Replace(body, []byte("octocat"), []byte("mallory"), 1)
	}
	return p.post(ctx, "/webhooks/github", h, body)
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = 0x40|b[6]&0x0f, 0x80|b[8]&0x3f
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// scenario is one run's names.
type scenario struct {
	run            string
	orderA, orderB string
}

// commit returns the SHA of the run's n-th pushed commit.
func (s scenario) commit(n int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s/%d", s.run, n))
	return hex.EncodeToString(h[:20])
}

// replay sends the deliveries, prints each answer against the one expected,
// and returns how many differed.
func (s scenario) replay(ctx context.Context, p *providers, out io.Writer) int {
	failed := 0
	expect := func(provider, what string, got answer, status int, replayed bool, code string) {
		mark := "ok"
		if got.status != status || got.replayed != replayed || got.what != code {
			mark, failed = fmt.Sprintf("WRONG, want %v", answer{status, replayed, code}), failed+1
		}
		fmt.Fprintf(out, "  %-7s %-62s → %-28s %s\n", provider, what, got, mark)
	}
	now := time.Now()
	evtA, evtB, evtC := "evt_"+s.run+"A1", "evt_"+s.run+"B2", "evt_"+s.run+"C3"
	fmt.Fprintln(out, "deliveries:")

	a := stripeEvent(evtA, s.orderA, 2500, 1)
	expect("stripe", evtA+": "+s.orderA+" paid", p.stripeDelivery(ctx, p.stripe, a, now), 200, false, "processed")
	// Stripe's retry after a timeout: signed anew, pending_webhooks counted anew.
	expect("stripe", evtA+" again (a retry)", p.stripeDelivery(ctx, p.stripe, stripeEvent(evtA, s.orderA, 2500, 0),
		now.Add(30*time.Second)), 200, true, "processed")
	b := stripeEvent(evtB, s.orderB, 1800, 1)
	expect("stripe", evtB+" signed with a secret the service does not know", p.stripeDelivery(ctx, p.forger, b, now),
		401, false, webhook.CodeSignatureInvalid)
	expect("stripe", evtB+" captured 10 minutes ago, sent again", p.stripeDelivery(ctx, p.stripe, b,
		now.Add(-10*time.Minute)), 401, false, webhook.CodeTimestampInvalid)
	expect("stripe", evtB+": "+s.orderB+" paid", p.stripeDelivery(ctx, p.stripe, b, now), 200, false, "processed")
	expect("stripe", evtA+" with another amount under the same ID", p.stripeDelivery(ctx, p.stripe,
		stripeEvent(evtA, s.orderA, 9999, 0), now), 422, false, idemhttp.CodeKeyReused)
	c := stripeEvent(evtC, "order-"+s.run+"-404", 700, 1)
	expect("stripe", evtC+": an order the service does not have", p.stripeDelivery(ctx, p.stripe, c, now),
		200, false, "failed")
	expect("stripe", evtC+" again (a retry)", p.stripeDelivery(ctx, p.stripe, c, now.Add(time.Minute)), 200, true, "failed")

	d1, d2 := uuid(), uuid()
	push1 := pushEvent("acme/shop", s.commit(0), s.commit(1), "Charge in cents")
	expect("github", "push "+s.commit(1)[:7]+", delivery "+d1[:8], p.githubDelivery(ctx, d1, push1, false), 200, false, "processed")
	expect("github", "delivery "+d1[:8]+" redelivered", p.githubDelivery(ctx, d1, push1, false), 200, true, "processed")
	push2 := pushEvent("acme/shop", s.commit(1), s.commit(2), "Round half to even")
	const copies = 20
	answers := make([]answer, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { answers[i] = p.githubDelivery(ctx, d2, push2, false) })
	}
	wg.Wait()
	counts := map[string]int{}
	for _, a := range answers {
		counts[a.String()]++
	}
	first := counts[answer{200, false, "processed"}.String()]
	others := counts[answer{409, false, idemhttp.CodeInFlight}.String()] + counts[answer{200, true, "processed"}.String()]
	mark := "ok"
	if first != 1 || first+others != copies {
		mark, failed = "WRONG, want one first answer, the others 409 or replayed", failed+1
	}
	var tally []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		tally = append(tally, fmt.Sprintf("%d× %s", counts[k], k))
	}
	fmt.Fprintf(out, "  %-7s %-62s → %s %s\n", "github", fmt.Sprintf("push %s, delivery %s: %d copies at once",
		s.commit(2)[:7], d2[:8], copies), strings.Join(tally, ", "), mark)
	expect("github", "delivery "+d2[:8]+" redelivered", p.githubDelivery(ctx, d2, push2, false), 200, true, "processed")
	expect("github", "a push whose body was changed after signing", p.githubDelivery(ctx, uuid(),
		pushEvent("acme/shop", s.commit(2), s.commit(3), "Add refunds"), true), 401, false, webhook.CodeSignatureInvalid)
	expect("github", "delivery "+d1[:8]+" with another body", p.githubDelivery(ctx, d1,
		pushEvent("acme/shop", s.commit(0), s.commit(9), "Force-pushed"), false), 422, false, idemhttp.CodeKeyReused)
	return failed
}
