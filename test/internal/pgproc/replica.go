package pgproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Pair is a primary and its streaming standby, two private servers made as
// in Start, for failover tests:
//
//   - The primary has synchronous_standby_names naming the standby (FIRST 1)
//     and synchronous_commit on (the default): a commit is acknowledged
//     only once the standby has flushed its WAL to disk, so a commit the
//     primary acknowledged survives the primary's loss on the standby.
//     synchronous_commit=remote_apply would also wait until the standby has
//     applied it (read-your-writes on the standby); a failover does not
//     need that: promotion replays all the WAL flushed before the standby
//     accepts writes. With Async, the primary does not wait for the
//     standby (what a commit acknowledged in between is worth is shown by
//     TestAsyncFailoverLosesAcknowledgedCommits).
//   - The standby is made by pg_basebackup from the primary (hot_standby:
//     it takes read-only sessions) and streams the primary's WAL under the
//     application_name "standby-N".
//
// Failover kills the primary (SIGKILL, the whole process group) and
// promotes the standby, which then runs without a synchronous standby (as
// an HA manager does while it has only one server: writes go on); Rebuild
// makes the dead primary a new synchronous standby of the promoted one.
// URL names both servers with target_session_attrs=read-write: a client
// connects to whichever one takes writes.
type Pair struct {
	tb    testing.TB
	async bool

	mu               sync.Mutex
	primary, standby *Server
	all              []*Server // every server the pair made
	serial           int       // standbys made
}

// PairConfig configures StartPair.
type PairConfig struct {
	// Async leaves synchronous_standby_names empty: the primary acknowledges
	// a commit before the standby has it.
	Async bool
}

// StartPair starts a primary, makes a standby of it with pg_basebackup and
// waits until the standby streams (synchronously, unless cfg.Async). At
// cleanup both servers are stopped and their folders removed. A nil cfg
// means the zero PairConfig.
func StartPair(tb testing.TB, cfg *PairConfig) *Pair {
	tb.Helper()
	if cfg == nil {
		cfg = &PairConfig{}
	}
	p := &Pair{tb: tb, async: cfg.Async}
	p.primary = start(tb, primaryArgs...)
	p.all = []*Server{p.primary}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	standby, err := p.newStandby(ctx, p.primary, nil)
	if err != nil {
		tb.Fatal(err)
	}
	p.standby = standby
	return p
}

// primaryArgs are the replication settings of every server of a pair (a
// standby may become a primary). wal_level=replica, max_wal_senders=10 and
// hot_standby=on are PostgreSQL's defaults, stated here because a pair needs
// them.
var primaryArgs = []string{
	"-c", "wal_level=replica", "-c", "max_wal_senders=10", "-c", "hot_standby=on",
	"-c", "wal_keep_size=64MB", "-c", "synchronous_commit=on",
}

// Primary returns the server that takes writes.
func (p *Pair) Primary() *Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.primary
}

// Standby returns the standby, or nil after Failover until Rebuild.
func (p *Pair) Standby() *Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.standby
}

// URL returns a multi-host connection URL naming the first primary and the
// first standby (in that order; their ports stay theirs whatever their role)
// with target_session_attrs=read-write: pgx tries the hosts in turn and
// keeps the first connection whose server takes writes.
func (p *Pair) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return MultiHostURL(p.primary, p.standby)
}

// MultiHostURL is the read-write URL of servers, in order.
func MultiHostURL(servers ...*Server) string {
	hosts := ""
	for i, s := range servers {
		if i > 0 {
			hosts += ","
		}
		hosts += "127.0.0.1:" + strconv.Itoa(s.port)
	}
	return "postgres://postgres@" + hosts + "/postgres?sslmode=disable&connect_timeout=10&target_session_attrs=read-write"
}

// Failover kills the primary with SIGKILL (the postmaster and every
// backend: like a machine that loses its power) and promotes the standby
// (pg_promote, waiting until it takes writes). The promoted server then has
// no standby: Rebuild gives it one.
func (p *Pair) Failover(ctx context.Context) error { return p.FailoverAfter(ctx, 0) }

