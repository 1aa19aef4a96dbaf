// Package migrate creates and upgrades idemkit's PostgreSQL tables with
// versioned migrations embedded in the library.
//
// Call Migrator.Up from your deployment or at your program's start, before
// the consumers, relays and middleware that use the tables:
// ExampleMigrator_Up applies every version to a schema of its own.
//
// Each version is a pair of SQL files, NNN_name.up.sql and NNN_name.down.sql,
// compiled into the binary. Their identifiers (schema, tables, indexes) come
// from Config and are quoted once with pgx.Identifier before the SQL is
// rendered; no value is ever put into SQL text.
//
// Contract:
//
//   - Up applies every pending version in order; Down reverts versions above
//     a target in reverse order. Each version runs in its own transaction
//     together with the insert or delete of its row in the migrations table,
//     so a version is either fully applied and recorded or not at all.
//   - Every step first takes a transaction-level advisory lock keyed on the
//     schema name, then re-checks whether its version is applied. Any number
//     of processes may call Up at once (for example every replica at start):
//     each version is applied exactly once and the others wait, then skip it.
//   - Up waits out a server that is starting, refuses connections or cannot
//     be reached, logging when it starts and stops waiting, until its
//     context ends: a service may call it at start while PostgreSQL restarts.
//   - Up refuses a server older than PostgreSQL 14 (MinServerVersion) with
//     a *ServerVersionError that names both versions, before it creates or
//     changes anything.
//   - Up creates the schema and the migrations table when missing. No other
//     DDL runs outside a versioned migration, and nothing else in idemkit runs
//     DDL: call Up from your deployment or your program's start, on purpose.
//   - Table names are free-form (any valid UTF-8 of at most 63 bytes without
//     NUL); derived index names are kept within PostgreSQL's 63-byte limit.
//
// Versions:
//
//   - 1 (001_baseline): every idemkit table, in groups that each serve one
//     package (a service that uses only some packages leaves the other
//     tables empty): the dedup store's processed messages and consumer
//     positions and the consumer's parked messages (packages dedup and
//     consumer); the outbox (package outbox); the HTTP idempotency records
//     (package idemhttp); the dead-letter replay records and stored values
//     (package dlq). Each table and index is explained in the SQL file.
//
// A later version is a new pair of files with the next number; Up applies
// it after the baseline, in order, under the same lock.
package migrate
