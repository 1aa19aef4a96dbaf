// Package dedup is idemkit's PostgreSQL store of processed message IDs.
//
// Contract: a message ID is claimed with INSERT … ON CONFLICT DO NOTHING in the
// caller's transaction, never SELECT-then-INSERT, so the claim commits or rolls
// back together with the business writes made in that transaction. A second
// claim of the same (consumer, message ID) is reported as a duplicate result,
// not an error. Records older than the configured retention are purged in
// bounded batches; after that, a redelivered message with the same ID counts
// as new: retention must outlast every redelivery and replay you expect.
package dedup
