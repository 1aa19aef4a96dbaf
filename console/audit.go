package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/migrate"
)

// Audit outcomes.
const (
	outcomeStarted = "started"
	outcomeDone    = "done"
	outcomeFailed  = "failed"
)

// AuditEntry is one action taken in the console.
type AuditEntry struct {
	ID         int64      `json:"id"`
	At         time.Time  `json:"at"`
	Principal  string     `json:"principal"`
	RemoteAddr string     `json:"remote_addr"`
	Action     string     `json:"action"`
	Target     string     `json:"target"`
	Outcome    string     `json:"outcome"`
	Detail     string     `json:"detail"`
	FinishedAt *time.Time `json:"finished_at"`
}

// auditLog writes and reads the audit table (migrate.Tables.ConsoleAudit),
// the console's own.
type auditLog struct {
	begin, finish, byKey, list string
}

func newAuditLog(t migrate.Tables) *auditLog {
	table := pgx.Identifier{t.Schema, t.ConsoleAudit}.Sanitize()
	cols := `id, at, principal, remote_addr, action, target, outcome, detail, finished_at`
	return &auditLog{
		begin: `INSERT INTO ` + table + ` (principal, remote_addr, action, target, form_key)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (form_key) DO NOTHING RETURNING id`,
		finish: `UPDATE ` + table + ` SET outcome = $2, detail = $3, finished_at = now() WHERE id = $1`,
		byKey:  `SELECT ` + cols + ` FROM ` + table + ` WHERE form_key = $1`,
		list:   `SELECT ` + cols + ` FROM ` + table + ` ORDER BY id DESC LIMIT $1`,
	}
}

// errNoAuditTable means the audit table is missing: actions are refused.
var errNoAuditTable = errors.New("no console audit table: run idemkit migrate up (every action is audited, so none is taken)")

func auditErr(err error) error {
	if errors.Is(pgexec.NotMigrated(errNoAuditTable, err), errNoAuditTable) {
		return errNoAuditTable
	}
	return fmt.Errorf("audit: %w", err)
}

// start records an action about to be taken under the form key. A form
// key already recorded returns that entry and fresh false: the form was
// submitted before, and the action must not run again.
func (a *auditLog) start(ctx context.Context, db pgexec.DB, e AuditEntry, key string) (id int64, prev *AuditEntry, err error) {
	err = db.QueryRow(ctx, a.begin, e.Principal, e.RemoteAddr, e.Action, e.Target, key).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		rows, qerr := db.Query(ctx, a.byKey, key)
		if qerr != nil {
			return 0, nil, auditErr(qerr)
		}
		p, qerr := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[AuditEntry])
		if qerr != nil {
			return 0, nil, auditErr(qerr)
		}
		return p.ID, &p, nil
	}
	if err != nil {
		return 0, nil, auditErr(err)
	}
	return id, nil, nil
}

// end records an action's outcome. It runs even when the request's
// context ended: the action may have happened.
func (a *auditLog) end(ctx context.Context, db pgexec.DB, id int64, actErr error, detail string) error {
	outcome := outcomeDone
	if actErr != nil {
		outcome, detail = outcomeFailed, actErr.Error()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := db.Exec(ctx, a.finish, id, outcome, detail); err != nil {
		return auditErr(err)
	}
	return nil
}

// recent returns the latest entries, newest first.
func (a *auditLog) recent(ctx context.Context, db pgexec.DB, limit int) ([]AuditEntry, error) {
	rows, err := db.Query(ctx, a.list, limit)
	if err != nil {
		return nil, auditErr(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AuditEntry])
	if err != nil {
		return nil, auditErr(err)
	}
	return out, nil
}

// actResult is what an action did, as its page and its JSON say.
type actResult struct {
	AuditID int64 `json:"audit_id"`
	// Duplicate is true when the form was submitted before: nothing was
	// done again, and Outcome and Detail are the first submission's.
	Duplicate bool   `json:"duplicate"`
	Outcome   string `json:"outcome"`
	Detail    string `json:"detail"`
}

// act records the action in the audit table under the form's key, runs do
// unless the key was recorded before, and records its outcome. Its error
// is the audit table's: then nothing was done. do's context ends after
// ActionTimeout, not when the request's does.
func (c *Console) act(r *http.Request, rq *request, key, action, target string,
	do func(ctx context.Context) (string, error)) (actResult, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), ActionTimeout)
	defer cancel()
	id, prev, err := c.audit.start(ctx, c.pool, AuditEntry{Principal: rq.principal.Name, RemoteAddr: remoteAddr(r),
		Action: action, Target: target}, key)
	if err != nil {
		return actResult{}, err
	}
	if prev != nil {
		return actResult{AuditID: id, Duplicate: true, Outcome: prev.Outcome, Detail: prev.Detail}, nil
	}
	detail, actErr := do(ctx)
	// An action's error may quote what it acted on (a handler's error
	// naming a card number): the page, the JSON and the audit table get it
	// redacted as the history's errors are.
	if actErr != nil {
		actErr = errors.New(c.red.Text(actErr.Error()))
	}
	res := actResult{AuditID: id, Outcome: outcomeDone, Detail: detail}
	if actErr != nil {
		res.Outcome, res.Detail = outcomeFailed, actErr.Error()
	}
	c.log.Info("console: action", "audit_id", id, "principal", rq.principal.Name, "action", action, "target", target,
		"outcome", res.Outcome)
	if err := c.audit.end(ctx, c.pool, id, actErr, detail); err != nil {
		c.log.Error("console: record an action's outcome", "audit_id", id, "err", err)
	}
	return res, nil
}

// auditData is the audit page's content.
type auditData struct {
	Entries []AuditEntry `json:"entries"`
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	entries, err := c.audit.recent(ctx, c.pool, 200)
	if err != nil {
		c.failErr(w, r, rq, "read the audit table", err)
		return
	}
	c.render(w, rq, http.StatusOK, "audit", "Audit", auditData{Entries: entries})
}
