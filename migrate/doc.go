// Package migrate creates and upgrades idemkit's PostgreSQL tables with
// versioned migrations embedded in the library.
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
//   - 1 (001_dedup): the dedup store's tables: processed messages, keyed by
//     (consumer, message_id), with an index on processed_at for retention
//     purges; and consumer positions, the next offset per (consumer, topic,
//     partition). See package dedup.
//   - 2 (002_outbox): the outbox table. See package outbox.
//   - 3 (003_idempotency): the HTTP idempotency records. See package idemhttp.
//   - 4 (004_retry): messages parked by the consumer's non-blocking mode, and
//     the dead-letter replay records. See packages consumer and dlq.
//   - 5 (005_outbox_scan): the outbox's scans read an index range that ends
//     at now(), one for Kafka rows and one per handler for dispatcher rows,
//     so rows not yet due are never read; the key index leaves out rows
//     held behind another. It replaces version 2's scan index; building
//     the indexes scans the outbox table and blocks writes to it meanwhile.
//     See package outbox.
//   - 6 (006_topic_identity): consumer positions gain the topic's
//     incarnation and the timestamp of the last record passed, so that a
//     deleted and recreated topic is recognised. See package consumer.
//   - 7 (007_dlq_incarnation): dead-letter replay records gain the origin
//     topic's incarnation, part of their primary key, so that dead letters
//     of two incarnations with equal coordinates never collide. The table is
//     rebuilt; reverting fails (changing nothing) while two incarnations'
//     records share coordinates. See package dlq.
//   - 8 (008_anchor_offset): consumer positions name the record of their
//     anchor, so that a position moved on over transaction markers keeps a
//     record to compare. See package consumer.
//   - 9 (009_parked_incarnation): parked messages gain the topic's
//     incarnation, part of their primary key, so that a message of a
//     recreated topic never collides with one of the old topic still
//     parked at the same offset. The table is rebuilt. See package consumer.
//   - 10 (010_position_epoch): consumer positions count their seeks, so
//     that a consumer removed by a forced seek cannot move a position on
//     after it. See dedup.Store.SeekTx.
//   - 11 (011_idempotency_hot): HTTP idempotency records lose the index of
//     records held past their lease, and their table leaves room on each
//     page (fillfactor 70), so that completing a record is a HOT update.
//     Existing records are kept as they are. See package idemhttp.
//   - 12 (012_outbox_ready): the outbox relay reads ready rows in enqueue
//     order from one partial index; rows that wait (not due, retrying,
//     dead heads: the new waiting column) and rows held behind them are
//     kept out of it. Unsent rows are kept, in order. Stop the relays,
//     migrate, start the new relays. See package outbox.
//   - 14 (014_dedup_uuid): a message ID that is a canonical UUID is stored
//     as uuid (16 bytes) in the new column message_uuid; the primary key on
//     (consumer, message_id) becomes two partial unique indexes, one per
//     column. No row is rewritten (older UUID rows stay text and keep
//     deduplicating). Building the text index scans and sorts the table and
//     blocks writes meanwhile; on a large table add the column and build
//     both indexes first with CREATE UNIQUE INDEX CONCURRENTLY (the
//     definitions are in 014_dedup_uuid.up.sql): the migration then changes
//     the catalog only.
//     Binaries of earlier versions cannot claim after it: stop them, migrate,
//     start the new ones. See package dedup.
package migrate
