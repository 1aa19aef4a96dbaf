package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// connectDB opens a pool on url and checks that the server answers.
func connectDB(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, cfg, err := openDB(ctx, url)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, dial)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s does not answer: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// openDB opens a pool on url without connecting: its first query does.
func openDB(ctx context.Context, url string) (*pgxpool.Pool, *pgxpool.Config, error) {
	if url == "" {
		return nil, nil, usagef("no database: pass -database or set IDEMKIT_DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, usagef("bad -database URL: %v", err)
	}
	cfg.ConnConfig.ConnectTimeout = dial
	// The command's sessions: a transaction left by a command whose
	// connection went silent is ended by the server, and both ends probe a
	// silent peer with TCP keepalives.
	cfg.ConnConfig.DialFunc = pgsession.Dialer(dial).DialContext
	cfg.AfterConnect = pgsession.AfterConnect(dial)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, cfg, nil
}

// waitDB opens a pool on url and waits, at most wait, for the server to
// answer: a server that is starting or briefly unreachable is waited out,
// and log says so.
func waitDB(ctx context.Context, url string, wait time.Duration, log *slog.Logger) (*pgxpool.Pool, error) {
	pool, cfg, err := openDB(ctx, url)
	if err != nil {
		return nil, err
	}
	w := &outage.Waiter{Op: "connect to PostgreSQL at " + cfg.ConnConfig.Host, Log: log, Max: wait}
	defer w.Stop()
	err = w.Do(ctx, func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, dial)
		defer cancel()
		return pool.Ping(pctx)
	})
	if err != nil {
		pool.Close()
		if errors.Is(err, retry.ErrOutage) {
			return nil, fmt.Errorf("PostgreSQL at %s did not answer within -wait %v: %w", cfg.ConnConfig.Host, wait, err)
		}
		return nil, fmt.Errorf("PostgreSQL at %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// migrateWaitDefault is how long migrate up waits for a server that is
// starting or cannot be reached.
const migrateWaitDefault = time.Minute

func migrateCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerDB(fs)
	var asJSON bool
	if sub == "status" {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	var wait time.Duration
	if sub == "up" {
		fs.DurationVar(&wait, "wait", migrateWaitDefault,
			"how long to wait for a PostgreSQL that is starting or cannot be reached, saying so on stderr (0: fail at once)")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	target := 0
	switch {
	case sub == "down" && len(pos) != 1:
		return usagef("migrate down takes the VERSION to go down to (0: all)")
	case sub == "down":
		if target, err = strconv.Atoi(pos[0]); err != nil || target < 0 {
			return usagef("migrate down: VERSION must be a number >= 0, not %q", pos[0])
		}
		if latest := slices.Max(migrate.Known()); target > latest {
			return usagef("migrate down: VERSION %d is above the latest version %d: there is nothing to go down to", target, latest)
		}
	case len(pos) != 0:
		return usagef("migrate %s takes no arguments", sub)
	case wait < 0:
		return usagef("-wait must not be negative, not %v", wait)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var pool *pgxpool.Pool
	if wait > 0 {
		pool, err = waitDB(ctx, c.database, wait, log)
	} else {
		pool, err = connectDB(ctx, c.database)
	}
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { err = c.dbErr(err) }()
	// Up waits out an outage during the migration too, until interrupted.
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: c.schema}, Logger: log})
	if err != nil {
		return err
	}
	switch sub {
	case "up":
		applied, err := m.Up(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "applied %v; schema %s is at version %d\n", applied, c.schema, m.Latest())
	case "down":
		reverted, err := m.Down(ctx, target)
		if err != nil {
			return err
		}
		v, err := m.Versions(ctx)
		if err != nil {
			return err
		}
		at := 0
		if len(v) > 0 {
			at = v[len(v)-1]
		}
		fmt.Fprintf(out, "reverted %v; schema %s is at version %d\n", reverted, c.schema, at)
	case "status":
		v, err := m.Versions(ctx)
		if err != nil {
			return err
		}
		if asJSON {
			var pending []int
			for _, k := range migrate.Known() {
				if !slices.Contains(v, k) {
					pending = append(pending, k)
				}
			}
			return writeJSON(out, struct {
				Schema  string `json:"schema"`
				Applied []int  `json:"applied"`
				Known   []int  `json:"known"`
				Pending []int  `json:"pending"`
			}{c.schema, nonNil(v), migrate.Known(), nonNil(pending)})
		}
		fmt.Fprintf(out, "schema %s: applied %v; this build knows %v\n", c.schema, v, migrate.Known())
	}
	return nil
}

// writeJSON prints v as indented JSON, as every -json does.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// nonNil makes a nil slice print as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
