package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idemkit/outbox"
)

// outboxData is the outbox page.
type outboxData struct {
	Table            string       `json:"table"`
	Missing          bool         `json:"missing"`
	Backlog          int64        `json:"backlog"`
	OldestAgeSeconds float64      `json:"oldest_age_seconds"`
	Held             int64        `json:"held"`
	DeadCount        int64        `json:"dead_count"`
	Dead             []deadOutbox `json:"dead"`
	// Limited is true when more dead messages exist than are listed.
	Limited bool       `json:"limited"`
	CLI     string     `json:"-"`
	Result  *actResult `json:"result,omitempty"`
}

// deadOutbox is one dead outbox message.
type deadOutbox struct {
	ID          string    `json:"id"`
	Destination string    `json:"destination"`
	Key         string    `json:"key"`
	Attempts    int       `json:"attempts"`
	Error       string    `json:"error"`
	BlockedBy   string    `json:"blocked_by,omitempty"`
	EnqueuedAt  time.Time `json:"enqueued_at"`
	DeadAt      time.Time `json:"dead_at"`
}

func (c *Console) outboxData(ctx context.Context) (*outboxData, error) {
	d := &outboxData{Table: c.tables.Outbox, Dead: []deadOutbox{}, CLI: deadOutboxCLI}
	st, err := c.outbox.Stats(ctx, c.pool)
	if errors.Is(err, outbox.ErrNotMigrated) {
		d.Missing = true
		return d, nil
	}
	if err != nil {
		return nil, err
	}
	s := outboxOf(d.Table, st)
	d.Backlog, d.OldestAgeSeconds, d.Held, d.DeadCount = s.Backlog, s.OldestAgeSeconds, s.Held, s.Dead
	msgs, err := c.deadOutbox(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		dest := m.Topic
		if m.Handler != "" {
			dest = "handler " + m.Handler
		}
		d.Dead = append(d.Dead, deadOutbox{ID: m.ID, Destination: dest, Key: c.red.Bytes(m.Key), Attempts: m.Attempts,
			Error: c.red.Text(m.Error), BlockedBy: m.BlockedBy, EnqueuedAt: m.EnqueuedAt.UTC(), DeadAt: m.DeadAt.UTC()})
	}
	d.Limited = len(msgs) >= deadOutboxLimit
	return d, nil
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	d, err := c.outboxData(ctx)
	if err != nil {
		c.failErr(w, r, rq, "read the outbox", err)
		return
	}
	c.render(w, rq, http.StatusOK, "outbox", "Outbox", d)
}

// outboxRetry requeues a dead message and the messages of its key held
// behind it (outbox.Store.Retry), once per form.
func (c *Console) outboxRetry(w http.ResponseWriter, r *http.Request, rq *request, key string) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	id := strings.TrimSpace(r.PostFormValue("id"))
	if id == "" {
		c.fail(w, r, rq, http.StatusBadRequest, "retry: no message ID")
		return
	}
	res, err := c.act(r, rq, key, "outbox.retry", c.tables.Outbox+" "+id, func(ctx context.Context) (string, error) {
		n, err := c.outbox.Retry(ctx, c.pool, id)
		if errors.Is(err, outbox.ErrNotFound) {
			return "", fmt.Errorf("message %s is not dead (retried or published meanwhile): nothing requeued", id)
		}
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("requeued %d message(s): %s and the messages of its key held behind it", n, id), nil
	})
	if err != nil {
		c.failErr(w, r, rq, "audit the retry", err)
		return
	}
	d, err := c.outboxData(ctx)
	if err != nil {
		c.failErr(w, r, rq, "read the outbox", err)
		return
	}
	d.Result = &res
	c.render(w, rq, http.StatusOK, "outbox", "Outbox", d)
}
