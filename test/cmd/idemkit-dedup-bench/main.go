// Command idemkit-dedup-bench measures the dedup store at scale:
// the processed-message table grown to each of -sizes records (spread over
// -consumers consumer names and 30 days of processed_at), then, at each
// size and for each table layout in turn (one interleaved run, medians of
// -rounds, each round starting with the next layout):
//
//   - claims/s with one message per transaction, sent as the consumer sends
//     it (BEGIN, the claim and the move of its position in one round trip,
//     then COMMIT), by -workers connections at once, each on its own partition;
//   - claims/s batched: -batch claims of one partition per transaction, as
//     the consumer's batches;
//   - the table's heap, its key index(es) and its processed_at index, and
//     bytes per record (the table with its indexes and TOAST, divided by
//     its rows);
//   - retention: a purge of the records older than 30 days × (1 - -purge),
//     about a -purge fraction of the table (one day of a 30-day retention by
//     default), with Store.Purge: its duration and WAL bytes, the dead rows
//     it leaves (bloat until vacuumed), and the VACUUM that reclaims them
//     (duration and WAL).
//
// Records are made in the database (generate_series; each load's records
// spread over the last 30 days in insertion order, as a table written by a
// consumer has them, so that a day's records share pages),
// with the table's indexes dropped during the load and built again after it,
// then VACUUM ANALYZE: the indexes are as compact as a fresh build makes
// them (a B-tree filled by random keys settles near 70% full, so production
// indexes run larger than these, for every layout alike).
//
// Usage: scripts/bench-dedup, which makes a private PostgreSQL cluster for
// it (the shared development server is never loaded with these tables):
//
//	scripts/bench-dedup [-sizes 1000000,10000000,50000000] [-rounds 3] …
//
// Or against a server of your own: go run ./cmd/idemkit-dedup-bench -url URL.
// The machine's load average is printed at each size: other work on the
// machine shows there.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/migrate"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-dedup-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	url       string
	sizes     []int64
	consumers int
	workers   int
	one       int
	batched   int
	batch     int
	rounds    int
	purge     float64
	layouts   []string
	churn     int
}

