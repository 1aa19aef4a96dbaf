package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/migrate"
)

const dailyEnableHelp = `Switches the schema's dedup store to the daily layout (dedup.Store.EnableDaily),
or, when it is daily already, changes the -keep-days and -ahead-days given. UUIDv7
message IDs dated from the day after tomorrow (UTC) on are then stored in a table
partitioned by their day,
and retention drops whole days (no row deletes, no bloat); every other ID stays in
the processed-messages table, where 'idemkit dedup purge' keeps deleting them.
Safe while consumers run (each is told by its next claim), and safe to run again
after a failure. Runners keep the partitions from then on (created -ahead-days
ahead, dropped past -keep-days) every PurgeInterval; 'idemkit dedup daily maintain'
does the same from cron. Keep -keep-days longer than the oldest message ID that can
still arrive (outbox messages requeued after days dead, dead letters replayed): a message
whose ID's day was dropped is refused, however fresh its delivery.`

const dailyStatusHelp = `Shows the schema's dedup layout and, when it is daily, its partitions with their
estimated rows.`

const dailyMaintainHelp = `Creates the daily partitions missing up to -ahead-days ahead of today and drops
those past -keep-days (dedup.Store.MaintainPartitions), as every runner does each
PurgeInterval. Does nothing with the flat layout.`

// dailyCmd runs `idemkit dedup daily enable|status|maintain`.
func dailyCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var c conn
	c.registerDB(fs)
	var keep, ahead int
	var asJSON bool
	switch sub {
	case "enable":
		fs.IntVar(&keep, "keep-days", 0, "days of partitions kept behind today (set it as your retention); -1 keeps them all; default: unchanged (none dropped for a new layout)")
		fs.IntVar(&ahead, "ahead-days", 0, "days of partitions created ahead of today, 1 to 366; default: unchanged (3 for a new layout)")
	default:
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 0:
		return usagef("dedup daily %s takes no arguments", sub)
	case keep < -1:
		return usagef("dedup daily enable: -keep-days must be -1 (keep all), 0 (unchanged) or a number of days, not %d", keep)
	case sub == "enable" && (ahead < 0 || ahead > 366):
		return usagef("dedup daily enable: -ahead-days must be within 1 to 366, not %d", ahead)
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
	defer func() { err = c.dbErr(err) }()
	switch sub {
	case "enable":
		l, err := store.EnableDaily(ctx, pool, dedup.DailyConfig{KeepDays: keep, AheadDays: ahead})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "daily layout: UUIDv7 IDs dated %s or later are stored by day; %s, %d day(s) created ahead\n",
			l.DailyFrom.Format(time.DateOnly), keptText(l.KeepDays), l.AheadDays)
		return nil
	case "maintain":
		ch, err := store.MaintainPartitions(ctx, pool)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(out, struct {
				Created []string `json:"created"`
				Dropped []string `json:"dropped"`
			}{dayList(ch.Created), dayList(ch.Dropped)})
		}
		fmt.Fprintf(out, "created %d partition(s) %s, dropped %d %s\n", len(ch.Created), strings.Join(dayList(ch.Created), " "),
			len(ch.Dropped), strings.Join(dayList(ch.Dropped), " "))
		return nil
	}
	// status
	l, err := store.Layout(ctx, pool)
	if err != nil {
		return err
	}
	parts, err := store.Partitions(ctx, pool)
	if err != nil {
		return err
	}
	rows, err := estimatedRows(ctx, pool, c.schema, parts)
	if err != nil {
		return err
	}
	if asJSON {
		type part struct {
			Day           string `json:"day"`
			Table         string `json:"table"`
			EstimatedRows int64  `json:"estimated_rows"`
		}
		v := struct {
			Layout    string `json:"layout"`
			DailyFrom string `json:"daily_from,omitempty"`
			KeepDays  int    `json:"keep_days"`
			AheadDays int    `json:"ahead_days"`
			Parts     []part `json:"partitions"`
		}{Layout: layoutName(l), KeepDays: l.KeepDays, AheadDays: l.AheadDays, Parts: []part{}}
		if !l.DailyFrom.IsZero() {
			v.DailyFrom = l.DailyFrom.Format(time.DateOnly)
		}
		for i, p := range parts {
			v.Parts = append(v.Parts, part{p.Day.Format(time.DateOnly), p.Name, rows[i]})
		}
		return writeJSON(out, v)
	}
	if l.DailyFrom.IsZero() {
		fmt.Fprintln(out, "layout: flat (every claim in the processed-messages table)")
		return nil
	}
	fmt.Fprintf(out, "layout: %s, UUIDv7 IDs dated %s or later stored by day; %s, %d day(s) created ahead\n",
		layoutName(l), l.DailyFrom.Format(time.DateOnly), keptText(l.KeepDays), l.AheadDays)
	for i, p := range parts {
		fmt.Fprintf(out, "  %s  %s  ~%d rows\n", p.Day.Format(time.DateOnly), p.Name, rows[i])
	}
	return nil
}

func layoutName(l dedup.Layout) string {
	switch {
	case l.Daily():
		return "daily"
	case !l.DailyFrom.IsZero():
		return "switching (finished by the next 'idemkit dedup daily maintain' or runner maintenance)"
	}
	return "flat"
}

func keptText(keep int) string {
	if keep == 0 {
		return "every partition kept"
	}
	return fmt.Sprintf("%d day(s) kept", keep)
}

func dayList(ds []time.Time) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Format(time.DateOnly)
	}
	return out
}

// estimatedRows reads the planner's row estimate of each partition (no
// scan): -1 when the table was never analyzed.
func estimatedRows(ctx context.Context, db dedup.DBTX, schema string, parts []dedup.Partition) ([]int64, error) {
	out := make([]int64, len(parts))
	for i, p := range parts {
		if err := db.QueryRow(ctx, `SELECT reltuples::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, schema, p.Name).Scan(&out[i]); err != nil {
			return nil, fmt.Errorf("partition %s: %w", p.Name, err)
		}
	}
	return out, nil
}
