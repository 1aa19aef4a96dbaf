package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/migrate"
)

const stuckHelp = `Lists HTTP idempotency records still PROCESSING after their lease ended
(idemhttp.Store.FindStuck), longest overdue first: account, operation, key,
fencing token, lease end, overdue by, created. It only reads. Such records
are left by middlewares that hold keys with a record of their own
(idemhttp.Config.NoTx or NoLeaseTakeover); settling them is the job of your
Reconciler (idemhttp.Store.Reconcile). In the default transaction mode a
request in flight has no record: a crashed one frees its key at once.
-json prints a JSON array; overdue_seconds is now minus the lease end.`

// idemhttpCmd runs `idemkit idemhttp stuck` (see stuckHelp).
func idemhttpCmd(ctx context.Context, cmd *command, args []string, out io.Writer) error {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerDB(fs)
	table := fs.String("table", migrate.IdempotencyRecordsDefault, "records table")
	limit := fs.Int("limit", idemhttp.FindLimitDefault, "most records to list")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("idemhttp %s takes no arguments", sub)
	}
	if *limit <= 0 {
		return usagef("idemhttp %s: -limit must be at least 1, not %d", sub, *limit)
	}
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: c.schema, IdempotencyRecords: *table}})
	if err != nil {
		return usagef("%v", err)
	}
	pool, err := connectDB(ctx, c.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	stuck, err := store.FindStuck(ctx, pool, *limit)
	if err != nil {
		return c.dbErr(err)
	}
	now := time.Now()
	if *asJSON {
		type row struct {
			Account        string    `json:"account"`
			Operation      string    `json:"operation"`
			Key            string    `json:"key"`
			Token          int64     `json:"token"`
			LeaseEnded     time.Time `json:"lease_ended"`
			OverdueSeconds float64   `json:"overdue_seconds"`
			Created        time.Time `json:"created"`
		}
		rows := []row{}
		for _, r := range stuck {
			rows = append(rows, row{r.Account, r.Operation, r.Key, r.Token, r.LockedUntil.UTC(),
				now.Sub(r.LockedUntil).Seconds(), r.CreatedAt.UTC()})
		}
		return writeJSON(out, rows)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ACCOUNT\tOPERATION\tKEY\tTOKEN\tLEASE ENDED\tOVERDUE\tCREATED")
	for _, r := range stuck {
		fmt.Fprintf(w, "%q\t%q\t%q\t%d\t%s\t%s\t%s\n", r.Account, r.Operation, r.Key, r.Token,
			r.LockedUntil.UTC().Format(time.RFC3339), now.Sub(r.LockedUntil).Round(time.Second),
			r.CreatedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "%d stuck record(s)\n", len(stuck))
	return w.Flush()
}
