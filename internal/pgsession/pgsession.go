// Package pgsession bounds how long PostgreSQL keeps a session whose client
// went silent: a transaction left open by a client that vanished (its FIN
// and RST lost to a NAT, a firewall or a partition) holds its locks until
// the server ends it, which with PostgreSQL's defaults
// (idle_in_transaction_session_timeout off, the OS's two-hour TCP
// keepalive) takes hours.
//
// Where idemkit owns a transaction it bounds it (BeginQuery: SET LOCAL
// idle_in_transaction_session_timeout); where it owns a session (a
// connection it took out of the pool, a pool it made) it sets the session's
// bounds and server-side TCP keepalives (SetSession, AfterConnect); on a
// pool a user passes it checks the user's settings once at start and logs
// a Warn naming those that are off (Check).
package pgsession

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemkit/internal/pgexec"
)

// Margin is added to a transaction's time budget (the longest its client
// may legitimately be idle inside it: a handler, a publish) to give its
// idle_in_transaction_session_timeout.
const Margin = 10 * time.Second

// The TCP keepalives of the sessions idemkit owns, on both ends: a peer
// that stopped answering is noticed after Idle + Interval*Count (30s).
const (
	KeepaliveIdle     = 15 * time.Second
	KeepaliveInterval = 5 * time.Second
	KeepaliveCount    = 3
)

// Timeout is the idle_in_transaction_session_timeout of a transaction
// whose client may be idle in it for budget: budget + Margin.
func Timeout(budget time.Duration) time.Duration { return max(budget, 0) + Margin }

func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// SetLocal returns the statement that bounds the current transaction:
// SET LOCAL idle_in_transaction_session_timeout to Timeout(budget). Send it
// right after BEGIN (in the same batch: it is one statement, for the
// extended protocol too).
func SetLocal(budget time.Duration) string {
	return "SET LOCAL idle_in_transaction_session_timeout = " + ms(Timeout(budget))
}

// BeginQuery returns the statement that begins a transaction (with
// isolation, e.g. "READ COMMITTED", or the session's when empty) and bounds
// it: SET LOCAL idle_in_transaction_session_timeout to Timeout(budget). It is
// meant for pgx.TxOptions.BeginQuery, which sends it in one round trip (the
// simple protocol runs both statements).
func BeginQuery(isolation string, budget time.Duration) string {
	begin := "BEGIN"
	if isolation != "" {
		begin += " ISOLATION LEVEL " + isolation
	}
	return begin + "; " + SetLocal(budget)
}

// SessionSQL is what SetSession runs: idle_in_transaction_session_timeout
// for a budget, and server-side TCP keepalives. When idle is positive, it
// also sets idle_session_timeout (PostgreSQL 14 and later; skipped before)
// to end a session that stays idle outside a transaction longer than idle:
// only for sessions that run a statement at least that often and hold
// session-level locks.
func SessionSQL(budget, idle time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "SET idle_in_transaction_session_timeout = %s; SET tcp_keepalives_idle = %d; "+
		"SET tcp_keepalives_interval = %d; SET tcp_keepalives_count = %d",
		ms(Timeout(budget)), int(KeepaliveIdle.Seconds()), int(KeepaliveInterval.Seconds()), KeepaliveCount)
	if idle > 0 {
		fmt.Fprintf(&b, "; SELECT pg_catalog.set_config('idle_session_timeout', '%s', false) "+
			"WHERE pg_catalog.current_setting('server_version_num')::int >= 140000", ms(idle))
	}
	return b.String()
}

// SetSession sets the bounds of SessionSQL on a connection idemkit owns.
func SetSession(ctx context.Context, conn *pgx.Conn, budget, idle time.Duration) error {
	if _, err := conn.Exec(ctx, SessionSQL(budget, idle)); err != nil {
		return fmt.Errorf("set session bounds: %w", err)
	}
	return nil
}

// AfterConnect returns a pgxpool AfterConnect for a pool idemkit makes:
// every session gets SessionSQL(budget, 0).
func AfterConnect(budget time.Duration) func(context.Context, *pgx.Conn) error {
	sql := SessionSQL(budget, 0)
	return func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("set session bounds: %w", err)
		}
		return nil
	}
}

// Dialer is a net.Dialer with the client-side TCP keepalives of
// idemkit's sessions, for pgconn.Config.DialFunc.
func Dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAliveConfig: net.KeepAliveConfig{Enable: true,
		Idle: KeepaliveIdle, Interval: KeepaliveInterval, Count: KeepaliveCount}}
}

// WarnMsg is the message of Check's Warn.
const WarnMsg = "PostgreSQL keeps a transaction whose client vanished open for hours with these settings: " +
	"set them for the pool's sessions (see docs/network-faults.md)"

// KeepaliveIdleMax is the longest tcp_keepalives_idle Off accepts.
const KeepaliveIdleMax = 5 * time.Minute

// Off names the settings of a pool's sessions that leave an abandoned
// session open: idle_in_transaction_session_timeout 0, and, on a TCP
// connection, a tcp_keepalives_idle longer than KeepaliveIdleMax (the OS's
// default is two hours on Linux).
func Off(ctx context.Context, db pgexec.DB) ([]string, error) {
	var idleInTxMS, keepIdleS int64
	var tcp bool
	err := db.QueryRow(ctx, `SELECT
		(SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'idle_in_transaction_session_timeout'),
		(SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'tcp_keepalives_idle'),
		pg_catalog.inet_server_addr() IS NOT NULL`).Scan(&idleInTxMS, &keepIdleS, &tcp)
	if err != nil {
		return nil, fmt.Errorf("read session settings: %w", err)
	}
	var off []string
	if idleInTxMS == 0 {
		off = append(off, "idle_in_transaction_session_timeout")
	}
	if tcp && (keepIdleS == 0 || time.Duration(keepIdleS)*time.Second > KeepaliveIdleMax) {
		off = append(off, "tcp_keepalives_idle")
	}
	return off, nil
}

// DialWarnMsg is the message of Check's Warn about a pool without
// connect_timeout.
const DialWarnMsg = "a connection dialled to a PostgreSQL server that accepts it and never answers waits for ever, " +
	"and keeps its place in the pool: set connect_timeout in the pool's URL (see docs/network-faults.md)"

// Check reads the settings of db's sessions (see Off) and logs one Warn
// naming those that are off, with component ("outbox relay orders"); when
// dial, the pool's connection settings, has no ConnectTimeout, it logs
// DialWarnMsg too. It returns the names of the settings that are off
// ("connect_timeout" for the latter). A failed read, or one without an
// answer within Margin, is logged at Debug and otherwise ignored: the
// caller's own loop meets and handles the outage.
func Check(ctx context.Context, db pgexec.DB, dial *pgconn.Config, log *slog.Logger, component string) []string {
	var off []string
	if dial != nil && dial.ConnectTimeout <= 0 {
		// pgxpool goes on dialling a connection whose Acquire gave up:
		// without a timeout of its own, one that never gets an answer
		// holds a place in the pool for good.
		log.Warn(DialWarnMsg, "component", component)
		off = append(off, "connect_timeout")
	}
	ctx, cancel := context.WithTimeout(ctx, Margin)
	defer cancel()
	server, err := Off(ctx, db)
	if err != nil {
		log.Debug("could not read the session settings", "component", component, "err", err)
		return off
	}
	if len(server) > 0 {
		log.Warn(WarnMsg, "component", component, "settings", strings.Join(server, ","))
	}
	return append(off, server...)
}
