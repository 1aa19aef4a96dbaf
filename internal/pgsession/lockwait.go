package pgsession

import (
	"context"
	"log/slog"
	"sync"
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

// LockWatch watches the statements of one goroutine, one at a time, for
// waiting on another session's lock: once a statement has run for
// Threshold, it reads the sessions that block it through DB (see Blockers)
// and, when there are any, logs one Warn with the first of them
// (blocking_pid, blocking_state, blocking_idle, blocking_application,
// blocking_client), how many there are and how long the statement has
// waited. Until Threshold nothing runs but one timer, reused from statement
// to statement: cheap enough for every claim. Its fields are set before
// the first Start.
type LockWatch struct {
	DB        pgexec.DB
	Threshold time.Duration
	Log       *slog.Logger

	t       *time.Timer
	wg      sync.WaitGroup // the look-up of the statement watched, if one started
	mu      sync.Mutex
	ctx     context.Context
	pid     uint32
	start   time.Time
	blocked bool
	cancel  context.CancelFunc // of the look-up under way
}

// Start watches the statement session pid runs from now on, until Stop.
func (w *LockWatch) Start(ctx context.Context, pid uint32) {
	w.mu.Lock()
	w.ctx, w.pid, w.start, w.blocked = ctx, pid, time.Now(), false
	w.mu.Unlock()
	w.wg.Add(1)
	if w.t == nil {
		w.t = time.AfterFunc(w.Threshold, w.fire)
	} else {
		w.t.Reset(w.Threshold)
	}
}

// Stop ends the watch of the statement Start began and returns how long it
// ran and whether it was found waiting for a lock; it returns once the
// look-up, if one started, is over (cancelled).
func (w *LockWatch) Stop() (ran time.Duration, blocked bool) {
	if w.t.Stop() {
		w.wg.Done() // never fired
		return time.Since(w.start), false
	}
	w.mu.Lock()
	if w.cancel != nil {
		w.cancel()
	}
	w.mu.Unlock()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.start), w.blocked
}

func (w *LockWatch) fire() {
	defer w.wg.Done()
	w.mu.Lock()
	ctx, cancel := context.WithCancel(w.ctx)
	w.cancel = cancel
	pid, start := w.pid, w.start
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancel = nil
		w.mu.Unlock()
		cancel()
	}()
	bs, err := Blockers(ctx, w.DB, pid)
	if err != nil {
		if ctx.Err() == nil {
			w.Log.Debug("could not read the sessions that block a statement", "pid", pid, "err", err)
		}
		return
	}
	if len(bs) == 0 {
		return
	}
	w.mu.Lock()
	w.blocked = true
	w.mu.Unlock()
	b := bs[0]
	w.Log.Warn(LockWaitMsg, "pid", pid, "waited", time.Since(start).Round(time.Millisecond),
		"blocking_pid", b.PID, "blocking_state", b.State, "blocking_idle", b.Idle.Round(time.Millisecond),
		"blocking_application", b.Application, "blocking_client", b.Client, "blockers", len(bs))
}
