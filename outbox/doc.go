// Package outbox makes side effects part of the business transaction.
//
// Contract (being built, see the README's package map for status): EnqueueTx
// writes outbox rows in the caller's pgx.Tx, each with a stable ID fixed at
// enqueue time; nothing is published unless that transaction commits. A relay
// publishes committed rows to Kafka after commit, at least once, carrying the
// stable ID as a header so that downstream idemkit consumers deduplicate on
// it. Several relays may run at once: rows are claimed with FOR UPDATE SKIP
// LOCKED, never read with a "last seen id" cursor, so a row of a slow
// transaction is never skipped, and messages with the same key reach Kafka in
// enqueue order.
package outbox