func run() error {
	var o options
	var sizes, layouts string
	flag.StringVar(&o.url, "url", os.Getenv("IDEMKIT_BENCH_DEDUP_URL"), "PostgreSQL URL (scripts/bench-dedup passes its private server)")
	flag.StringVar(&sizes, "sizes", "1000000,10000000,50000000", "records in the table at each measurement, ascending")
	flag.IntVar(&o.consumers, "consumers", 4, "consumer names the records are spread over")
	flag.IntVar(&o.workers, "workers", 4, "connections claiming at once")
	flag.IntVar(&o.one, "one", 3000, "one-message claims per round (all workers)")
	flag.IntVar(&o.batched, "batched", 50000, "batched claims per round (all workers)")
	flag.IntVar(&o.batch, "batch", 500, "claims per batched transaction")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds per size; each round runs every layout in turn")
	flag.Float64Var(&o.purge, "purge", 1.0/30, "fraction of the records the retention purge deletes")
	flag.StringVar(&layouts, "layouts", "uuid,daily", "table layouts to compare, of "+strings.Join(layoutNames(), ", ")+
		" (uuid: UUIDs stored as uuid; text: IDs that are no UUID, stored as text;"+
		" uuid-av: uuid with PostgreSQL's default autovacuum settings instead of the table's;"+
		" daily: UUIDv7 IDs in the daily-partitioned table, retention by dropping a day)")
	flag.IntVar(&o.churn, "churn", 0, "then, at the last size, this many days of churn: a day of new records, "+
		"the retention of the oldest day, and what autovacuum does meanwhile (table size, dead rows); 0: none")
	flag.Parse()
	if o.url == "" {
		return errors.New("no -url (run scripts/bench-dedup, which starts a private server)")
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n <= 0 || (len(o.sizes) > 0 && n < o.sizes[len(o.sizes)-1]) {
			return fmt.Errorf("-sizes %q: positive and ascending", sizes)
		}
		o.sizes = append(o.sizes, n)
	}
	o.layouts = strings.Split(layouts, ",")
	if o.workers < 1 || o.one < o.workers || o.batch < 1 || o.batched < o.batch || o.rounds < 1 || o.consumers < 1 ||
		o.purge <= 0 || o.purge >= 1 {
		return errors.New("bad -workers, -one, -batched, -batch, -rounds, -consumers or -purge")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, o.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&version); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s; %d workers; one-message %d and batched %d (×%d) claims per round; %d rounds; purge %.1f%%; %s\n",
		version, o.workers, o.one, o.batched, o.batch, o.rounds, 100*o.purge, loadavg())

	var vs []*variant
	for _, name := range o.layouts {
		v, err := newVariant(ctx, pool, name)
		if err != nil {
			return err
		}
		vs = append(vs, v)
	}
	defer func() {
		for _, v := range vs {
			_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+pgx.Identifier{v.schema}.Sanitize()+` CASCADE`)
		}
	}()

	var rows []result
	for _, size := range o.sizes {
		for _, v := range vs {
			start := time.Now()
			if err := v.grow(ctx, pool, size, o.consumers); err != nil {
				return fmt.Errorf("%s: grow to %d: %w", v.name, size, err)
			}
			fmt.Printf("%s: %d records in %s (%s)\n", v.name, size, time.Since(start).Round(time.Second), loadavg())
		}
		res := make([]result, len(vs))
		one := make([][]float64, len(vs))
		batched := make([][]float64, len(vs))
		for r := 0; r < o.rounds; r++ {
			// Each round starts with another layout: none always runs
			// right after the other's writes.
			order := make([]int, len(vs))
			for k := range order {
				order[k] = (k + r) % len(vs)
			}
			for _, i := range order {
				v := vs[i]
				rate, err := v.claimOne(ctx, pool, o)
				if err != nil {
					return fmt.Errorf("%s: one-message claims: %w", v.name, err)
				}
				one[i] = append(one[i], rate)
			}
			for _, i := range order {
				v := vs[i]
				rate, err := v.claimBatched(ctx, pool, o)
				if err != nil {
					return fmt.Errorf("%s: batched claims: %w", v.name, err)
				}
				batched[i] = append(batched[i], rate)
			}
		}
		for i, v := range vs {
			res[i] = result{size: size, layout: v.name, one: median(one[i]), batched: median(batched[i]), oneAll: one[i], batchedAll: batched[i]}
			if err := v.sizes(ctx, pool, &res[i]); err != nil {
				return fmt.Errorf("%s: sizes: %w", v.name, err)
			}
		}
		for i, v := range vs {
			if err := v.retention(ctx, pool, o.purge, &res[i]); err != nil {
				return fmt.Errorf("%s: retention: %w", v.name, err)
			}
		}
		for _, r := range res {
			fmt.Printf("  %-9s %11d records: one %7.0f/s %v, batched %7.0f/s %v, %.1f B/record\n", r.layout, r.records,
				r.one, round(r.oneAll), r.batched, round(r.batchedAll), r.perRecord)
		}
		fmt.Printf("  (%s)\n", loadavg())
		rows = append(rows, res...)
	}

	fmt.Println()
	fmt.Println("| records | layout | claims/s one-message | claims/s batched | heap MB | key index MB | processed_at index MB | bytes/record | purge rows | purge s | purge WAL MB | dead after purge | vacuum s | vacuum WAL MB |")
	fmt.Println("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %d | %.1f | %.1f | %.1f%% | %.1f | %.1f |\n",
			human(r.size), r.layout, r.one, r.batched, mb(r.heap), mb(r.keyIndex), mb(r.timeIndex), r.perRecord,
			r.purged, r.purgeTime.Seconds(), mb(r.purgeWAL), 100*r.deadFraction, r.vacuumTime.Seconds(), mb(r.vacuumWAL))
	}
	if len(rows) > 0 && len(vs) > 1 {
		fmt.Println()
		fmt.Printf("ratios %s / %s at each size: one-message, batched, bytes/record\n", vs[1].name, vs[0].name)
		for i := 0; i+1 < len(rows); i += len(vs) {
			a, b := rows[i], rows[i+1]
			fmt.Printf("  %s: %.2f×, %.2f×, %.2f×\n", human(a.size), b.one/a.one, b.batched/a.batched, b.perRecord/a.perRecord)
		}
	}
	if o.churn > 0 {
		if err := churn(ctx, pool, vs, o); err != nil {
			return err
		}
	}
	fmt.Printf("\n%s\n", loadavg())
	return nil
}

