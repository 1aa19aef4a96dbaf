// Package dedup is idemkit's PostgreSQL store of processed message IDs.
//
// Contract: a message ID is claimed with INSERT … ON CONFLICT DO NOTHING in the
// caller's transaction, never SELECT-then-INSERT, so the claim commits or rolls
// back together with the business writes made in that transaction. A second
// claim of the same (consumer, message ID) is reported as a duplicate result,
// not an error. Records older than the configured retention are purged in
// bounded batches; after that, a redelivered message with the same ID counts
// as new: retention must outlast every redelivery and replay you expect.
//
// # Claims
//
// Store.ClaimTx, Store.ClaimWithPositionTx and Store.ClaimBatchTx take the
// pgx.Tx your handler writes in. A new claim (duplicate == false) is
// invisible to other transactions until yours commits; if yours rolls back,
// the claim goes with it and the message can be claimed again. While it is
// uncommitted, a concurrent claim of the same ID waits for it, then reports a
// duplicate (your transaction committed) or claims it (it rolled back): of
// any number of concurrent claims, exactly one commits as new. The guarantee
// is scoped to one consumer name: the same message ID claimed by two consumers
// is two claims. It holds at the PostgreSQL boundary only: effects outside the
// transaction need the outbox or the receiver's own idempotency.
//
// Store.QueueClaimWithPosition and Store.QueueClaimBatch queue the same
// statements on a pgx.Batch instead: after pgx.Batch.BeginTx, the
// transaction begins and claims in one round trip (the consumer does this).
// Store.QueueClaimMovePosition queues the claim and a plain UPDATE of an
// existing position row, two statements PostgreSQL runs for less CPU than
// the one of QueueClaimWithPosition; it reports whether the row moved, and
// when it did not, Store.SavePositionTx in the same transaction writes what
// QueueClaimWithPosition would have (the consumer does this with one
// message per transaction).
//
// Input is checked before any SQL runs: consumer names and message IDs with
// ValidateID (non-empty, at most MaxIDLength bytes, valid UTF-8, no control
// characters), topics non-empty, partitions and offsets not negative. An
// invalid claim writes nothing and returns an error matching ErrInvalidInput
// (and ErrInvalidID when an ID is at fault): retrying it cannot help.
//
// # Positions
//
// The positions table holds, per (consumer, topic, partition), the
// consumer's next offset: the offset of the first message whose effects are
// not committed. ClaimWithPositionTx and ClaimBatchTx write it in the same
// statement as the claim, so it commits atomically with the effects, which
// makes it a correct place to resume from after a crash between the database
// commit and the Kafka offset commit. It never moves back through the store
// (a redelivery at a lower offset leaves it alone) and it is recorded for
// duplicates too, since a duplicate is done. Positions are never purged.
//
// Store.SeekTx is the one way a position moves back (or jumps ahead): it
// locks the consumer's positions in a topic, returns what it replaced, and
// writes the new ones with their anchor time cleared; with newIncarnation it
// also moves them onto the topic's next incarnation, for a topic
// that was deleted and created again. A consumer starts at the later of its
// position and its group's Kafka offset, so a rewind must move both:
// `idemkit consumer seek` does. Store.ListPositions reads positions with their
// incarnation and anchor time.
//
// # Retention
//
// Records live until Store.Purge deletes them; nothing expires on its own.
// Purge(ctx, pool, retention, n) deletes records processed more than
// retention ago, n rows per short statement, so it never holds long locks or
// a long transaction. After a record is purged its message ID is unknown: a
// redelivered or replayed message with that ID counts as new and its handler
// runs again. Choose a retention longer than the longest window in which a
// message can come back: Kafka redelivery after a rebalance or crash (minutes),
// dead-letter replays, and any manual re-consumption from an older offset
// (the topic's own retention, if you may rewind that far). Run Purge on a
// schedule you own, set consumer.Config.Retention (the runner then purges
// every PurgeInterval), or run `idemkit dedup purge -older-than D`.
//
// # Compact keys
//
// A message ID in the canonical form of a UUID (36 characters: lower-case
// hex digits in groups of 8-4-4-4-12 separated by hyphens, as PostgreSQL
// prints a uuid) is stored in 16 bytes, in the uuid column message_uuid,
// with message_id NULL; any other ID (upper case, braces, no hyphens, any
// other string) is stored as text in message_id, unchanged. The API takes
// and returns strings either way: since only the canonical form qualifies,
// the stored uuid prints as the very ID that was claimed, and two IDs that
// differ as strings never share a key. Each column has its own partial
// unique index, per consumer; a claim is still one INSERT … ON CONFLICT DO
// NOTHING, whose arbiters are both indexes, so it stays atomic and
// concurrent claims of an ID still settle on one winner.
//
// # Daily partitions
//
// A schema may store UUIDv7 IDs in a table partitioned by day instead
// (Store.EnableDaily, `idemkit dedup daily enable`): its
// retention then drops whole days, an O(1) catalog change that leaves no
// dead rows behind and takes no row locks from the claims, where Purge
// deletes and vacuums row by row. PostgreSQL requires a unique index on a
// partitioned table to include the partition key, so the key is
// (consumer, message_uuid, day), and the day must be the same on every
// delivery of a message: it is read from the ID itself, the 48-bit
// millisecond timestamp of a UUIDv7 (RFC 9562), in UTC. Since the day is a
// function of the ID, computed by the store from the ID alone, one ID
// always lands in one partition, where the unique index sees every claim
// of it: a claim is still one INSERT … ON CONFLICT DO NOTHING, atomic with
// the business writes, and concurrent claims still settle on one winner.
//
// IDs without such a time stay in the flat table: any ID that is not a
// canonical UUIDv7 (text IDs, UUIDs of other versions), and UUIDv7 IDs
// dated before the day the layout took effect (Layout.DailyFrom, two days
// after EnableDaily). An ID is in exactly one of the two tables, decided by
// the ID and DailyFrom alone; EnableDaily makes that hold for processes
// already running with a CHECK on the flat table that refuses the IDs the
// daily table now takes (a store that read the old layout gets
// ErrLayoutChanged and reads it again; the runner waits and runs the
// transaction again). The CHECK costs each flat insert a few microseconds
// once the layout is enabled, nothing before.
//
// Store.MaintainPartitions creates partitions ahead (Layout.AheadDays) and
// drops those older than Layout.KeepDays, raising a watermark
// (Layout.DroppedBefore) before it drops, so that a dropped day is never
// created again; it also finishes a switch that EnableDaily left
// unfinished. The consumer's runner calls it every PurgeInterval. A claim
// dated on a day without a partition fails with ErrNoPartition (retried:
// maintenance creates it, unless the producer's clock is far ahead), or
// with ErrPartitionDropped when the day is below the watermark: such a
// message can no longer be deduplicated, and the runner sends it to
// OnFailure as beyond the horizon (a dlq Redrive reports it as
// BeyondHorizon). Retention is by the ID's time, not by when the message
// is delivered: keep KeepDays longer than the oldest ID a message can
// still arrive with (an outbox message requeued after days dead, a dead
// letter replayed, a backlog), or such messages are refused, however fresh their
// delivery. Migrating down to 14 copies the daily rows back into the flat
// table; stop the consumers first.
//
// # Tables
//
// The tables are created by package migrate (versions 1, 14 and 15);
// Config and migrate.Config must name the same schema and tables. Only
// the daily layout's DDL (EnableDaily, MaintainPartitions) runs here.
package dedup
