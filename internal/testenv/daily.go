package testenv

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/migrate"
)

// UUID7 returns a random UUIDv7 (RFC 9562) whose time is at, in canonical
// form.
func UUID7(tb testing.TB, at time.Time) string {
	tb.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	ms := at.UnixMilli()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Today is the database's current day, UTC: the days of the daily dedup
// layout.
func Today(tb testing.TB, pool *pgxpool.Pool) time.Time {
	tb.Helper()
	var d time.Time
	if err := pool.QueryRow(context.Background(), `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&d); err != nil {
		tb.Fatal(err)
	}
	return time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
}

// BackdateDaily moves schema's daily dedup layout (already enabled, with
// the default table names) to start days before today, as if it had been
// enabled then: the next MaintainPartitions creates the partitions since.
// The flat table's CHECK keeps the bound of the real switch, a state only
// tests reach.
func BackdateDaily(tb testing.TB, pool *pgxpool.Pool, schema string, days int) {
	tb.Helper()
	layout := pgx.Identifier{schema, migrate.DerivedName(migrate.ProcessedMessagesDefault, "_layout")}.Sanitize()
	if _, err := pool.Exec(context.Background(), `UPDATE `+layout+` SET daily_from = $1`,
		Today(tb, pool).AddDate(0, 0, -days)); err != nil {
		tb.Fatal(err)
	}
}
