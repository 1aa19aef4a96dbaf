package pgsession

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idemkit/internal/pgexec"
)

// Blocker is a session that holds a lock another session waits for.
type Blocker struct {
	PID uint32
	// State is pg_stat_activity's: "idle in transaction" for a transaction
	// whose client sends nothing (gone, or busy elsewhere).
	State string
	// Idle is how long the session has been in State.
	Idle time.Duration
	// Application is its application_name; Client its address ("" for a
	// Unix socket).
	Application, Client string
}

// Blockers returns the sessions that block the session pid (its backend
// process ID, pgconn.PgConn.PID), read through db: another connection.
func Blockers(ctx context.Context, db pgexec.DB, pid uint32) ([]Blocker, error) {
	rows, err := db.Query(ctx, `SELECT a.pid, coalesce(a.state, ''),
		coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - a.state_change), 0)::float8,
		coalesce(a.application_name, ''), coalesce(host(a.client_addr), '')
		FROM pg_catalog.pg_stat_activity a
		WHERE a.pid = ANY (pg_catalog.pg_blocking_pids($1))
		ORDER BY a.state_change`, int32(pid))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Blocker
	for rows.Next() {
		var (
			b    Blocker
			p    int32
			idle pgtype.Float8
		)
		if err := rows.Scan(&p, &b.State, &idle, &b.Application, &b.Client); err != nil {
			return nil, err
		}
		b.PID, b.Idle = uint32(p), time.Duration(idle.Float64*float64(time.Second))
		out = append(out, b)
	}
	return out, rows.Err()
}

// LockWaitMsg is the message of WatchLockWait's Warn.
const LockWaitMsg = "a statement waits for another session's lock; an orphaned transaction " +
	"(blocking_state idle in transaction) holds it until the server ends it or someone does: " +
	"SELECT pg_terminate_backend(blocking_pid)"

// WatchLockWait watches a statement that session pid runs: once it has
// run for threshold, it reads the sessions that block it through db (see
// Blockers) and, when there are any, logs one Warn with the first of them
// (blocking_pid, blocking_state, blocking_idle, blocking_application,
// blocking_client), how many there are and how long the statement has
// waited, with attrs. stop ends the watch and returns how long the
// statement ran and whether it was found waiting for a lock; it returns
// once the look-up, if one started, is over. Call stop when the statement
// returns. Until threshold nothing runs but a timer (time.AfterFunc): cheap
// enough for every claim.
func WatchLockWait(ctx context.Context, db pgexec.DB, pid uint32, threshold time.Duration, log *slog.Logger,
	attrs ...any) (stop func() (ran time.Duration, blocked bool)) {
	start := time.Now()
	w := &lockWatch{done: make(chan struct{})}
	lctx, cancel := context.WithCancel(ctx)
	w.t = time.AfterFunc(threshold, func() {
		defer close(w.done)
		bs, err := Blockers(lctx, db, pid)
		if err != nil {
			if lctx.Err() == nil {
				log.Debug("could not read the sessions that block a statement", "pid", pid, "err", err)
			}
			return
		}
		if len(bs) == 0 {
			return
		}
		w.blocked = true
		b := bs[0]
		log.Warn(LockWaitMsg, append([]any{"pid", pid, "waited", time.Since(start).Round(time.Millisecond),
			"blocking_pid", b.PID, "blocking_state", b.State, "blocking_idle", b.Idle.Round(time.Millisecond),
			"blocking_application", b.Application, "blocking_client", b.Client, "blockers", len(bs)}, attrs...)...)
	})
	return func() (time.Duration, bool) {
		ran := time.Since(start)
		if w.t.Stop() {
			cancel()
			return ran, false // never fired
		}
		cancel() // a look-up under way gives up
		<-w.done
		return ran, w.blocked
	}
}

type lockWatch struct {
	t       *time.Timer
	done    chan struct{}
	blocked bool // written before done closes
}