// FailoverAfter is Failover with a pause between the kill and the
// promotion: the time an operator or a failover manager takes to notice,
// during which no server takes writes.
func (p *Pair) FailoverAfter(ctx context.Context, pause time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby == nil {
		return errors.New("pgproc: failover without a standby")
	}
	if err := p.primary.Kill(); err != nil {
		return err
	}
	if pause > 0 {
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if err := p.standby.Promote(ctx); err != nil {
		return err
	}
	p.primary, p.standby = p.standby, nil
	return nil
}

// Rebuild makes the server that lost its primary role (killed by Failover)
// a standby of the current primary: its data folder is made again with
// pg_basebackup, it starts on its old port, and the primary waits for it
// (synchronously, unless the pair is Async).
func (p *Pair) Rebuild(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby != nil {
		return errors.New("pgproc: rebuild while the pair has a standby")
	}
	old := p.otherLocked()
	if old == nil {
		return errors.New("pgproc: no server to rebuild")
	}
	if err := old.Stop(ctx, Immediate); err != nil {
		return err
	}
	if err := os.RemoveAll(old.data); err != nil {
		return fmt.Errorf("pgproc: remove %s: %w", old.data, err)
	}
	s, err := p.newStandby(ctx, p.primary, old)
	if err != nil {
		return err
	}
	p.standby = s
	return nil
}

// otherLocked returns the server of the pair that is neither primary nor
// standby: the one Failover killed.
func (p *Pair) otherLocked() *Server {
	for _, s := range p.all {
		if s != p.primary && s != p.standby {
			return s
		}
	}
	return nil
}

// newStandby makes a standby of primary: in reuse's folder and port when
// reuse is not nil, else in a new server's. It starts it, then names it in
// the primary's synchronous_standby_names and waits until the primary
// reports it streaming (as "sync" unless the pair is Async).
func (p *Pair) newStandby(ctx context.Context, primary, reuse *Server) (*Server, error) {
	p.serial++
	name := "standby-" + strconv.Itoa(p.serial)
	s := reuse
	if s == nil {
		s = newServer(p.tb)
		p.all = append(p.all, s)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", primary.port, name)
	s.args = append(append([]string{}, primaryArgs...), "-c", "primary_conninfo="+conninfo, "-c", "cluster_name="+name)
	// -X stream: the WAL written during the copy comes along; -c fast: an
	// immediate checkpoint on the primary; -N: no fsync of the copy (the
	// server itself runs with fsync on).
	bb := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
		"-U", "postgres", "-D", s.data, "-X", "stream", "-c", "fast", "-N")
	s.as(bb)
	t0 := time.Now()
	if out, err := bb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgproc: pg_basebackup from port %d: %v\n%s", primary.port, err, out)
	}
	signal := filepath.Join(s.data, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return nil, fmt.Errorf("pgproc: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(signal, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgproc: %w", err)
		}
	}
	t1 := time.Now()
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	t2 := time.Now()
	sync := ""
	if !p.async {
		sync = `FIRST 1 ("` + name + `")`
	}
	if err := primary.setSync(ctx, sync); err != nil {
		return nil, err
	}
	want := "sync"
	if p.async {
		want = "async"
	}
	if err := primary.waitReplica(ctx, name, want); err != nil {
		return nil, fmt.Errorf("%w; standby log: %s", err, s.LogTail())
	}
	p.tb.Logf("pgproc: %s on port %d streams from port %d: pg_basebackup %s, start %s, streaming %s", name, s.port, primary.port,
		t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
	return s, nil
}

// setSync sets the server's synchronous_standby_names (ALTER SYSTEM, so that
// it stays through a restart) and reloads its configuration.
func (s *Server) setSync(ctx context.Context, names string) error {
	return s.exec(ctx, func(conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+quoteLiteral(names)); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, `SELECT pg_reload_conf()`)
		return err
	})
}

// waitReplica waits until the server reports the standby name streaming
// with the sync_state want ("sync" or "async").
func (s *Server) waitReplica(ctx context.Context, name, want string) error {
	var last string
	for {
		err := s.exec(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SELECT coalesce((SELECT state || '/' || sync_state FROM pg_stat_replication
				WHERE application_name = $1), 'absent')`, name).Scan(&last)
		})
		if err == nil && last == "streaming/"+want {
			return nil
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgproc: standby %s not streaming (%s) on port %d: %s (%w)", name, want, s.port, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote ends the standby's recovery (pg_promote, as pg_ctl promote does)
// and waits until it takes writes.
func (s *Server) Promote(ctx context.Context) error {
	err := s.exec(ctx, func(conn *pgx.Conn) error {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("pg_promote returned false: not promoted within 60s")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgproc: promote the server on port %d: %w; log: %s", s.port, err, s.LogTail())
	}
	return nil
}

// InRecovery reports whether the server is a standby (pg_is_in_recovery).
func (s *Server) InRecovery(ctx context.Context) (bool, error) {
	var in bool
	err := s.exec(ctx, func(conn *pgx.Conn) error { return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in) })
	return in, err
}

// exec runs f on a connection of its own to the server.
func (s *Server) exec(ctx context.Context, f func(*pgx.Conn) error) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, s.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

// quoteLiteral quotes s as an SQL string literal (ALTER SYSTEM takes no
// parameters).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
