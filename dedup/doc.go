// Package dedup is idemkit's PostgreSQL store of processed message IDs and
// consumer positions: a claim of a message ID commits or rolls back
// together with the business writes of the caller's transaction, so a
// message's effect is applied once however often it is delivered. Package
// consumer uses it for every message; use it directly to deduplicate in a
// loop of your own.
//
// ExampleStore_ClaimTx shows a handler's transaction that claims the message
// ID first and writes its effects only when the claim is new;
// ExampleStore_ClaimBatchTx, ExampleStore_Purge, ExampleStore_SeekTx and
// ExampleValidateID show batches, retention, rewinding a consumer and the
// rules for IDs.
//
// # Contract
//
// Claims. Store.ClaimTx, Store.ClaimWithPositionTx and Store.ClaimBatchTx
// claim with INSERT … ON CONFLICT DO NOTHING in your pgx.Tx, never
// SELECT-then-INSERT. A second claim of the same (consumer, message ID) is
// reported as a duplicate result, not an error. A new claim is invisible to
// other transactions until yours commits, and goes away if yours rolls
// back; a concurrent claim of the same ID waits for yours: of any number of
// concurrent claims, exactly one commits as new. The guarantee is scoped to
// one consumer name, and holds at the PostgreSQL boundary only: effects
// outside the transaction need the outbox or the receiver's own idempotency.
// The Queue… methods queue the same statements on a pgx.Batch, so that
// BEGIN and the claim take one round trip.
//
// Input is checked before any SQL runs: consumer names and message IDs with
// ValidateID (non-empty, at most MaxIDLength bytes, valid UTF-8, no control
// characters), topics non-empty, partitions and offsets not negative. An
// invalid claim writes nothing and returns an error matching ErrInvalidInput
// (and ErrInvalidID when an ID is at fault): retrying it cannot help.
//
// Positions. Per (consumer, topic, partition) the store keeps the next
// offset whose effects are not committed, written with the claim, so it is
// a correct place to resume from after a crash. It never moves back through
// a claim; Store.SeekTx is the one way to rewind or skip (`idemkit consumer
// seek` moves the group's Kafka offsets with it). Positions are never
// purged.
//
// Retention. Records live until Store.Purge (or the consumer's
// Config.Retention, or `idemkit dedup purge -older-than D`) deletes those
// processed more than retention ago, in short bounded statements. After
// that a message with the same ID counts as new and its handler runs
// again: choose a retention longer than the longest window in which a
// message can come back (redelivery, dead-letter replays, rewinds).
//
// Daily layout. Store.EnableDaily (`idemkit dedup daily enable`) keeps
// UUIDv7 IDs in a table partitioned by the day of the ID's own timestamp,
// whose retention drops whole days (Store.MaintainPartitions, which the
// consumer runs every PurgeInterval); other IDs stay in the flat table.
// A claim dated on a day without a partition fails with ErrNoPartition
// (retried), one dated on a dropped day with ErrPartitionDropped: such a
// message cannot be deduplicated. Keep Layout.KeepDays longer than
// the oldest ID a message can still arrive with.
//
// The tables are created by package migrate; Config and migrate.Config must
// name the same schema and tables, and without them calls return errors
// matching ErrNotMigrated. Only the daily layout's DDL (EnableDaily,
// MaintainPartitions) runs here.
//
// The design (queued claims, positions, compact UUID keys, the daily
// partitions and the switch to them) is explained in docs/design/dedup.md
// in the repository.
package dedup
