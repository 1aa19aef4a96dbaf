package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// outboxCmd runs `idemkit outbox stats|dead|retry ID...`: the backlog, the
// dead messages with their errors, and requeueing dead messages (with the
// messages of their key held behind them).
func outboxCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerDB(fs)
	table := fs.String("table", "", "outbox table (default idemkit_outbox)")
	var asJSON bool
	var red redactor
	if sub != "retry" {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	if sub == "dead" {
		red.register(fs)
	}
	ids, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := red.init(fs); err != nil {
		return err
	}
	switch {
	case sub == "retry" && len(ids) == 0:
		return usagef("outbox retry takes the IDs of dead messages (see idemkit outbox dead)")
	case sub != "retry" && len(ids) != 0:
		return usagef("outbox %s takes no arguments", sub)
	}
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: c.schema, Outbox: *table}})
	if err != nil {
		return usagef("%v", err)
	}
	pool, err := connectDB(ctx, c.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { err = c.dbErr(err) }()
	switch sub {
	case "stats":
		st, err := store.Stats(ctx, pool)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(out, struct {
				Backlog          int64   `json:"backlog"`
				OldestAgeSeconds float64 `json:"oldest_age_seconds"`
				Dead             int64   `json:"dead"`
			}{st.Backlog, st.OldestAge.Seconds(), st.Dead})
		}
		fmt.Fprintf(out, "backlog %d (oldest waiting %s), dead %d\n", st.Backlog, st.OldestAge.Round(time.Millisecond), st.Dead)
	case "dead":
		dead, err := store.Dead(ctx, pool)
		if err != nil {
			return err
		}
		if asJSON {
			type row struct {
				ID         string    `json:"id"`
				Topic      string    `json:"topic,omitempty"`
				Handler    string    `json:"handler,omitempty"`
				Key        string    `json:"key"`
				Attempts   int       `json:"attempts"`
				Error      string    `json:"error"`
				BlockedBy  string    `json:"blocked_by,omitempty"`
				EnqueuedAt time.Time `json:"enqueued_at"`
				DeadAt     time.Time `json:"dead_at"`
			}
			rows := []row{}
			for _, p := range dead {
				rows = append(rows, row{p.ID, p.Topic, p.Handler, red.bytes(p.Key), p.Attempts, red.text(p.Error), p.BlockedBy,
					p.EnqueuedAt.UTC(), p.DeadAt.UTC()})
			}
			return writeJSON(out, rows)
		}
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tDESTINATION\tKEY\tATTEMPTS\tDEAD\tERROR")
		for _, p := range dead {
			dest := p.Topic
			if p.Handler != "" {
				dest = "handler " + p.Handler
			}
			why := short(red.text(p.Error), 80)
			if p.BlockedBy != "" {
				why = "behind " + p.BlockedBy
			}
			fmt.Fprintf(w, "%s\t%s\t%q\t%d\t%s\t%s\n", p.ID, dest, red.bytes(p.Key), p.Attempts,
				p.DeadAt.UTC().Format(time.RFC3339), why)
		}
		fmt.Fprintf(w, "%d dead message(s)\n", len(dead))
		return w.Flush()
	default:
		n, err := store.Retry(ctx, pool, ids...)
		if errors.Is(err, outbox.ErrNotFound) {
			return fmt.Errorf("none of %v is dead", ids)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "requeued %d message(s)\n", n)
	}
	return nil
}

const purgeHelp = `Deletes processed-message records older than -older-than, in bounded batches
(dedup.Store.Purge), for every consumer sharing the table. After it, a
redelivered message whose record was purged counts as new: keep the retention
longer than any redelivery or replay you expect.`

// dedupCmd runs `idemkit dedup purge -older-than D`: the retention purge of
// processed-message records, in bounded batches. After it, a redelivered
// message whose record was purged counts as new.
func dedupCmd(ctx context.Context, cmd *command, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerDB(fs)
	olderThan := fs.Duration("older-than", 0, "purge records processed more than this long ago (required, e.g. 168h)")
	batch := fs.Int("batch", dedup.PurgeBatchDefault, "rows per delete statement")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dedup purge takes no arguments")
	}
	if *olderThan <= 0 {
		return usagef("dedup purge needs -older-than, the retention (e.g. 168h): records older than that are deleted")
	}
	if *batch <= 0 {
		return usagef("dedup purge: -batch must be at least 1, not %d", *batch)
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: c.schema}})
	if err != nil {
		return usagef("%v", err)
	}
	pool, err := connectDB(ctx, c.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := store.Purge(ctx, pool, *olderThan, *batch)
	if err != nil {
		return c.dbErr(err)
	}
	fmt.Fprintf(out, "purged %d record(s) processed more than %s ago\n", n, *olderThan)
	return nil
}
