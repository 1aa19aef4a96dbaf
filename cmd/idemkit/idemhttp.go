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

// idemhttpCmd runs `idemkit idemhttp stuck`: it lists HTTP idempotency
// records still PROCESSING after their lease ended (idemhttp.Store.FindStuck),
// longest overdue first: account, operation, key, token, lease end, overdue
// by, created. It only reads. In transaction mode the next request with a
// listed key takes its record over; with idemhttp.Config.NoTx or
// NoLeaseTakeover, settling them is the job of your Reconciler
// (idemhttp.Store.Reconcile).
func idemhttpCmd(ctx context.Context, sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("idemhttp "+sub, flag.ContinueOnError)
	var c conn
	c.register(fs)
	table := fs.String("table", migrate.IdempotencyRecordsDefault, "records table")
	limit := fs.Int("limit", idemhttp.FindLimitDefault, "most records to list")
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
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Schema: c.schema, Table: *table})
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
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ACCOUNT\tOPERATION\tKEY\tTOKEN\tLEASE ENDED\tOVERDUE\tCREATED")
	now := time.Now()
	for _, r := range stuck {
		fmt.Fprintf(w, "%q\t%q\t%q\t%d\t%s\t%s\t%s\n", r.Account, r.Operation, r.Key, r.Token,
			r.LockedUntil.UTC().Format(time.RFC3339), now.Sub(r.LockedUntil).Round(time.Second),
			r.CreatedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "%d stuck record(s)\n", len(stuck))
	return w.Flush()
}