// churn runs o.churn days of a steady state at the last size, each layout
// in turn: a day's records (a thirtieth of the table) are claimed, the
// oldest day goes by retention (Purge, or dropping its partition), and
// autovacuum (woken every 5 s here) is given 60 s to run. Table sizes
// include the indexes, summed over the partitions.
func churn(ctx context.Context, pool *pgxpool.Pool, vs []*variant, o options) error {
	for _, q := range []string{`ALTER SYSTEM SET autovacuum_naptime = '5s'`, `SELECT pg_reload_conf()`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	fmt.Printf("\nchurn: %d days at %s records; autovacuum_naptime 5s, 60s allowed per day\n", o.churn, human(o.sizes[len(o.sizes)-1]))
	fmt.Println("| layout | day | table + indexes MB | growth vs day 0 | dead rows after the day | autovacuum runs | retention s |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|")
	for _, v := range vs {
		size0, err := v.totalSize(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Printf("| %s | 0 | %.0f | | | | |\n", v.name, mb(size0))
		if v.daily != nil {
			if _, err := pool.Exec(ctx, `UPDATE `+v.layout+` SET ahead_days = $1`, o.churn+2); err != nil {
				return err
			}
			if _, err := v.daily.MaintainPartitions(ctx, pool); err != nil {
				return err
			}
		}
		avRuns := 0
		for d := 1; d <= o.churn; d++ {
			n := v.rows / 30
			if err := v.claimDay(ctx, pool, d, n); err != nil {
				return fmt.Errorf("%s: churn day %d: %w", v.name, d, err)
			}
			start := time.Now()
			var r result
			if v.daily != nil {
				if err := v.dropOldestDay(ctx, pool, &r); err != nil {
					return fmt.Errorf("%s: churn day %d: %w", v.name, d, err)
				}
			} else {
				if r.purged, err = v.store.Purge(ctx, pool, time.Duration(30-d)*24*time.Hour, 0); err != nil {
					return fmt.Errorf("%s: churn day %d: %w", v.name, d, err)
				}
				r.purgeTime = time.Since(start)
			}
			took := r.purgeTime
			v.rows += n - r.purged
			dead := 0.0
			if v.daily == nil {
				ran, frac, err := v.awaitAutovacuum(ctx, pool, 60*time.Second)
				if err != nil {
					return err
				}
				if ran {
					avRuns++
				}
				dead = frac
			}
			size, err := v.totalSize(ctx, pool)
			if err != nil {
				return err
			}
			fmt.Printf("| %s | %d | %.0f | %+.1f%% | %.1f%% | %d | %.1f |\n", v.name, d, mb(size), 100*(float64(size)/float64(size0)-1),
				100*dead, avRuns, took.Seconds())
		}
	}
	return nil
}

// claimDay claims n new records dated day d of the churn (now, or for the
// daily layout IDs of today + d).
func (v *variant) claimDay(ctx context.Context, pool *pgxpool.Pool, d int, n int64) error {
	if v.daily != nil {
		_, err := pool.Exec(ctx, `WITH r AS (
	SELECT g, ((now() AT TIME ZONE 'UTC')::date + $3::int + time '12:00') AT TIME ZONE 'UTC' AS at, md5('churn' || g) AS h
	FROM generate_series($1::bigint, $2::bigint) AS g
)
INSERT INTO `+v.table+` (consumer, message_uuid, day, topic, kafka_partition, kafka_offset)
SELECT 'bench-consumer-' || (g % 4),
	(lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
	(at AT TIME ZONE 'UTC')::date, '`+topic+`', (g % 24)::int, g
FROM r`, v.next, v.next+n-1, d)
		v.next += n
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+v.table+` (consumer, message_uuid, topic, kafka_partition, kafka_offset)
	SELECT 'bench-consumer-' || (g % 4), md5('churn' || g)::uuid, '`+topic+`', (g % 24)::int, g
	FROM generate_series($1::bigint, $2::bigint) AS g`, v.next, v.next+n-1)
	v.next += n
	return err
}

// flushStats sends a backend's pending statistics at once where the server
// can (pg_stat_force_next_flush, PostgreSQL 15 on); PostgreSQL 14 sends them
// through its statistics collector within half a second.
func flushStats(ctx context.Context, pool *pgxpool.Pool) error {
	var can bool
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int >= 150000`).Scan(&can); err != nil || !can {
		return err
	}
	_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	return err
}

// awaitAutovacuum waits up to limit for autovacuum to vacuum the table;
// it returns whether it did and the dead rows' share after.
func (v *variant) awaitAutovacuum(ctx context.Context, pool *pgxpool.Pool, limit time.Duration) (bool, float64, error) {
	stats := func() (runs, live, dead int64, err error) {
		if err = flushStats(ctx, pool); err != nil {
			return
		}
		err = pool.QueryRow(ctx, `SELECT autovacuum_count, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			v.table).Scan(&runs, &live, &dead)
		return
	}
	runs0, _, _, err := stats()
	if err != nil {
		return false, 0, err
	}
	deadline := time.Now().Add(limit)
	for {
		runs, live, dead, err := stats()
		if err != nil {
			return false, 0, err
		}
		frac := 0.0
		if live+dead > 0 {
			frac = float64(dead) / float64(live+dead)
		}
		if runs > runs0 || time.Now().After(deadline) {
			return runs > runs0, frac, nil
		}
		select {
		case <-ctx.Done():
			return false, 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// totalSize is the table's size with its indexes, over its partitions.
func (v *variant) totalSize(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM (
		SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
		UNION ALL SELECT $1::regclass WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::regclass))) AS leaves`, v.table).Scan(&n)
	return n, err
}

// result is one layout at one size.
type result struct {
	size                      int64
	layout                    string
	one, batched              float64
	oneAll, batchedAll        []float64
	records                   int64
	heap, keyIndex, timeIndex int64
	total                     int64
	perRecord                 float64
	purged                    int64
	purgeTime, vacuumTime     time.Duration
	purgeWAL, vacuumWAL       int64
	deadFraction              float64
}

// variant is one table layout in a schema of its own.
type variant struct {
	name   string
	schema string
	table  string // qualified, quoted
	store  *dedup.Store
	claims dedupq.Queuer // store's, as the consumer queues them
	// load inserts the records numbered $1 to $2, for $3 consumers.
	load  string
	next  int64 // the next record number to load
	rows  int64 // records in the table
	parts []int64
	newID func() string // a new message ID
	// daily is set for the daily layout: its store, and the layout row.
	daily  *dedup.Store
	layout string
}

const topic = "bench.orders"

// layoutNames lists the layouts -layouts accepts, the default first.
func layoutNames() []string { return []string{"uuid", "text", "uuid-av", "daily"} }

func newVariant(ctx context.Context, pool *pgxpool.Pool, name string) (*variant, error) {
	v := &variant{name: name, schema: "bench_dedup_" + name, next: 1}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{v.schema}.Sanitize()+` CASCADE`); err != nil {
		return nil, err
	}
	cfg := &migrate.Config{Tables: migrate.Tables{Schema: v.schema}}
	m, err := migrate.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return nil, err
	}
	v.table = pgx.Identifier{v.schema, migrate.ProcessedMessagesDefault}.Sanitize()
	if name == "daily" {
		return v, v.enableDaily(ctx, pool)
	}
	load := func(idColumn, idExpr string) string {
		return `INSERT INTO ` + v.table + ` (consumer, ` + idColumn + `, topic, kafka_partition, kafka_offset, processed_at)
	SELECT 'bench-consumer-' || (g % $3), ` + idExpr + `, '` + topic + `', (g % 24)::int, g,
		now() - interval '30 days' * (1 - (g - $1 + 1)::float8 / ($2 - $1 + 1))
	FROM generate_series($1::bigint, $2::bigint) AS g`
	}
	ids := `md5('bench' || g)::uuid`
	v.newID = newUUID
	switch name {
	case "uuid", "text", "uuid-av": // UUIDs as uuid; IDs that are no UUID as text
		s, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: v.schema}})
		if err != nil {
			return nil, err
		}
		v.store, v.claims = s, dedupq.Of(s)
		v.load = load("message_uuid", ids)
		if name == "text" {
			v.load = load("message_id", "upper("+ids+"::text)")
			v.newID = func() string { return strings.ToUpper(newUUID()) }
		}
		if name == "uuid-av" {
			if _, err := pool.Exec(ctx, `ALTER TABLE `+v.table+` RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
				autovacuum_vacuum_insert_scale_factor)`); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("unknown layout %q (have %v)", name, layoutNames())
	}
	return v, nil
}

// enableDaily makes v the daily layout, as if enabled more than 30 days
// ago: the records, spread over the last 30 days, all go to partitions.
func (v *variant) enableDaily(ctx context.Context, pool *pgxpool.Pool) error {
	s, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: v.schema}})
	if err != nil {
		return err
	}
	if _, err := s.EnableDaily(ctx, pool, dedup.DailyConfig{KeepDays: 31}); err != nil {
		return err
	}
	v.daily, v.store, v.claims = s, s, dedupq.Of(s)
	v.table = pgx.Identifier{v.schema, migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily")}.Sanitize()
	v.layout = pgx.Identifier{v.schema, migrate.DerivedName(migrate.ProcessedMessagesDefault, "_layout")}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+v.layout+` SET daily_from = (now() AT TIME ZONE 'UTC')::date - 40`); err != nil {
		return err
	}
	if _, err := s.MaintainPartitions(ctx, pool); err != nil {
		return err
	}
	if _, err := v.claims.Layout(ctx, pool, 0); err != nil { // queued claims need it
		return err
	}
	// UUIDv7: 48 bits of milliseconds, version 7, 12 random bits, variant
	// 10, 62 random bits (md5 of the record number stands for them).
	v.load = `WITH r AS (
	SELECT g, now() - interval '30 days' * (1 - (g - $1 + 1)::float8 / ($2 - $1 + 1)) AS at, md5('bench' || g) AS h
	FROM generate_series($1::bigint, $2::bigint) AS g
)
INSERT INTO ` + v.table + ` (consumer, message_uuid, day, topic, kafka_partition, kafka_offset, processed_at)
SELECT 'bench-consumer-' || (g % $3),
	(lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
	(at AT TIME ZONE 'UTC')::date, '` + topic + `', (g % 24)::int, g, at
FROM r`
	v.newID = func() string { return newUUID7(time.Now()) }
	return nil
}

// newUUID7 returns a random UUIDv7 of time at.
func newUUID7(at time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	ms := at.UnixMilli()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// index is one index of the table, with the constraint it backs.
type index struct {
	name, def, constraint, constraintDef string
}

// grow loads records until the table holds size, with its indexes dropped
// meanwhile and built again after, then vacuums and analyzes it.
func (v *variant) grow(ctx context.Context, pool *pgxpool.Pool, size int64, consumers int) error {
	if v.rows >= size {
		return nil
	}
	if v.daily != nil { // the days the last retention dropped come back
		if _, err := pool.Exec(ctx, `UPDATE `+v.layout+` SET keep_days = 31`); err != nil {
			return err
		}
		if _, err := v.daily.MaintainPartitions(ctx, pool); err != nil {
			return err
		}
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, pg_get_indexdef(i.indexrelid), coalesce(con.conname, ''),
		coalesce(pg_get_constraintdef(con.oid), '')
	FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
	LEFT JOIN pg_constraint AS con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')
	WHERE i.indrelid = $1::regclass ORDER BY c.relname`, v.table)
	if err != nil {
		return err
	}
	idx, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (index, error) {
		var x index
		return x, r.Scan(&x.name, &x.def, &x.constraint, &x.constraintDef)
	})
	if err != nil {
		return err
	}
	for _, x := range idx {
		q := `DROP INDEX ` + pgx.Identifier{v.schema, x.name}.Sanitize()
		if x.constraint != "" {
			q = `ALTER TABLE ` + v.table + ` DROP CONSTRAINT ` + pgx.Identifier{x.constraint}.Sanitize()
		}
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	// One statement: its records spread over 30 days in order.
	n := size - v.rows
	if _, err := pool.Exec(ctx, v.load, v.next, v.next+n-1, consumers); err != nil {
		return err
	}
	v.next += n
	v.rows += n
	for _, x := range idx {
		q := x.def
		if x.constraint != "" {
			q = `ALTER TABLE ` + v.table + ` ADD CONSTRAINT ` + pgx.Identifier{x.constraint}.Sanitize() + ` ` + x.constraintDef
		}
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	_, err = pool.Exec(ctx, `VACUUM (ANALYZE) `+v.table)
	return err
}

// newUUID returns a random (version 4) UUID in canonical form.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// offsets returns worker w's partition and reserves n offsets on it: each
// worker claims on a partition of its own, its position moving forward.
func (v *variant) offsets(w, n int) (partition int, first int64) {
	first = v.parts[w]
	v.parts[w] += int64(n)
	return 1000 + w, first
}

// parallel runs f on o.workers goroutines, each given its share of total,
// and returns total per second of wall time.
func (v *variant) parallel(ctx context.Context, o options, total int, f func(ctx context.Context, w, n int) error) (float64, error) {
	per := total / o.workers
	for len(v.parts) < o.workers { // each goroutine then touches its own element only
		v.parts = append(v.parts, 0)
	}
	errs := make([]error, o.workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = f(ctx, w, per)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	v.rows += int64(per * o.workers)
	return float64(per*o.workers) / elapsed.Seconds(), nil
}

// claimOne claims new IDs one per transaction, as the consumer does with
// one message: BEGIN and the claim in one round trip, then COMMIT.
func (v *variant) claimOne(ctx context.Context, pool *pgxpool.Pool, o options) (float64, error) {
	return v.parallel(ctx, o, o.one, func(ctx context.Context, w, n int) error {
		partition, offset := v.offsets(w, n)
		for i := 0; i < n; i++ {
			c := dedupq.Claim{Consumer: "bench-consumer-0", MessageID: v.newID(), Topic: topic, Partition: partition,
				Offset: offset + int64(i), Time: time.Now()}
			var dup, moved bool
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			if err := v.claims.QueueClaimMove(b, c, &dup, &moved); err != nil {
				return err
			}
			br := pool.SendBatch(ctx, b)
			tx := br.Tx()
			if err := br.Close(); err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return err
			}
			if !moved { // the partition's first claim: its position row is inserted
				if err := v.store.SavePositionTx(ctx, tx, c.Consumer, c.Topic, c.Partition, c.Offset+1, c.Time, 0); err != nil {
					_ = tx.Rollback(context.WithoutCancel(ctx))
					return err
				}
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			if dup {
				return fmt.Errorf("new ID %s reported a duplicate", c.MessageID)
			}
		}
		return nil
	})
}

// claimBatched claims new IDs o.batch per transaction, as the consumer's
// batches of one partition.
func (v *variant) claimBatched(ctx context.Context, pool *pgxpool.Pool, o options) (float64, error) {
	return v.parallel(ctx, o, o.batched, func(ctx context.Context, w, n int) error {
		n -= n % o.batch
		partition, offset := v.offsets(w, n)
		claims := make([]dedupq.Claim, o.batch)
		for done := 0; done < n; done += o.batch {
			for i := range claims {
				claims[i] = dedupq.Claim{Consumer: "bench-consumer-0", MessageID: v.newID(), Topic: topic, Partition: partition,
					Offset: offset + int64(done+i), Time: time.Now()}
			}
			var dup []bool
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			if err := v.claims.QueueClaimBatch(b, claims, &dup); err != nil {
				return err
			}
			br := pool.SendBatch(ctx, b)
			tx := br.Tx()
			if err := br.Close(); err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			if i := slices.Index(dup, true); i >= 0 {
				return fmt.Errorf("new ID %s reported a duplicate", claims[i].MessageID)
			}
		}
		return nil
	})
}

// sizes measures the table and its indexes.
func (v *variant) sizes(ctx context.Context, pool *pgxpool.Pool, r *result) error {
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+v.table).Scan(&r.records); err != nil {
		return err
	}
	v.rows = r.records
	// Summed over the table's partitions (a plain table is its own leaf).
	if err := pool.QueryRow(ctx, `WITH leaves AS (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
		UNION ALL SELECT $1::regclass WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::regclass)))
	SELECT (SELECT sum(pg_relation_size(relid)) FROM leaves)::bigint, (SELECT sum(pg_total_relation_size(relid)) FROM leaves)::bigint,
		coalesce(sum(pg_relation_size(i.indexrelid)) FILTER (WHERE c.relname NOT LIKE '%processed_at_idx'), 0)::bigint,
		coalesce(sum(pg_relation_size(i.indexrelid)) FILTER (WHERE c.relname LIKE '%processed_at_idx'), 0)::bigint
	FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid IN (SELECT relid FROM leaves)`, v.table).
		Scan(&r.heap, &r.total, &r.keyIndex, &r.timeIndex); err != nil {
		return err
	}
	r.perRecord = float64(r.total) / float64(r.records)
	return nil
}

// retention purges the oldest fraction of the records (by processed_at,
// spread over 30 days), then vacuums the table.
func (v *variant) retention(ctx context.Context, pool *pgxpool.Pool, fraction float64, r *result) error {
	wal := func() (int64, error) {
		var lsn int64
		err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&lsn)
		return lsn, err
	}
	olderThan := time.Duration(float64(30*24*time.Hour) * (1 - fraction))
	w0, err := wal()
	if err != nil {
		return err
	}
	start := time.Now()
	if v.daily != nil {
		if err := v.dropOldestDay(ctx, pool, r); err != nil {
			return err
		}
	} else {
		if r.purged, err = v.store.Purge(ctx, pool, olderThan, 0); err != nil {
			return err
		}
		r.purgeTime = time.Since(start)
	}
	w1, err := wal()
	if err != nil {
		return err
	}
	r.purgeWAL = w1 - w0
	if v.daily != nil {
		v.rows -= r.purged
		return nil // no dead rows: nothing to vacuum
	}
	if err := flushStats(ctx, pool); err != nil {
		return err
	}
	var live, dead int64
	// The statistics are sent asynchronously; a fresh transaction sees them.
	if err := pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`,
		v.table).Scan(&live, &dead); err != nil {
		return err
	}
	if live+dead > 0 {
		r.deadFraction = float64(dead) / float64(live+dead)
	}
	start = time.Now()
	if _, err := pool.Exec(ctx, `VACUUM `+v.table); err != nil {
		return err
	}
	r.vacuumTime = time.Since(start)
	w2, err := wal()
	if err != nil {
		return err
	}
	r.vacuumWAL = w2 - w1
	v.rows -= r.purged
	return nil
}

// dropOldestDay drops the daily layout's oldest day of records (with any
// empty day before it): keep the days after it, and maintain. r.purged is
// the records it held, r.purgeTime the time the drop took.
func (v *variant) dropOldestDay(ctx context.Context, pool *pgxpool.Pool, r *result) error {
	var oldest time.Time
	if err := pool.QueryRow(ctx, `SELECT min(day) FROM `+v.table).Scan(&oldest); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+v.table+` WHERE day <= $1`, oldest).Scan(&r.purged); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `UPDATE `+v.layout+` SET keep_days = (now() AT TIME ZONE 'UTC')::date - $1::date - 1`, oldest); err != nil {
		return err
	}
	start := time.Now()
	ch, err := v.daily.MaintainPartitions(ctx, pool)
	r.purgeTime = time.Since(start)
	if err != nil {
		return err
	}
	if len(ch.Dropped) == 0 || !ch.Dropped[len(ch.Dropped)-1].Equal(oldest) {
		return fmt.Errorf("dropped %v, want the days up to %s", ch.Dropped, oldest.Format(time.DateOnly))
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func round(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x + 0.5)
	}
	return out
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func human(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.FormatInt(n, 10)
}

// loadavg is the machine's load average, as /proc/loadavg reports it.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:3], " ")
}
