package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// stuckData is the HTTP idempotency page: the records still PROCESSING
// after their lease (idemhttp.Store.FindStuck), as idemkit idemhttp stuck
// lists them.
type stuckData struct {
	Table   string        `json:"table"`
	Missing bool          `json:"missing"`
	Records []stuckRecord `json:"records"`
	Limit   int           `json:"limit"`
	Result  *actResult    `json:"result,omitempty"`
}

type stuckRecord struct {
	Account        string    `json:"account"`
	Operation      string    `json:"operation"`
	Key            string    `json:"key"`
	Token          int64     `json:"token"`
	LeaseEnded     time.Time `json:"lease_ended"`
	OverdueSeconds float64   `json:"overdue_seconds"`
	Created        time.Time `json:"created"`
}

// Overdue says how long ago the lease ended.
func (s stuckRecord) Overdue() time.Duration { return secs(s.OverdueSeconds) }

func (c *Console) stuck(ctx context.Context) (*stuckData, error) {
	d := &stuckData{Table: c.tables.IdempotencyRecords, Records: []stuckRecord{}, Limit: idemhttp.FindLimitDefault}
	recs, err := c.idem.FindStuck(ctx, c.pool, d.Limit)
	if errors.Is(err, idemhttp.ErrNotMigrated) {
		d.Missing = true
		return d, nil
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, r := range recs {
		d.Records = append(d.Records, stuckRecord{Account: r.Account, Operation: r.Operation, Key: r.Key, Token: r.Token,
			LeaseEnded: r.LockedUntil.UTC(), OverdueSeconds: now.Sub(r.LockedUntil).Seconds(), Created: r.CreatedAt.UTC()})
	}
	return d, nil
}

func (c *Console) idemhttpPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	d, err := c.stuck(ctx)
	if err != nil {
		c.failErr(w, r, rq, "read the idempotency records", err)
		return
	}
	c.render(w, rq, http.StatusOK, "idemhttp", "HTTP idempotency", d)
}

// idemhttpResolve settles one stuck record with AllowRetry or MarkFailed
// (idemhttp.Store.Resolve): only while it still has the token the page
// showed and is still PROCESSING or UNKNOWN, so that a record that moved
// on meanwhile (completed, released, taken over) is left alone.
func (c *Console) idemhttpResolve(w http.ResponseWriter, r *http.Request, rq *request, key string) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	f := r.PostForm
	token, err := strconv.ParseInt(f.Get("token"), 10, 64)
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, "resolve: token: want the record's fencing token, a whole number")
		return
	}
	var dec idemhttp.Decision
	switch f.Get("decision") {
	case "allow-retry":
		dec = idemhttp.AllowRetry
	case "mark-failed":
		dec = idemhttp.MarkFailed
	default:
		c.fail(w, r, rq, http.StatusBadRequest, "resolve: decision: want allow-retry or mark-failed, not "+strconv.Quote(f.Get("decision")))
		return
	}
	rec := idemhttp.Record{Account: f.Get("account"), Operation: f.Get("operation"), Key: f.Get("key"), Token: token}
	target := fmt.Sprintf("%s account=%q operation=%q key=%q token=%d", c.tables.IdempotencyRecords, rec.Account, rec.Operation, rec.Key, token)
	res, err := c.act(r, rq, key, "idemhttp."+f.Get("decision"), target, func(ctx context.Context) (string, error) {
		// The rules of idemkit idemhttp stuck: only a record still held with
		// the token shown, and past its lease (in flight is not stuck).
		cur, err := c.idem.Get(ctx, c.pool, rec.Account, rec.Operation, rec.Key)
		switch {
		case errors.Is(err, idemhttp.ErrNotFound):
			return "", errors.New("no such record (completed and expired, or released): nothing changed")
		case err != nil:
			return "", err
		case cur.Token != rec.Token:
			return "", errors.New("the record has another token now (taken over or reserved anew): nothing changed")
		case cur.State == idemhttp.StateProcessing && cur.LockedUntil.After(time.Now()):
			return "", errors.New("its lease has not ended: the request is in flight, not stuck; nothing changed")
		}
		ok, err := c.idem.Resolve(ctx, c.pool, rec, dec)
		switch {
		case err != nil:
			return "", err
		case !ok:
			return "", errors.New("the record moved on meanwhile (completed, released or taken over): left alone")
		}
		return dec.String() + " applied", nil
	})
	if err != nil {
		c.failErr(w, r, rq, "audit the resolution", err)
		return
	}
	d, err := c.stuck(ctx)
	if err != nil {
		c.failErr(w, r, rq, "read the idempotency records", err)
		return
	}
	d.Result = &res
	c.render(w, rq, http.StatusOK, "idemhttp", "HTTP idempotency", d)
}
