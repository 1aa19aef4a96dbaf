// Package pgexec holds what idemkit's PostgreSQL stores share: the small
// executor interface their methods take, and the loop of bounded deletes
// behind every retention purge.
package pgexec

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB runs queries: a pgx.Tx, a *pgxpool.Pool and a *pgx.Conn all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ DB = pgx.Tx(nil)
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)
)

// DeleteInBatches runs sql, a DELETE of at most batch rows whose last
// parameter is that limit, one short statement at a time until a statement
// deletes fewer than batch rows or ctx ends. It returns how many rows it
// deleted, also when it stops on an error.
func DeleteInBatches(ctx context.Context, db DB, sql string, batch int, args ...any) (int64, error) {
	args = append(args, batch)
	var deleted int64
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return deleted, err
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return deleted, nil
		}
	}
}

// NotMigrated returns err unchanged unless PostgreSQL answered that a table
// or a column does not exist: then it returns err saying so, matching both
// err and sentinel (the package's ErrNotMigrated) but with no text of the
// sentinel's, so that the caller's one prefix stays the only one.
func NotMigrated(sentinel, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703") { // undefined_table, undefined_column
		return &notMigratedError{sentinel: sentinel, err: err}
	}
	return err
}

type notMigratedError struct{ sentinel, err error }

func (e *notMigratedError) Error() string {
	return e.err.Error() + " (schema not migrated: run migrate.Up or idemkit migrate up)"
}

func (e *notMigratedError) Unwrap() []error { return []error{e.sentinel, e.err} }
